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
#include "records_core.h"

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

namespace {

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

  for (int t = 0; t < num; ++t) {
    const Moments& m = moments[t];
    const int64_t n = xs[t].NumElements();
    const int64_t finite = n - m.nan - m.pos_inf - m.neg_inf;
    const bool any = finite > 0;
    const double lo = any ? m.lo : 0.0, hi = any ? m.hi : 0.0;
    FillStats(m, n, centered_sum[t], &stats(t, 0));
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
