// The one-pass loops of the records (records.h), free of TensorFlow: the moments, the range and the buckets of
// one chunk of a tensor, and whether a chunk holds a NaN or an Inf.
//
// Why apart: two builds read them. TensorFlow's custom ops (records.cc) and the C interface that JAX's host
// callback calls through ctypes (host_records.cc), built without TensorFlow's headers, so that both compute a
// step's records with the same loops (docs/DESIGN.md, "The cost of a written step on JAX").
// `T` is any element type with a conversion to float (float, Eigen's half and bfloat16, or host_records.cc's).
#ifndef TB_LAYERGRAD_KERNELS_RECORDS_CORE_H_
#define TB_LAYERGRAD_KERNELS_RECORDS_CORE_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#define TB_LAYERGRAD_AVX512_BUCKETS 1
#endif

namespace tb_layergrad {

// The positions in a `stats` record: tb_layergrad.metadata.STAT_FIELDS, in that order
// (tests/metadata/test_metadata.py pins these names and values to it).
enum Stat : int { kElements, kNan, kPosInf, kNegInf, kZeros, kMin, kMax, kMean, kStd, kNorm, kMeanAbs, kNoGradient, kNumStats };

constexpr int64_t kChunk = 1 << 15;    // elements per unit of parallel work
constexpr int64_t kParallelMinElements = 1 << 19;  // fewer elements in all: one thread

// Moments and counts of one chunk (or, summed, of one tensor).
struct Moments {
  double sum = 0, sumsq = 0, sumabs = 0;
  float lo = std::numeric_limits<float>::infinity();
  float hi = -std::numeric_limits<float>::infinity();
  int64_t zeros = 0, nan = 0, pos_inf = 0, neg_inf = 0;

  void Add(const Moments& o) {
    sum += o.sum;
    sumsq += o.sumsq;
    sumabs += o.sumabs;
    lo = std::min(lo, o.lo);
    hi = std::max(hi, o.hi);
    zeros += o.zeros;
    nan += o.nan;
    pos_inf += o.pos_inf;
    neg_inf += o.neg_inf;
  }
};

// A tensor's `stats` row (kNumStats values) from its merged moments, its element count and the sum of its
// centered squares.
inline void FillStats(const Moments& m, int64_t n, double centered, double* row) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t finite = n - m.nan - m.pos_inf - m.neg_inf;
  const bool any = finite > 0;
  const double lo = any ? m.lo : 0.0, hi = any ? m.hi : 0.0;
  row[kElements] = static_cast<double>(n);
  row[kNan] = static_cast<double>(m.nan);
  row[kPosInf] = static_cast<double>(m.pos_inf);
  row[kNegInf] = static_cast<double>(m.neg_inf);
  row[kZeros] = static_cast<double>(m.zeros);
  row[kMin] = any ? lo : nan;
  row[kMax] = any ? hi : nan;
  row[kMean] = any ? m.sum / finite : nan;
  row[kStd] = any ? std::sqrt(centered / finite) : nan;
  row[kNorm] = std::sqrt(m.sumsq);
  row[kMeanAbs] = any ? m.sumabs / finite : nan;
  row[kNoGradient] = 0.0;
}

template <typename T>
inline float Load(const T* x, int64_t i) { return static_cast<float>(x[i]); }

