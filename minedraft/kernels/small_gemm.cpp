// y = x @ W + bias for a few rows of x (float32, AVX-512), reading each weight once for all rows.
//
// At decode and verification sizes (1 to 64 rows) the weights are far bigger than the cache, so a
// product costs what streaming them costs, and oneDNN's and MKL's cost well above one pass
// (docs/BENCHMARKS.md). Here W is packed once into panels of 32 columns, [panels, K, 32]
// (minedraft/kernels/small_gemm.py), and each panel is multiplied with every row of x before the
// next one is read: it comes from memory once and from L2 for the later row blocks.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <array>
#include <utility>

#ifndef __AVX512F__
#error "small_gemm needs AVX-512F (minedraft/kernels/small_gemm.py builds it only where the CPU has it)"
#endif

namespace {

constexpr int64_t kPanel = 32;   // columns per panel: two 16-float vectors
constexpr int kMaxBlockRows = 12;  // 2 x 12 accumulators + 2 weight vectors + 1 broadcast <= 32 registers
// With several rows the FMAs hide the loads from the hardware prefetcher; asking for the weights
// 32 KB ahead took 8-row products from 1.3-1.6x to 1.1-1.2x the one-row time here (one row is
// faster without).
constexpr int64_t kPrefetchFloats = 8192;
constexpr int64_t kChunk = 64;  // k terms summed in registers before they are added to y

// Rows x[0..R) against one panel: 2R accumulators, each weight vector loaded once per k.
// `prefetch`: the first row block of a panel of a product with several rows. The sum over k runs
// in chunks of kChunk, each added to y (in L1): with one running sum over all of K, SmolLM2's
// float32 logits were 1.4e-4 off float64's (oneDNN / MKL: 6e-5); in chunks, 3.4e-5.
template <int R>
void panel_block(const float* x, int64_t K, const float* panel, const float* bias, float* y, int64_t ldy,
                 int64_t cols, bool prefetch) {
  const __mmask16 m0 = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : static_cast<__mmask16>((1u << (cols - 16)) - 1);
  for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
    __m512 a0[R], a1[R];
    for (int r = 0; r < R; ++r) {
      a0[r] = _mm512_setzero_ps();
      a1[r] = _mm512_setzero_ps();
    }
    for (int64_t k = k0; k < std::min(K, k0 + kChunk); ++k) {
      if (prefetch) {  // the packed panels are contiguous: this runs on into the next ones
        _mm_prefetch(reinterpret_cast<const char*>(panel + k * kPanel + kPrefetchFloats), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(panel + k * kPanel + kPrefetchFloats + 16), _MM_HINT_T0);
      }
      const __m512 w0 = _mm512_load_ps(panel + k * kPanel);
      const __m512 w1 = _mm512_load_ps(panel + k * kPanel + 16);
      for (int r = 0; r < R; ++r) {
        const __m512 xr = _mm512_set1_ps(x[r * K + k]);
        a0[r] = _mm512_fmadd_ps(xr, w0, a0[r]);
        a1[r] = _mm512_fmadd_ps(xr, w1, a1[r]);
      }
    }
    for (int r = 0; r < R; ++r) {  // y = bias + chunk sums, in order
      const float* base = k0 == 0 ? bias : y + r * ldy;
      const __m512 t0 = base ? _mm512_maskz_loadu_ps(m0, base) : _mm512_setzero_ps();
      const __m512 t1 = base ? _mm512_maskz_loadu_ps(m1, base + 16) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(y + r * ldy, m0, _mm512_add_ps(t0, a0[r]));
      _mm512_mask_storeu_ps(y + r * ldy + 16, m1, _mm512_add_ps(t1, a1[r]));
    }
  }
}

using BlockFn = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t, int64_t, bool);

template <int... Rs>
constexpr auto block_table(std::integer_sequence<int, Rs...>) {
  return std::array<BlockFn, sizeof...(Rs)>{panel_block<Rs + 1>...};
}
constexpr auto kBlocks = block_table(std::make_integer_sequence<int, kMaxBlockRows>{});

// x [M, K] float32, panels [P, K, 32] float32 (zero-padded past column n), bias [n] or none.
at::Tensor small_gemm(const at::Tensor& x, const at::Tensor& panels, int64_t n, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "small_gemm: x must be [M, K] float32");
  TORCH_CHECK(panels.dim() == 3 && panels.scalar_type() == at::kFloat && panels.size(2) == kPanel &&
                  panels.size(1) == x.size(1) && panels.size(0) * kPanel >= n && panels.is_contiguous(),
              "small_gemm: panels must be [ceil(n / 32), K, 32] float32, contiguous");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->numel() == n && bias->is_contiguous()),
              "small_gemm: bias must be [n] float32");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(panels.data_ptr()) % 64 == 0, "small_gemm: panels must be 64-byte aligned");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), P = (n + kPanel - 1) / kPanel;
  at::Tensor y = at::empty({M, n}, xc.options());
  if (M == 0 || n == 0) return y;
  if (K == 0) return bias ? bias->expand({M, n}).contiguous() : y.zero_();  // no k-chunk writes y
  const float* xp = xc.data_ptr<float>();
  const float* wp = panels.data_ptr<float>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Row blocks of equal size (16 rows: 8 + 8, not 12 + 4): a thin block does few FMAs per load.
  const int64_t nblocks = (M + kMaxBlockRows - 1) / kMaxBlockRows;
  const int64_t block_rows = (M + nblocks - 1) / nblocks;
  at::parallel_for(0, P, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t col = p * kPanel, cols = std::min(kPanel, n - col);
      for (int64_t row = 0; row < M; row += block_rows) {
        const int64_t rows = std::min(block_rows, M - row);
        const bool prefetch = row == 0 && M > 1;
        kBlocks[rows - 1](xp + row * K, K, wp + p * K * kPanel, bp ? bp + col : nullptr, yp + row * n + col, n, cols,
                          prefetch);
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(minedraft_kernels, m) {
  m.def("small_gemm(Tensor x, Tensor panels, int n, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(minedraft_kernels, CPU, m) {
  m.impl("small_gemm", &small_gemm);
}
