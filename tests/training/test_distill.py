"""The drafter training pipeline on tiny float64 models: the exported checkpoint is what our
decoder loads, the loss lowers held-out disagreement, and a run resumes from its checkpoint."""

import json

import pytest
import torch

from conftest import keep_float64
from minedraft import LLM, SamplingParams
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.draft_format import CONFIG_KEY
from minedraft.models.loader import load_model, read_config
from minedraft.training.data import reply_sample, write_shard
from minedraft.training.distill import Student, TrainConfig, collate, frequent_tokens, train


def test_exported_drafter_loads_into_our_decoder_with_the_same_logits(tiny_llama, tmp_path):
    ids = torch.tensor([i for i in range(97) if i % 4])
    torch.set_default_dtype(torch.float64)  # built in float64 from the start: no float32 round trip
    try:
        student = keep_float64(Student(tiny_llama, (1, 0), ids))
    finally:
        torch.set_default_dtype(torch.float32)
    with torch.no_grad():  # the export stores float16: compare on weights that survive the rounding
        for p in student.parameters():
            if p.requires_grad:  # not the embedding, which stays the target's
                p.copy_(p.half().double())
    folder = student.export(tmp_path / "draft", {})
    target = load_model(tiny_llama, torch.float64, torch.device("cpu"))
    with pytest.raises(ValueError, match="target's embedding"):
        load_model(folder, torch.float64, torch.device("cpu"))
    draft = load_model(folder, torch.float64, torch.device("cpu"), embedding=target.input_embedding)
    assert draft.input_embedding.data_ptr() == target.input_embedding.data_ptr()  # shared, not copied
    tokens = [5, 17, 3, 44, 9, 2, 61, 8]
    runner = ModelRunner(draft, 1, 32, torch.float64, torch.device("cpu"))
    ours = runner.forward([Row(runner.cache.allocate(), tokens, num_logits=len(tokens))])
    with torch.no_grad():
        hidden = student(torch.tensor([tokens]), torch.ones(1, len(tokens), dtype=torch.long))[0]
        theirs = student.head(hidden)
    assert torch.equal(draft.draft_vocab, ids)  # ours scores the draft vocabulary alone, in its order
    assert (ours - theirs).abs().max() < 1e-9


def make_shard(folder, path, n: int = 96):
    """Replies of the target itself to random prompts, with its top-5 log-probabilities."""
    llm = LLM(str(folder), dtype="float64", max_num_seqs=8, max_model_len=64)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 97, (int(torch.randint(2, 12, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(n)]
    params = [SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0, max_tokens=16, ignore_eos=True, seed=i,
                             logprobs=5) for i in range(n)]
    outs = llm.generate([{"prompt_token_ids": x} for x in prompts], params, use_tqdm=False)
    write_shard(path, [reply_sample("random", p.greedy, out, 5) for p, out in zip(params, outs)])
    return path


def test_collate_lines_each_reply_token_up_with_the_output_that_predicts_it():
    sample = {"prompt": torch.tensor([4, 5, 6], dtype=torch.int32), "reply": torch.tensor([7, 8], dtype=torch.int32),
              "top_ids": torch.tensor([[7, 1], [8, 2]], dtype=torch.int32),
              "top_logprobs": torch.tensor([[-0.1, -2.0], [-0.2, -3.0]], dtype=torch.float16)}
    to_draft = torch.full((10,), -1)
    to_draft[torch.tensor([1, 7, 8])] = torch.tensor([0, 1, 2])
    batch = collate([sample], to_draft)
    assert batch["input_ids"].tolist() == [[4, 5, 6, 7, 8]]
    assert batch["cols"].tolist() == [2, 3]  # the output after token 6 predicts 7
    assert batch["draft_ids"].tolist() == [[1, 0], [2, 0]]
    assert batch["teacher"][1].tolist() == [1.0, 0.0]  # token 2 is outside the draft vocabulary


def test_frequent_tokens_keep_end_of_sequence_and_report_coverage():
    samples = [{"reply": torch.tensor([3, 3, 3, 5, 5, 9])}]
    ids, coverage = frequent_tokens(samples, 12, 2, always={11})
    assert ids.tolist() == [3, 11] and coverage == pytest.approx(3 / 6)


def test_distillation_lowers_held_out_loss_and_resumes(tiny_llama, tmp_path):
    shard = make_shard(tiny_llama, tmp_path / "shard-0000.pt")
    config = TrainConfig(init_layers=(0,), vocab_size=60, epochs=4, batch_tokens=256, lr=3e-3, warmup_steps=2,
                         eval_every=10)
    train(tiny_llama, [shard], tmp_path / "work", config, always=set())
    log = [json.loads(line) for line in (tmp_path / "work" / "log.jsonl").read_text().splitlines()]
    first, last = log[0], log[-1]
    assert last["greedy_loss"] < 0.8 * first["greedy_loss"], (first, last)
    assert last["greedy_agreement"] > first["greedy_agreement"]
    # A second run finds the finished checkpoint and does no more steps.
    student = train(tiny_llama, [shard], tmp_path / "work", config, always=set())
    assert len((tmp_path / "work" / "log.jsonl").read_text().splitlines()) == len(log)
    with pytest.raises(ValueError, match="different training config"):
        train(tiny_llama, [shard], tmp_path / "work", TrainConfig(init_layers=(1,), vocab_size=60), always=set())
    assert read_config(student.export(tmp_path / "model", {"note": 1}))[CONFIG_KEY]["note"] == 1
    # Continuing from the export starts where the first run ended (up to float16 rounding).
    again = TrainConfig(init_layers=(0,), init_from=str(tmp_path / "model"), epochs=1, batch_tokens=256)
    train(tiny_llama, [shard], tmp_path / "again", again, always=set())
    start = json.loads((tmp_path / "again" / "log.jsonl").read_text().splitlines()[0])
    assert start["greedy_loss"] == pytest.approx(last["greedy_loss"], rel=1e-2)
    with pytest.raises(ValueError, match="does not fit --init-layers"):
        train(tiny_llama, [shard], tmp_path / "third", TrainConfig(init_layers=(0, 1), init_from=str(tmp_path / "model")),
              always=set())
