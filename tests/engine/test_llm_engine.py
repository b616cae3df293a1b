import pytest

from minedraft import LLM, SamplingParams

PROMPTS = [[5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33, 33, 1, 7, 7, 7, 70, 4, 11, 2, 3], [40, 41]]


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=128)


def as_prompts(ids_list):
    return [{"prompt_token_ids": ids} for ids in ids_list]


def test_batched_equals_one_at_a_time(llm):
    # Different max_tokens make rows finish at different steps.
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 30, 5, 21)]
    batched = tokens(llm.generate(as_prompts(PROMPTS), params, use_tqdm=False))
    single = [tokens(llm.generate(as_prompts([p]), [sp], use_tqdm=False))[0] for p, sp in zip(PROMPTS, params)]
    assert batched == single
    assert [len(t) for t in batched] == [12, 30, 5, 21]


@pytest.mark.parametrize("engine", [{"max_num_batched_tokens": 3}, {"max_num_batched_tokens": 6,
                                                                     "enable_chunked_prefill": False}],
                         ids=["chunks-of-3", "whole-prompts-up-to-6"])
def test_prompt_chunks_beside_decode_rows_change_nothing(llm, tiny_llama, engine):
    """Prompts prefilled a few tokens a step in the same pass as the running rows (or whole, as
    many as fit) give the outputs of the default engine, with requests arriving mid-run."""
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 30, 5, 21)]
    want = tokens(llm.generate(as_prompts(PROMPTS), params, use_tqdm=False))
    chunked = LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=128, trace=True, **engine)
    ids = [chunked.engine.add_request(p, sp) for p, sp in zip(PROMPTS[:2], params)]
    chunked.engine.step()
    ids += [chunked.engine.add_request(p, sp) for p, sp in zip(PROMPTS[2:], params[2:])]
    done = run_all(chunked.engine)
    assert [done[i][0].token_ids for i in ids] == want
    events = [e for e in chunked.engine.trace if "prompt_tokens" in e]
    assert any(e["kind"] == "decode" for e in events)  # prompt tokens rode beside decode rows
    # Chunks fill the budget; a whole prompt longer than it (13 tokens) runs without other prompts.
    assert max(e["prompt_tokens"] for e in events) == (3 if engine.get("enable_chunked_prefill", True) else 13)


def test_more_requests_than_slots_queue_and_complete(llm):
    prompts = as_prompts(PROMPTS * 3)  # 12 requests, 4 slots
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert tokens(outs) == tokens(outs[:4]) * 3
    assert llm.engine.runner.cache.num_free == 4


def test_seeded_sampling_is_reproducible_and_seed_dependent(llm):
    def run(seed):
        params = SamplingParams(temperature=1.0, max_tokens=20, seed=seed, ignore_eos=True)
        return tokens(llm.generate(as_prompts(PROMPTS[:2]), params, use_tqdm=False))

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_n_completions_differ_under_sampling(llm):
    out = llm.generate(as_prompts([PROMPTS[0]]), SamplingParams(n=3, temperature=1.0, max_tokens=15, seed=1,
                                                                 ignore_eos=True), use_tqdm=False)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) == 3


