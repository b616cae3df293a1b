// Attention of a few new tokens per row over the KV cache (float32 or bfloat16), in vec.h's
// sixteen-lane vectors (AVX-512, AVX2 or portable C++).
//
// A decode step or a verification brings 1 to a few queries per row, each over a few hundred
// cached keys: a few thousand multiply-adds per head, which PyTorch's attention (flash attention
// on CPU) wraps in more fixed cost per call (1.2-2.4x this kernel's time on SmolLM2's layers,
// docs/BENCHMARKS.md). This writes the new keys and values into the cache and attends each query
// over its row's prefix in one call for the whole batch. The queries of a row's tokens and of the
// heads sharing one key-value head are taken together, so each key and value comes from memory
// once per row, not once per query (a verification of 5 tokens with 3 heads a group used to read
// them 15 times); float32 sums; a query's bits depend on neither the other rows nor its row's
// other queries.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace {

using vec::kLanes;
using vec::Vec;

constexpr int64_t kMaxHeadDim = 256;
// Keys (and values) every query of a row takes before the next tile is read: 16 KB of float32
// keys at D = 64, in L1 while the row's queries use them.
constexpr int64_t kTile = 64;

inline void put(float* p, Vec x) { vec::store(p, x); }
inline void put(at::BFloat16* p, Vec x) {
  float tmp[kLanes];
  vec::store(tmp, x);
  for (int64_t i = 0; i < kLanes; ++i) p[i] = at::BFloat16(tmp[i]);  // round to nearest even
}

// e^x for x <= 0 (scores less their maximum), to about 1e-7 relative: x = (n + f) ln 2 with n an
// integer and |f| <= 1/2, e^(f ln 2) by its Taylor series to degree 7 (the rest is below 1e-9),
// times 2^n. Sixteen at a time: with std::exp a call took 1.3-1.5x as long (docs/BENCHMARKS.md).
inline Vec exp_nonpositive(Vec x) {
  x = vec::max(x, vec::set1(-87.0f));  // e^-87 is about float32's smallest normal
  const Vec n = vec::round(x * vec::set1(1.44269504f));
  const Vec y = vec::fnmadd(n, vec::set1(0.693147181f), x);  // (f ln 2), |y| <= 0.35
  Vec p = vec::set1(1.0f / 5040);
  for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = vec::fmadd(p, y, vec::set1(c));
  return vec::scale2(p, n);
}

// Asks for a row of D values ahead of its use, into L2. Measured with scripts/kernel_ab.py
// (docs/BENCHMARKS.md, 2026-12-03 review): without these requests, two of three runs timed the
// same and the third 1.02x (decode step) to 1.04x (verification) as long. Probes outside the
// repository, under load, had read far more (0.81 -> 0.61 ms a layer); that did not reproduce.
template <typename T>
inline void prefetch_row(const T* row, int64_t D) {
  for (int64_t i = 0; i < D; i += 64 / static_cast<int64_t>(sizeof(T)))
    vec::prefetch(row + i);
}

// Rows to ask for while a tile of keys is scored: keys [kTile, kTile + keys) and values [0, values)
// from the tile's start, the rows one tile ahead of the keys and beside them.
struct Asks {
  int64_t keys = 0, values = 0;
  Asks from(int64_t j) const { return {keys - j, values - j}; }
  template <typename T>
  void row(const T* K, const T* V, int64_t j, int64_t D) const {  // the rows beside key j
    if (j < keys) prefetch_row(K + (kTile + j) * D, D);
    if (j < values) prefetch_row(V + j * D, D);
  }
};

// Scores of sixteen keys in a row, K [16, C * 16], for a query held in registers, asking for the
// rows `asks` names beside each key: sixteen vectors of partial dot products (key j's spread over
// the lanes), summed lane-wise into one vector of scores, key j in lane j.
template <typename T, int C>
inline Vec block_scores(const Vec (&qv)[C], const T* K, const T* V, Asks asks) {
  Vec a[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    asks.row(K, V, j, C * kLanes);
    Vec acc = qv[0] * vec::load(K + j * C * kLanes);
    for (int c = 1; c < C; ++c) acc = vec::fmadd(qv[c], vec::load(K + (j * C + c) * kLanes), acc);
    a[j] = acc;
  }
  return vec::sum_lanes(a);
}

