"""A program that uses MineDraft ends as it would without it, in every mode and on every way out.

Each case runs a small script in its own process and session (as a terminal would run it) on the
tiny random models, and checks its exit status, that nothing aborted, and that no process of the
session (a drafter) outlives it.
"""

import os
import signal
import subprocess
import sys

import pytest

from conftest import processes_left

MODES = ["psd", "sd-remote", "sd", "ar"]

SCRIPT = """
import gc, os, signal, sys
from minedraft import LLM, SamplingParams

target, draft, mode, way = sys.argv[1:5]
spec = {"ar": None, "sd": {"model": draft, "num_speculative_tokens": 2},
        "sd-remote": {"model": draft, "num_speculative_tokens": 2, "draft_device": "cpu"},
        "psd": {"model": draft, "num_speculative_tokens": 2, "parallel": True}}[mode]
params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

def make():
    return LLM(target, dtype="float64", max_model_len=256, enforce_eager=True, speculative_config=spec)

def generate(llm):
    print(llm.generate([{"prompt_token_ids": [1, 2, 3]}], params, use_tqdm=False)[0].outputs[0].token_ids)

def drafters(llm):
    process = getattr(llm.engine.proposer, "process", None)
    return [] if process is None else [process.pid]

def left(pids):
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}")]

if way == "with":
    with make() as llm:
        generate(llm)
        pids = drafters(llm)
    print("left", left(pids))
elif way == "two":
    first, second = make(), make()
    generate(first)
    generate(second)
else:
    llm = make()
    generate(llm)
    pids = drafters(llm)
    if way == "raise":
        raise RuntimeError("the user's code failed")
    if way == "sigint":  # Ctrl-C a few steps into a long generate: the terminal signals the whole group
        step, steps = llm.engine.step, []
        def interrupted_step():
            steps.append(1)
            if len(steps) == 5:
                os.killpg(0, signal.SIGINT)
            return step()
        llm.engine.step = interrupted_step
        llm.generate([{"prompt_token_ids": [1, 2, i]} for i in range(8)],
                     SamplingParams(temperature=0, max_tokens=200, ignore_eos=True), use_tqdm=False)
        print("generate was not interrupted")
    if way == "del":
        del llm
        print("left", left(pids))
    if way == "gc":
        llm.itself = llm  # a reference cycle: only the garbage collector frees it
        del llm
        gc.collect()
        print("left", left(pids))
"""

# The status Python gives each way out of a plain script (a Ctrl-C'd Python ends by SIGINT).
STATUS = {"end": 0, "raise": 1, "sigint": -signal.SIGINT, "del": 0, "gc": 0, "two": 0, "with": 0}
ABORTS = ("terminate called", "Fatal Python error", "INTERNAL ASSERT FAILED", "Aborted", "core dumped")


def run_script(tiny_llama, tiny_draft, mode: str, way: str) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tiny_llama), str(tiny_draft), mode, way],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{mode} / {way}: the script hung")
    assert not processes_left(proc.pid), f"{mode} / {way}: processes left behind"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("way", list(STATUS))
@pytest.mark.parametrize("mode", MODES)
def test_a_program_ends_as_python_would(tiny_llama, tiny_draft, mode, way):
    done = run_script(tiny_llama, tiny_draft, mode, way)
    assert not any(word in done.stderr for word in ABORTS), done.stderr[-3000:]
    assert done.returncode == STATUS[way], done.stderr[-3000:]
    tracebacks = done.stderr.count("Traceback")
    if way == "raise":
        assert tracebacks == 1 and "RuntimeError: the user's code failed" in done.stderr
    elif way == "sigint":  # the script's own KeyboardInterrupt, none from its drafter
        assert tracebacks == 1 and "KeyboardInterrupt" in done.stderr
        assert "generate was not interrupted" not in done.stdout
    else:
        assert tracebacks == 0, done.stderr[-3000:]
    if way in ("del", "gc", "with"):  # the drafter stops then, not only when the program ends
        assert "left []" in done.stdout
