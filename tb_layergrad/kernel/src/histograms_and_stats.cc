// TbLayergradHistogramsAndStats: the records of several tensors as two tensors (records.h).
#include "records.h"

#include "tensorflow/core/framework/op.h"

namespace tb_layergrad {

REGISTER_OP("TbLayergradHistogramsAndStats")
    .Input("xs: T")
    .Attr("T: list({half, bfloat16, float}) >= 1")
    .Attr("buckets: int >= 1")
    .Output("histograms: double")
    .Output("stats: double")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int n, k;
      TF_RETURN_IF_ERROR(NumTensors(c, &n));
      TF_RETURN_IF_ERROR(c->GetAttr("buckets", &k));
      c->set_output(0, c->MakeShape({n, k, 3}));
      c->set_output(1, c->MakeShape({n, kNumStats}));
      return absl::OkStatus();
    })
    .Doc("Histogram [T, buckets, 3] and stats [T, 12] records of each input (tb_layergrad).");

class HistogramsAndStatsOp : public tensorflow::OpKernel {
 public:
  explicit HistogramsAndStatsOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("buckets", &k_));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    tensorflow::OpInputList xs;
    OP_REQUIRES_OK(ctx, ctx->input_list("xs", &xs));
    const int num = xs.size();
    tensorflow::Tensor* hist = nullptr;
    tensorflow::Tensor* stats = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({num, k_, 3}), &hist));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tensorflow::TensorShape({num, kNumStats}), &stats));
    ComputeRecords(ctx, xs, k_, hist, stats);
  }

 private:
  int k_;
};

REGISTER_KERNEL_BUILDER(Name("TbLayergradHistogramsAndStats").Device(tensorflow::DEVICE_CPU), HistogramsAndStatsOp);

}  // namespace tb_layergrad
