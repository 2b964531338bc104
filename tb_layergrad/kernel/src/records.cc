// The histogram and statistics records of several tensors, two reads of each (records.h).
//
// The first read takes every moment and the range, the second the histogram and
// the centered sum of squares, for all tensors of a step at once, in chunks
// (spread over TensorFlow's CPU worker threads when there are many elements).
//
// The numbers follow docs/FORMAT.md like the TensorFlow paths in reductions.py:
// non-finite elements are counted and left out of every moment and bucket;
// subnormal numbers count as zero; squares are accumulated in float64 (float32
// data cannot overflow or underflow there), sums of x and |x| in float32 over
// blocks of 256 elements, then in float64; buckets span [min, max] in k equal
// widths with float64 edges, bucket indices computed in float32 (float64 when
// max - min overflows float32), the last bucket closed.
#include "records.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

namespace tb_layergrad {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

constexpr int64_t kChunk = 1 << 15;    // elements per unit of parallel work
constexpr int64_t kParallelMinElements = 1 << 19;  // fewer elements in all: one thread

namespace {

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

// Bucket counts and the centered sum of squares of one chunk's finite elements;
// `clean` (no NaN, Inf or subnormal in the tensor) takes the vectorized loop.
// Bucket indices are computed in float32, as docs/FORMAT.md says (and in
// float64 when the span overflows float32).
template <typename T>
double ChunkBuckets(const T* x, int64_t n, double lo, double hi, double mean, int k, bool clean, int64_t* counts) {
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
  for (int64_t start = 0; start < n; start += kBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kBlock, n - start));
    double block_centered = 0;
    if (fast) {
#pragma omp simd reduction(+ : block_centered)
      for (int j = 0; j < m; ++j) {
        const float v = Load(x, start + j);
        float b = (v - lo_f) * scale_f;  // float32: twice the SIMD lanes of float64
        b = b < 0.0f ? 0.0f : b;
        b = b > top_f ? top_f : b;
        index[j] = static_cast<int32_t>(b);
        const double e = static_cast<double>(v) - mean;
        block_centered += e * e;
      }
      int j = 0;
      for (; j + 4 <= m; j += 4) {
        ++s0[index[j]];
        ++s1[index[j + 1]];
        ++s2[index[j + 2]];
        ++s3[index[j + 3]];
      }
      for (; j < m; ++j) ++s0[index[j]];
    } else {
      for (int j = 0; j < m; ++j) {
        float v = Load(x, start + j);
        if (!std::isfinite(v)) continue;  // not counted
        v = std::fabs(v) < FLT_MIN ? 0.0f : v;
        const double d = v;
        double b = (d - lo) * scale;
        b = b < 0 ? 0 : (b > top ? top : b);
        ++s0[static_cast<int32_t>(b)];
        const double e = d - mean;
        block_centered += e * e;
      }
    }
    centered += block_centered;
  }
  for (int i = 0; i < k; ++i) counts[i] += static_cast<int64_t>(s0[i]) + s1[i] + s2[i] + s3[i];
  return centered;
}

struct Chunk {
  int tensor;
  int64_t begin, end;
};

// The tensor's element type, resolved once per chunk.
Moments TensorChunkMoments(const Tensor& x, const Chunk& c, bool* clean) {
  const int64_t n = c.end - c.begin;
  switch (x.dtype()) {
    case tensorflow::DT_FLOAT:
      return ChunkMoments(x.flat<float>().data() + c.begin, n, clean);
    case tensorflow::DT_HALF:
      return ChunkMoments(x.flat<Eigen::half>().data() + c.begin, n, clean);
    default:
      return ChunkMoments(x.flat<Eigen::bfloat16>().data() + c.begin, n, clean);
  }
}

double TensorChunkBuckets(const Tensor& x, const Chunk& c, const Moments& m, int64_t finite, int k, bool clean, int64_t* counts) {
  const int64_t n = c.end - c.begin;
  const double mean = m.sum / finite;
  switch (x.dtype()) {
    case tensorflow::DT_FLOAT:
      return ChunkBuckets(x.flat<float>().data() + c.begin, n, m.lo, m.hi, mean, k, clean, counts);
    case tensorflow::DT_HALF:
      return ChunkBuckets(x.flat<Eigen::half>().data() + c.begin, n, m.lo, m.hi, mean, k, clean, counts);
    default:
      return ChunkBuckets(x.flat<Eigen::bfloat16>().data() + c.begin, n, m.lo, m.hi, mean, k, clean, counts);
  }
}

// The tensors of a step cut into chunks of at most kChunk elements, and a way to run over them.
class Chunks {
 public:
  Chunks(OpKernelContext* ctx, const tensorflow::OpInputList& xs) {
    int64_t total = 0;
    for (int t = 0; t < xs.size(); ++t) {
      const int64_t n = xs[t].NumElements();
      total += n;
      for (int64_t b = 0; b < n; b += kChunk) chunks_.push_back({t, b, std::min(n, b + kChunk)});
    }
    // Spread over TensorFlow's CPU threads only when the work outweighs the handoff: waking and
    // stealing cost as much as reading a small model's gradients twice on one thread
    // (docs/DESIGN.md, "Benchmark notes").
    pool_ = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    parallel_ = total >= kParallelMinElements && chunks_.size() > 1;
  }

  const std::vector<Chunk>& all() const { return chunks_; }
  int64_t size() const { return static_cast<int64_t>(chunks_.size()); }

  void ForEach(const std::function<void(int64_t, int64_t)>& work) const {
    if (parallel_) {
      pool_->ParallelFor(size(), 4 * kChunk /* ~cycles per chunk and read */, work);
    } else {
      work(0, size());
    }
  }

