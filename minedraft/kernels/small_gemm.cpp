// y = x @ W + bias for a few rows of x (float32, or bfloat16 where the CPU has AVX512-BF16),
// reading each weight once for all rows, in vec.h's sixteen-lane vectors (AVX-512, AVX2 or
// portable C++).
//
// At decode and verification sizes (1 to 64 rows) the weights are far bigger than the cache, so a
// product costs what streaming them costs, and oneDNN's and MKL's cost well above one pass
// (docs/BENCHMARKS.md). Here W is packed once into panels of 32 columns, [panels, K, 32]
// (minedraft/kernels/small_gemm.py), and each panel is multiplied with every row of x before the
// next one is read: it comes from memory once, and from L1 for the later row blocks (a chunk of it
// at a time).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <array>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace {

using vec::Vec;

constexpr int64_t kPanel = 32;  // columns per panel: two vectors
// 2 accumulators a row + 2 weight vectors + 1 broadcast within the registers: 12 rows with
// AVX-512 (its 32 registers), 2 with AVX2's 16.
constexpr int kMaxBlockRows = std::min(12, (vec::kRegisters - 3) / 2);
// The FMAs hide the loads from the hardware prefetcher, so each k step asks for the weights 32 KB
// ahead, into L2 (T1): on the Xeon that took 8-row products from 1.3-1.6x to 1.1-1.2x the one-row
// time with T0; T1 instead of T0 then saved another 10-17% at 1 to 40 rows (docs/BENCHMARKS.md).
constexpr int64_t kPrefetchBytes = 32768;
constexpr int64_t kChunk = 64;  // k terms summed in registers before they are added to y

// Rows of x past this many are padding (a compiled graph's, set around the call by its caller on
// this thread): their products are skipped and their rows of y are zero. Negative: no limit.
thread_local int64_t row_limit = -1;

void set_row_limit(int64_t limit) { row_limit = limit; }

// What differs between the two element types: how many k terms one lane of a weight vector holds
// and how a row's terms meet them. float32: one term, an FMA. bfloat16: two adjacent terms packed
// in a lane (panels [P, K / 2, 32, 2]), multiplied and summed into float32 by one VDPBF16PS, which
// is twice the float32 FMA's work per instruction, over half the bytes.
struct F32 {
  using T = float;
  static constexpr int kTerms = 1;
  static Vec broadcast(const T* x) { return vec::set1(*x); }
  static Vec madd(Vec acc, Vec x, Vec w) { return vec::fmadd(x, w, acc); }
};

#if defined(MINEDRAFT_AVX512) && defined(__AVX512BF16__)
#define MINEDRAFT_BF16 1
struct BF16 {
  using T = at::BFloat16;
  static constexpr int kTerms = 2;
  static Vec broadcast(const T* x) {  // x[k] and x[k + 1] together, in every lane
    int32_t pair;
    std::memcpy(&pair, x, sizeof(pair));
    return {_mm512_castsi512_ps(_mm512_set1_epi32(pair))};
  }
  static Vec madd(Vec acc, Vec x, Vec w) {
    return {_mm512_dpbf16_ps(acc.v, reinterpret_cast<__m512bh&>(x.v), reinterpret_cast<__m512bh&>(w.v))};
  }
};
#endif

// Where a row block's weights come from, k step by k step (a chunk of one panel, its first term
// at k = 0): `load(k, w0, w1)` gives the chunk's 32 columns at k step k as two vectors, `prefetch(k)`
// asks for bytes a later k step reads (panels: kPrefetchBytes ahead; codes: 512 k steps ahead).
// Packed panels: [kn, 32] of E::T ([kn / 2, 32, 2] in bfloat16), contiguous, so the asking runs on
// into the next panels.
template <typename E>
struct Panels {
  const typename E::T* w;
  void prefetch(int64_t k) const {
    constexpr int64_t ahead = kPrefetchBytes / sizeof(typename E::T);
    vec::prefetch(w + k * kPanel + ahead);
    vec::prefetch(w + k * kPanel + ahead + 16 * E::kTerms);
  }
  void load(int64_t k, Vec& w0, Vec& w1) const {  // (bfloat16: the pairs' bits, as floats)
    w0 = vec::load(reinterpret_cast<const float*>(w + k * kPanel));
    w1 = vec::load(reinterpret_cast<const float*>(w + k * kPanel + 16 * E::kTerms));
  }
};

