"""The OpenAI-compatible server, driven by the official openai client and raw HTTP."""

import asyncio
import json
import time

import httpx
import openai
import pytest

from conftest import KEY, LiveServer


@pytest.fixture(scope="module", params=["ar", "psd"])
def server(request, tiny_chat):
    spec = {"model": "self", "num_speculative_tokens": 3, "parallel": True} if request.param == "psd" else None
    live = LiveServer(tiny_chat, max_num_seqs=16, speculative_config=spec)
    yield live
    live.close()


def test_completions_and_chat_with_the_openai_client(server):
    c = server.client
    out = c.completions.create(model="test-model", prompt="Hello there", max_tokens=5, temperature=0,
                               extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5
    chat = c.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "Hi"}],
                                     max_tokens=6, temperature=0, n=2, extra_body={"ignore_eos": True})
    assert [ch.index for ch in chat.choices] == [0, 1] and chat.usage.completion_tokens == 12
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy: identical


def test_streaming_equals_non_streaming(server):
    c = server.client
    kwargs = dict(model="test-model", max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    full = c.completions.create(prompt="Once upon a time", **kwargs).choices[0].text
    chunks = list(c.completions.create(prompt="Once upon a time", stream=True, **kwargs))
    assert "".join(ch.choices[0].text for ch in chunks) == full
    assert chunks[-1].choices[0].finish_reason == "length"
    messages = [{"role": "user", "content": "Tell me something"}]
    full = c.chat.completions.create(messages=messages, **kwargs).choices[0].message.content
    stream = c.chat.completions.create(messages=messages, stream=True, stream_options={"include_usage": True}, **kwargs)
    chunks = list(stream)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == full
    assert chunks[-1].usage.completion_tokens == 12


def test_concurrent_streams_with_disconnects_leave_no_slot_behind(server):
    async def client(i: int, http: httpx.AsyncClient):
        body = {"model": "test-model", "prompt": f"Request number {i}", "max_tokens": 24, "temperature": 1.0,
                "seed": i, "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
        async with http.stream("POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status_code == 200
            events = 0
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events += 1
                    if i % 4 == 0 and events == 3:
                        return None  # leave mid-stream: the server must abort the request
                    if line == "data: [DONE]":
                        break
                    last = line
        return last

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            return await asyncio.gather(*(client(i, http) for i in range(64)))

    results = asyncio.run(main())
    finished = [r for i, r in enumerate(results) if i % 4]
    assert len(finished) == 48
    assert all('"completion_tokens": 24' in r for r in finished)
    deadline = time.time() + 30
    while server.running() != 0 and time.time() < deadline:
        time.sleep(0.2)
    assert server.running() == 0
    assert server.engine.engine.runner.cache.num_free == 16


def post(server, body: dict, path: str = "/v1/completions", timeout: float = 60) -> httpx.Response:
    """Python's JSON, which writes NaN and Infinity as JavaScript does (httpx refuses to)."""
    return httpx.post(server.url + path, content=json.dumps({"model": "test-model", **body}), timeout=timeout,
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})


@pytest.mark.parametrize("body,param", [
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "top_k": 0}, "top_k"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "word " * 400}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "hi", "n": "many"}, "n"),
    ({"prompt": "hi", "n": True}, "n"),
    ({"prompt": "hi", "temperature": float("nan")}, "temperature"),
    ({"prompt": "hi", "temperature": float("inf")}, "temperature"),
    ({"prompt": "hi", "seed": 2**70}, "seed"),
    ({"prompt": "hi", "seed": -1}, "seed"),
    ({"prompt": "hi", "max_tokens": 10**12}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens"),
    ({"prompt": "hi", "logprobs": 10000}, "logprobs"),
    ({"prompt": "hi", "stop": 5}, "stop"),
    ({"prompt": "hi", "stop": [""]}, "stop"),
    ({"prompt": "hi", "ignore_eos": "no"}, "ignore_eos"),
    ({"prompt": "hi", "stream": 1}, "stream"),
    ({"prompt": "hi", "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({"prompt": [1, 10**9]}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [3] * 300}, "prompt"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    r = post(server, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_json_auth_and_unknown_model(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/completions", json={"model": "test-model", "prompt": "x"},
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    with pytest.raises(openai.NotFoundError):
        server.client.completions.create(model="gpt-9", prompt="x", max_tokens=2)
    assert httpx.get(server.url + "/health").status_code == 200
    assert server.client.models.list().data[0].id == "test-model"
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("minedraft:num_requests_waiting", "minedraft:spec_decode_num_accepted_tokens_total",
                 "minedraft:time_to_first_token_seconds_bucket", "minedraft:generation_tokens_total"):
        assert name in metrics


def test_full_queue_answers_503(tiny_chat):
    live = LiveServer(tiny_chat, max_queue=0)
    try:
        r = httpx.post(live.url + "/v1/completions", json={"model": "test-model", "prompt": "x"},
                       headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 503
    finally:
        live.close()


def test_smollm2_chat_answers_paris(smollm2_path):
    live = LiveServer(smollm2_path, api_key=KEY)
    try:
        chat = live.client.chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16, temperature=0)
        assert "Paris" in chat.choices[0].message.content
    finally:
        live.close()


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": HI, "max_completion_tokens": 10**9}, "max_completion_tokens"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens"),
    ({"messages": HI, "logprobs": True, "top_logprobs": 10000}, "top_logprobs"),
    ({"messages": HI, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": HI, "logprobs": 2}, "logprobs"),
    ({"messages": HI, "temperature": 1e400}, "temperature"),
])
def test_bad_chat_input_is_a_400_naming_the_field(server, body, param):
    r = post(server, body, "/v1/chat/completions")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param




def test_a_refused_request_leaves_nothing_behind(server):
    """A request refused for its seed must not leave one of its n sequences queued."""
    r = post(server, {"prompt": "hi", "n": 2, "seed": 18446744073709551615, "max_tokens": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    r = post(server, {"prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert server.engine.engine.runner.cache.num_free == 16 and not server.engine.engine.requests


def test_tiny_temperatures_are_served(server):
    r = post(server, {"prompt": "hi", "temperature": 1e-320, "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_prompt_as_token_ids(server):
    ids = server.engine.engine.tokenize_prompt("Hello there")
    body = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    by_text = post(server, {"prompt": "Hello there", **body}).json()
    by_ids = post(server, {"prompt": ids, **body}).json()
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"] == by_text["usage"]


def test_logprobs_in_completions_and_chat(server):
    c = server.client
    out = c.completions.create(model="test-model", prompt="Hello", max_tokens=4, logprobs=2, temperature=0,
                               extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(top) <= 2 for top in lp.top_logprobs)
    streamed = [ch.choices[0].logprobs for ch in c.completions.create(
        model="test-model", prompt="Hello", max_tokens=4, logprobs=2, temperature=0, stream=True,
        extra_body={"ignore_eos": True}) if ch.choices[0].logprobs]
    assert sum((s.token_logprobs for s in streamed), []) == lp.token_logprobs
    chat = c.chat.completions.create(model="test-model", messages=HI, max_tokens=3, logprobs=True, top_logprobs=2,
                                     extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_streaming_with_a_stop_string_equals_non_streaming(server):
    c = server.client
    kwargs = dict(model="test-model", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    free = c.completions.create(prompt="Once upon a time", **kwargs).choices[0].text
    stop = free[len(free) // 2 : len(free) // 2 + 3]
    full = c.completions.create(prompt="Once upon a time", stop=stop, **kwargs).choices[0].text
    chunks = list(c.completions.create(prompt="Once upon a time", stop=stop, stream=True, **kwargs))
    assert "".join(ch.choices[0].text for ch in chunks) == full == free[: free.index(stop)]


def test_a_request_the_engine_fails_is_a_500_and_others_go_on(server, monkeypatch):
    engine = server.engine.engine
    append = engine.append_tokens

    def append_tokens(seq, tokens, logprobs=None):
        if seq.prompt_token_ids[0] == 7777:
            raise RuntimeError("this request's own failure")
        append(seq, tokens, logprobs)

    monkeypatch.setattr(engine, "append_tokens", append_tokens)
    body = {"prompt": [7777, 5, 6], "max_tokens": 5}
    r = post(server, body)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    r = post(server, {**body, "stream": True})
    assert r.status_code == 500 or '"error"' in r.text
    assert post(server, {"prompt": [7778, 5, 6], "max_tokens": 5}).status_code == 200
    assert engine.runner.cache.num_free == 16


def test_a_dead_engine_answers_503(tiny_chat):
    live = LiveServer(tiny_chat)
    try:
        assert httpx.get(live.url + "/health").status_code == 200
        engine = live.engine.engine

        def broken():
            raise RuntimeError("the engine thread dies")

        engine.has_unfinished = broken
        deadline = time.time() + 5
        while live.engine.alive and time.time() < deadline:
            time.sleep(0.05)
        assert httpx.get(live.url + "/health").status_code == 503
        r = post(live, {"prompt": "hi", "max_tokens": 3}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
    finally:
        live.close()


def test_kv_slots_are_reported(server):
    slots = httpx.get(server.url + "/debug/kv_slots").json()
    assert slots["target"] == slots["num_slots"] == 16


@pytest.mark.parametrize("continuous", [False, True])
def test_continuous_usage_sends_every_step_that_added_tokens(continuous):
    from minedraft.engine.sequence import CompletionOutput, RequestOutput
    from minedraft.server.api import StreamOptions, sse

    def output(text: str, tokens: list[int], finish: str | None = None) -> RequestOutput:
        return RequestOutput("r", None, [5, 6], [CompletionOutput(0, text, tokens, finish)], finish is not None,
                             0.0, 0.0, None)

    # the second step's token is the first half of a character: it adds no text
    steps = [output("A", [1]), output("A", [1, 2]), output("A\u20ac", [1, 2, 3], "length")]

    async def rest():
        for out in steps[1:]:
            yield out

    async def events() -> list[dict]:
        options = StreamOptions(include_usage=True, continuous_usage_stats=continuous)
        lines = [line async for line in sse(rest(), steps[0], {"id": "x"}, False, options, None, str)]
        assert lines[-1] == "data: [DONE]\n\n"
        return [json.loads(line[len("data: "):]) for line in lines[:-1]]

    chunks = asyncio.run(events())
    with_choices = [c for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["text"] for c in with_choices) == "A\u20ac"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    if continuous:
        assert [c["choices"][0]["text"] for c in with_choices] == ["A", "", "\u20ac"]
        assert [c["usage"]["completion_tokens"] for c in with_choices] == [1, 2, 3]
    else:
        assert [c["choices"][0]["text"] for c in with_choices] == ["A", "\u20ac"]
        assert all("usage" not in c for c in with_choices)
