"""The small-row GEMM kernel: equal to F.linear, the reference path for what it does not take, the
fallback when it cannot be built, its use inside compiled graphs, and unchanged greedy output in the
engine."""

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from minedraft import LLM, SamplingParams, kernels
from minedraft.engine.model_runner import Row
from minedraft.kernels import small_gemm
from minedraft.models.llama import Linear, pack_linears
from minedraft.models.loader import load_model

needs_kernel = pytest.mark.skipif(not small_gemm.build(), reason="small-row GEMM kernel not built on this machine")
needs_bf16 = pytest.mark.skipif(not small_gemm.bf16_supported(), reason="no bfloat16 kernel on this CPU (AVX512-BF16)")


@pytest.fixture
def unbuilt(monkeypatch):
    """The kernels as if not tried yet in this process (the ops themselves stay loaded)."""
    monkeypatch.setattr(small_gemm, "_state", {})
    monkeypatch.setattr(kernels, "_state", {})


@needs_kernel
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 12, 13, 16, 40, 64, 65, 96])
@pytest.mark.parametrize("k,n", [(0, 7), (1, 1), (5, 17), (64, 31), (64, 32), (64, 33), (577, 100), (576, 960),
                                 (1536, 65)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_equals_f_linear(m, k, n, bias):
    torch.manual_seed(m * 1000 + k + n)
    x, w = torch.randn(m, k), torch.randn(n, k)  # w: F.linear's [out, in]
    b = torch.randn(n) if bias else None
    packed = small_gemm.pack(w.t())  # the models' [in, out]
    assert packed.panels.shape == (-(-n // small_gemm.PANEL), k, small_gemm.PANEL)
    got = small_gemm.linear(x, packed, b)
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert got.dtype == torch.float32 and got.shape == (m, n)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16)])
@pytest.mark.parametrize("k", [0, 64, 576])
def test_rows_past_the_padding_limit_are_zeros(dtype, k):
    """Inside `padding_after(r)` the kernel returns the product for the first r rows, bias
    included, and zeros for the rest; after the block every row is multiplied again."""
    torch.manual_seed(k)
    x, w, b = torch.randn(8, k, dtype=dtype), torch.randn(k, 40, dtype=dtype), torch.randn(40, dtype=dtype)
    packed = small_gemm.pack(w)
    full = small_gemm.linear(x, packed, b)
    for rows in (0, 5, 8, 12):
        with small_gemm.padding_after(rows):
            got = small_gemm.linear(x, packed, b)
        assert got.shape == (8, 40) and got.dtype == dtype
        assert torch.equal(got[:rows], full[:rows]) and not got[rows:].any()
    assert torch.equal(small_gemm.linear(x, packed, b), full)
    with pytest.raises(KeyError), small_gemm.padding_after(3):
        raise KeyError  # a block that fails still resets the limit
    assert torch.equal(small_gemm.linear(x, packed, b), full)


@needs_bf16
@pytest.mark.parametrize("m", [1, 2, 4, 5, 8, 12, 13, 40, 64])
@pytest.mark.parametrize("k,n", [(0, 7), (2, 1), (64, 31), (64, 33), (576, 960), (1536, 65)])
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_kernel_rounds_the_exact_product_once(m, k, n, bias):
    """bfloat16 in, float32 sums, one rounding to bfloat16 at the end: within bfloat16's unit
    roundoff (2**-8 relative) of the exact product of the bfloat16 inputs, plus float32 summation
    error."""
    torch.manual_seed(m * 1000 + k + n)
    x, w = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
    b = torch.randn(n, dtype=torch.bfloat16) if bias else None
    packed = small_gemm.pack(w)
    assert packed.panels.dtype == torch.bfloat16 and packed.panels.shape == (-(-n // small_gemm.PANEL), k, 32)
    got = torch.ops.minedraft_kernels.small_gemm(x, packed.panels, n, b)  # every m, AMX or not
    exact = x.double() @ w.double() + (0 if b is None else b.double())
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    err = (got.double() - exact).abs()
    assert (err <= exact.abs() * 2 ** -8 + 1e-5 * k).all(), err.max()


@needs_bf16
def test_bf16_odd_k_is_not_packed():
    assert small_gemm.pack(torch.randn(5, 8, dtype=torch.bfloat16)) is None


@needs_kernel
def test_a_row_gets_the_same_bits_in_any_product():
    """Each row's sums run in the same order whatever the row count, so a verification of k + 1
    tokens and a one-token step agree to the bit (as oneDNN's packed products do)."""
    for dtype in (torch.float32, *((torch.bfloat16,) if small_gemm.bf16_supported() else ())):
        x, w = torch.randn(40, 576, dtype=dtype), torch.randn(576, 200, dtype=dtype)
        packed = small_gemm.pack(w)
        whole = small_gemm.linear(x, packed)
        for m in (1, 3, 5, 13):
            assert torch.equal(small_gemm.linear(x[:m], packed), whole[:m])


@needs_kernel
def test_weights_packed_in_order_lie_one_after_another():
    """`pack_in_order` packs into one buffer per dtype, in the order given, 64-byte aligned, and
    the products are bit for bit those of weights packed alone; what the kernel does not take
    (an odd K in bfloat16, float64) stays unpacked."""
    dtypes = (torch.float32, *((torch.bfloat16,) if small_gemm.bf16_supported() else ()))
    weights = [torch.randn(k, n, dtype=dtype) for dtype in dtypes for k, n in [(64, 40), (576, 96), (8, 1)]]
    weights.insert(1, torch.randn(5, 8, dtype=torch.float64))
    weights.insert(3, torch.randn(5, 8, dtype=torch.bfloat16))
    packs = small_gemm.pack_in_order(weights)
    assert packs[1] is None and packs[3] is None
    for dtype in dtypes:
        mine = [p.panels for p in packs if p is not None and p.panels.dtype == dtype]
        for a, b in zip(mine, mine[1:]):
            assert b.data_ptr() == a.data_ptr() + a.numel() * a.element_size()
    for w, packed in zip(weights, packs):
        if packed is None:
            continue
        alone = small_gemm.pack(w)
        assert packed.dense is w and packed.panels.data_ptr() % 64 == 0 and torch.equal(packed.panels, alone.panels)
        x = torch.randn(5, w.shape[0], dtype=w.dtype)
        assert torch.equal(small_gemm.linear(x, packed), small_gemm.linear(x, alone))


@needs_kernel
def test_a_models_weights_lie_in_the_order_it_multiplies_them(tiny_llama, monkeypatch):
    """The panels lie one after another in module order, and a forward pass's products read them
    in that order (so the kernel's requests ahead run on into the next product)."""
    llm = LLM(str(tiny_llama), dtype="float32", enforce_eager=True, max_num_seqs=1)
    model = llm.engine.runner.model
    panels = [m.small.panels for m in model.modules() if isinstance(m, Linear)]
    assert len(panels) == 4 * model.args.num_layers + 1
    for a, b in zip(panels, panels[1:]):
        assert b.data_ptr() == a.data_ptr() + a.numel() * a.element_size()
    called = []
    real = small_gemm.linear
    monkeypatch.setattr(small_gemm, "linear", lambda x, packed, *a: called.append(packed.panels.data_ptr())
                        or real(x, packed, *a))
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
    assert called == [p.data_ptr() for p in panels]


@needs_kernel
def test_non_contiguous_rows():
    x, w = torch.randn(6, 40).t()[:, :5].t(), torch.randn(40, 48)  # a strided [5, 40] view
    torch.testing.assert_close(small_gemm.linear(x, small_gemm.pack(w)), x @ w, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_many_rows_take_the_reference_path():
    w = torch.randn(64, 40)
    x = torch.randn(small_gemm.MAX_ROWS + 1, 64)
    assert torch.equal(small_gemm.linear(x, small_gemm.pack(w)), x @ w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("amx", [False, True])
def test_which_products_the_kernel_takes(monkeypatch, dtype, amx):
    monkeypatch.setattr(small_gemm, "_has_amx", lambda: amx)
    most = small_gemm.MAX_ROWS
    eager = [m for m in range(0, most + 5) if small_gemm.applies(m, dtype, compiling=False)]
    graph = [m for m in range(0, most + 5) if small_gemm.applies(m, dtype, compiling=True)]
    # bfloat16 with AMX: oneDNN's tile products win eagerly from 5 rows; graphs keep the kernel.
    assert eager == list(range(1, 5 if amx and dtype == torch.bfloat16 else most + 1))
    assert graph == list(range(small_gemm.GRAPH_MIN_ROWS, most + 1))


@needs_bf16
def test_bf16_model_multiplies_many_rows_through_onednn(tiny_llama, monkeypatch):
    """Eagerly, a bfloat16 model sends 5+ rows to oneDNN where the CPU has AMX, and its output
    stays what the kernel's products give within bfloat16 rounding."""
    model = load_model(tiny_llama, torch.bfloat16, torch.device("cpu"))
    linear = next(m for m in model.modules() if isinstance(m, Linear) and m.small is not None)
    x = torch.randn(12, linear.in_features, dtype=torch.bfloat16)
    calls = []
    real = small_gemm.linear
    monkeypatch.setattr(small_gemm, "linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    for amx in (True, False):
        monkeypatch.setattr(small_gemm, "_has_amx", lambda: amx)
        with torch.no_grad():
            got = linear(x)
        torch.testing.assert_close(got.float(), (x.double() @ linear.weight.double()).float() + (
            0 if linear.bias is None else linear.bias.float()), rtol=2e-2, atol=2e-2)
    assert calls == [12]  # only the run without AMX used the kernel


def test_other_dtypes_take_the_other_paths(tiny_llama):
    assert small_gemm.pack(torch.randn(64, 40, dtype=torch.float64)) is None
    model = load_model(tiny_llama, torch.float64, torch.device("cpu"))
    assert not any(m.small is not None for m in model.modules() if isinstance(m, Linear))


def test_bf16_packs_only_where_the_cpu_multiplies_it(tiny_llama):
    model = load_model(tiny_llama, torch.bfloat16, torch.device("cpu"))
    packed = [m.small is not None for m in model.modules() if isinstance(m, Linear)]
    assert packed and set(packed) == {small_gemm.bf16_supported()}


def test_failed_build_warns_once_and_keeps_the_other_paths(monkeypatch, unbuilt):
    def fail(variant=None):
        raise RuntimeError("Error building extension 'minedraft_kernels'\nmore lines")

    monkeypatch.setattr(kernels, "_compile", fail)
    layer, other = Linear(64, 40, bias=True), Linear(64, 40, bias=False)
    with torch.no_grad():
        for p in (*layer.parameters(), *other.parameters()):
            torch.nn.init.normal_(p)
    with pytest.warns(UserWarning, match=r"building the C\+\+ kernels failed.*Error building extension"):
        pack_linears(layer, keep_dense=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second layer: no second warning
        pack_linears(other, keep_dense=True)
    assert layer.small is None and other.small is None
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer(x), x @ layer.weight + layer.bias, rtol=1e-5, atol=1e-4)


def test_switched_off_builds_nothing(monkeypatch, unbuilt):
    monkeypatch.setenv("MINEDRAFT_SMALL_GEMM", "0")
    monkeypatch.setattr(kernels, "_compile", lambda variant=None: pytest.fail("built although switched off"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert small_gemm.pack(torch.randn(8, 8)) is None


@needs_kernel
def test_a_build_killed_midway_does_not_hang_the_next(tmp_path, monkeypatch):
    """torch leaves its lock file behind when a build is killed; the next build must go ahead."""
    monkeypatch.setenv("MINEDRAFT_CACHE", str(tmp_path))
    build_dir = kernels._build_dir()
    build_dir.mkdir(parents=True)
    (build_dir / "lock").touch()
    code = "from minedraft import kernels; kernels._compile()"
    subprocess.run([sys.executable, "-c", code], env=os.environ, timeout=300, check=True)
    assert list(build_dir.glob("*.so")) and not (build_dir / "lock").exists()


@needs_kernel
def test_greedy_output_unchanged(tiny_llama, tiny_draft, monkeypatch):
    """float32 engine, autoregressive and verifying 5 tokens a step (1..16-row products through
    the kernel), against the engine without it (oneDNN and MKL products)."""
    prompts = [{"prompt_token_ids": p} for p in ([5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33] * 4)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (19, 30, 11)]
    kwargs = dict(dtype="float32", max_num_seqs=4, max_model_len=96)
    spec = {"model": str(tiny_draft), "num_speculative_tokens": 4}

    def outputs(**extra):
        llm = LLM(str(tiny_llama), **kwargs, **extra)
        linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, Linear)]
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)], linears

    with_kernel, linears = outputs()
    assert all(m.small is not None for m in linears)
    assert outputs(speculative_config=spec)[0] == with_kernel
    monkeypatch.setattr(small_gemm, "_state", {"ok": False})
    without, linears = outputs()
    assert not any(m.small is not None for m in linears)
    assert without == with_kernel


@needs_kernel
def test_compiled_graphs_call_the_kernel_from_two_rows(tiny_llama):
    """Graphs for 4 and 8 tokens multiply through the kernel (Inductor's templates are slower
    there), one for a single token keeps Inductor's own products; the kernel stops at the real
    tokens of a padded graph; all give the eager path's logits."""
    with LLM(str(tiny_llama), dtype="float32", max_num_seqs=2, max_model_len=64, compile_sizes=[1, 4, 8]) as llm:
        runner = llm.engine.runner
        slot = runner.cache.allocate()
        runner.forward([Row(slot, list(range(3, 13)))])  # 10 tokens: an eager prefill

        def step(tokens: list[int]) -> tuple[torch.Tensor, int, list]:
            runner.forward([Row(slot, tokens, len(tokens))])  # builds the graph
            runner.cache.truncate(slot, 10)
            with torch.profiler.profile(record_shapes=True) as prof:
                logits = runner.forward([Row(slot, tokens, len(tokens))])
            runner.cache.truncate(slot, 10)
            limits = [e.concrete_inputs for e in prof.events() if e.name == "minedraft_kernels::set_row_limit"]
            return logits, sum(e.name == "minedraft_kernels::small_gemm" for e in prof.events()), limits

        cases = {(7, 1, 8, 2, 8, 1): 8, (4, 5, 9): 4, (6,): 1}
        calls = {}
        for tokens, size in cases.items():
            logits, calls[size], limits = step(list(tokens))
            assert runner.compiled.size_for(len(tokens)) == size and not runner.compiled.failed
            assert limits == [[len(tokens)], [-1]]  # the graph's products stop at the real tokens
            runner.compiled.failed = True  # the same step eagerly
            eager = runner.forward([Row(slot, list(tokens), len(tokens))])
            runner.cache.truncate(slot, 10)
            runner.compiled.failed = False
            torch.testing.assert_close(logits, eager, rtol=1e-5, atol=1e-5)
        # Every linear (qkv, o, gate_up, down per layer, and the head) in the 4- and 8-token graphs.
        assert calls[8] == calls[4] == 4 * runner.model.args.num_layers + 1
        assert calls[1] == 0


def gguf_dequantized(w: torch.Tensor, kind: str) -> torch.Tensor:
    """`w` ([K, N]) quantized per column in blocks of 32 k terms as llama.cpp's Q4_1 / Q8_0 do it,
    then dequantized to float32: what a GGUF file's float32 conversion holds."""
    K, N = w.shape
    blocks = w.t().reshape(N, K // 32, 32).float()
    if kind == "q4_1":
        low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
        d = (high - low) / 15
        q = ((blocks - low) * torch.where(d > 0, 1 / d, 0) + 0.5).floor().clamp(0, 15)
        out = d.half().float() * q + low.half().float()
    else:
        d = blocks.abs().amax(-1, keepdim=True) / 127
        q = (blocks * torch.where(d > 0, 1 / d, 0)).round()
        out = d.half().float() * q
    return out.reshape(N, K).t().contiguous()


@needs_kernel
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("k,n", [(32, 1), (64, 97), (576, 960), (1536, 65)])
def test_block_coded_weights_give_the_float32_products_bit_for_bit(kind, k, n):
    """A weight a GGUF quantization produced is found as block codes (a third of the bytes or
    less) and multiplies to the very bits the float32 panels give (the decoded weights are the
    same values, summed in the same order); one-hot rows give the weights back exactly."""
    torch.manual_seed(k + n)
    w = gguf_dequantized(torch.randn(k, n) * 0.1 + 0.02, kind)
    if n > 1:  # (a weight of zeros alone is Q4_1 too)
        w[:32, 0] = 0  # a constant block: d = 0
    packed = small_gemm.pack(w)
    assert packed.codes.codes.dtype == (torch.uint8 if kind == "q4_1" else torch.int8)
    assert packed.codes.nbytes <= 0.3 * packed.panels.numel() * 4

    def coded(x, bias=None):
        return torch.ops.minedraft_kernels.coded_gemm(x, *packed.codes, n, bias)

    for start in range(0, k, small_gemm.MAX_ROWS):
        assert torch.equal(coded(torch.eye(k)[start : start + small_gemm.MAX_ROWS]), w[start : start + small_gemm.MAX_ROWS])
    b = torch.randn(n)
    for m in (1, 5, 13, 96):
        x = torch.randn(m, k)
        got = coded(x, b)
        assert torch.equal(got, torch.ops.minedraft_kernels.small_gemm(x, packed.panels, n, b))
        torch.testing.assert_close(got.double(), x.double() @ w.double() + b.double(), rtol=1e-5, atol=1e-5 * k ** 0.5)
        with small_gemm.padding_after(3):
            limited = coded(x, b)
        assert torch.equal(limited[:3], got[:3]) and not limited[3:].any()


@needs_bf16
@pytest.mark.parametrize("k,n", [(32, 1), (64, 97), (576, 960), (1536, 65)])
def test_bf16_rows_multiply_the_exact_q4_1_weights(k, n):
    """A bfloat16 weight rounded from Q4_1 codes carries those codes (in pairs of k terms), and a
    few bfloat16 rows multiply the codes' exact values: within bfloat16's unit roundoff of the
    exact product, the same for a row in any product, zeros past the padding limit."""
    torch.manual_seed(k + n)
    w = gguf_dequantized(torch.randn(k, n) * 0.1 + 0.02, "q4_1")
    if n > 1:
        w[:32, 0] = 0  # a constant block: d = 0
    packed = small_gemm.pack(w.bfloat16(), source=w)
    assert packed.codes.codes.dtype == torch.uint8 and packed.codes.codes.shape == (-(-n // 32), k, 16)
    b = torch.randn(n, dtype=torch.bfloat16)

    def coded(x, bias=None):
        return torch.ops.minedraft_kernels.coded_gemm(x, *packed.codes, n, bias)

    one_hot = coded(torch.eye(k, dtype=torch.bfloat16)[:16])
    assert ((one_hot.double() - w[:16].double()).abs() <= w[:16].double().abs() * 2 ** -8 + 1e-6).all()
    x = torch.randn(13, k, dtype=torch.bfloat16)
    exact = x.double() @ w.double() + b.double()
    for m in (1, 5, 6, 7, 13):
        got = coded(x[:m], b)
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        err = (got.double() - exact[:m]).abs()
        assert (err <= exact[:m].abs() * 2 ** -8 + 1e-5 * k ** 0.5).all(), err.max()
        assert torch.equal(got, coded(x, b)[:m])
    with small_gemm.padding_after(3):
        limited = coded(x, b)
    assert torch.equal(limited[:3], coded(x[:3], b)) and not limited[3:].any()


@needs_bf16
def test_bf16_weights_carry_codes_only_from_a_q4_1_source():
    """No source, a Q8_0 source or one that was never quantized: bfloat16 panels only."""
    w = torch.randn(64, 40) * 0.1
    assert small_gemm.pack(w.bfloat16()).codes is None
    for source in (gguf_dequantized(w, "q8_0"), w):
        assert small_gemm.pack(source.bfloat16(), source=source).codes is None
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="bfloat16 rows need Q4_1 codes"):
        torch.ops.minedraft_kernels.coded_gemm(x, *small_gemm.block_codes(gguf_dequantized(w, "q8_0")), 40, None)


@needs_kernel
def test_products_of_a_few_rows_read_the_codes(monkeypatch):
    """Up to CODED_MAX_ROWS rows the product decodes the codes; more read the float32 panels."""
    packed = small_gemm.pack(gguf_dequantized(torch.randn(64, 40), "q4_1"))
    called = []
    for op in ("coded_gemm", "small_gemm"):
        real = getattr(torch.ops.minedraft_kernels, op)
        monkeypatch.setattr(torch.ops.minedraft_kernels, op, lambda *a, op=op, real=real: called.append(op) or real(*a))
    for m in range(1, small_gemm.MAX_ROWS + 1):
        small_gemm.linear(torch.randn(m, 64), packed)
    most = small_gemm.CODED_MAX_ROWS
    assert called == ["coded_gemm"] * most + ["small_gemm"] * (small_gemm.MAX_ROWS - most)


@needs_kernel
def test_weights_that_are_not_block_codes_keep_their_panels(monkeypatch):
    """Codes are taken only where every value is exactly one: not for trained weights, not for a
    quantized weight with one value one ulp off or a block minimum that is no float16, not where
    K is no multiple of 32, and not when switched off."""
    torch.manual_seed(0)
    assert small_gemm.pack(torch.randn(64, 40)).codes is None
    w = gguf_dequantized(torch.randn(64, 40), "q4_1")
    assert small_gemm.pack(w).codes is not None
    nudged = w.clone()
    nudged[40, 39] = torch.nextafter(nudged[40, 39], torch.tensor(1.0))
    assert small_gemm.pack(nudged).codes is None
    shifted = w.clone()
    shifted[32:, 7] += 1e-4  # every value of a block, its minimum too
    assert small_gemm.pack(shifted).codes is None
    assert small_gemm.pack(gguf_dequantized(torch.randn(96, 40), "q8_0")[:80]).codes is None
    monkeypatch.setenv("MINEDRAFT_BLOCK_CODES", "0")
    assert small_gemm.pack(w).codes is None


def test_block_coded_products_run_from_one_row_in_graphs_too():
    """Coded weights go through the kernel from one row, compiled or not: anything else would
    stream the float32 weights."""
    most = small_gemm.MAX_ROWS
    for compiling in (False, True):
        rows = [m for m in range(0, most + 5) if small_gemm.applies(m, torch.float32, compiling, coded=True)]
        assert rows == list(range(1, most + 1))


@pytest.fixture(scope="session")
def tiny_gguf_llama(tmp_path_factory, tiny_llama):
    """The tiny model with its linear weights as a GGUF Q4_1 file would give them, its embedding
    (the untied LM head's too) as Q8_0's."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("tiny_gguf_llama")
    for f in tiny_llama.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(tiny_llama / "model.safetensors")
    for name, t in tensors.items():
        if t.dim() == 2:
            kind = "q8_0" if "embed" in name or "lm_head" in name else "q4_1"
            tensors[name] = gguf_dequantized(t.t(), kind).t().double().contiguous()
    save_file(tensors, out / "model.safetensors")
    return out


@needs_kernel
def test_a_gguf_models_greedy_output_is_the_float32_panels(tiny_gguf_llama, tiny_draft, monkeypatch):
    """A model whose weights are GGUF codes streams them (every linear coded) and generates what
    the same model with float32 panels generates, autoregressively and verifying 5 tokens."""
    prompts = [{"prompt_token_ids": p} for p in ([5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33] * 4)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (19, 30, 11)]
    spec = {"model": str(tiny_draft), "num_speculative_tokens": 4}

    def outputs(**extra):
        llm = LLM(str(tiny_gguf_llama), dtype="float32", max_num_seqs=4, max_model_len=96, **extra)
        linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, Linear)]
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)], linears

    coded, linears = outputs()
    assert all(m.small.codes is not None for m in linears)
    assert outputs(speculative_config=spec)[0] == coded
    monkeypatch.setenv("MINEDRAFT_BLOCK_CODES", "0")
    plain, linears = outputs()
    assert all(m.small.codes is None for m in linears)
    assert plain == coded


@needs_bf16
def test_a_bf16_gguf_model_multiplies_a_few_rows_from_the_codes(tiny_gguf_llama, monkeypatch):
    """Loaded in bfloat16, a model whose float32 weights are Q4_1 codes keeps those codes (its Q8_0
    LM head: panels), takes one-row products from them, and gives logits as close to the float32
    model's as bfloat16 panels do."""
    def logits(dtype):
        with LLM(str(tiny_gguf_llama), dtype=dtype, max_num_seqs=2, max_model_len=64, enforce_eager=True) as llm:
            runner = llm.engine.runner
            linears = [m for m in runner.model.modules() if isinstance(m, Linear)]
            slot = runner.cache.allocate()
            runner.forward([Row(slot, list(range(3, 13)))])
            with torch.profiler.profile() as prof:
                out = runner.forward([Row(slot, [6], 1)]).double()
            calls = sum(e.name == "minedraft_kernels::coded_gemm" for e in prof.events())
            return out, linears, calls

    reference = logits("float32")[0]
    coded, linears, calls = logits("bfloat16")
    assert [m.small.codes is not None for m in linears] == [True] * (len(linears) - 1) + [False]
    assert calls == len(linears) - 1
    monkeypatch.setenv("MINEDRAFT_BLOCK_CODES", "0")
    plain, linears, calls = logits("bfloat16")
    assert calls == 0 and all(m.small.codes is None for m in linears)
    assert (coded - reference).abs().max() <= 2 * (plain - reference).abs().max() + 1e-3


@needs_kernel
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=needs_bf16)])
def test_compiled_graphs_call_the_coded_kernel_from_one_row(tiny_gguf_llama, dtype):
    """A one-token graph multiplies coded weights through the kernel (not Inductor's templates
    over the dense copy) and gives the eager path's logits. (bfloat16: the Q8_0 LM head has no
    codes for bfloat16 rows.)"""
    with LLM(str(tiny_gguf_llama), dtype=dtype, max_num_seqs=2, max_model_len=64, compile_sizes=[1]) as llm:
        runner = llm.engine.runner
        slot = runner.cache.allocate()
        runner.forward([Row(slot, list(range(3, 13)))])
        runner.forward([Row(slot, [6], 1)])  # builds the graph
        runner.cache.truncate(slot, 10)
        with torch.profiler.profile() as prof:
            logits = runner.forward([Row(slot, [6], 1)])
        runner.cache.truncate(slot, 10)
        assert runner.compiled.size_for(1) == 1 and not runner.compiled.failed
        assert sum(e.name == "minedraft_kernels::coded_gemm" for e in prof.events()) == \
            4 * runner.model.args.num_layers + (dtype == "float32")
        runner.compiled.failed = True
        eager = runner.forward([Row(slot, [6], 1)])
        # (bfloat16: Inductor rounds its fused element-wise work once where eager rounds each op;
        # within 4 units in the last place of the largest logit, as with bfloat16 panels.)
        tolerance = 1e-5 if dtype == "float32" else eager.abs().max().item() * 2 ** -5
        torch.testing.assert_close(logits, eager, rtol=1e-5, atol=tolerance)


def test_the_bundled_models_weights_stream_as_codes(smollm2):
    """SmolLM2-135M-Instruct's GGUF file is Q4_1 with a Q8_0 embedding: all 121 products stream
    block codes, under a fifth of the float32 bytes."""
    if not small_gemm.build():
        pytest.skip("small-row GEMM kernel not built on this machine")
    linears = [m for m in smollm2.engine.runner.model.modules() if isinstance(m, Linear)]
    kinds = [m.small.codes.codes.dtype for m in linears if m.small is not None and m.small.codes is not None]
    assert kinds == [torch.uint8] * 120 + [torch.int8]
    assert sum(m.nbytes for m in linears) < 0.2 * sum(m.weight.numel() * 4 for m in linears)