// A row block's chunk sums (a0[r], a1[r]: columns 0-15 and 16-31 of row r) added to y: to the bias
// first at a panel's first chunk, else to what earlier chunks left there. The last panel's columns
// past n are masked off.
template <int R>
void add_chunk_sums(const Vec* a0, const Vec* a1, bool first, const float* bias, float* y, int64_t ldy,
                    int64_t cols) {
  for (int r = 0; r < R; ++r) {  // y = bias + chunk sums, in order
    const float* base = first ? bias : y + r * ldy;
    const Vec t0 = base ? vec::load_first(base, cols) : vec::zero();
    const Vec t1 = base ? vec::load_first(base + 16, cols - 16) : vec::zero();
    vec::store_first(y + r * ldy, t0 + a0[r], cols);
    vec::store_first(y + r * ldy + 16, t1 + a1[r], cols - 16);
  }
}

// Rows x[0..R) against k terms [0, kn) of one panel chunk (kn <= kChunk, x starting at the chunk's
// first term): 2R float32 accumulators, each weight vector got once per k step, their sums added to
// y (float32, in L1; to the bias first, at the panel's first chunk). Summing K in chunks: with one
// running sum over all of K, SmolLM2's float32 logits were 1.4e-4 off float64's (oneDNN / MKL:
// 6e-5); in chunks, 3.4e-5. The row blocks of a chunk share the asking ahead: block
// `prefetch_phase` of `prefetch_every` asks at that block's turn of the k steps. With the first
// block asking for all of it, products of 16 to 64 rows took 1.1-1.2x as long
// (docs/BENCHMARKS.md): its requests came in bursts, idle while the other blocks ran.
template <typename E, typename Source, int R>
void panel_block(const typename E::T* x, int64_t ldx, int64_t kn, Source w, bool first, const float* bias, float* y,
                 int64_t ldy, int64_t cols, int64_t prefetch_phase, int64_t prefetch_every) {
  Vec a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = vec::zero();
  int64_t turn = prefetch_phase;
  for (int64_t k = 0; k < kn; k += E::kTerms) {
    // (The first test keeps the counter out of a lone block's loop: with it, 5-row products took 4%
    // longer.)
    if (prefetch_every == 1 || turn-- == 0) {
      turn = prefetch_every - 1;
      w.prefetch(k);
    }
    Vec w0, w1;
    w.load(k, w0, w1);
    for (int r = 0; r < R; ++r) {
      const Vec xr = E::broadcast(x + r * ldx + k);
      a0[r] = E::madd(a0[r], xr, w0);
      a1[r] = E::madd(a1[r], xr, w1);
    }
  }
  add_chunk_sums<R>(a0, a1, first, bias, y, ldy, cols);
}

template <typename E, typename Source>
using BlockFn = void (*)(const typename E::T*, int64_t, int64_t, Source, bool, const float*, float*, int64_t, int64_t,
                         int64_t, int64_t);

template <typename E, typename Source, int... Rs>
constexpr auto block_table(std::integer_sequence<int, Rs...>) {
  return std::array<BlockFn<E, Source>, sizeof...(Rs)>{panel_block<E, Source, Rs + 1>...};
}

// The loop every product shares: y [M, n] for x [M, K] (contiguous), panel after panel, each in
// chunks of kChunk k terms, and each chunk (8 KB of float32 panels) meets every row block before the
// next is read, so it comes from L1 after the first; each row's sums come out as they would alone.
// `block(p, k0, kn, row, rows, index, nblocks)` multiplies rows [row, row + rows) (row block `index`
// of `nblocks`) with panel p's terms [k0, k0 + kn).
template <int MaxRows, typename Block>
void for_each_block(int64_t M, int64_t K, int64_t n, Block block) {
  const int64_t P = (n + kPanel - 1) / kPanel;
  // Row blocks of equal size (16 rows: 8 + 8, not 12 + 4): a thin block does few FMAs per load.
  const int64_t nblocks = (M + MaxRows - 1) / MaxRows;
  const int64_t block_rows = (M + nblocks - 1) / nblocks;
  at::parallel_for(0, P, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t kn = std::min(kChunk, K - k0);
        for (int64_t row = 0; row < M; row += block_rows) {
          block(p, k0, kn, row, std::min(block_rows, M - row), row / block_rows, nblocks);
        }
      }
    }
  });
}

