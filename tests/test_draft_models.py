"""The drafter shipped in minedraft/draft_models for the bundled target (an EAGLE-3 head)."""

import pytest

from minedraft import LLM, SamplingParams
from minedraft.models.loader import DEFAULT_DRAFT

QUESTIONS = ("What is the capital of France?", "Give me three tips for staying focused.",
             "Translate into German: The weather is nice today.")


def test_bundled_drafter_is_small_enough_to_ship():
    size = sum(f.stat().st_size for f in DEFAULT_DRAFT.iterdir())
    assert size <= 40 * 2**20, size


def test_speculation_without_a_named_draft_uses_the_bundled_drafter(smollm2):
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=32)
    expected = [o.outputs[0].token_ids for o in smollm2.chat(conversations, params, use_tqdm=False)]
    with LLM(max_num_seqs=4, max_model_len=512, speculative_config={"num_speculative_tokens": 4}) as sd:
        assert sd.engine.config.speculative.model_path == DEFAULT_DRAFT
        assert sd.engine.config.speculative.method == "eagle3"
        # Prompt lookup goes first by default for the bundled drafter (docs/DRAFT_MODEL.md).
        assert sd.engine.config.speculative.prompt_lookup_first and sd.engine.config.speculative.prompt_lookup_min == 2
        got = [o.outputs[0].token_ids for o in sd.chat(conversations, params, use_tqdm=False)]
        metrics = sd.get_metrics()
    assert got == expected
    # Only that some drafts are accepted: the drafter is weak (figures in docs/DRAFT_MODEL.md).
    assert metrics["num_accepted_tokens"] > 0, metrics


def test_other_targets_must_name_their_drafter(tiny_llama):
    with pytest.raises(ValueError, match="no default draft model"):
        LLM(str(tiny_llama), speculative_config={"num_speculative_tokens": 4})
