"""The OpenAI-compatible server, driven by the official openai client and raw HTTP."""

import asyncio
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
])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/completions", json={"model": "test-model", **body},
                   headers={"Authorization": f"Bearer {KEY}"})
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
