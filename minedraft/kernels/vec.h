// Sixteen float32 lanes: the one vector type the kernels are written in, whatever the build's
// instruction set. With AVX-512 one register; with AVX2 + FMA + F16C two; elsewhere (ARM, older
// x86, or MINEDRAFT_PORTABLE set by the build) a plain array in loops the compiler vectorizes as
// it can. Products are fused multiply-adds on every path, so a product of rows and weights gives
// the same bits on each; only reductions across lanes (attention's scores) may add in another order.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if !defined(MINEDRAFT_PORTABLE) && defined(__AVX512F__)
#define MINEDRAFT_AVX512 1
#include <immintrin.h>
#elif !defined(MINEDRAFT_PORTABLE) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MINEDRAFT_AVX2 1
#include <immintrin.h>
#endif

namespace vec {

constexpr int64_t kLanes = 16;

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 2); }  // into L2 (x86: prefetcht1)

#if defined(MINEDRAFT_AVX512)

constexpr const char* kIsa = "avx512";
constexpr int kRegisters = 32;  // Vecs the register file holds

struct Vec {
  __m512 v;
};
inline Vec zero() { return {_mm512_setzero_ps()}; }
inline Vec set1(float x) { return {_mm512_set1_ps(x)}; }
inline Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline Vec load(const at::BFloat16* p) {  // a bfloat16 is the top half of a float32
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16))};
}
inline Vec load(const at::Half* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline void store(float* p, Vec x) { _mm512_storeu_ps(p, x.v); }
inline __mmask16 first_lanes(int64_t n) {
  return n >= kLanes ? 0xFFFF : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
}
inline Vec load_first(const float* p, int64_t n) { return {_mm512_maskz_loadu_ps(first_lanes(n), p)}; }  // zeros past n
inline void store_first(float* p, Vec x, int64_t n) { _mm512_mask_storeu_ps(p, first_lanes(n), x.v); }
inline Vec operator+(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vec max(Vec a, Vec b) { return {_mm512_max_ps(a.v, b.v)}; }
inline Vec fmadd(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }    // a b + c
inline Vec fnmadd(Vec a, Vec b, Vec c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }  // c - a b
inline float reduce_add(Vec x) { return _mm512_reduce_add_ps(x.v); }
inline float reduce_max(Vec x) { return _mm512_reduce_max_ps(x.v); }
inline Vec round(Vec x) { return {_mm512_roundscale_ps(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline Vec scale2(Vec p, Vec n) { return {_mm512_scalef_ps(p.v, n.v)}; }  // p 2^n for whole n
// The low and high nibbles of 16 bytes, as floats 0..15.
inline void nibbles(const uint8_t* p, Vec& low, Vec& high) {
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  low = {_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15)))};
  high = {_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4))};
}
inline Vec load(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
// Lane j: the sum of a[j]'s lanes. 30 shuffles and 15 adds, where one horizontal sum per vector
// costs about as many for each.
inline Vec sum_lanes(const Vec (&a)[kLanes]) {
  __m512 b[8], c[4];
  for (int p = 0; p < 8; ++p)  // each 128-bit lane: vectors 2p and 2p + 1, two terms each
    b[p] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * p].v, a[2 * p + 1].v), _mm512_unpackhi_ps(a[2 * p].v, a[2 * p + 1].v));
  for (int p = 0; p < 4; ++p) {  // each 128-bit lane: vectors 4p .. 4p + 3, one term each
    const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b[2 * p]), _mm512_castps_pd(b[2 * p + 1]));
    const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b[2 * p]), _mm512_castps_pd(b[2 * p + 1]));
    c[p] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  }
  // Sum c[p]'s four 128-bit lanes into lane p of the result.
  const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return {_mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(3, 1, 3, 1)))};
}

#elif defined(MINEDRAFT_AVX2)

constexpr const char* kIsa = "avx2";
constexpr int kRegisters = 8;  // 16 ymm registers, two a Vec