// The common case, branch-free so that it vectorizes (a select that flushes
// subnormals stops that, docs/DESIGN.md, "Benchmark notes"). It only counts
// them: a chunk with a subnormal number, a NaN or an Inf (which makes `sum`
// non-finite), whose float32 block sums overflow, or of tiny values, is read
// again by CountedMoments (all in float64).
template <typename T>
Moments FastMoments(const T* x, int64_t n, bool* clean) {
  double sum = 0, sumsq = 0, sumabs = 0;
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  int64_t zeros = 0, subnormal = 0;
  // Sums of x and |x| in float32 within blocks of 256, in float64 across them: half the
  // float64 work, and 256 float32 terms lose nothing a float32 tensor's mean could show.
  // Squares stay float64 (a vanishing gradient's squares underflow float32).
  constexpr int64_t kBlock = 256;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const T* xb = x + start;
    float block_sum = 0, block_abs = 0;
    int32_t block_zeros = 0, block_subnormal = 0;
#pragma omp simd reduction(+ : block_sum, block_abs, sumsq, block_zeros, block_subnormal) reduction(min : lo) reduction(max : hi)
    for (int64_t i = 0; i < m; ++i) {
      const float v = Load(xb, i);
      const float a = std::fabs(v);
      const bool zero = a < FLT_MIN;
      const double d = v;
      block_sum += v;
      sumsq += d * d;
      block_abs += a;
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
      block_zeros += zero;
      block_subnormal += zero & (a > 0.0f);
    }
    sum += block_sum;
    sumabs += block_abs;
    zeros += block_zeros;
    subnormal += block_subnormal;
  }
  // A float32 block sum past FLT_MAX reads Inf: such a chunk is read again too. So is one of tiny
  // values, whose float32 partial sums could cancel below FLT_MIN (TensorFlow's threads flush those to 0):
  // with max |x| >= 2^-60 what flushing can lose is far below the mean's rounding (docs/FORMAT.md).
  const float top = std::max(std::fabs(lo), std::fabs(hi));
  const bool tiny = top > 0.0f && top < 0x1p-60f;
  *clean = subnormal == 0 && !tiny && std::isfinite(sum) && std::isfinite(sumabs) && std::isfinite(sumsq);
  Moments m;
  m.sum = sum;
  m.sumsq = sumsq;
  m.sumabs = sumabs;
  m.lo = lo;
  m.hi = hi;
  m.zeros = zeros;
  return m;
}

template <typename T>
Moments CountedMoments(const T* x, int64_t n) {
  Moments m;
  for (int64_t i = 0; i < n; ++i) {
    float v = Load(x, i);
    if (std::isnan(v)) {
      ++m.nan;
    } else if (std::isinf(v)) {
      ++(v > 0 ? m.pos_inf : m.neg_inf);
    } else {
      const float a = std::fabs(v);
      if (a < FLT_MIN) {
        v = 0.0f;
        ++m.zeros;
      }
      const double d = v;
      m.sum += d;
      m.sumsq += d * d;
      m.sumabs += std::fabs(d);
      m.lo = std::min(m.lo, v);
      m.hi = std::max(m.hi, v);
    }
  }
  return m;
}

// `*clean`: no NaN, Inf or subnormal number in the chunk.
template <typename T>
Moments ChunkMoments(const T* x, int64_t n, bool* clean) {
  Moments m = FastMoments(x, n, clean);
  return *clean ? m : CountedMoments(x, n);
}

// Adds one to the counter of each of a block's `m` bucket indices. Four sets of counters: consecutive elements
// in one bucket do not wait on each other's increment.
inline void CountIndices(const int32_t* index, int m, uint32_t* s0, uint32_t* s1, uint32_t* s2, uint32_t* s3) {
  int j = 0;
  for (; j + 4 <= m; j += 4) {
    ++s0[index[j]];
    ++s1[index[j + 1]];
    ++s2[index[j + 2]];
    ++s3[index[j + 3]];
  }
  for (; j < m; ++j) ++s0[index[j]];
}

#ifdef TB_LAYERGRAD_AVX512_BUCKETS
constexpr int kPermutedBuckets = 32;  // two registers of float32 edges