// y [M, n] = x [M, K] times the panels: `chunk(p, k0)` gives the source (above) of panel p's terms
// from k0 on, the packed panels themselves or codes it decodes.
template <typename E, typename Chunk>
void multiply(const at::Tensor& x, int64_t n, const float* bp, float* yp, Chunk chunk) {
  using Source = decltype(chunk(int64_t{0}, int64_t{0}));
  static constexpr auto blocks = block_table<E, Source>(std::make_integer_sequence<int, kMaxBlockRows>{});
  const int64_t M = x.size(0), K = x.size(1);
  const auto* xp = reinterpret_cast<const typename E::T*>(x.data_ptr());
  for_each_block<kMaxBlockRows>(M, K, n, [&](int64_t p, int64_t k0, int64_t kn, int64_t row, int64_t rows,
                                             int64_t index, int64_t nblocks) {
    const int64_t col = p * kPanel;
    blocks[rows - 1](xp + row * K + k0, K, kn, chunk(p, k0), k0 == 0, bp ? bp + col : nullptr, yp + row * n + col, n,
                     std::min(kPanel, n - col), index, nblocks);
  });
}

// Weights stored as block codes: each column's weights, in blocks of 32 k terms, are exactly
// d * q + m (GGUF's Q4_1: q in 0..15, d and m float16) or d * q (Q8_0: q in -128..127), the values
// a GGUF file's float32 conversion holds. Decoding gives those float32 values bit for bit (d * q is
// exact in float32, so one rounding of + m either way), at 0.625 or 1.125 bytes a weight rather than
// 4: a one-row product then streams a sixth of the bytes. Panel p's codes are [K, 16] bytes (byte j:
// column j in the low nibble, column j + 16 in the high one) or [K, 32] int8; its scales
// [K / 32, 2 or 1, 32] float16 (d, then m). These sources decode a chunk's weights in registers, k
// step by k step, as the FMAs take them (kChunk is a whole number of blocks: a chunk starts on one).
struct Q4_1 {
  const uint8_t* codes;    // the chunk's first term's
  const at::Half* scales;  // its first block's
  Vec d0, d1, m0, m1;      // the block's
  void prefetch(int64_t k) const {
    if (k % 4 == 0) vec::prefetch(codes + k * 16 + kPrefetchBytes / 4);
  }
  void load(int64_t k, Vec& w0, Vec& w1) {
    if (k % 32 == 0) {
      const at::Half* s = scales + k / 32 * 64;
      d0 = vec::load(s), d1 = vec::load(s + 16), m0 = vec::load(s + 32), m1 = vec::load(s + 48);
    }
    Vec low, high;
    vec::nibbles(codes + k * 16, low, high);
    w0 = vec::fmadd(d0, low, m0);
    w1 = vec::fmadd(d1, high, m1);
  }
};

struct Q8_0 {
  const int8_t* codes;
  const at::Half* scales;
  Vec d0, d1;
  void prefetch(int64_t k) const {
    if (k % 2 == 0) vec::prefetch(codes + k * 32 + kPrefetchBytes / 2);
  }
  void load(int64_t k, Vec& w0, Vec& w1) {
    if (k % 32 == 0) d0 = vec::load(scales + k / 32 * 32), d1 = vec::load(scales + k / 32 * 32 + 16);
    w0 = d0 * vec::load(codes + k * 32);
    w1 = d1 * vec::load(codes + k * 32 + 16);
  }
};

#ifdef MINEDRAFT_BF16
inline __m512 halves(const at::Half* h) { return vec::load(h).v; }  // 16 float16 values as float32

// bfloat16 rows against Q4_1 codes. Decoding each weight to float32 and rounding it would cost more
// than the float32 kernel's decoding; instead each block's sum is split as
//   sum_k (d q_k + m) x_k = d * sum_k (128 + q_k) x_k + (m - 128 d) * sum_k x_k,
// where 128 + q_k is a bfloat16 whose bits are 0x4300 | q_k (one OR, no conversion), multiplied by
// the row's bfloat16 terms in the CPU's bfloat16 dot product (two k terms a lane), and sum_k x_k is
// the row's block sum, once per product (`block_sums`). The weights are the codes' exact values, not
// bfloat16 roundings of them. Codes for this: [P, K / 2, 32] uint8, byte 2j + t of pair h holding
// k = 2h + t of column j (low nibble) and column j + 16 (high nibble), so that one byte-to-word
// widening puts each column's two terms side by side in a lane.
constexpr int kMaxCodedBF16Rows = 6;  // 4 accumulators a row + 6 registers of codes and terms <= 32

