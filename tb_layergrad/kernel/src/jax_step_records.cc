// The records of a JAX step's tensors computed inside the compiled step: an XLA FFI handler around the host
// build's loops (host_records.cc, built into the same library), built against jaxlib's FFI headers
// (jax.ffi.include_dir()) by tb_layergrad/kernel/host_records.py.
//
// Why inside the step: a host callback makes JAX's CPU step run synchronously and hands every tensor to Python
// as a copy (docs/DESIGN.md, "The cost of a written step on JAX"); a custom call reads the step's own buffers
// where they are and returns a few hundred numbers per layer, which leave the step as its outputs. XLA only
// calls it on the steps that are written (it sits in the written branch of a lax.cond), and its operands are
// buffers the step holds anyway: it adds no scratch memory of its own.
#include <xmmintrin.h>

#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

extern "C" int tb_layergrad_host_num_stats();
extern "C" int tb_layergrad_host_records_on(int num, const void* const* data, const int64_t* sizes,
                                            const int32_t* dtypes, int k, int threads,
                                            void (*schedule)(void* pool, void (*task)(void* data), void* data),
                                            void* pool, double* stats, int64_t* counts);

namespace {

namespace ffi = xla::ffi;

// XLA runs a CPU step with subnormal numbers flushed to zero (FTZ and DAZ set in MXCSR), which would make the
// loops see a subnormal element as 0: the records must not depend on who calls them (host_records.cc computes
// them in the default mode, as the reference does). Cleared for the call and for each of its tasks on XLA's
// pool, restored after.
class DefaultFloatingPointMode {
 public:
  DefaultFloatingPointMode() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~(kFlushToZero | kDenormalsAreZero)); }
  ~DefaultFloatingPointMode() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  unsigned saved_;
};

// host_records.cc's DType codes; -1: not read here (the caller widens such tensors first).
int32_t DTypeCode(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32:
      return 0;
    case ffi::DataType::F16:
      return 1;
    case ffi::DataType::BF16:
      return 2;
    case ffi::DataType::F64:
      return 3;
    default:
      return -1;
  }
}

// The loops' helpers as tasks of XLA's own pool, the one that runs the step's other work on the CPU: inside a
// step a thread of the loops' own brought nothing measurable (docs/DESIGN.md, "The cost of a written step on
// JAX"). Each task runs in the default mode too, whatever the pool's thread was set to.
void OnXlaPool(void* pool, void (*task)(void* data), void* data) {
  static_cast<ffi::ThreadPool*>(pool)->Schedule([task, data] {
    DefaultFloatingPointMode mode;
    task(data);
  });
}

ffi::Error StepRecords(ffi::ThreadPool pool, ffi::RemainingArgs tensors, int64_t buckets, int64_t threads,
                       ffi::Result<ffi::Buffer<ffi::F64>> stats, ffi::Result<ffi::Buffer<ffi::S64>> counts) {
  const int64_t num = static_cast<int64_t>(tensors.size());
  if (buckets < 1 || threads < 1) return ffi::Error::InvalidArgument("buckets and threads must be >= 1");
  if (static_cast<int64_t>(stats->element_count()) != num * tb_layergrad_host_num_stats() ||
      static_cast<int64_t>(counts->element_count()) != num * buckets) {
    return ffi::Error::InvalidArgument("the outputs' shapes are not [tensors, stats] and [tensors, buckets]");
  }
  std::vector<const void*> data(num);
  std::vector<int64_t> sizes(num);
  std::vector<int32_t> dtypes(num);
  for (int64_t t = 0; t < num; ++t) {
    auto x = tensors.get<ffi::AnyBuffer>(t);
    if (x.has_error()) return x.error();
    data[t] = x->untyped_data();
    sizes[t] = static_cast<int64_t>(x->element_count());
    dtypes[t] = DTypeCode(x->element_type());
    if (dtypes[t] < 0) return ffi::Error::InvalidArgument("a tensor of a dtype the loops do not read");
  }
  DefaultFloatingPointMode mode;
  const int status = tb_layergrad_host_records_on(static_cast<int>(num), data.data(), sizes.data(), dtypes.data(),
                                                  static_cast<int>(buckets), static_cast<int>(threads), OnXlaPool,
                                                  &pool, stats->typed_data(), counts->typed_data());
  if (status == -2) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "the step's records ran out of memory");
  if (status != 0) return ffi::Error::InvalidArgument("the step's records refused their input");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(tb_layergrad_step_records, StepRecords,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .Attr<int64_t>("buckets")
                                  .Attr<int64_t>("threads")
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::S64>>());