 private:
  std::vector<Chunk> chunks_;
  decltype(tensorflow::DeviceBase::CpuWorkerThreads{}.workers) pool_ = nullptr;  // TensorFlow's CPU worker pool
  bool parallel_ = false;
};

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

bool TensorChunkHasNonfinite(const Tensor& x, const Chunk& c) {
  const int64_t n = c.end - c.begin;
  const char* data = x.tensor_data().data();
  switch (x.dtype()) {
    case tensorflow::DT_FLOAT:
      return ChunkHasNonfinite(reinterpret_cast<const uint32_t*>(data) + c.begin, n, uint32_t{0x7fffffff}, uint32_t{0x7f800000});
    case tensorflow::DT_HALF:
      return ChunkHasNonfinite(reinterpret_cast<const uint16_t*>(data) + c.begin, n, uint16_t{0x7fff}, uint16_t{0x7c00});
    default:  // bfloat16
      return ChunkHasNonfinite(reinterpret_cast<const uint16_t*>(data) + c.begin, n, uint16_t{0x7fff}, uint16_t{0x7f80});
  }
}

}  // namespace

void NonfiniteFlags(OpKernelContext* ctx, const tensorflow::OpInputList& xs, bool* out) {
  const Chunks chunks(ctx, xs);
  std::unique_ptr<bool[]> found(new bool[chunks.size()]);
  chunks.ForEach([&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) found[u] = TensorChunkHasNonfinite(xs[chunks.all()[u].tensor], chunks.all()[u]);
  });
  std::fill(out, out + xs.size(), false);
  for (int64_t u = 0; u < chunks.size(); ++u) out[chunks.all()[u].tensor] |= found[u];
}

void ComputeRecords(OpKernelContext* ctx, const tensorflow::OpInputList& xs, int k, Tensor* hist_out, Tensor* stats_out) {
  const int num = xs.size();
  const Chunks chunked(ctx, xs);
  const std::vector<Chunk>& chunks = chunked.all();
  const int64_t units = chunked.size();
  auto for_each_chunk = [&](const std::function<void(int64_t, int64_t)>& work) { chunked.ForEach(work); };

  // Read 1: moments and range, per chunk, then per tensor.
  std::vector<Moments> chunk_moments(chunks.size());
  std::unique_ptr<bool[]> chunk_clean(new bool[chunks.size()]);
  for_each_chunk([&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) chunk_moments[u] = TensorChunkMoments(xs[chunks[u].tensor], chunks[u], &chunk_clean[u]);
  });
  std::vector<Moments> moments(num);
  std::unique_ptr<bool[]> clean(new bool[num]);
  std::fill(clean.get(), clean.get() + num, true);
  for (size_t u = 0; u < chunks.size(); ++u) {
    moments[chunks[u].tensor].Add(chunk_moments[u]);
    clean[chunks[u].tensor] &= chunk_clean[u];
  }

  // Read 2: buckets and centered squares, where there are at least two distinct finite values.
  std::vector<int64_t> counts(static_cast<size_t>(units) * k, 0);
  std::vector<double> centered(chunks.size(), 0);
  for_each_chunk([&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const Chunk& c = chunks[u];
      const Moments& m = moments[c.tensor];
      const int64_t finite = xs[c.tensor].NumElements() - m.nan - m.pos_inf - m.neg_inf;
      if (finite == 0 || !(m.hi > m.lo)) continue;
      centered[u] = TensorChunkBuckets(xs[c.tensor], c, m, finite, k, clean[c.tensor], counts.data() + u * k);
    }
  });

  auto hist = hist_out->tensor<double, 3>();
  auto stats = stats_out->matrix<double>();
  hist.setZero();
  for (size_t u = 0; u < chunks.size(); ++u) {
    const int t = chunks[u].tensor;
    for (int i = 0; i < k; ++i) hist(t, i, 2) += static_cast<double>(counts[u * k + i]);
  }
  std::vector<double> centered_sum(num, 0);
  for (size_t u = 0; u < chunks.size(); ++u) centered_sum[chunks[u].tensor] += centered[u];

  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int t = 0; t < num; ++t) {
    const Moments& m = moments[t];
    const int64_t n = xs[t].NumElements();
    const int64_t finite = n - m.nan - m.pos_inf - m.neg_inf;
    const bool any = finite > 0;
    const double lo = any ? m.lo : 0.0, hi = any ? m.hi : 0.0;
    const double mean = any ? m.sum / finite : nan;
    stats(t, kElements) = static_cast<double>(n);
    stats(t, kNan) = static_cast<double>(m.nan);
    stats(t, kPosInf) = static_cast<double>(m.pos_inf);
    stats(t, kNegInf) = static_cast<double>(m.neg_inf);
    stats(t, kZeros) = static_cast<double>(m.zeros);
    stats(t, kMin) = any ? lo : nan;
    stats(t, kMax) = any ? hi : nan;
    stats(t, kMean) = mean;
    stats(t, kStd) = any ? std::sqrt(centered_sum[t] / finite) : nan;
    stats(t, kNorm) = std::sqrt(m.sumsq);
    stats(t, kMeanAbs) = any ? m.sumabs / finite : nan;
    stats(t, kNoGradient) = 0.0;
    // Edges: lo + i * (hi - lo) / k in float64, the first lo and the last hi exactly.
    const double width = (hi - lo) / k;
    for (int i = 0; i < k; ++i) {
      hist(t, i, 0) = i == 0 ? lo : lo + i * width;
      if (i > 0) hist(t, i - 1, 1) = hist(t, i, 0);
    }
    hist(t, k - 1, 1) = hi;
    if (any && !(hi > lo)) hist(t, k - 1, 2) = static_cast<double>(finite);  // one unique value
  }
}

}  // namespace tb_layergrad