template <int R>
void q4_bf16_block(const at::BFloat16* x, int64_t ldx, const float* xsum, int64_t ldxs, int64_t kn,
                   const uint8_t* codes, const at::Half* scales, bool first, const float* bias, float* y, int64_t ldy,
                   int64_t cols) {
  const __m512i low = _mm512_set1_epi16(0x000F), b128 = _mm512_set1_epi16(0x4300);
  Vec t0[R], t1[R];
  for (int r = 0; r < R; ++r) t0[r] = t1[r] = vec::zero();
  for (int64_t b = 0; b < kn / 32; ++b) {
    Vec s0[R], s1[R];
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = vec::zero();
    const uint8_t* c = codes + b * 32 * 16;
    for (int h = 0; h < 16; ++h) {
      if (h % 2 == 0) vec::prefetch(c + h * 32 + kPrefetchBytes / 4);
      const __m512i q = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + h * 32)));
      const __m512i w0 = _mm512_ternarylogic_epi32(q, low, b128, 0xEA);  // (q & 15) | 0x4300
      const __m512i w1 = _mm512_or_si512(_mm512_srli_epi16(q, 4), b128);
      for (int r = 0; r < R; ++r) {
        const Vec xr = BF16::broadcast(x + r * ldx + b * 32 + 2 * h);
        s0[r] = BF16::madd(s0[r], xr, Vec{_mm512_castsi512_ps(w0)});
        s1[r] = BF16::madd(s1[r], xr, Vec{_mm512_castsi512_ps(w1)});
      }
    }
    const at::Half* sc = scales + b * 64;
    const __m512 d0 = halves(sc), d1 = halves(sc + 16), minus128 = _mm512_set1_ps(-128.f);
    const __m512 m0 = _mm512_fmadd_ps(minus128, d0, halves(sc + 32));
    const __m512 m1 = _mm512_fmadd_ps(minus128, d1, halves(sc + 48));
    for (int r = 0; r < R; ++r) {
      const __m512 xs = _mm512_set1_ps(xsum[r * ldxs + b]);
      t0[r].v = _mm512_fmadd_ps(d0, s0[r].v, _mm512_fmadd_ps(m0, xs, t0[r].v));
      t1[r].v = _mm512_fmadd_ps(d1, s1[r].v, _mm512_fmadd_ps(m1, xs, t1[r].v));
    }
  }
  add_chunk_sums<R>(t0, t1, first, bias, y, ldy, cols);
}

using CodedBF16Fn = void (*)(const at::BFloat16*, int64_t, const float*, int64_t, int64_t, const uint8_t*,
                             const at::Half*, bool, const float*, float*, int64_t, int64_t);

template <int... Rs>
constexpr auto coded_bf16_table(std::integer_sequence<int, Rs...>) {
  return std::array<CodedBF16Fn, sizeof...(Rs)>{q4_bf16_block<Rs + 1>...};
}

// Each row's sums over its blocks of 32 terms, [M, K / 32] float32.
std::vector<float> block_sums(const at::BFloat16* x, int64_t M, int64_t K) {
  std::vector<float> sums(M * (K / 32));
  for (int64_t i = 0; i < M * (K / 32); ++i) {
    const __m256i* v = reinterpret_cast<const __m256i*>(x + i * 32);
    const __m512 lo = _mm512_cvtpbh_ps(reinterpret_cast<__m256bh>(_mm256_loadu_si256(v)));
    const __m512 hi = _mm512_cvtpbh_ps(reinterpret_cast<__m256bh>(_mm256_loadu_si256(v + 1)));
    sums[i] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
  }
  return sums;
}

