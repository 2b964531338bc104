// The histogram and statistics records of several tensors: what both of tb_layergrad's ops compute.
//
// Why one computation for all tensors of a step: built from TensorFlow's kernels, a
// tensor's records cost about ten kernels (sum, sum of squares, min, max, sum of |x|, a
// non-zero count, the histogram and its range) plus dozens of scalar ops around them,
// each with its own dispatch; on a small model that is most of what logging costs.
#ifndef TB_LAYERGRAD_KERNELS_RECORDS_H_
#define TB_LAYERGRAD_KERNELS_RECORDS_H_

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "records_core.h"

namespace tb_layergrad {

// Fills `hist` [T, k, 3] (left edge, right edge, count) and `stats` [T, kNumStats],
// both float64 and allocated by the caller, from the T float16/bfloat16/float32 `xs`.
void ComputeRecords(tensorflow::OpKernelContext* ctx, const tensorflow::OpInputList& xs, int k,
                    tensorflow::Tensor* hist, tensorflow::Tensor* stats);

// Sets out[t] to whether xs[t] holds a NaN or an Inf: one read of each, spread like ComputeRecords'.
void NonfiniteFlags(tensorflow::OpKernelContext* ctx, const tensorflow::OpInputList& xs, bool* out);

// The number of tensors in the list attr "T" (for the ops' shape functions).
inline absl::Status NumTensors(tensorflow::shape_inference::InferenceContext* c, int* n) {
  std::vector<tensorflow::DataType> types;
  TF_RETURN_IF_ERROR(c->GetAttr("T", &types));
  *n = static_cast<int>(types.size());
  return absl::OkStatus();
}

}  // namespace tb_layergrad

#endif  // TB_LAYERGRAD_KERNELS_RECORDS_H_