// The vectorized loop below for one block of float32 data, written out for AVX-512: the same float32 index
// and the same one-bucket settlement, with each element's two edges taken from registers by a permutation
// (a gather, which the compiler emits for `above[i]`, reads memory lane by lane and costs several times the
// rest of the loop). The centered squares are summed in float64 as there, in another order.
template <bool Exact>
double PermutedBlock(const float* x, int m, float lo_f, float scale_f, float top_f, double mean,
                     const float* below, const float* above, int32_t* index) {
  const __m512 lo = _mm512_set1_ps(lo_f), scale = _mm512_set1_ps(scale_f), top = _mm512_set1_ps(top_f);
  const __m512 zero = _mm512_setzero_ps();
  const __m512d mean8 = _mm512_set1_pd(mean);
  const __m512i one = _mm512_set1_epi32(1);
  __m512 below_lo = zero, below_hi = zero, above_lo = zero, above_hi = zero;
  if constexpr (Exact) {
    below_lo = _mm512_loadu_ps(below);
    below_hi = _mm512_loadu_ps(below + 16);
    above_lo = _mm512_loadu_ps(above);
    above_hi = _mm512_loadu_ps(above + 16);
  }
  __m512d sum_lo = _mm512_setzero_pd(), sum_hi = _mm512_setzero_pd();
  for (int j = 0; j < m; j += 16) {
    const __mmask16 lanes = m - j >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (m - j)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(lanes, x + j);
    __m512 b = _mm512_mul_ps(_mm512_sub_ps(v, lo), scale);
    b = _mm512_min_ps(_mm512_max_ps(b, zero), top);
    __m512i i = _mm512_cvttps_epi32(b);
    if constexpr (Exact) {
      const __mmask16 up = _mm512_cmp_ps_mask(v, _mm512_permutex2var_ps(above_lo, i, above_hi), _CMP_GE_OQ);
      const __mmask16 down = _mm512_cmp_ps_mask(v, _mm512_permutex2var_ps(below_lo, i, below_hi), _CMP_LT_OQ);
      i = _mm512_mask_sub_epi32(_mm512_mask_add_epi32(i, up, i, one), down, i, one);
    }
    _mm512_mask_storeu_epi32(index + j, lanes, i);
    const __m512d e_lo = _mm512_maskz_sub_pd(static_cast<__mmask8>(lanes),
                                             _mm512_cvtps_pd(_mm512_castps512_ps256(v)), mean8);
    const __m512d e_hi = _mm512_maskz_sub_pd(static_cast<__mmask8>(lanes >> 8),
                                             _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)), mean8);
    sum_lo = _mm512_add_pd(sum_lo, _mm512_mul_pd(e_lo, e_lo));
    sum_hi = _mm512_add_pd(sum_hi, _mm512_mul_pd(e_hi, e_hi));
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(sum_lo, sum_hi));
}
#endif

// Bucket counts and the centered sum of squares of one chunk's finite elements;
// `clean` (no NaN, Inf or subnormal in the tensor) takes the vectorized loop.
// Bucket indices are computed in float32, as docs/FORMAT.md says (and in
// float64 when the span overflows float32).
//
// `Exact` (host_records.cc): the counts are those of the written float64 edges. Bucket i then holds x with
// below[i] <= x < above[i] (below[0] = -Inf, above[k - 1] = +Inf), below[i] = above[i - 1] being the i-th left
// edge rounded up to float32 (for a float32 x, x >= e exactly when x >= that rounding). The float32 index is
// at most one bucket off (its rounding is a few float32 ulps of an index below k): one comparison on each side
// settles it in the vectorized loop; the branching loop settles in a loop.
template <bool Exact, typename T>
double ChunkBucketsOf(const T* x, int64_t n, double lo, double hi, double mean, int k, bool clean, int64_t* counts,
                      const float* below, const float* above) {
  const double scale = k / (hi - lo);
  const double top = k - 1;
  // In float32 where hi - lo fits (a span past FLT_MAX would read Inf and bucket everything last).
  const float lo_f = static_cast<float>(lo), scale_f = static_cast<float>(scale), top_f = static_cast<float>(top);
  const bool float_index = std::isfinite(static_cast<float>(hi) - lo_f) && std::isfinite(scale_f);
  constexpr int kBlock = 256;
  int32_t index[kBlock];
  double centered = 0;
  // Four sets of counters: consecutive elements in one bucket do not wait on each other's increment.
  // 32-bit: a chunk holds at most kChunk elements.
  std::vector<uint32_t> sets(4 * static_cast<size_t>(k), 0);
  uint32_t* const s0 = sets.data();
  uint32_t* const s1 = s0 + k;
  uint32_t* const s2 = s1 + k;
  uint32_t* const s3 = s2 + k;
  // No NaN, Inf or subnormal, and a span that fits float32: the vectorized loop, every index in [0, k).
  const bool fast = clean && float_index;
#ifdef TB_LAYERGRAD_AVX512_BUCKETS
  // float32 data whose edges fit two registers: the edges are looked up by a permutation, not a gather.
  float tables[2][kPermutedBuckets];
  const bool permuted = std::is_same_v<T, float> && (!Exact || k <= kPermutedBuckets);
  if (fast && permuted && Exact) {
    std::fill(tables[0], tables[0] + kPermutedBuckets, std::numeric_limits<float>::infinity());
    std::fill(tables[1], tables[1] + kPermutedBuckets, std::numeric_limits<float>::infinity());
    std::copy(below, below + k, tables[0]);
    std::copy(above, above + k, tables[1]);
  }
#endif
  for (int64_t start = 0; start < n; start += kBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kBlock, n - start));
    double block_centered = 0;