def test_stop_token_ids_and_eos(llm):
    free = tokens(llm.generate(as_prompts([PROMPTS[0]]), SamplingParams(temperature=0, max_tokens=20,
                                                                       ignore_eos=True), use_tqdm=False))[0]
    stop_at = free[4]
    first = free.index(stop_at)
    out = llm.generate(as_prompts([PROMPTS[0]]), SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop_at]),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free[: first + 1] and out.finish_reason == "stop"
    llm.engine.output.eos_token_ids = {stop_at}
    try:
        out = llm.generate(as_prompts([PROMPTS[0]]), SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
        assert out[0].outputs[0].token_ids == free[: first + 1]
        out = llm.generate(as_prompts([PROMPTS[0]]), SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                           use_tqdm=False)
        assert out[0].outputs[0].token_ids == free
    finally:
        llm.engine.output.eos_token_ids = set()


def test_max_tokens_may_fill_the_context_but_not_more(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float64", max_num_seqs=2, max_model_len=16)
    room = 16 - len(PROMPTS[2])
    out = llm.generate(as_prompts([PROMPTS[2]]), SamplingParams(temperature=0, max_tokens=room, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == room and out.finish_reason == "length"
    # Like vLLM's server: a request asking for more than the context leaves is refused up front,
    # rather than holding a slot until the context is full.
    with pytest.raises(ValueError, match="^max_tokens "):
        llm.generate(as_prompts([PROMPTS[2]]), SamplingParams(max_tokens=10**12), use_tqdm=False)
    assert not llm.engine.has_unfinished()


def test_abort_frees_slots(llm):
    engine = llm.engine
    ids = [engine.add_request(p, SamplingParams(max_tokens=50, ignore_eos=True)) for p in PROMPTS]
    engine.step()
    engine.step()
    for request_id in ids:
        engine.abort(request_id)
    assert not engine.has_unfinished() and engine.runner.cache.num_free == 4 and not engine.requests


@pytest.mark.parametrize("prompt,params,message", [
    ({"prompt_token_ids": []}, SamplingParams(), "prompt is empty"),
    ({"prompt_token_ids": [1] * 128}, SamplingParams(), "more than max_model_len"),
    ({"prompt_token_ids": [1000]}, SamplingParams(), "token ids must be"),
    ("text", SamplingParams(), "has no tokenizer"),
])
def test_bad_prompts_raise_clear_errors_and_engine_keeps_serving(llm, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([{"prompt_token_ids": [1, 2]}, prompt], params, use_tqdm=False)
    assert not llm.engine.has_unfinished()
    assert len(llm.generate(as_prompts([[3]]), SamplingParams(max_tokens=2), use_tqdm=False)) == 1


@pytest.mark.parametrize("kwargs,field", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"n": 0}, "n"),
    ({"stop": [""]}, "stop"),
])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field} "):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"model": "/nonexistent/model"}, "does not exist"),
    ({"dtype": "float16"}, "dtype"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_model_len": 100000}, "max_position_embeddings"),
    ({"kv_cache_memory_gb": 1e-9}, "kv_cache_memory_gb"),
    ({"prefill_stall_ratio": 1}, "prefill_stall_ratio"),
    ({"prefill_stall_ratio": float("nan")}, "prefill_stall_ratio"),
    ({"prefill_stall_ratio": True}, "prefill_stall_ratio"),
    ({"prefill_stall_ratio": "fast"}, "prefill_stall_ratio"),
    ({"enable_chunked_prefill": 1}, "enable_chunked_prefill"),
    ({"serving": "yes"}, "serving"),
])
def test_bad_engine_config_is_named(tiny_llama, kwargs, message):
    kwargs = {"model": str(tiny_llama), **kwargs}
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        LLM(**kwargs)


def test_chunks_beside_streams_are_paced_when_serving_on_cpu_and_take_the_whole_budget_offline(tiny_llama):
    from minedraft.config import CPU_MAX_NUM_BATCHED_TOKENS, CPU_SERVING_STALL_RATIO, EngineConfig

    offline = EngineConfig(str(tiny_llama))
    assert offline.max_num_batched_tokens == offline.max_prompt_tokens_beside_streams == CPU_MAX_NUM_BATCHED_TOKENS
    assert offline.prefill_stall_ratio is None
    serving = EngineConfig(str(tiny_llama), serving=True)
    assert serving.max_num_batched_tokens == serving.max_prompt_tokens_beside_streams == CPU_MAX_NUM_BATCHED_TOKENS
    assert serving.prefill_stall_ratio == CPU_SERVING_STALL_RATIO
    assert EngineConfig(str(tiny_llama), serving=True, prefill_stall_ratio=None).prefill_stall_ratio is None
    assert EngineConfig(str(tiny_llama), prefill_stall_ratio=4).prefill_stall_ratio == 4
    chosen = EngineConfig(str(tiny_llama), serving=True, max_num_batched_tokens=100,
                          max_prompt_tokens_beside_streams=20)
    assert (chosen.max_num_batched_tokens, chosen.max_prompt_tokens_beside_streams) == (100, 20)
    assert EngineConfig(str(tiny_llama), max_num_batched_tokens=100).max_prompt_tokens_beside_streams == 100
    with pytest.raises(ValueError, match="max_prompt_tokens_beside_streams"):
        EngineConfig(str(tiny_llama), max_prompt_tokens_beside_streams=0)