void multiply_q4_bf16(const at::Tensor& x, const uint8_t* codes, const at::Half* scales, int64_t n, const float* bp,
                      float* yp) {
  static constexpr auto blocks = coded_bf16_table(std::make_integer_sequence<int, kMaxCodedBF16Rows>{});
  const int64_t M = x.size(0), K = x.size(1);
  const auto* xp = reinterpret_cast<const at::BFloat16*>(x.data_ptr());
  const std::vector<float> sums = block_sums(xp, M, K);
  for_each_block<kMaxCodedBF16Rows>(M, K, n, [&](int64_t p, int64_t k0, int64_t kn, int64_t row, int64_t rows,
                                                 int64_t, int64_t) {
    const int64_t col = p * kPanel;
    blocks[rows - 1](xp + row * K + k0, K, sums.data() + row * (K / 32) + k0 / 32, K / 32, kn,
                     codes + (p * K + k0) * 16, scales + (p * K + k0) / 32 * 64, k0 == 0, bp ? bp + col : nullptr,
                     yp + row * n + col, n, std::min(kPanel, n - col));
  });
}
#endif

std::string isa() { return vec::kIsa; }

bool bf16_supported() {
#ifdef MINEDRAFT_BF16
  return true;
#else
  return false;
#endif
}

// y [M, n] float32 for x [M, K] and a bias of x's type or none: `product(x, bias, y)` fills it for
// the rows below the row limit (the rest stay zero).
template <typename Product>
at::Tensor rows_within_limit(const at::Tensor& x, int64_t n, const std::optional<at::Tensor>& bias, Product product) {
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t rows = row_limit < 0 ? M : std::min(M, row_limit);  // the rest: zeros
  const auto f32 = x.options().dtype(at::kFloat);
  if (K == 0 || rows == 0 || n == 0) {  // no k chunk writes y
    at::Tensor y = at::zeros({M, n}, f32);
    if (bias) y.slice(0, 0, rows) += *bias;
    return y;
  }
  at::Tensor y = rows < M ? at::zeros({M, n}, f32) : at::empty({M, n}, f32);
  const std::optional<at::Tensor> b32 = bias ? std::optional<at::Tensor>(bias->to(at::kFloat)) : std::nullopt;
  product(x.slice(0, 0, rows).contiguous(), b32 ? b32->data_ptr<float>() : nullptr, y.data_ptr<float>());
  return y;
}

void check_bias(const char* op, const at::Tensor& x, int64_t n, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(!bias || (bias->scalar_type() == x.scalar_type() && bias->numel() == n && bias->is_contiguous()), op,
              ": bias must be [n] of x's type");
}

// x [M, K] float32 or bfloat16, panels [ceil(n / 32), K, 32] of x's type (zero-padded past column
// n; bfloat16: K even, k pairs side by side), bias [n] of x's type or none. y has x's type; a
// bfloat16 y is the float32 sum rounded once, as oneDNN's bfloat16 products give it.
at::Tensor small_gemm(const at::Tensor& x, const at::Tensor& panels, int64_t n, const std::optional<at::Tensor>& bias) {
  const auto type = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && (type == at::kFloat || (type == at::kBFloat16 && bf16_supported())),
              "small_gemm: x must be [M, K] float32 (or bfloat16 on a CPU with AVX512-BF16)");
  TORCH_CHECK(panels.dim() == 3 && panels.scalar_type() == type && panels.size(2) == kPanel &&
                  panels.size(1) == x.size(1) && panels.size(0) * kPanel >= n && panels.is_contiguous(),
              "small_gemm: panels must be [ceil(n / 32), K, 32] of x's type, contiguous");
  TORCH_CHECK(type == at::kFloat || x.size(1) % 2 == 0, "small_gemm: bfloat16 needs an even K");
  check_bias("small_gemm", x, n, bias);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(panels.data_ptr()) % 64 == 0, "small_gemm: panels must be 64-byte aligned");
  const int64_t panel_size = x.size(1) * kPanel;
  if (type == at::kFloat) {
    const float* wp = panels.data_ptr<float>();
    return rows_within_limit(x, n, bias, [&](const at::Tensor& xc, const float* bp, float* yp) {
      multiply<F32>(xc, n, bp, yp, [&](int64_t p, int64_t k0) {
        return Panels<F32>{wp + p * panel_size + k0 * kPanel};
      });
    });
  }
  const auto* wp = reinterpret_cast<const at::BFloat16*>(panels.data_ptr());
  return rows_within_limit(x, n, bias, [&](const at::Tensor& xc, const float* bp, float* yp) {
#ifdef MINEDRAFT_BF16
    multiply<BF16>(xc, n, bp, yp, [&](int64_t p, int64_t k0) {
      return Panels<BF16>{wp + p * panel_size + k0 * kPanel};
    });
#endif
  }).to(at::kBFloat16);
}

