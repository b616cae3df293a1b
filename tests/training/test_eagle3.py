import torch

from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.eagle3 import load_eagle3, save_eagle3
from minedraft.models.loader import load_model
from minedraft.models.llama import rope_tables
from minedraft.training.distill import frequent_tokens
from minedraft.training.eagle3 import (Eagle3TrainConfig, Trainer, collate, extract_features, load_features, new_head,
                                       unroll)

CPU = torch.device("cpu")


def samples_for(target, n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    vocab = target.args.vocab_size
    samples = [{"category": "t", "greedy": True,
                "prompt": torch.randint(0, vocab, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen),
                "reply": torch.randint(0, vocab, (int(torch.randint(6, 14, (1,), generator=gen)),), generator=gen)}
               for _ in range(n)]
    extract_features(ModelRunner(target, 4, 64, target.input_embedding.dtype, CPU), (0, 1, 1), samples)
    return samples


def test_training_time_test_matches_the_head_drafting_with_its_cache(tiny_llama):
    """Each unrolled step of the training attention equals what the head computes at inference
    (KV cache, context entries then its own drafts one at a time), in float64."""
    target = load_model(tiny_llama, torch.float64, CPU)
    vocab_ids = torch.arange(0, target.args.vocab_size, 2)
    head = new_head(target, vocab_ids, (0, 1, 1), seed=3).double()
    head.embed = target.input_embedding
    sample = samples_for(target, n=1)[0]
    for s in ("aux", "final"):
        sample[s] = sample[s].double()
    batch = collate([sample])
    batch["aux"], batch["final"] = sample["aux"][None], sample["final"][None]
    cos, sin = rope_tables(target.args, 64, torch.float64)
    steps = 3
    trained = [logits[0] for logits, _, _, _ in unroll(head, batch, steps, cos, sin, target.lm_head.weight[:, vocab_ids])]
    ids = batch["ids"][0].tolist()
    runner = ModelRunner(head, 1, 64, torch.float64, CPU)
    for t in (0, 4, len(ids) - 2 - steps):
        runner.cache.lengths[0] = 0
        # Context: entries for tokens 1..t+1 with the target's features of positions 0..t.
        logits, feature = runner.run([Row(0, ids[1 : t + 2], 1)], features=sample["aux"][: t + 1])
        for j in range(steps):
            assert torch.allclose(head.compute_logits(head.norm(feature[-1:]))[0], trained[j][t], atol=1e-9)
            if j + 1 < steps:
                _, feature = runner.run([Row(0, [ids[t + 2 + j]], 1)], features=feature[-1:])


def test_training_lowers_the_loss_and_the_export_loads_in_the_public_layout(tiny_llama, tmp_path):
    target = load_model(tiny_llama, torch.float32, CPU)
    samples = samples_for(target, n=8)
    ids, coverage = frequent_tokens(samples, target.args.vocab_size, 48, always={0})
    assert len(ids) == 48 and 0 in ids.tolist() and 0 < coverage <= 1
    config = Eagle3TrainConfig(ttt_steps=3, epochs=30, batch_tokens=64, lr=3e-3, warmup_steps=1,
                               eval_every=1000)
    trainer = Trainer(target, tmp_path, config, (0, 1, 1), ids)
    with torch.no_grad():
        first = float(trainer.loss(collate(samples)))
    trainer.train(samples, samples, tmp_path / "head")
    with torch.no_grad():
        assert float(trainer.loss(collate(samples))) < 0.8 * first
    assert (tmp_path / "checkpoint.pt").exists() and (tmp_path / "log.jsonl").exists()
    head = load_eagle3(tmp_path / "head", torch.float32, CPU, target.input_embedding)
    assert torch.equal(head.draft_to_target, ids)
    assert head.config.aux_layers(target.args.num_layers) == (0, 1, 1)
    # Round trip: saving the loaded head again gives the same tensors.
    again = load_eagle3(save_eagle3(head, tmp_path / "again", (0, 1, 1)), torch.float32, CPU, target.input_embedding)
    for name, value in head.state_dict().items():
        assert torch.equal(value, again.state_dict()[name]), name
    # Resuming continues from the checkpoint.
    resumed = Trainer(target, tmp_path, config, (0, 1, 1), ids)
    assert resumed.step == trainer.step and resumed.epoch == config.epochs


def test_a_warm_start_takes_an_exported_heads_weights_vocabulary_and_layers(tiny_llama, tmp_path):
    from minedraft.training.eagle3 import head_aux_layers, head_vocabulary

    target = load_model(tiny_llama, torch.float32, CPU)
    samples = samples_for(target, n=4)
    ids = torch.arange(0, target.args.vocab_size, 3)
    config = Eagle3TrainConfig(ttt_steps=2, epochs=2, batch_tokens=64, warmup_steps=1, eval_every=1000)
    for d in "abcd":
        (tmp_path / d).mkdir()
    first = Trainer(target, tmp_path / "a", config, (0, 1, 1), ids)
    first.train(samples, samples, tmp_path / "best")
    exported = save_eagle3(first.head, tmp_path / "head", (0, 1, 1))  # trained: not what new_head makes
    assert torch.equal(head_vocabulary(exported), ids)
    assert head_aux_layers(exported, target.args.num_layers) == (0, 1, 1)
    warm = Trainer(target, tmp_path / "b", config, (0, 1, 1), head_vocabulary(exported), init_from=exported)
    for name, value in first.head.state_dict().items():  # the export's float16 values, in float32
        expected = value.half().float() if value.is_floating_point() else value
        assert torch.equal(warm.head.state_dict()[name], expected), name
    assert not torch.equal(warm.head.fc.weight, new_head(target, ids, (0, 1, 1), config.seed).fc.weight)
    # Another vocabulary (every second token against every third): the layers and the rows of the
    # tokens both hold (every sixth) come from the export, the other rows are the target's.
    other_ids = torch.arange(0, target.args.vocab_size, 2)
    other = Trainer(target, tmp_path / "d", config, (0, 1, 1), other_ids, init_from=exported).head
    fresh = new_head(target, other_ids, (0, 1, 1), config.seed)
    assert torch.equal(other.draft_to_target, other_ids)
    assert torch.equal(other.fc.weight, warm.head.fc.weight)
    for j, t in enumerate(other_ids.tolist()):
        source = warm.head.lm_head.weight[:, t // 3] if t % 3 == 0 else fresh.lm_head.weight[:, j]
        assert torch.equal(other.lm_head.weight[:, j], source), t
    assert not torch.equal(warm.head.lm_head.weight[:, 0], fresh.lm_head.weight[:, 0])  # the test can tell


def test_feature_files_load_memory_mapped_and_train_the_same(tiny_llama, tmp_path):
    target = load_model(tiny_llama, torch.float32, CPU)
    samples = samples_for(target, n=4)
    torch.save(samples[:2], tmp_path / "a.pt")
    torch.save(samples[2:], tmp_path / "b.pt")
    loaded = load_features([tmp_path / "a.pt", tmp_path / "b.pt"])
    for mine, theirs in zip(loaded, samples):
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in ("prompt", "reply", "aux", "final"))
    config = Eagle3TrainConfig(ttt_steps=2, epochs=1, batch_tokens=64, warmup_steps=1, eval_every=1000)
    ids = torch.arange(0, target.args.vocab_size, 2)
    trainer = Trainer(target, tmp_path, config, (0, 1, 1), ids)
    assert trainer.loss(collate(loaded)).isfinite()


def test_prompt_positions_enter_the_loss_with_their_weight(tiny_llama, tmp_path):
    target = load_model(tiny_llama, torch.float64, CPU)
    samples = samples_for(target, n=3)
    for s in samples:
        s["aux"], s["final"] = s["aux"].double(), s["final"].double()
    ids = torch.arange(0, target.args.vocab_size, 2)
    batch = collate(samples)
    batch["aux"], batch["final"] = batch["aux"].double(), batch["final"].double()

    def trainer(weight: float, folder: str) -> Trainer:
        (tmp_path / folder).mkdir()
        t = Trainer(target, tmp_path / folder, Eagle3TrainConfig(ttt_steps=1, prompt_loss_weight=weight), (0, 1, 1), ids)
        t.head.double()
        t.target_head, t.cos, t.sin = t.target_head.double(), t.cos.double(), t.sin.double()
        return t

    plain, weighted = trainer(0.0, "a"), trainer(0.5, "b")
    weighted.head.load_state_dict(plain.head.state_dict())
    logits, teacher, reply, inside = next(unroll(plain.head, batch, 1, plain.cos, plain.sin, plain.target_head))
    ce = -(torch.softmax(teacher, -1) * torch.log_softmax(logits, -1)).sum(-1)
    prompt = inside & ~reply
    assert reply.any() and prompt.any()
    with torch.no_grad():
        torch.testing.assert_close(plain.loss(batch), ce[reply].mean())
        expected = (ce[reply].sum() + 0.5 * ce[prompt].sum()) / (reply.sum() + 0.5 * prompt.sum())
        torch.testing.assert_close(weighted.loss(batch), expected)
