"""Batch parallel SD (`psd`) and the drafter in its own process."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from minedraft import LLM, SamplingParams
from minedraft.spec_decode import remote

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


def make(tiny_llama, draft, k=3, max_num_seqs=4, chunk=None, **placement):
    spec = {"model": str(draft), "num_speculative_tokens": k, "parallel": True, "draft_timeout_s": 20, **placement}
    return LLM(str(tiny_llama), dtype="float64", max_num_seqs=max_num_seqs, max_model_len=96, trace=True,
               max_num_batched_tokens=chunk, speculative_config=spec)


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


@pytest.mark.parametrize("k,chunk", [(1, None), (3, None), (3, 4), (5, None), ("auto", None), ("auto", 3)])
def test_greedy_psd_equals_ar_with_arrivals_and_an_abort(tiny_llama, tiny_draft, expected, k, chunk):
    """Chunk: prompts prefilled that many tokens a step, beside a sub-batch's verification."""
    with make(tiny_llama, tiny_draft, k=k, chunk=chunk) as llm:
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
        assert llm.engine.proposer.stats() == {"free_slots": 4, "sequences": 0, "tokens": 0, "choices": {}}


def test_prompts_reach_the_drafter_at_admission_and_ride_beside_verification(tiny_llama, tiny_draft, expected):
    """With chunks of 4 prompt tokens a step, the drafter process is sent each chunk once the
    target has run it and prefills it then, so a request's first draft catches up on one token."""
    with make(tiny_llama, tiny_draft, chunk=4) as llm:
        engine = llm.engine
        long = engine.add_request(PROMPTS[4], greedy(LENGTHS[4]))  # 20 tokens: five chunks
        for chunk in range(1, 5):
            engine.step()
            assert engine.proposer.stats() == {"free_slots": 3, "sequences": 1, "tokens": 4 * chunk, "choices": {}}
        engine.step()  # the last chunk, and the first token: the first draft will send that token alone
        assert engine.proposer.stats() == {"free_slots": 3, "sequences": 1, "tokens": 20, "choices": {}}
        short = engine.add_request(PROMPTS[0], greedy(LENGTHS[0]))
        done = {}
        while engine.has_unfinished():
            done.update((o.request_id, o.outputs[0].token_ids) for o in engine.step() if o.finished)
        assert done == {long: expected[4], short: expected[0]}
        trace = engine.trace
        prefills = [e for e in trace if e["kind"] == "prefill"]
        assert [e["prompt_tokens"] for e in prefills] == [4] * 5  # nothing else ran yet
        # The short prompt's two chunks ran in the passes that verified the long request.
        assert [e["prompt_tokens"] for e in trace if e["kind"] == "verify" and "prompt_tokens" in e] == [4, 3]


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


