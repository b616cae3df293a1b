from conftest import save_distilled_draft, save_tiny_checkpoint
from minedraft import LLM, SamplingParams
from minedraft.bench.draft import CONFIDENCE_BINS, calibration

PROMPTS = [{"prompt_token_ids": [5, 17, 3, 44]}, {"prompt_token_ids": [8, 1, 90, 12, 33, 7]}]


def test_a_drafter_that_is_its_target_has_every_first_draft_accepted(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float64", max_model_len=64,
              speculative_config={"model": "self", "num_speculative_tokens": 2})
    bins = calibration(llm, PROMPTS, output_len=6)
    answers = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    assert [(b["low"], b["high"]) for b in bins] == list(zip(CONFIDENCE_BINS, CONFIDENCE_BINS[1:]))
    # One first draft per answer token.
    assert sum(b["drafts"] for b in bins) == sum(len(a.outputs[0].token_ids) for a in answers) > 0
    assert all(b["accepted"] == b["drafts"] for b in bins)



def test_a_reduced_vocabulary_drafter_is_scored_in_the_targets_ids(tmp_path):
    """A drafter that is its (tied) target cut to two thirds of the vocabulary: its first draft is
    accepted exactly where the target's answer token is in its vocabulary."""
    target = save_tiny_checkpoint(tmp_path / "target", tie_word_embeddings=True)
    draft = save_distilled_draft(tmp_path / "draft", target, init_layers=(0, 1))
    llm = LLM(str(target), dtype="float64", max_model_len=64,
              speculative_config={"model": str(draft), "num_speculative_tokens": 2})
    bins = calibration(llm, PROMPTS, output_len=6)
    answers = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    in_vocab = [t % 3 != 0 for a in answers for t in a.outputs[0].token_ids]  # save_distilled_draft keeps these
    assert sum(b["drafts"] for b in bins) == len(in_vocab) and 0 < sum(in_vocab) < len(in_vocab)
    assert sum(b["accepted"] for b in bins) == sum(in_vocab)
