// Attention of a few new tokens per row over the KV cache (float32 or bfloat16, AVX-512).
//
// A decode step or a verification brings 1 to a few queries per row, each over a few hundred
// cached keys: a few thousand multiply-adds per head, which PyTorch's attention (flash attention
// on CPU) wraps in more fixed cost per call (1.2-2.4x this kernel's time on SmolLM2's layers,
// docs/BENCHMARKS.md). This writes the new keys and values into the cache and attends each query
// over its row's prefix in one call for the whole batch: one pass over each key and value per
// query head, float32 sums, a row's bits independent of the other rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kMaxHeadDim = 256;  // the output accumulators stay in registers

inline __m512 load(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load(const at::BFloat16* p) {  // a bfloat16 is the top half of a float32
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline void store(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store(at::BFloat16* p, __m512 x) {
  alignas(64) float tmp[kLanes];
  _mm512_store_ps(tmp, x);
  for (int64_t i = 0; i < kLanes; ++i) p[i] = at::BFloat16(tmp[i]);  // round to nearest even
}

// e^x for x <= 0 (scores less their maximum), to about 1e-7 relative: x = (n + f) ln 2 with n an
// integer and |f| <= 1/2, e^(f ln 2) by its Taylor series to degree 7 (the rest is below 1e-9),
// times 2^n. Sixteen at a time: with std::exp a call took 1.3-1.5x as long (docs/BENCHMARKS.md).
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));  // e^-87 is about float32's smallest normal
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  const __m512 y = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147181f), x);  // (f ln 2), |y| <= 0.35
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// One query head of one token: out = softmax(q . K[0..n) * scale) V[0..n), K and V [n, D].
template <typename T>
void attend_one(const T* q, const T* K, const T* V, int64_t n, int64_t D, float scale, float* scores, T* out) {
  const int64_t chunks = D / kLanes;
  __m512 qv[kMaxHeadDim / kLanes];
  for (int64_t c = 0; c < chunks; ++c) qv[c] = _mm512_mul_ps(load(q + c * kLanes), _mm512_set1_ps(scale));
  float top = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    __m512 acc = _mm512_mul_ps(qv[0], load(K + j * D));
    for (int64_t c = 1; c < chunks; ++c) acc = _mm512_fmadd_ps(qv[c], load(K + j * D + c * kLanes), acc);
    scores[j] = _mm512_reduce_add_ps(acc);
    top = std::max(top, scores[j]);
  }
  __m512 sums = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += kLanes) {
    const __mmask16 m = n - j >= kLanes ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + j), _mm512_set1_ps(top)));
    _mm512_mask_storeu_ps(scores + j, m, e);
    sums = _mm512_add_ps(sums, _mm512_maskz_mov_ps(m, e));
  }
  const float total = _mm512_reduce_add_ps(sums);
  __m512 acc[kMaxHeadDim / kLanes];
  for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m512 w = _mm512_set1_ps(scores[j]);
    for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_fmadd_ps(w, load(V + j * D + c * kLanes), acc[c]);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / total);
  for (int64_t c = 0; c < chunks; ++c) store(out + c * kLanes, _mm512_mul_ps(acc[c], inv));
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
         const int64_t* rows, int64_t B, at::Tensor& out) {
  const int64_t H = q.size(1), D = q.size(2), Hkv = k.size(1), L = k_cache.size(2), group = H / Hkv;
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* kc = k_cache.data_ptr<T>();
  T* vc = v_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  std::vector<int64_t> first(B + 1, 0);  // each row's first token among the packed new ones
  for (int64_t b = 0; b < B; ++b) first[b + 1] = first[b] + rows[b * 3 + 2];
  for (int64_t b = 0; b < B; ++b) {  // the new keys and values go in first: a query sees its own
    const int64_t slot = rows[b * 3], start = rows[b * 3 + 1];
    for (int64_t i = 0; i < rows[b * 3 + 2]; ++i)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t src = ((first[b] + i) * Hkv + h) * D, dst = ((slot * Hkv + h) * L + start + i) * D;
        std::copy(kp + src, kp + src + D, kc + dst);
        std::copy(vp + src, vp + src + D, vc + dst);
      }
  }
  int64_t longest = 0;  // keys of the longest row: what a query's scores need at most
  for (int64_t b = 0; b < B; ++b) longest = std::max(longest, rows[b * 3 + 1] + rows[b * 3 + 2]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(longest);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, slot = rows[b * 3], start = rows[b * 3 + 1];
      const T* K = kc + (slot * Hkv + h / group) * L * D;
      const T* V = vc + (slot * Hkv + h / group) * L * D;
      for (int64_t i = 0; i < rows[b * 3 + 2]; ++i) {  // causal: the token at start + i sees keys 0..start + i
        const int64_t t = first[b] + i;
        attend_one(qp + (t * H + h) * D, K, V, start + i + 1, D, scale, scores.data(), op + (t * H + h) * D);
      }
    }
  });
}

// q [N', H, D], k and v [N', Hkv, D] (the first N rows real, N = the rows' new tokens in all, row
// after row), k_cache and v_cache one layer's [slots, Hkv, max_len, D], rows [B, 3] int64: slot,
// tokens cached before this step, new tokens. Returns [N', H * D], zero past N.
at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor k_cache,
                            at::Tensor v_cache, const at::Tensor& rows) {
  const auto type = q.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16, "cached_attention: float32 or bfloat16");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && k.size(0) == q.size(0) &&
                  k.size(2) == q.size(2) && q.size(1) % k.size(1) == 0,
              "cached_attention: q [N, H, D], k and v [N, Hkv, D] with H a multiple of Hkv");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.size(1) == k.size(1) &&
                  k_cache.size(3) == q.size(2) && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "cached_attention: caches [slots, Hkv, max_len, D], contiguous");
  TORCH_CHECK(k.scalar_type() == type && v.scalar_type() == type && k_cache.scalar_type() == type &&
                  v_cache.scalar_type() == type, "cached_attention: one dtype for q, k, v and the caches");
  const int64_t D = q.size(2);
  TORCH_CHECK(D % kLanes == 0 && D <= kMaxHeadDim, "cached_attention: head_dim a multiple of 16, at most 256");
  TORCH_CHECK(rows.dim() == 2 && rows.size(1) == 3 && rows.scalar_type() == at::kLong, "cached_attention: rows [B, 3] int64");
  const at::Tensor r = rows.contiguous();
  const int64_t* rp = r.data_ptr<int64_t>();
  const int64_t B = r.size(0), S = k_cache.size(0), L = k_cache.size(2);
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(rp[b * 3] >= 0 && rp[b * 3] < S && rp[b * 3 + 1] >= 0 && rp[b * 3 + 2] > 0 &&
                    rp[b * 3 + 1] + rp[b * 3 + 2] <= L, "cached_attention: a row outside the cache");
    n += rp[b * 3 + 2];
  }
  TORCH_CHECK(n <= q.size(0), "cached_attention: the rows hold more tokens than q");
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  at::Tensor out = at::zeros({q.size(0), q.size(1), D}, q.options());
  if (type == at::kFloat)
    run<float>(qc, kc, vc, k_cache, v_cache, rp, B, out);
  else
    run<at::BFloat16>(qc, kc, vc, k_cache, v_cache, rp, B, out);
  return out.view({q.size(0), q.size(1) * D});
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minedraft_kernels, m) {
  m.def("cached_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(minedraft_kernels, CPU, m) {
  m.impl("cached_attention", &cached_attention);
}
