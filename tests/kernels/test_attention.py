"""The attention kernel: the definition of causal attention over the cache (writes included), the
engine's use of it for decode and verification batches, PyTorch's path for everything else."""

import pytest
import torch

from minedraft import LLM, SamplingParams, kernels
from minedraft.engine.model_runner import Row
from minedraft.kernels import attention as attention_kernel
from minedraft.kernels import small_gemm
from minedraft.models.llama import Linear

needs_kernel = pytest.mark.skipif(not kernels.build(), reason="C++ kernels not built on this machine")


def reference(q, k, v, k_cache, v_cache, rows):
    """Causal attention in float64, one query at a time, after writing the new keys and values."""
    kc, vc = k_cache.double().clone(), v_cache.double().clone()
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], q.shape[2], dtype=torch.float64)
    t = 0
    for slot, start, n in rows.tolist():
        kc[slot, :, start : start + n] = k[t : t + n].double().transpose(0, 1)
        vc[slot, :, start : start + n] = v[t : t + n].double().transpose(0, 1)
        for i in range(n):
            for h in range(q.shape[1]):
                keys, values = kc[slot, h // group, : start + i + 1], vc[slot, h // group, : start + i + 1]
                out[t + i, h] = torch.softmax(keys @ q[t + i, h].double() / q.shape[2] ** 0.5, 0) @ values
        t += n
    return out.flatten(1), kc, vc


@needs_kernel
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 16), (2, 1, 128)])
# The last case crosses the kernel's tiles of 64 keys and blocks of 16 at other places in each row
# and brings 16 tokens (a row's most) to one row.
@pytest.mark.parametrize("rows", [[[2, 10, 1]], [[0, 0, 5], [3, 44, 6], [1, 7, 1]], [[1, 0, 1], [0, 63, 1]],
                                  [[0, 150, 16], [3, 64, 1], [1, 127, 2], [2, 0, 16]]])
def test_kernel_equals_the_definition(dtype, tolerance, heads, kv_heads, head_dim, rows):
    torch.manual_seed(heads * 100 + head_dim + len(rows))
    rows = torch.tensor(rows)
    n, padded = int(rows[:, 2].sum()), int(rows[:, 2].sum()) + 3  # padding rows past the real tokens
    length = max(64, int((rows[:, 1] + rows[:, 2]).max()) + 5)
    k_cache, v_cache = (torch.randn(4, kv_heads, length, head_dim).to(dtype) for _ in range(2))
    q, k, v = (torch.randn(padded, h, head_dim).to(dtype) for h in (heads, kv_heads, kv_heads))
    want, want_k, want_v = reference(q, k, v, k_cache, v_cache, rows)
    got = attention_kernel.cached_attention(q, k, v, k_cache, v_cache, rows)
    assert got.dtype == dtype and got.shape == (padded, heads * head_dim)
    assert (got[n:] == 0).all()
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)
    assert torch.equal(k_cache.double(), want_k) and torch.equal(v_cache.double(), want_v)


@needs_kernel
def test_a_querys_bits_do_not_depend_on_the_other_queries():
    """A token verified among five (15 queries sharing each key-value head, in two groups for the
    values; the row's keys run into a second tile of 64, where the token's own end in the first),
    beside another row, gets the same bits as when it is decoded alone: what makes a verification's
    scores equal the plain decode step's at the same position."""
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(2, 3, 160, 64), torch.randn(2, 3, 160, 64)
    q, k, v = torch.randn(6, 9, 64), torch.randn(6, 3, 64), torch.randn(6, 3, 64)
    together = attention_kernel.cached_attention(q, k, v, k_cache.clone(), v_cache.clone(),
                                                 torch.tensor([[1, 40, 1], [0, 62, 5]]))
    alone = attention_kernel.cached_attention(q[1:2], k[1:2], v[1:2], k_cache.clone(), v_cache.clone(),
                                              torch.tensor([[0, 62, 1]]))
    assert torch.equal(together[1], alone[0])