class Scripted:
    """Stands in for the engine's OverlapPolicy: overlap for `run` steps, then merge for `run`."""

    def __init__(self, run: int):
        self.run, self.steps, self.merged = run, 0, 0

    def overlap(self, rows: int, tokens: int) -> bool:
        self.steps += 1
        overlap = (self.steps // self.run) % 2 == 0
        self.merged += not overlap
        return overlap

    def observe_verify(self, tokens: int, seconds: float) -> None:
        pass

    def observe_draft(self, rows: int, seconds: float) -> None:
        pass


@pytest.mark.parametrize("k,chunk", [(3, None), (2, 4), ("auto", None)])
def test_greedy_psd_that_merges_its_sub_batches_at_times_equals_ar(tiny_llama, tiny_draft, expected, k, chunk):
    """"overlap": "auto" switches between overlapped and merged steps (drafts in flight dropped at
    each switch to merged); the output stays the target's and every slot is freed."""
    with make(tiny_llama, tiny_draft, k=k, chunk=chunk, overlap="auto") as llm:
        engine = llm.engine
        engine.overlap = Scripted(run=3)
        decide, schedules = engine._overlaps, []

        def spy(seqs):  # each step's schedule, and the one "auto" k's step-time model then assumes
            overlap = decide(seqs)
            schedules.append((overlap, engine.draft_length and engine.draft_length.parallel))
            return overlap

        engine._overlaps = spy
        outs = run_staggered(llm, abort_index=2)
        assert sorted(outs) == [0, 1, 3, 4, 5]
        for i, out in outs.items():
            assert out.token_ids == expected[i], i
        assert engine.overlap.merged > 0 and llm.get_metrics()["num_overlapped_steps"] > 0
        if k == "auto":
            assert {overlap for overlap, _ in schedules} == {True, False}
            assert all(overlap == parallel for overlap, parallel in schedules)
        assert_all_free(llm)


def test_overlap_auto_learns_from_the_steps(tiny_llama, tiny_draft, expected):
    with make(tiny_llama, tiny_draft, overlap="auto") as llm:
        outs = run_staggered(llm)
        assert [outs[i].token_ids for i in range(len(PROMPTS))] == expected
        policy = llm.engine.overlap
        assert policy.verify.w > 0 and policy.draft.w > 0


def test_sequential_remote_drafter_equals_ar(tiny_llama, tiny_draft, expected):
    with make(tiny_llama, tiny_draft, parallel=False, draft_device="cpu") as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], [greedy(n) for n in LENGTHS], use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected
        assert llm.get_metrics()["num_overlapped_steps"] == 0


@pytest.mark.parametrize("prefill_on_drafter", [False, True])
def test_killed_drafter_every_request_still_completes(tiny_llama, tiny_draft, expected, prefill_on_drafter):
    """Prompts handed over to the drafter's target copy when it dies are prefilled here instead."""
    with make(tiny_llama, tiny_draft, prefill_on_drafter=prefill_on_drafter) as llm:
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
    ({"parallel": True, "target_cpus": "one core", "draft_cpus": "one core"}, "overlap"),
    ({"parallel": True, "draft_cpus": [4096]}, "draft_cpus"),
    ({"parallel": True, "rendezvous": "127.0.0.1:1234"}, "rendezvous"),
    ({"draft_cpus": [0]}, "own process"),
    ({"draft_device": "cuda:7"}, "CUDA"),
    ({"parallel": "yes"}, "parallel"),
    ({"prefill_on_drafter": True}, "needs a drafter in its own process"),
    ({"parallel": True, "prefill_on_drafter": "yes"}, "prefill_on_drafter must be"),
    ({"overlap": "auto"}, "overlap 'auto' applies to psd only"),
    ({"parallel": True, "overlap": "sometimes"}, "overlap must be"),
])
def test_bad_placement_is_named(tiny_llama, placement, message):
    core = [min(os.sched_getaffinity(0))]  # one this process may use (cores listed but not ours are another error)
    placement = {k: core if v == "one core" else v for k, v in placement.items()}
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_llama), speculative_config={"model": "self", "num_speculative_tokens": 2, **placement})


# -- either sub-batch may empty at any moment -------------------------------------------------------


def in_flight_requests(engine) -> set[str]:
    """The requests of the sub-batch the drafter is working on."""
    batches = engine.batches
    return {s.request_id for s in engine.scheduler.running if batches.group.get(s.seq_id) == batches.in_flight}


def assert_all_free(llm, slots=4):
    engine = llm.engine
    assert not engine.has_unfinished() and not engine.requests
    assert engine.runner.cache.num_free == slots
    assert engine.batches is None or not engine.batches.group and engine.batches.in_flight is None
    assert engine.proposer.stats() == {"free_slots": slots, "sequences": 0, "tokens": 0, "choices": {}}