#ifdef TB_LAYERGRAD_AVX512_BUCKETS
    if constexpr (std::is_same_v<T, float>) {
      if (fast && permuted) {
        block_centered =
            PermutedBlock<Exact>(x + start, m, lo_f, scale_f, top_f, mean, tables[0], tables[1], index);
        CountIndices(index, m, s0, s1, s2, s3);
        centered += block_centered;
        continue;
      }
    }
#endif
    if (fast) {
#pragma omp simd reduction(+ : block_centered)
      for (int j = 0; j < m; ++j) {
        const float v = Load(x, start + j);
        float b = (v - lo_f) * scale_f;  // float32: twice the SIMD lanes of float64
        b = b < 0.0f ? 0.0f : b;
        b = b > top_f ? top_f : b;
        int32_t i = static_cast<int32_t>(b);
        if constexpr (Exact) i += (v >= above[i] ? 1 : 0) - (v < below[i] ? 1 : 0);
        index[j] = i;
        const double e = static_cast<double>(v) - mean;
        block_centered += e * e;
      }
      CountIndices(index, m, s0, s1, s2, s3);
    } else {
      for (int j = 0; j < m; ++j) {
        float v = Load(x, start + j);
        if (!std::isfinite(v)) continue;  // not counted
        v = std::fabs(v) < FLT_MIN ? 0.0f : v;
        const double d = v;
        double b = (d - lo) * scale;
        b = b < 0 ? 0 : (b > top ? top : b);
        int32_t i = static_cast<int32_t>(b);
        if constexpr (Exact) {
          while (v < below[i]) --i;
          while (v >= above[i]) ++i;
        }
        ++s0[i];
        const double e = d - mean;
        block_centered += e * e;
      }
    }
    centered += block_centered;
  }
  for (int i = 0; i < k; ++i) counts[i] += static_cast<int64_t>(s0[i]) + s1[i] + s2[i] + s3[i];
  return centered;
}

// The TensorFlow op's buckets (float32 indices; docs/FORMAT.md lets an element next to an edge land on either side).
template <typename T>
double ChunkBuckets(const T* x, int64_t n, double lo, double hi, double mean, int k, bool clean, int64_t* counts) {
  return ChunkBucketsOf<false>(x, n, lo, hi, mean, k, clean, counts, nullptr, nullptr);
}

// The largest magnitude bits of a chunk: a NaN or an Inf is any value whose exponent bits are all
// set, so the chunk holds one exactly when this is at least `inf`. A max reduction vectorizes; no
// floating-point operation (and so no exception flag or subnormal handling) is involved.
template <typename Bits>
bool ChunkHasNonfinite(const Bits* bits, int64_t n, Bits magnitude, Bits inf) {
  Bits top = 0;
#pragma omp simd reduction(max : top)
  for (int64_t i = 0; i < n; ++i) top = std::max<Bits>(top, bits[i] & magnitude);
  return top >= inf;
}

}  // namespace tb_layergrad

#endif  // TB_LAYERGRAD_KERNELS_RECORDS_CORE_H_