// x [M, K] float32 or bfloat16 (K a multiple of 32) times weights stored as block codes (above):
// codes [ceil(n / 32), K, 16] uint8 (Q4_1) or [ceil(n / 32), K, 32] int8 (Q8_0), scales
// [ceil(n / 32), K / 32, 2 or 1, 32] float16; bias [n] of x's type or none. y has x's type. For
// bfloat16 x (on a CPU with AVX512-BF16): Q4_1 only, its codes in pairs ([P, K / 2, 32], above),
// and y is the float32 sum rounded once.
at::Tensor coded_gemm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, int64_t n,
                      const std::optional<at::Tensor>& bias) {
  const auto type = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && (type == at::kFloat || (type == at::kBFloat16 && bf16_supported())) &&
                  x.size(1) % 32 == 0,
              "coded_gemm: x must be [M, K] float32 (or bfloat16 on a CPU with AVX512-BF16) with K a multiple of 32");
  const int64_t K = x.size(1), P = codes.size(0);
  const bool q4 = codes.scalar_type() == at::kByte;
  TORCH_CHECK(codes.dim() == 3 && (q4 || codes.scalar_type() == at::kChar) && codes.size(1) == K &&
                  codes.size(2) == (q4 ? 16 : 32) && P * kPanel >= n && codes.is_contiguous(),
              "coded_gemm: codes must be [ceil(n / 32), K, 16] uint8 or [ceil(n / 32), K, 32] int8, contiguous");
  TORCH_CHECK(type == at::kFloat || q4, "coded_gemm: bfloat16 rows need Q4_1 codes");
  TORCH_CHECK(scales.dim() == 4 && scales.scalar_type() == at::kHalf && scales.size(0) == P &&
                  scales.size(1) == K / 32 && scales.size(2) == (q4 ? 2 : 1) && scales.size(3) == kPanel &&
                  scales.is_contiguous(),
              "coded_gemm: scales must be [ceil(n / 32), K / 32, 2 (Q4_1) or 1 (Q8_0), 32] float16, contiguous");
  check_bias("coded_gemm", x, n, bias);
  const auto* sp = scales.data_ptr<at::Half>();
  const int64_t scale_size = K / 32 * scales.size(2) * kPanel;
  if (type == at::kBFloat16) {
    const uint8_t* cp = codes.data_ptr<uint8_t>();
    return rows_within_limit(x, n, bias, [&](const at::Tensor& xc, const float* bp, float* yp) {
#ifdef MINEDRAFT_BF16
      multiply_q4_bf16(xc, cp, sp, n, bp, yp);
#endif
    }).to(at::kBFloat16);
  }
  return rows_within_limit(x, n, bias, [&](const at::Tensor& xc, const float* bp, float* yp) {
    if (q4) {
      const uint8_t* cp = codes.data_ptr<uint8_t>();
      multiply<F32>(xc, n, bp, yp, [&](int64_t p, int64_t k0) {
        return Q4_1{cp + (p * K + k0) * 16, sp + p * scale_size + k0 / 32 * 64};
      });
    } else {
      const int8_t* cp = codes.data_ptr<int8_t>();
      multiply<F32>(xc, n, bp, yp, [&](int64_t p, int64_t k0) {
        return Q8_0{cp + (p * K + k0) * 32, sp + p * scale_size + k0 / 32 * 32};
      });
    }
  });
}

}  // namespace

MINEDRAFT_LIBRARY(MINEDRAFT_OPS, m) {
  m.def("isa() -> str", &isa);
  m.def("small_gemm(Tensor x, Tensor panels, int n, Tensor? bias) -> Tensor");
  m.def("coded_gemm(Tensor x, Tensor codes, Tensor scales, int n, Tensor? bias) -> Tensor");
  m.def("bf16_supported() -> bool", &bf16_supported);
  m.def("set_row_limit(int limit) -> ()", &set_row_limit);
}

MINEDRAFT_LIBRARY_IMPL(MINEDRAFT_OPS, CPU, m) {
  m.impl("small_gemm", &small_gemm);
  m.impl("coded_gemm", &coded_gemm);
}