def test_prompts_go_shortest_first_when_serving_and_in_arrival_order_offline(tiny_llama):
    from minedraft.config import EngineConfig

    assert EngineConfig(str(tiny_llama)).scheduling_policy == "fcfs"
    assert EngineConfig(str(tiny_llama), serving=True).scheduling_policy == "shortest_prompt"
    assert EngineConfig(str(tiny_llama), serving=True, scheduling_policy="fcfs").scheduling_policy == "fcfs"
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineConfig(str(tiny_llama), scheduling_policy="lifo")


# -- one bad request never hurts another -------------------------------------------------------------


def test_admission_is_all_or_nothing(llm):
    engine = llm.engine
    params = SamplingParams(n=2, seed=5)
    params.seed = 2**64 - 1  # changed after construction: the second completion's seed would overflow
    with pytest.raises(ValueError, match="^seed "):
        engine.add_request([1, 2, 3], params)
    with pytest.raises(ValueError, match="^max_tokens "):
        engine.add_request([1, 2, 3], SamplingParams(n=3, max_tokens=126))
    assert not engine.has_unfinished() and not engine.requests
    assert len(llm.generate(as_prompts([[3]]), SamplingParams(max_tokens=2), use_tqdm=False)) == 1


def run_all(engine) -> dict:
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o.outputs) for o in engine.step() if o.finished)
    return done


def test_a_request_failing_on_its_own_fails_alone(llm, monkeypatch):
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    want = tokens(llm.generate(as_prompts(PROMPTS[:2]), params, use_tqdm=False))
    good, bad = (engine.add_request(p, SamplingParams(n=n, temperature=0, max_tokens=10, ignore_eos=True))
                 for p, n in zip(PROMPTS[:2], (1, 2)))
    state = engine.requests[bad][1].decode_state  # the second of its two completions
    step = engine.output.detokenizer.step

    def failing_step(s, tail):
        if s is state and len(tail) > 6:
            raise RuntimeError("this completion's own failure")
        return step(s, tail)

    monkeypatch.setattr(engine.output.detokenizer, "step", failing_step)
    done = run_all(engine)
    assert done[good][0].token_ids == want[0]
    assert done[bad][0].token_ids == want[1] and done[bad][1].finish_reason == "error"
    assert engine.runner.cache.num_free == 4


def test_a_failed_step_fails_only_its_sequences(llm, monkeypatch):
    """A prefill that fails (here: its forward) fails the requests it admitted; requests already
    running go on."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = tokens(llm.generate(as_prompts(PROMPTS[:1]), params, use_tqdm=False))
    running = engine.add_request(PROMPTS[0], params)
    engine.step()
    late = engine.add_request(PROMPTS[2], params)
    run = engine.runner.run

    def failing_run(rows, **inputs):
        if any(len(r.tokens) == len(PROMPTS[2]) for r in rows):  # the late request's prefill
            raise RuntimeError("out of memory, say")
        return run(rows, **inputs)

    monkeypatch.setattr(engine.runner, "run", failing_run)
    done = run_all(engine)
    assert done[late][0].finish_reason == "error" and done[running][0].token_ids == want[0]
    assert engine.runner.cache.num_free == 4 and not engine.requests


def test_streamed_text_is_never_cut_by_a_later_stop_string(tiny_chat):
    """Text shown while a request runs is always a prefix of its final text, even when a stop
    string begins in one token and ends in the next."""
    llm = LLM(str(tiny_chat), dtype="float64", max_num_seqs=2, max_model_len=128)
    engine = llm.engine

    def texts(params):  # the text after each step, as a stream shows it
        engine.add_request("Once upon a time", params)
        shown = []
        while engine.has_unfinished():
            shown += [o.outputs[0].text for o in engine.step()]
        return shown

    growth = texts(SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    free = growth[-1]
    # A stop string made of the text of two consecutive steps, found first where they begin.
    i = next(i for i in range(1, len(growth) - 1) if growth[i - 1] != growth[i] != growth[i + 1]
             and free.find(growth[i + 1][len(growth[i - 1]):]) == len(growth[i - 1]))
    stop = growth[i + 1][len(growth[i - 1]):]
    shown = texts(SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=stop))
    final = shown[-1]
    assert final == free[: free.index(stop)]
    assert all(final.startswith(text) for text in shown)