@needs_kernel
def test_bad_rows_are_refused():
    k_cache = v_cache = torch.zeros(2, 1, 8, 16)
    q, k = torch.zeros(3, 2, 16), torch.zeros(3, 1, 16)
    with pytest.raises(RuntimeError, match="outside the cache"):
        attention_kernel.cached_attention(q, k, k, k_cache, v_cache, torch.tensor([[2, 0, 1]]))
    with pytest.raises(RuntimeError, match="outside the cache"):
        attention_kernel.cached_attention(q, k, k, k_cache, v_cache, torch.tensor([[0, 6, 3]]))
    with pytest.raises(RuntimeError, match="more tokens than q"):
        attention_kernel.cached_attention(q, k, k, k_cache, v_cache, torch.tensor([[0, 0, 2], [1, 0, 2]]))


def test_what_it_does_not_take():
    cpu = torch.device("cpu")
    assert not attention_kernel.applies(torch.float64, 16, cpu)
    assert not attention_kernel.applies(torch.float32, 24, cpu)  # head_dim not a multiple of 16
    assert not attention_kernel.applies(torch.float32, 16, torch.device("meta"))


def attention_calls(runner, rows: list[Row]) -> tuple[torch.Tensor, int]:
    with torch.profiler.profile() as prof:
        logits = runner.forward(rows)
    return logits, sum(e.name == "minedraft_kernels::cached_attention" for e in prof.events())


@needs_kernel
def test_engine_batches_take_the_kernel_and_agree_with_pytorch(tiny_llama, monkeypatch):
    """Decode and verification rows (here 1 and 5 new tokens, slots not evenly spaced) go through
    one kernel call per layer; a prompt of more than MAX_QUERIES tokens takes PyTorch's path; the
    logits agree with PyTorch's attention."""
    with LLM(str(tiny_llama), dtype="float32", max_num_seqs=4, max_model_len=96) as llm:
        runner = llm.engine.runner
        layers = runner.model.args.num_layers
        slots = [runner.cache.allocate() for _ in range(4)]
        prompt = list(range(3, 3 + attention_kernel.MAX_QUERIES + 1))
        _, calls = attention_calls(runner, [Row(s, prompt[:n]) for s, n in zip((slots[0], slots[1], slots[3]), (17, 9, 12))])
        assert calls == 0  # the longest row brings 17 queries
        lengths = [runner.cache.lengths[s] for s in slots]
        step = [Row(slots[0], [5], 1), Row(slots[1], [7, 1, 8, 2, 8], 5), Row(slots[3], [9], 1)]
        logits, calls = attention_calls(runner, step)
        assert calls == layers
        for s, n in zip(slots, lengths):
            runner.cache.truncate(s, n)
        monkeypatch.setenv("MINEDRAFT_ATTENTION_KERNEL", "0")
        again, calls = attention_calls(runner, step)
        assert calls == 0
        torch.testing.assert_close(logits, again, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_speculative_output_equals_plain_decoding_with_the_kernels(tiny_llama, tiny_draft, dtype):
    """Every product of up to 64 rows (prefill, verification, decode) through the small-row kernel
    and every decode or verification batch through the attention kernel: greedy speculative output
    equals plain decoding's, in float32 and, where the CPU multiplies it, bfloat16."""
    if dtype == "bfloat16" and not small_gemm.bf16_supported():
        pytest.skip("no bfloat16 kernel on this CPU (AVX512-BF16)")
    prompts = [{"prompt_token_ids": p} for p in ([5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33] * 4)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (19, 30, 11)]
    kwargs = dict(dtype=dtype, max_num_seqs=4, max_model_len=96)
    spec = {"model": str(tiny_draft), "num_speculative_tokens": 4}
    runs = []
    for extra in ({}, {"speculative_config": spec}):
        llm = LLM(str(tiny_llama), **kwargs, **extra)
        assert all(m.small is not None for m in llm.engine.runner.model.modules() if isinstance(m, Linear))
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
    assert runs[1] == runs[0] and [len(t) for t in runs[0]] == [19, 30, 11]
