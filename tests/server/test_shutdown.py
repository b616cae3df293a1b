"""`minedraft serve` stopped by SIGTERM or Ctrl-C while a stream is open: it stops accepting, gives
the stream its grace period, then ends it properly, stops the drafter and exits 0."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from conftest import processes_left, save_tiny_checkpoint

GRACE_S = 1.0
LONG = 4096  # context: a stream that would run far longer than the grace period


@pytest.fixture(scope="module")
def long_models(tmp_path_factory):
    target = save_tiny_checkpoint(tmp_path_factory.mktemp("long_target"), max_position_embeddings=LONG)
    draft = save_tiny_checkpoint(tmp_path_factory.mktemp("long_draft"), seed=1, num_hidden_layers=1,
                                 max_position_embeddings=LONG)
    return target, draft


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(target, draft, mode: str, port: int, log) -> subprocess.Popen:
    spec = {"ar": None, "sd": {"model": str(draft), "num_speculative_tokens": 2},
            "sd-remote": {"model": str(draft), "num_speculative_tokens": 2, "draft_device": "cpu"},
            "psd": {"model": str(draft), "num_speculative_tokens": 2, "parallel": True}}[mode]
    command = [sys.executable, "-m", "minedraft.cli", "serve", "--model", str(target), "--dtype", "float64",
               "--enforce-eager", "--max-model-len", str(LONG), "--port", str(port),
               "--served-model-name", "test-model", "--shutdown-grace-s", str(GRACE_S)]
    if spec is not None:
        command += ["--speculative-config", json.dumps(spec)]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    server.kill()
    log.seek(0)
    pytest.fail(f"the server did not start: {log.read()[-3000:]}")


def read_stream(url: str, lines: list, first: threading.Event) -> None:
    """One long greedy stream: (arrival time, line) of every event, `first` set at the first text."""
    body = {"model": "test-model", "prompt": [1, 2, 3], "max_tokens": LONG - 8, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # a chunk every step
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                lines.append((time.monotonic(), line.removeprefix("data: ")))
                first.set()


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
@pytest.mark.parametrize("mode", ["psd", "sd-remote", "sd", "ar"])
def test_a_stopped_server_ends_its_open_streams_and_exits_0(long_models, tmp_path, mode, how):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "server.log", "w+") as log:
        server = start_server(*long_models, mode, port, log)
        lines, first = [], threading.Event()
        reader = threading.Thread(target=read_stream, args=(url, lines, first))
        reader.start()
        assert first.wait(30), "no streamed token"
        stopped = time.monotonic()
        if how == "SIGTERM":
            server.send_signal(signal.SIGTERM)
        else:  # a terminal's Ctrl-C signals the whole process group, the drafter included
            os.killpg(server.pid, signal.SIGINT)
        time.sleep(0.5)
        with pytest.raises(httpx.TransportError):  # no new connections while the grace period runs
            httpx.get(url + "/health")
        reader.join(timeout=GRACE_S + 10)
        assert not reader.is_alive(), "the stream was not ended"
        try:
            status = server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            pytest.fail("the server did not exit")
        log.seek(0)
        output = log.read()
    assert status == 0, output[-3000:]
    assert "Traceback" not in output and "terminate called" not in output, output[-3000:]
    assert not processes_left(server.pid)
    times = [t for t, _ in lines]
    assert lines[-1][1] == "[DONE]"
    chunks = [json.loads(line) for _, line in lines[:-1]]
    final = [c["choices"][0] for c in chunks if c["choices"]][-1]
    assert final["finish_reason"] == "abort" and chunks[-1]["usage"]["completion_tokens"] < LONG - 8
    # The stream ran on through the grace period, and was ended soon after it.
    assert sum(t > stopped + GRACE_S / 2 for t in times) > 2
    assert GRACE_S <= times[-1] - stopped < GRACE_S + 5
