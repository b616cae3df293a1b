"""Every kernel path this CPU executes, not only the one the engine's build takes: on an AVX-512
machine the AVX2 and portable paths too, on an AVX2 machine the portable one (each a build of the
same sources under its own op namespace, `kernels.build(variant)`)."""

from pathlib import Path

import pytest
import torch

from minedraft import kernels
from minedraft.kernels import small_gemm

from test_attention import reference
from test_small_gemm import gguf_dequantized

VARIANTS = kernels.other_variants()
needs_kernel = pytest.mark.skipif(not kernels.build(), reason="C++ kernels not built on this machine")


def test_the_engine_build_takes_the_widest_path_the_cpu_has():
    if not kernels.build():
        pytest.skip("C++ kernels not built on this machine")
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.is_file() else ""
    want = "avx512" if " avx512f" in flags else "avx2" if all(f" {f}" in flags for f in ("avx2", "fma", "f16c")) \
        else "portable"
    assert kernels.isa() == (want if kernels.engine_variant() == "native" else kernels.engine_variant())


@needs_kernel
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_variant_builds_beside_the_engines(variant):
    assert kernels.build(variant) and kernels.isa(variant) == variant


@needs_kernel
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m", [1, 2, 5, 13, 40])
@pytest.mark.parametrize("k,n", [(1, 1), (64, 33), (577, 100), (576, 960)])
def test_products_give_the_engine_builds_bits(variant, m, k, n):
    """Fused multiply-adds in the same order on every path: the same float32 bits as the engine's
    build, and the float64 product within float32 rounding."""
    torch.manual_seed(m * 1000 + k + n)
    x, w, b = torch.randn(m, k), torch.randn(k, n), torch.randn(n)
    packed = small_gemm.pack(w)
    got = kernels.ops(variant).small_gemm(x, packed.panels, n, b)
    torch.testing.assert_close(got.double(), x.double() @ w.double() + b.double(), rtol=1e-5, atol=1e-5 * k ** 0.5)
    assert torch.equal(got, kernels.ops().small_gemm(x, packed.panels, n, b))


@needs_kernel
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_coded_products_decode_the_same_weights(variant, kind, m):
    torch.manual_seed(m)
    w = gguf_dequantized(torch.randn(576, 200), kind)
    codes = small_gemm.block_codes(w)
    assert codes is not None
    x = torch.randn(m, 576)
    got = kernels.ops(variant).coded_gemm(x, *codes, 200, None)
    assert torch.equal(got, kernels.ops(variant).small_gemm(x, small_gemm.pack(w).panels, 200, None))
    assert torch.equal(got, kernels.ops().coded_gemm(x, *codes, 200, None))


@needs_kernel
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [[[0, 0, 5], [3, 44, 6], [1, 7, 1]], [[0, 150, 16], [3, 64, 1], [2, 0, 16]]])
def test_attention_equals_the_definition(variant, dtype, tolerance, rows):
    torch.manual_seed(len(rows))
    rows = torch.tensor(rows)
    n = int(rows[:, 2].sum())
    length = int((rows[:, 1] + rows[:, 2]).max()) + 5
    k_cache, v_cache = (torch.randn(4, 3, length, 64).to(dtype) for _ in range(2))
    q, k, v = (torch.randn(n + 2, h, 64).to(dtype) for h in (9, 3, 3))
    want, want_k, want_v = reference(q, k, v, k_cache, v_cache, rows)
    got = kernels.ops(variant).cached_attention(q, k, v, k_cache, v_cache, rows)
    assert (got[n:] == 0).all()
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)
    assert torch.equal(k_cache.double(), want_k) and torch.equal(v_cache.double(), want_v)
