"""Batch parallel SD (`psd`) and the drafter in its own process."""

import os
import signal

import pytest

from minedraft import LLM, SamplingParams

PROMPTS = [[5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33, 33, 1, 7, 7, 7, 70, 4, 11, 2, 3], [40, 41], [66] * 20,
           [3, 1, 4, 1, 5, 9, 2, 6]]
LENGTHS = [23, 40, 7, 31, 12, 18]


def greedy(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(tiny_llama):
    """AR greedy outputs, one prompt at a time."""
    ar = LLM(str(tiny_llama), dtype="float64", max_num_seqs=1, max_model_len=96)
    return [ar.generate([{"prompt_token_ids": p}], greedy(n), use_tqdm=False)[0].outputs[0].token_ids
            for p, n in zip(PROMPTS, LENGTHS)]


def make(tiny_llama, draft, k=3, max_num_seqs=4, **placement):
    spec = {"model": str(draft), "num_speculative_tokens": k, "parallel": True, "draft_timeout_s": 20, **placement}
    return LLM(str(tiny_llama), dtype="float64", max_num_seqs=max_num_seqs, max_model_len=96, trace=True,
               speculative_config=spec)


def run_staggered(llm, abort_index=None, kill_after=None, stop_after=None):
    """Requests arrive over time; optionally one is aborted and the drafter killed or frozen."""
    engine = llm.engine
    ids, done, step = [], {}, 0
    pending = list(range(len(PROMPTS)))
    while pending or engine.has_unfinished():
        if pending and step % 3 == 0:  # two arrivals every third step
            for i in pending[:2]:
                ids.append((i, engine.add_request(PROMPTS[i], greedy(LENGTHS[i]))))
            pending = pending[2:]
        if abort_index is not None and step == 5:
            engine.abort(dict((i, r) for i, r in ids)[abort_index])
        if kill_after is not None and step == kill_after:
            os.kill(engine.proposer.process.pid, signal.SIGKILL)
        if stop_after is not None and step == stop_after:
            os.kill(engine.proposer.process.pid, signal.SIGSTOP)
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
        step += 1
    return {i: done[r] for i, r in ids if r in done}


@pytest.mark.parametrize("k", [1, 3, 5, "auto"])
def test_greedy_psd_equals_ar_with_arrivals_and_an_abort(tiny_llama, tiny_draft, expected, k):
    with make(tiny_llama, tiny_draft, k=k) as llm:
        outs = run_staggered(llm, abort_index=2)
        assert sorted(outs) == [0, 1, 3, 4, 5]  # the aborted request produced no final output
        for i, out in outs.items():
            assert out.token_ids == expected[i], i
        metrics = llm.get_metrics()
        assert metrics["num_overlapped_steps"] > 0
        # "auto" may switch drafting off for this weak drafter; it drafted at first.
        assert metrics["num_draft_tokens" if k == "auto" else "num_accepted_tokens"] > 0
        # Every slot is free again, in the target and in the drafter process.
        assert llm.engine.runner.cache.num_free == 4
        assert llm.engine.proposer.stats() == {"free_slots": 4, "sequences": 0}


def test_self_drafting_psd_accepts_everything(tiny_llama, expected):
    with make(tiny_llama, "self", k=4) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], [greedy(n) for n in LENGTHS], use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        assert llm.get_metrics()["acceptance_rate"] == 1.0


def test_sub_batches_alternate_and_overlap(tiny_llama, tiny_draft):
    with make(tiny_llama, tiny_draft) as llm:
        llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:4]], greedy(30), use_tqdm=False)
        verifies = [e for e in llm.engine.trace if e["kind"] == "verify"]
        assert all(a["group"] != b["group"] for a, b in zip(verifies, verifies[1:]))
        assert all(e["size"] == 2 for e in verifies[:10])  # 4 requests: two balanced sub-batches
        # Each verification is of the sub-batch just drafted, and while it ran the other sub-batch
        # was already submitted to the drafter (wall-clock overlap is shown by the benchmark: on
        # these tiny models both take about a millisecond).
        trace = llm.engine.trace
        assert all(trace[i - 1]["kind"] == "draft" and trace[i - 1]["group"] == e["group"]
                   for i, e in enumerate(trace) if e["kind"] == "verify")
        metrics = llm.get_metrics()
        assert metrics["num_overlapped_steps"] >= metrics["num_steps"] - 2


def test_one_request_falls_back_to_standard_sd(tiny_llama, tiny_draft, expected):
    with make(tiny_llama, tiny_draft) as llm:
        out = llm.generate([{"prompt_token_ids": PROMPTS[1]}], greedy(LENGTHS[1]), use_tqdm=False)
        assert out[0].outputs[0].token_ids == expected[1]
        metrics = llm.get_metrics()
        assert metrics["num_steps"] > 0 and metrics["num_overlapped_steps"] == 0


def test_sequential_remote_drafter_equals_ar(tiny_llama, tiny_draft, expected):
    with make(tiny_llama, tiny_draft, parallel=False, draft_device="cpu") as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], [greedy(n) for n in LENGTHS], use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        assert llm.get_metrics()["num_overlapped_steps"] == 0


def test_killed_drafter_every_request_still_completes(tiny_llama, tiny_draft, expected):
    with make(tiny_llama, tiny_draft) as llm:
        outs = run_staggered(llm, kill_after=7)
        assert sorted(outs) == list(range(len(PROMPTS)))
        assert [outs[i].token_ids for i in range(len(PROMPTS))] == expected
        assert llm.get_metrics()["drafter_failures"] == 1 and llm.engine.proposer is None
        assert llm.engine.runner.cache.num_free == 4


def test_frozen_drafter_times_out_and_requests_complete(tiny_llama, tiny_draft, expected):
    with make(tiny_llama, tiny_draft, draft_timeout_s=1.0) as llm:
        process = llm.engine.proposer.process
        try:
            outs = run_staggered(llm, stop_after=4)
        finally:
            process.kill()
        assert [outs[i].token_ids for i in range(len(PROMPTS))] == expected
        assert llm.get_metrics()["drafter_failures"] == 1


@pytest.mark.parametrize("placement,message", [
    ({"parallel": True, "target_cpus": [0], "draft_cpus": [0]}, "overlap"),
    ({"parallel": True, "draft_cpus": [4096]}, "draft_cpus"),
    ({"parallel": True, "rendezvous": "127.0.0.1:1234"}, "rendezvous"),
    ({"draft_cpus": [0]}, "own process"),
    ({"draft_device": "cuda:7"}, "CUDA"),
    ({"parallel": "yes"}, "parallel"),
])
def test_bad_placement_is_named(tiny_llama, placement, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_llama), speculative_config={"model": "self", "num_speculative_tokens": 2, **placement})