struct Vec {
  __m256 lo, hi;  // lanes 0-7, 8-15
};
inline Vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vec set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline Vec load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 widen_bf16(__m128i bits) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)); }
inline Vec load(const at::BFloat16* p) {
  const auto* q = reinterpret_cast<const __m128i*>(p);
  return {widen_bf16(_mm_loadu_si128(q)), widen_bf16(_mm_loadu_si128(q + 1))};
}
inline Vec load(const at::Half* p) {
  const auto* q = reinterpret_cast<const __m128i*>(p);
  return {_mm256_cvtph_ps(_mm_loadu_si128(q)), _mm256_cvtph_ps(_mm_loadu_si128(q + 1))};
}
inline void store(float* p, Vec x) { _mm256_storeu_ps(p, x.lo), _mm256_storeu_ps(p + 8, x.hi); }
inline __m256i first_lanes(int64_t n) {  // all ones in lanes below n
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(n, 0, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline Vec load_first(const float* p, int64_t n) {
  return {_mm256_maskload_ps(p, first_lanes(n)), _mm256_maskload_ps(p + 8, first_lanes(n - 8))};
}
inline void store_first(float* p, Vec x, int64_t n) {
  _mm256_maskstore_ps(p, first_lanes(n), x.lo);
  _mm256_maskstore_ps(p + 8, first_lanes(n - 8), x.hi);
}
inline Vec operator+(Vec a, Vec b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline Vec max(Vec a, Vec b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline Vec fmadd(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline Vec fnmadd(Vec a, Vec b, Vec c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline float lanes_sum(__m256 x) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
inline float reduce_add(Vec x) { return lanes_sum(_mm256_add_ps(x.lo, x.hi)); }
inline float reduce_max(Vec x) {
  const __m256 m = _mm256_max_ps(x.lo, x.hi);
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline Vec round(Vec x) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(x.lo, mode), _mm256_round_ps(x.hi, mode)};
}
inline __m256 pow2(__m256 n) {  // 2^n for whole n in float32's normal range: n + 127 in the exponent bits
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline Vec scale2(Vec p, Vec n) { return {_mm256_mul_ps(p.lo, pow2(n.lo)), _mm256_mul_ps(p.hi, pow2(n.hi))}; }
inline Vec bytes(__m128i q) {  // 16 unsigned bytes as floats
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)))};
}
inline void nibbles(const uint8_t* p, Vec& low, Vec& high) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), mask = _mm_set1_epi8(15);
  low = bytes(_mm_and_si128(q, mask));
  high = bytes(_mm_and_si128(_mm_srli_epi16(q, 4), mask));
}
inline Vec load(const int8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))};
}
// Lane j of the result: the sum of s[j]'s lanes, for eight vectors: pairwise horizontal adds
// leave four sums per 128-bit half, and the halves are then added across.
inline __m256 sum_lanes8(const __m256* s) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(s[4], s[5]), _mm256_hadd_ps(s[6], s[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
inline Vec sum_lanes(const Vec (&a)[kLanes]) {
  __m256 s[kLanes];
  for (int j = 0; j < kLanes; ++j) s[j] = _mm256_add_ps(a[j].lo, a[j].hi);
  return {sum_lanes8(s), sum_lanes8(s + 8)};
}

#else

constexpr const char* kIsa = "portable";
constexpr int kRegisters = 16;

struct Vec {
  float x[kLanes];
};
template <typename F>
inline Vec each(F f) {
  Vec r;
  for (int64_t i = 0; i < kLanes; ++i) r.x[i] = f(i);
  return r;
}
inline Vec zero() { return each([](int64_t) { return 0.0f; }); }
inline Vec set1(float x) { return each([x](int64_t) { return x; }); }
template <typename T>
inline Vec load(const T* p) {  // float32, bfloat16, float16 or int8
  return each([p](int64_t i) { return static_cast<float>(p[i]); });
}
inline void store(float* p, Vec x) { std::memcpy(p, x.x, sizeof(x.x)); }
inline Vec load_first(const float* p, int64_t n) { return each([p, n](int64_t i) { return i < n ? p[i] : 0.0f; }); }
inline void store_first(float* p, Vec x, int64_t n) { std::memcpy(p, x.x, sizeof(float) * std::clamp<int64_t>(n, 0, kLanes)); }
inline Vec operator+(Vec a, Vec b) { return each([&](int64_t i) { return a.x[i] + b.x[i]; }); }
inline Vec operator-(Vec a, Vec b) { return each([&](int64_t i) { return a.x[i] - b.x[i]; }); }
inline Vec operator*(Vec a, Vec b) { return each([&](int64_t i) { return a.x[i] * b.x[i]; }); }
inline Vec max(Vec a, Vec b) { return each([&](int64_t i) { return std::max(a.x[i], b.x[i]); }); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return each([&](int64_t i) { return std::fma(a.x[i], b.x[i], c.x[i]); }); }
inline Vec fnmadd(Vec a, Vec b, Vec c) { return each([&](int64_t i) { return std::fma(-a.x[i], b.x[i], c.x[i]); }); }
inline float reduce_add(Vec x) {
  for (int64_t w = kLanes / 2; w > 0; w /= 2)
    for (int64_t i = 0; i < w; ++i) x.x[i] += x.x[i + w];
  return x.x[0];
}
inline float reduce_max(Vec x) { return *std::max_element(x.x, x.x + kLanes); }
inline Vec round(Vec x) { return each([&](int64_t i) { return std::nearbyint(x.x[i]); }); }
inline Vec scale2(Vec p, Vec n) { return each([&](int64_t i) { return std::ldexp(p.x[i], static_cast<int>(n.x[i])); }); }
inline void nibbles(const uint8_t* p, Vec& low, Vec& high) {
  low = each([p](int64_t i) { return static_cast<float>(p[i] & 15); });
  high = each([p](int64_t i) { return static_cast<float>(p[i] >> 4); });
}
inline Vec sum_lanes(const Vec (&a)[kLanes]) { return each([&](int64_t j) { return reduce_add(a[j]); }); }

#endif

}  // namespace vec