// scores[0..n) = (q . K[j]) for one query already scaled (qs, float32 [C * 16]), K [n, C * 16],
// n <= kTile, asking for the rows `asks` names. The query stays in registers (C vectors) while
// keys stream past, sixteen at a time; the last few keys are copied after zeros, so that no read
// goes past key n.
template <typename T, int C>
void query_scores(const float* qs, const T* K, const T* V, int64_t n, float* scores, Asks asks) {
  Vec qv[C];
  for (int c = 0; c < C; ++c) qv[c] = vec::load(qs + c * kLanes);
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t j0 = 0; j0 < whole; j0 += kLanes)
    vec::store(scores + j0, block_scores<T, C>(qv, K + j0 * C * kLanes, V + j0 * C * kLanes, asks.from(j0)));
  if (whole < n) {
    alignas(64) T tail[kLanes * C * kLanes] = {};
    std::copy(K + whole * C * kLanes, K + n * C * kLanes, tail);
    vec::store(scores + whole, block_scores<T, C>(qv, tail, tail, Asks{}));  // scores has room for whole blocks
    for (int64_t j = whole; j < std::max(asks.keys, asks.values); ++j) asks.row(K, V, j, C * kLanes);
  }
}

template <typename T>
using ScoresFn = void (*)(const float*, const T*, const T*, int64_t, float*, Asks);

template <typename T, int... Cs>
constexpr auto scores_table(std::integer_sequence<int, Cs...>) {
  return std::array<ScoresFn<T>, sizeof...(Cs)>{query_scores<T, Cs + 1>...};
}

// sums[r] += sum_j p[r][j] V[j] over keys [j0, j0 + n) for R queries sharing one head's values,
// V [keys, D], asking for the first `ahead` rows of `next` beside the first slice: each value
// vector is loaded once for the R queries, one 16-lane slice of D at a time. p[r][j] is zero past
// query r's keys, so every query runs over the same keys, and its sums (one running sum per lane,
// key after key) do not depend on which other queries share the call.
template <typename T, int R>
void weigh_values(const float* const* p, const T* V, int64_t j0, int64_t n, int64_t D, float* const* sums,
                  const T* next, int64_t ahead) {
  for (int64_t c = 0; c < D; c += kLanes) {
    Vec acc[R];
    for (int r = 0; r < R; ++r) acc[r] = vec::load(sums[r] + c);
    for (int64_t j = j0; j < j0 + n; ++j) {
      if (c == 0 && j - j0 < ahead) prefetch_row(next + (j - j0) * D, D);
      const Vec v = vec::load(V + j * D + c);
      for (int r = 0; r < R; ++r) acc[r] = vec::fmadd(vec::set1(p[r][j]), v, acc[r]);
    }
    for (int r = 0; r < R; ++r) vec::store(sums[r] + c, acc[r]);
  }
}

// Accumulators, a value vector and the weights' broadcasts within the registers: 8 with AVX-512, 6 with AVX2.
constexpr int kMaxValueQueries = std::min(8, vec::kRegisters - 2);

template <typename T>
using ValuesFn = void (*)(const float* const*, const T*, int64_t, int64_t, int64_t, float* const*, const T*, int64_t);

template <typename T, int... Rs>
constexpr auto values_table(std::integer_sequence<int, Rs...>) {
  return std::array<ValuesFn<T>, sizeof...(Rs)>{weigh_values<T, Rs + 1>...};
}

