// Probe: one core's peak multiply-add rate, float32 FMA and bfloat16 VDPBF16PS (AVX-512, AVX512-BF16),
// the bound on what each extra row of a verification can cost (docs/BENCHMARKS.md, 2026-12-06).
//   g++ -O2 -march=native scripts/fma_peak.cpp -o /tmp/fma_peak && taskset -c 0 /tmp/fma_peak
#include <immintrin.h>
#include <chrono>
#include <cstdio>
int main() {
  // 12 independent accumulators per type hide the FMA latency; n iterations each.
  const long n = 200000000;
  __m512 a[12]; for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(0.f);
  const __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n / 12; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) a[j] = _mm512_fmadd_ps(x, y, a[j]);
  }
  auto t1 = std::chrono::steady_clock::now();
  float s = 0; for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(a[i]);
  double sec = std::chrono::duration<double>(t1 - t0).count();
  std::printf("float32 FMA: %.1f G multiply-adds/s (%.3g)\n", (n / 12 * 12) * 16.0 / sec / 1e9, s);
  __m512 b[12]; for (int i = 0; i < 12; ++i) b[i] = _mm512_set1_ps(0.f);
  const __m512bh xb = _mm512_cvtne2ps_pbh(x, x), yb = _mm512_cvtne2ps_pbh(y, y);
  t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n / 12; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) b[j] = _mm512_dpbf16_ps(b[j], xb, yb);
  }
  t1 = std::chrono::steady_clock::now();
  s = 0; for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(b[i]);
  sec = std::chrono::duration<double>(t1 - t0).count();
  std::printf("bfloat16 VDPBF16PS: %.1f G multiply-adds/s (%.3g)\n", (n / 12 * 12) * 32.0 / sec / 1e9, s);
}
