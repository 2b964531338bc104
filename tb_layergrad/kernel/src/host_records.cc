// The histogram and statistics records of several host arrays, behind a C interface: what JAX's host
// callback calls through ctypes (tb_layergrad/kernel/host_records.py), built without TensorFlow.
//
// The moments, the range and the centered sum of squares of 16- and 32-bit float data are the fused
// kernel's (records_core.h: the same chunks, the same loops, merged in the same order, so the same bits
// on the same CPU); the buckets are those of the float64 edges every writer computes
// (metadata.histogram_edges), found exactly as jax/reductions.py finds them: each edge rounded up to
// float32 (for a float32 x, x >= e exactly when x >= that rounding), a float32 estimate of the index
// settled against those edges. float64 data (and integers, widened to it by the caller) take a plain
// three-read path on x / 2**e, like the reference's general path (no overflow, no underflow).
#include <atomic>
#include <new>
#include <cstring>
#include <functional>
#include <memory>
#include <system_error>
#include <thread>

#include "records_core.h"

namespace tb_layergrad {

// Where a call's helpers run (the C interface below): on threads of its own (`schedule` null), or as tasks of
// the caller's pool (XLA's, from a custom call), whose idle threads take them at once.
using Schedule = void (*)(void* pool, void (*task)(void* data), void* data);

namespace {

// The element types of the interface: tb_layergrad/kernel/host_records.py's DTYPES, in that order.
enum DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// IEEE binary16, widened exactly to float32 by integer operations and selects only, so that it vectorizes
// and does not depend on the thread's denormals-are-zero mode (a subnormal half is a normal float32).
struct Half {
  uint16_t bits;
  explicit operator float() const {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    const uint32_t em = bits & 0x7fffu;
    const float normal = FromBits((em << 13) + ((127u - 15u) << 23));
    const float subnormal = static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f;
    const float special = FromBits((em << 13) | 0x7f800000u);  // Inf, NaN (payload kept)
    const float magnitude = em >= 0x7c00u ? special : (em >= 0x0400u ? normal : subnormal);
    uint32_t u;
    std::memcpy(&u, &magnitude, sizeof u);
    return FromBits(u | sign);
  }
};

// bfloat16: the top half of a float32.
struct BFloat16 {
  uint16_t bits;
  explicit operator float() const { return FromBits(static_cast<uint32_t>(bits) << 16); }
};

// The smallest float32 >= e (e finite, within float32's range).
inline float RoundUp(double e) {
  float f = static_cast<float>(e);
  if (static_cast<double>(f) < e) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

struct Chunk {
  int tensor;
  int64_t begin, end;
};

struct Input {
  const void* data;
  int64_t size;
  int32_t dtype;
};

Moments InputChunkMoments(const Input& x, const Chunk& c, bool* clean) {
  const int64_t n = c.end - c.begin;
  switch (x.dtype) {
    case kFloat32:
      return ChunkMoments(static_cast<const float*>(x.data) + c.begin, n, clean);
    case kFloat16:
      return ChunkMoments(static_cast<const Half*>(x.data) + c.begin, n, clean);
    default:
      return ChunkMoments(static_cast<const BFloat16*>(x.data) + c.begin, n, clean);
  }
}

double InputChunkBuckets(const Input& x, const Chunk& c, const Moments& m, double mean, int k, const float* below,
                         const float* above, bool clean, int64_t* counts) {
  const int64_t n = c.end - c.begin;
  switch (x.dtype) {
    case kFloat32:
      return ChunkBucketsOf<true>(static_cast<const float*>(x.data) + c.begin, n, m.lo, m.hi, mean, k, clean,
                                  counts, below, above);
    case kFloat16:
      return ChunkBucketsOf<true>(static_cast<const Half*>(x.data) + c.begin, n, m.lo, m.hi, mean, k, clean,
                                  counts, below, above);
    default:
      return ChunkBucketsOf<true>(static_cast<const BFloat16*>(x.data) + c.begin, n, m.lo, m.hi, mean, k, clean,
                                  counts, below, above);
  }
}

// Runs work(u) for u in [0, units) on up to `threads` threads (this one included), each unit once. Every unit
// writes its own slot, merged afterwards in unit order: the result does not depend on the number of threads.
//
// A pool's task may start late, even after this call returned (a pool may run its tasks one at a time), so
// what a task reads is shared and outlives the call, and a task that finds no unit left leaves `work` alone;
// this thread takes units too, so the call finishes whether or not any task ever starts.
template <typename Work>
void ForEachUnit(int64_t units, int threads, bool parallel, Schedule schedule, void* pool, const Work& work) {
  const int helpers = parallel ? static_cast<int>(std::min<int64_t>(threads, units)) - 1 : 0;
  if (helpers <= 0) {
    for (int64_t u = 0; u < units; ++u) work(u);
    return;
  }
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
    std::atomic<bool> out_of_memory{false};
    int64_t units = 0;
    std::function<void(int64_t)> work;
    void Run() {
      for (int64_t u = next.fetch_add(1); u < units; u = next.fetch_add(1)) {
        try {
          work(u);
        } catch (const std::bad_alloc&) {  // on another thread: told to the caller, not thrown there
          out_of_memory.store(true);
        }
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto shared = std::make_shared<Shared>();
  shared->units = units;
  shared->work = [&work](int64_t u) { work(u); };
  std::vector<std::thread> own;
  for (int h = 0; h < helpers; ++h) {
    if (schedule != nullptr) {
      auto* task_data = new std::shared_ptr<Shared>(shared);
      schedule(pool, [](void* data) {
        std::unique_ptr<std::shared_ptr<Shared>> held(static_cast<std::shared_ptr<Shared>*>(data));
        (*held)->Run();
      }, task_data);
      continue;
    }
    try {
      own.emplace_back([shared] { shared->Run(); });
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the ones running (this one at least) take every unit
    }
  }
  shared->Run();
  // Units other threads took are finished by them: wait for those (each is one chunk's read).
  while (shared->done.load(std::memory_order_acquire) < units) std::this_thread::yield();
  for (std::thread& t : own) t.join();
  if (shared->out_of_memory.load()) throw std::bad_alloc();  // the C interface returns -2
}

// The left edges written (metadata.histogram_edges): lo + i * ((hi - lo) / k), on lo / s and hi / s (s a power
// of two, so exact) where hi - lo would overflow; the first lo.
void LeftEdges(double lo, double hi, int k, double s, double* left) {
  const double ls = lo / s, width = (hi / s - ls) / k;
  for (int i = 0; i < k; ++i) left[i] = i == 0 ? lo : (ls + i * width) * s;
}

// The largest power of two <= top (top finite, >= 0); 1 for 0.
double Pow2AtMost(double top) {
  if (!(top > 0)) return 1.0;
  int e;
  std::frexp(top, &e);
  return std::ldexp(1.0, e - 1);
}

// Statistics and counts of one float64 tensor: counts and range, then the scaled moments and the buckets, then
// the centered squares. Subnormal numbers count as zero, as in the reference.
void Float64Records(const double* x, int64_t n, int k, double* row, int64_t* counts) {
  constexpr double kTiny = DBL_MIN;
  Moments m;  // lo/hi unused: float64 below
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    if (std::isnan(v)) {
      ++m.nan;
    } else if (std::isinf(v)) {
      ++(v > 0 ? m.pos_inf : m.neg_inf);
    } else {
      if (std::fabs(v) < kTiny) {
        v = 0.0;
        ++m.zeros;
      }
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  const int64_t finite = n - m.nan - m.pos_inf - m.neg_inf;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::fill(row, row + kNumStats, 0.0);
  row[kElements] = static_cast<double>(n);
  row[kNan] = static_cast<double>(m.nan);
  row[kPosInf] = static_cast<double>(m.pos_inf);
  row[kNegInf] = static_cast<double>(m.neg_inf);
  row[kZeros] = static_cast<double>(m.zeros);
  if (finite == 0) {
    for (int f : {kMin, kMax, kMean, kStd, kMeanAbs}) row[f] = nan;
    return;
  }
  const double s = Pow2AtMost(std::max(std::fabs(lo), std::fabs(hi)));
  std::vector<double> left(k);
  LeftEdges(lo, hi, k, s, left.data());
  const bool spread = hi > lo;
  const double scale = spread ? k / (hi / s - lo / s) : 0.0, ls = lo / s;
  double sum = 0, sumsq = 0, sumabs = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    if (!std::isfinite(v)) continue;
    v = std::fabs(v) < kTiny ? 0.0 : v;
    const double w = v / s;
    sum += w;
    sumsq += w * w;
    sumabs += std::fabs(w);
    if (!spread) continue;
    double b = (w - ls) * scale;
    b = b < 0 ? 0 : (b > k - 1 ? k - 1 : b);
    int i_ = static_cast<int>(b);
    while (i_ > 0 && v < left[i_]) --i_;
    while (i_ < k - 1 && v >= left[i_ + 1]) ++i_;
    ++counts[i_];
  }
  if (!spread) counts[k - 1] = finite;  // one unique value
  const double mean_s = sum / finite;
  double centered = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    if (!std::isfinite(v)) continue;
    v = std::fabs(v) < kTiny ? 0.0 : v;
    const double e = v / s - mean_s;
    centered += e * e;
  }
  row[kMin] = lo;
  row[kMax] = hi;
  row[kMean] = mean_s * s;
  row[kStd] = std::sqrt(centered / finite) * s;
  row[kNorm] = std::sqrt(sumsq) * s;
  row[kMeanAbs] = sumabs / finite * s;
}

}  // namespace

// The records of the C interface below (its arguments).
int Records(int num, const void* const* data, const int64_t* sizes, const int32_t* dtypes, int k, int threads,
            Schedule schedule, void* pool, double* stats, int64_t* counts);

}  // namespace tb_layergrad

extern "C" {

// The number of values in a stats row (metadata.STAT_FIELDS): the caller checks it before any call.
int tb_layergrad_host_num_stats() { return tb_layergrad::kNumStats; }

int tb_layergrad_host_records_on(int num, const void* const* data, const int64_t* sizes, const int32_t* dtypes, int k,
                                 int threads, tb_layergrad::Schedule schedule, void* pool, double* stats,
                                 int64_t* counts);

// Fills stats [num, kNumStats] (float64) and counts [num, k] (int64), both allocated by the caller, with the
// records of the `num` arrays data[t] of sizes[t] elements of dtypes[t] (DType), reading them on up to
// `threads` threads. Returns 0, -1 for an unknown dtype or k < 1, -2 when memory ran out (no exception
// crosses the C interface).
int tb_layergrad_host_records(int num, const void* const* data, const int64_t* sizes, const int32_t* dtypes, int k,
                              int threads, double* stats, int64_t* counts) {
  return tb_layergrad_host_records_on(num, data, sizes, dtypes, k, threads, nullptr, nullptr, stats, counts);
}

// The same, its helpers run as tasks of the caller's pool: schedule(pool, task, data) runs task(data) once, on any
// thread, at any time (even after this returned).
int tb_layergrad_host_records_on(int num, const void* const* data, const int64_t* sizes, const int32_t* dtypes, int k,
                                 int threads, tb_layergrad::Schedule schedule, void* pool, double* stats,
                                 int64_t* counts) {
  try {
    return tb_layergrad::Records(num, data, sizes, dtypes, k, threads, schedule, pool, stats, counts);
  } catch (const std::bad_alloc&) {
    return -2;
  }
}

}  // extern "C"

namespace tb_layergrad {

int Records(int num, const void* const* data, const int64_t* sizes, const int32_t* dtypes, int k, int threads,
            Schedule schedule, void* pool, double* stats, int64_t* counts) {
  if (k < 1) return -1;
  for (int t = 0; t < num; ++t) {
    if (dtypes[t] < kFloat32 || dtypes[t] > kFloat64) return -1;
  }
  std::fill(counts, counts + static_cast<int64_t>(num) * k, int64_t{0});
  std::vector<Input> xs(num);
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (int t = 0; t < num; ++t) {
    xs[t] = {data[t], sizes[t], dtypes[t]};
    if (dtypes[t] == kFloat64) continue;
    total += sizes[t];
    for (int64_t b = 0; b < sizes[t]; b += kChunk) chunks.push_back({t, b, std::min(sizes[t], b + kChunk)});
  }
  const int64_t units = static_cast<int64_t>(chunks.size());
  const bool parallel = total >= kParallelMinElements && units > 1;

  // Read 1: moments and range, per chunk, then per tensor (in chunk order).
  std::vector<Moments> chunk_moments(units);
  std::unique_ptr<bool[]> chunk_clean(new bool[units > 0 ? units : 1]);
  ForEachUnit(units, threads, parallel, schedule, pool, [&](int64_t u) {
    chunk_moments[u] = InputChunkMoments(xs[chunks[u].tensor], chunks[u], &chunk_clean[u]);
  });
  std::vector<Moments> moments(num);
  std::vector<char> clean(num, 1);
  for (int64_t u = 0; u < units; ++u) {
    moments[chunks[u].tensor].Add(chunk_moments[u]);
    clean[chunks[u].tensor] &= chunk_clean[u];
  }

  // The edges of each tensor with at least two distinct finite values, rounded up to float32.
  std::vector<float> below(static_cast<size_t>(num) * k), above(static_cast<size_t>(num) * k);
  std::vector<double> left(k);
  for (int t = 0; t < num; ++t) {
    const Moments& m = moments[t];
    if (xs[t].dtype == kFloat64 || !(m.hi > m.lo)) continue;
    LeftEdges(m.lo, m.hi, k, 1.0, left.data());
    float* b = below.data() + static_cast<size_t>(t) * k;
    float* a = above.data() + static_cast<size_t>(t) * k;
    b[0] = -std::numeric_limits<float>::infinity();
    for (int i = 1; i < k; ++i) a[i - 1] = b[i] = RoundUp(left[i]);
    a[k - 1] = std::numeric_limits<float>::infinity();
  }

  // Read 2: buckets and centered squares, where there are at least two distinct finite values.
  std::vector<int64_t> chunk_counts(static_cast<size_t>(units) * k, 0);
  std::vector<double> centered(units, 0);
  ForEachUnit(units, threads, parallel, schedule, pool, [&](int64_t u) {
    const Chunk& c = chunks[u];
    const Moments& m = moments[c.tensor];
    const int64_t finite = xs[c.tensor].size - m.nan - m.pos_inf - m.neg_inf;
    if (finite == 0 || !(m.hi > m.lo)) return;
    const size_t at = static_cast<size_t>(c.tensor) * k;
    centered[u] = InputChunkBuckets(xs[c.tensor], c, m, m.sum / finite, k, below.data() + at, above.data() + at,
                                    clean[c.tensor], chunk_counts.data() + u * k);
  });
  std::vector<double> centered_sum(num, 0);
  for (int64_t u = 0; u < units; ++u) {
    const int t = chunks[u].tensor;
    for (int i = 0; i < k; ++i) counts[static_cast<int64_t>(t) * k + i] += chunk_counts[u * k + i];
    centered_sum[t] += centered[u];
  }

  for (int t = 0; t < num; ++t) {
    double* row = stats + static_cast<int64_t>(t) * kNumStats;
    int64_t* bucket = counts + static_cast<int64_t>(t) * k;
    if (xs[t].dtype == kFloat64) {
      Float64Records(static_cast<const double*>(xs[t].data), xs[t].size, k, row, bucket);
      continue;
    }
    const Moments& m = moments[t];
    const int64_t finite = xs[t].size - m.nan - m.pos_inf - m.neg_inf;
    FillStats(m, xs[t].size, centered_sum[t], row);
    if (finite > 0 && !(m.hi > m.lo)) bucket[k - 1] = finite;  // one unique value
  }
  return 0;
}

}  // namespace tb_layergrad