// p[0..limit) = e^(s - max) of the scores in place, zero from limit to n; returns their sum.
inline float exponentiate(float* p, int64_t limit, int64_t n) {
  // The scores past limit were written (whole blocks of keys) but are not this query's: the maximum
  // is taken over the first `limit`, and their exponentials are zeroed before they are summed.
  float top = -INFINITY;
  for (int64_t j = 0; j + kLanes <= limit; j += kLanes) top = std::max(top, vec::reduce_max(vec::load(p + j)));
  for (int64_t j = limit / kLanes * kLanes; j < limit; ++j) top = std::max(top, p[j]);
  Vec sums = vec::zero();
  for (int64_t j = 0; j < limit; j += kLanes) {
    const Vec e = exp_nonpositive(vec::load_first(p + j, limit - j) - vec::set1(top));
    vec::store_first(p + j, e, limit - j);
    sums = sums + vec::load_first(p + j, limit - j);
  }
  std::fill(p + limit, p + n, 0.0f);
  return vec::reduce_add(sums);
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
  int64_t longest = 0, most = 0;  // keys of the longest row, queries of the row with most tokens
  for (int64_t b = 0; b < B; ++b) {
    longest = std::max(longest, rows[b * 3 + 1] + rows[b * 3 + 2]);
    most = std::max(most, rows[b * 3 + 2] * group);
  }
  const int64_t stride = (longest + kLanes - 1) / kLanes * kLanes;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  static constexpr auto scorers = scores_table<T>(std::make_integer_sequence<int, kMaxHeadDim / kLanes>{});
  static constexpr auto weighers = values_table<T>(std::make_integer_sequence<int, kMaxValueQueries>{});
  // One task per row and key-value head: the row's queries of every head sharing those keys and
  // values (its tokens x the group). Keys and values are taken a tile at a time, and every query
  // uses a tile before the next is read, so each comes from memory once per row and from L1 after.
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(most * stride), scaled(most * D), sums(most * D), totals(most);
    std::vector<const float*> weights(most);
    std::vector<float*> accumulators(most);
    std::vector<int64_t> limits(most);
    const auto keys = [&](int64_t task) { return kc + (rows[task / Hkv * 3] * Hkv + task % Hkv) * L * D; };
    const auto length = [&](int64_t task) { return rows[task / Hkv * 3 + 1] + rows[task / Hkv * 3 + 2]; };
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / Hkv, g = task % Hkv, start = rows[b * 3 + 1];
      const int64_t queries = rows[b * 3 + 2] * group, n = length(task);
      const T* K = keys(task);
      const T* V = vc + (K - kc);
      // Query r: token r / group of the row, head g * group + r % group.
      const auto at = [&](int64_t r) { return ((first[b] + r / group) * H + g * group + r % group) * D; };
      for (int64_t r = 0; r < queries; ++r) {
        const T* qr = qp + at(r);
        for (int64_t d = 0; d < D; ++d) scaled[r * D + d] = static_cast<float>(qr[d]) * scale;
        limits[r] = start + r / group + 1;  // causal: keys 0..start + token
        weights[r] = scores.data() + r * stride;
        accumulators[r] = sums.data() + r * D;
      }
      for (int64_t t0 = 0; t0 < n; t0 += kTile) {
        // The first query to use a tile asks for the next tile's keys and for this tile's values.
        Asks asks{std::clamp<int64_t>(n - t0 - kTile, 0, kTile), std::min(kTile, n - t0)};
        for (int64_t r = 0; r < queries; ++r)
          if (limits[r] > t0) {
            scorers[D / kLanes - 1](scaled.data() + r * D, K + t0 * D, V + t0 * D, std::min(kTile, limits[r] - t0),
                                    scores.data() + r * stride + t0, asks);
            asks = Asks{};
          }
      }
      for (int64_t r = 0; r < queries; ++r) totals[r] = exponentiate(scores.data() + r * stride, limits[r], n);
      std::fill(sums.begin(), sums.begin() + queries * D, 0.0f);
      // While the values are weighed, the next task's first keys are asked for.
      const T* next = task + 1 < end ? keys(task + 1) : nullptr;
      const int64_t ahead = next ? std::min(kTile, length(task + 1)) : 0;
      for (int64_t t0 = 0; t0 < n; t0 += kTile)
        for (int64_t r = 0; r < queries; r += kMaxValueQueries)
          weighers[std::min<int64_t>(kMaxValueQueries, queries - r) - 1](
              weights.data() + r, V, t0, std::min(kTile, n - t0), D, accumulators.data() + r, next,
              r == 0 && t0 == 0 ? ahead : 0);
      for (int64_t r = 0; r < queries; ++r) {
        T* out = op + at(r);
        const Vec inv = vec::set1(1.0f / totals[r]);
        for (int64_t c = 0; c < D; c += kLanes) put(out + c, vec::load(accumulators[r] + c) * inv);
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

MINEDRAFT_LIBRARY_FRAGMENT(MINEDRAFT_OPS, m) {
  m.def("cached_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor rows) -> Tensor");
}

MINEDRAFT_LIBRARY_IMPL(MINEDRAFT_OPS, CPU, m) {
  m.impl("cached_attention", &cached_attention);
}
