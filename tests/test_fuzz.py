"""Property-based fuzzing of every way input enters: SamplingParams, LLM.generate and the HTTP
request schema. Whatever the input, it is served or refused with a ValueError / 400 naming a
field, never another exception or a 5xx, and nothing is left behind."""

import json
import math

import httpx
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import KEY, LiveServer
from minedraft import LLM, SamplingParams
from minedraft.sampling import sample

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def text(max_size: int) -> st.SearchStrategy[str]:
    """Any text, lone surrogates (which JSON can carry but UTF-8 cannot, so st.text never makes
    them) and NULs included."""
    odd = st.lists(st.one_of(st.characters(), st.sampled_from("\ud800\udfff\x00\n")), max_size=max_size)
    plain = st.text(max_size=max_size)
    return st.one_of(plain, plain, plain, odd.map("".join))


# Values of the wrong type, or of no type a field could take.
junk = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), text(8),
                 st.lists(st.one_of(st.integers(), text(4), st.none()), max_size=3),
                 st.dictionaries(text(3), st.integers(), max_size=2))


def mostly(valid: st.SearchStrategy, *edges) -> st.SearchStrategy:
    """Usually (13 times in 16) a valid value, else one at or past the edge of what is valid, or junk.
    (Not st.one_of: it would pick each kind a third of the time, and few requests would be valid.)"""
    return st.integers(0, 15).flatmap(lambda i: valid if i < 13 else junk if i == 15 else st.sampled_from(edges))
FIELDS = {
    "n": mostly(st.integers(1, 3), 0, -1, 129),
    "temperature": mostly(st.floats(0, 2), 1e-320, 1e-5, math.nan, math.inf, -1.0),
    "top_p": mostly(st.floats(0.01, 1), 0.0, 1.5, math.nan),
    "top_k": mostly(st.integers(-1, 50), 0, -2, 10**30),
    "max_tokens": mostly(st.integers(1, 8), 0, -1, 10**12),
    "stop": mostly(st.one_of(st.none(), text(3), st.lists(text(3), max_size=3)), "", [""]),
    "stop_token_ids": mostly(st.lists(st.integers(0, 100), max_size=3), [-1]),
    "ignore_eos": mostly(st.booleans(), 0, 1),
    "seed": mostly(st.one_of(st.none(), st.integers(0, 10)), -1, 2**63 - 3, 2**63 - 1, 2**64 - 1),
    "logprobs": mostly(st.one_of(st.none(), st.integers(0, 20)), -1, 21, 10000),
}
sampling_kwargs = st.fixed_dictionaries({}, optional=FIELDS)


@FAST
@given(sampling_kwargs)
def test_sampling_params_are_valid_or_a_value_error_naming_a_field(kwargs):
    try:
        params = SamplingParams(**kwargs)
    except ValueError as e:
        assert str(e).split(" ", 1)[0] in kwargs
        return
    assert math.isfinite(params.temperature)
    assert params.seed is None or 0 <= params.seed + params.n - 1 < 2**63
    generator = None if params.greedy else torch.Generator().manual_seed(0)
    tokens, dist = sample(torch.tensor([[3.0, 1.0, -2.0, 0.5]]), [params], [generator])
    assert 0 <= tokens[0] < 4 and (dist is None) == params.greedy
    assert dist is None or torch.isfinite(dist.probs).all() and abs(float(dist.probs.sum()) - 1) < 1e-6


@pytest.fixture(scope="module")
def llm(tiny_chat):
    return LLM(str(tiny_chat), dtype="float64", max_num_seqs=4, max_model_len=32)


token_ids = mostly(st.lists(st.integers(0, 49151), max_size=40), [], [-1], [49152], [1, True], [1, "7"])
prompt = st.one_of(text(40), st.fixed_dictionaries({"prompt_token_ids": st.one_of(token_ids, junk)}), junk)


@FAST
@given(st.one_of(prompt, st.lists(prompt, max_size=3)),
       st.one_of(st.tuples(st.just("kwargs"), sampling_kwargs), st.tuples(st.just("as is"), junk)))
def test_generate_serves_or_raises_a_value_error(llm, prompts, params):
    try:
        kind, value = params  # SamplingParams' keyword arguments, or any object in its place
        outs = llm.generate(prompts, SamplingParams(**value) if kind == "kwargs" else value, use_tqdm=False)
    except ValueError:
        pass
    else:
        assert all(o.finished for o in outs)
    engine = llm.engine
    assert not engine.has_unfinished() and not engine.requests and engine.runner.cache.num_free == 4


@pytest.fixture(scope="module")
def server(tiny_chat):
    live = LiveServer(tiny_chat, max_num_seqs=8, max_model_len=96)
    yield live
    live.close()


REQUEST = {**{k: v for k, v in FIELDS.items() if k not in ("stop_token_ids", "logprobs")},
           "stream": mostly(st.booleans(), 1, "true"),
           "stream_options": mostly(st.fixed_dictionaries({"include_usage": mostly(st.booleans(), 1)}), [])}
model = mostly(st.just("test-model"), "gpt-9", "")
completion = st.fixed_dictionaries(
    {"model": model, "prompt": mostly(st.one_of(text(30), token_ids), "")},
    optional={**REQUEST, "logprobs": FIELDS["logprobs"]})
message = st.fixed_dictionaries({"role": mostly(st.sampled_from(["user", "system", "assistant"]), "robot"),
                                 "content": mostly(text(30), [{"type": "text", "text": "hi"}])})
chat = st.fixed_dictionaries(
    {"model": model, "messages": mostly(st.lists(message, min_size=1, max_size=3), [])},
    optional={**REQUEST, "max_completion_tokens": FIELDS["max_tokens"], "logprobs": mostly(st.booleans(), 1),
              "top_logprobs": FIELDS["logprobs"]})
requests = st.one_of(st.tuples(st.just("/v1/completions"), completion),
                     st.tuples(st.just("/v1/chat/completions"), chat),
                     st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), junk))


@FAST
@given(requests)
def test_every_request_is_served_or_a_400(server, request):
    path, body = request
    r = httpx.post(server.url + path, content=json.dumps(body), timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    event(f"HTTP {r.status_code}")  # pytest --hypothesis-show-statistics shows how many of each
    assert r.status_code in (200, 400, 404), (r.status_code, r.text)
    if r.status_code != 200:
        assert r.json()["error"]["type"] == "invalid_request_error"
    elif body.get("stream") is True:
        assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text
    else:
        assert len(r.json()["choices"]) == body.get("n", 1)