def test_aborting_every_request_being_drafted(tiny_llama, tiny_draft, expected):
    """The sub-batch in flight loses all its requests: the step verifies nothing, the other
    requests go on, and the drafter frees the aborted requests' slots."""
    with make(tiny_llama, tiny_draft) as llm:
        engine = llm.engine
        ids = {engine.add_request(PROMPTS[i], greedy(LENGTHS[i])): i for i in range(4)}
        while engine.batches is None or engine.batches.in_flight is None or len(engine.scheduler.running) < 4:
            engine.step()
        gone = in_flight_requests(engine)
        assert 0 < len(gone) < 4
        for request_id in gone:
            engine.abort(request_id)
        done = {}
        while engine.has_unfinished():
            done.update((o.request_id, o.outputs[0].token_ids) for o in engine.step() if o.finished)
        assert {ids[r]: t for r, t in done.items()} == {ids[r]: expected[ids[r]] for r in ids if r not in gone}
        assert llm.get_metrics()["drafter_failures"] == 0
        assert_all_free(llm)


def test_aborting_every_request_frees_the_drafter_without_another_step(tiny_llama, tiny_draft):
    with make(tiny_llama, tiny_draft) as llm:
        engine = llm.engine
        ids = [engine.add_request(PROMPTS[i], greedy(30)) for i in range(3)]
        while engine.batches.in_flight is None:
            engine.step()
        for request_id in ids:
            engine.abort(request_id)
        assert_all_free(llm)


@pytest.mark.parametrize("seed", range(4))
def test_sub_batches_empty_at_random_moments(tiny_llama, tiny_draft, seed):
    """Requests arrive, finish (length, stop token) and are aborted at random steps, often
    emptying one sub-batch while its drafts are in flight or just before they are verified:
    every request that was not aborted still gets exactly AR's tokens, and nothing is left behind."""
    rng = random.Random(seed)
    prompts = [rng.choice(PROMPTS) for _ in range(10)]
    lengths = [rng.randint(1, 12) for _ in prompts]
    ar = LLM(str(tiny_llama), dtype="float64", max_num_seqs=1, max_model_len=96)
    free = [ar.generate([{"prompt_token_ids": p}], greedy(n), use_tqdm=False)[0].outputs[0].token_ids
            for p, n in zip(prompts, lengths)]
    params = []  # some stop at a token the free run produces
    for n, tokens in zip(lengths, free):
        stop = [rng.choice(tokens)] if rng.random() < 0.4 else None
        params.append(SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, stop_token_ids=stop))
    want = [ar.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0].outputs[0].token_ids
            for p, sp in zip(prompts, params)]
    with make(tiny_llama, tiny_draft, k=rng.choice([1, 3])) as llm:
        engine = llm.engine
        ids, aborted, done, pending = {}, set(), {}, list(range(len(prompts)))
        while pending or engine.has_unfinished():
            if pending and rng.random() < 0.4:
                i = pending.pop(0)
                ids[engine.add_request(prompts[i], params[i])] = i
            live = [r for r in ids if r in engine.requests]
            if live and rng.random() < 0.15:  # abort one request, or the whole sub-batch in flight
                drafting = in_flight_requests(engine) if engine.batches.in_flight is not None else set()
                victims = drafting if drafting and rng.random() < 0.5 else {rng.choice(live)}
                for request_id in victims:
                    engine.abort(request_id)
                aborted |= victims
            done.update((o.request_id, o.outputs[0].token_ids) for o in engine.step() if o.finished)
        assert aborted and done
        for request_id, tokens in done.items():
            assert tokens == want[ids[request_id]], ids[request_id]
        assert set(done) | aborted == set(ids)
        assert llm.get_metrics()["drafter_failures"] == 0
        assert_all_free(llm)


def test_a_request_failing_in_verification_fails_alone(tiny_llama, tiny_draft, expected, monkeypatch):
    with make(tiny_llama, tiny_draft) as llm:
        engine = llm.engine
        ids = {engine.add_request(PROMPTS[i], greedy(LENGTHS[i])): i for i in range(4)}
        bad = next(r for r, i in ids.items() if i == 2)
        append = engine.append_tokens

        def append_tokens(seq, tokens, logprobs=None):
            if seq.request_id == bad and seq.output_token_ids:  # after its prefill: in a verification
                raise RuntimeError("this request's own failure")
            append(seq, tokens, logprobs)

        monkeypatch.setattr(engine, "append_tokens", append_tokens)
        done = {}
        while engine.has_unfinished():
            done.update((o.request_id, o.outputs[0]) for o in engine.step() if o.finished)
        assert done[bad].finish_reason == "error"
        assert {ids[r]: o.token_ids for r, o in done.items() if r != bad} == {i: expected[i] for i in (0, 1, 3)}
        assert_all_free(llm)


