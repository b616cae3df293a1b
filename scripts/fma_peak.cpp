// Probe: one core's peak multiply-add rate, float32 FMA and bfloat16 VDPBF16PS (AVX-512, AVX512-BF16),
// the bound on what each extra row of a verification can cost (docs/BENCHMARKS.md, 2026-12-06).
//   g++ -O2 -march=native scripts/fma_peak.cpp -o /tmp/fma_peak && taskset -c 0 /tmp/fma_peak
#include <immintrin.h>

#include <chrono>
#include <cstdio>

// `madd(acc)` is one instruction doing `per_instruction` multiply-adds; 12 independent accumulators
// hide its latency.
template <typename Madd>
void rate(const char* name, double per_instruction, Madd madd) {
  constexpr long kSteps = 200000000 / 12;
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < kSteps; ++i) {
#pragma GCC unroll 12
    for (auto& a : acc) a = madd(a);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  float sum = 0;  // used, so the loop is not optimized away
  for (auto& a : acc) sum += _mm512_reduce_add_ps(a);
  std::printf("%s: %.1f G multiply-adds/s (%.3g)\n", name, kSteps * 12 * per_instruction / seconds / 1e9, sum);
}

int main() {
  const __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
  const __m512bh xb = _mm512_cvtne2ps_pbh(x, x), yb = _mm512_cvtne2ps_pbh(y, y);
  rate("float32 FMA", 16, [&](__m512 a) { return _mm512_fmadd_ps(x, y, a); });
  rate("bfloat16 VDPBF16PS", 32, [&](__m512 a) { return _mm512_dpbf16_ps(a, xb, yb); });
}
