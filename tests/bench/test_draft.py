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