# -- the drafter process failing at start-up ----------------------------------------------------------


def test_drafter_dying_at_start_up_falls_back(tiny_llama, tiny_draft, expected, tmp_path):
    """A drafter whose weights cannot be loaded (config fine, weights missing) dies after joining
    the channel: the engine runs without speculation, counted as a drafter failure."""
    draft = tmp_path / "draft"
    draft.mkdir()
    shutil.copy(tiny_draft / "config.json", draft / "config.json")
    with make(tiny_llama, draft) as llm:
        assert llm.engine.proposer is None and llm.get_metrics()["drafter_failures"] == 1
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], [greedy(n) for n in LENGTHS], use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected


@pytest.mark.parametrize("command", ["import sys; sys.exit(3)", "import time; time.sleep(60)"])
def test_drafter_exiting_or_hanging_before_it_joins_falls_back(tiny_llama, tiny_draft, monkeypatch, command):
    """A drafter process that exits at once is noticed at once; one that hangs, after the start-up
    timeout. Either way the engine starts without speculation."""
    popen = subprocess.Popen
    monkeypatch.setattr(remote.subprocess, "Popen", lambda _: popen([sys.executable, "-c", command]))
    monkeypatch.setattr(remote, "READY_TIMEOUT_S", 3.0)
    start = time.monotonic()
    with make(tiny_llama, tiny_draft) as llm:
        assert llm.engine.proposer is None and llm.get_metrics()["drafter_failures"] == 1
        out = llm.generate([{"prompt_token_ids": PROMPTS[0]}], greedy(5), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 5
    assert time.monotonic() - start < 20


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_closing_restores_affinity_and_threads(tiny_llama, tiny_draft):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        before = os.sched_getaffinity(0), torch.get_num_threads()
        llm = make(tiny_llama, tiny_draft, target_cpus=[0], draft_cpus=[1])
        assert os.sched_getaffinity(0) == {0} and torch.get_num_threads() == 1  # pinned while it runs
        llm.close()
        assert (os.sched_getaffinity(0), torch.get_num_threads()) == before
    finally:
        torch.set_num_threads(threads)


def test_closing_while_drafts_are_in_flight_stops_the_drafter_at_once(tiny_llama, tiny_draft):
    llm = make(tiny_llama, tiny_draft)
    engine = llm.engine
    for i in range(3):
        engine.add_request(PROMPTS[i], greedy(30))
    while engine.batches.in_flight is None:
        engine.step()
    process = engine.proposer.process
    start = time.monotonic()
    llm.close()
    assert process.poll() == 0 and time.monotonic() - start < 10


@pytest.mark.parametrize("parallel", [True, False])
def test_prompts_prefilled_by_the_drafters_target_copy_equal_ar(tiny_llama, tiny_draft, expected, parallel):
    """"prefill_on_drafter": prompts arriving beside streams are prefilled in the drafter process
    (psd, and the drafter in its own process strictly draft-then-verify), one is aborted."""
    placement = {"prefill_on_drafter": True, **({} if parallel else {"parallel": False, "draft_device": "cpu"})}
    with make(tiny_llama, tiny_draft, **placement) as llm:
        outs = run_staggered(llm, abort_index=2)
        assert sorted(outs) == [0, 1, 3, 4, 5]
        for i, out in outs.items():
            assert out.token_ids == expected[i], i
        assert llm.get_metrics()["num_prompts_prefilled_by_drafter"] >= 2
        assert_all_free(llm)
