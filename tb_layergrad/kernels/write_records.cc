// TbLayergradWriteHistogramsAndStats: computes the records of several tensors (records.h)
// and writes them to a summary writer itself, as `tf.summary.write` would, when `record`
// is true; when it is false it does nothing.
//
// Why: through `tf.summary.write`, a logged step is a condition (`tf.cond` on
// `tf.summary.should_record_summaries()`) around ~6 nodes per record. The condition
// is the costly part: its branch starts only once every gradient it reads exists, behind
// the backward pass, and costs a function call. Measured in an MLP's training step
// (plain 3.6 ms, in-step A/B): 1.089x through the condition with eight WriteSummary ops,
// 1.073x with this op taking the condition as an input. The first-non-finite bookkeeping
// (docs/FORMAT.md, kind `first_nonfinite`) is kept here too, per writer and tag, so that a
// logged step runs no other op.
// The records are the same bytes as through `tf.summary.write` (docs/FORMAT.md).
#include "records.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/kernels/summary_interface.h"

namespace tb_layergrad {

REGISTER_OP("TbLayergradWriteHistogramsAndStats")
    .Input("writer: resource")
    .Input("record: bool")
    .Input("step: int64")
    .Input("xs: T")
    .Attr("T: list({half, bfloat16, float}) >= 1")
    .Attr("buckets: int >= 1")
    .Attr("histogram_tags: list(string)")
    .Attr("histogram_metadata: list(string)")
    .Attr("stats_tags: list(string)")
    .Attr("stats_metadata: list(string)")
    .Attr("first_nonfinite_tags: list(string)")
    .Attr("first_nonfinite_metadata: list(string)")
    .Attr("flush: bool = false")
    .Output("written: bool")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(
        "When record is true: writes the histogram [buckets, 3] and stats [12] record of each input to the "
        "summary writer at step, under the given tags and serialized SummaryMetadata, and (unless its tags are "
        "empty) the int64 [1] first_nonfinite record of each input that held a NaN/Inf at a step written so far; flushes the writer "
        "if flush. Returns record (tb_layergrad).");

namespace {

// The first step at which each (writer, tag) held a NaN/Inf: process-wide, like the writers.
// Keyed by the writer's resource (container and name: anonymous writers get unique names), so a
// new writer starts clean, and every op writing to one writer shares its values.
class FirstNonfiniteSteps {
 public:
  // The first non-finite step of `key` after this step (`nonfinite`: this step's records hold a NaN/Inf); -1: none.
  int64_t Update(const std::string& key, int64_t step, bool nonfinite) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = first_.find(key);
    if (it != first_.end()) return it->second;
    if (!nonfinite) return -1;
    first_.emplace(key, step);
    return step;
  }

 private:
  std::mutex mu_;
  std::map<std::string, int64_t> first_;
};

FirstNonfiniteSteps& FirstSteps() {
  static auto* steps = new FirstNonfiniteSteps();
  return *steps;
}

constexpr int kNanStat = 1, kPosInfStat = 2, kNegInfStat = 3;  // metadata.STAT_FIELDS

}  // namespace

class WriteHistogramsAndStatsOp : public tensorflow::OpKernel {
 public:
  explicit WriteHistogramsAndStatsOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    std::vector<tensorflow::DataType> types;
    OP_REQUIRES_OK(c, c->GetAttr("T", &types));
    OP_REQUIRES_OK(c, c->GetAttr("buckets", &k_));
    OP_REQUIRES_OK(c, c->GetAttr("flush", &flush_));
    const char* names[] = {"histogram_tags", "histogram_metadata", "stats_tags", "stats_metadata",
                           "first_nonfinite_tags", "first_nonfinite_metadata"};
    std::vector<std::string>* lists[] = {&histogram_tags_, &histogram_metadata_, &stats_tags_, &stats_metadata_,
                                         &first_tags_, &first_metadata_};
    for (int i = 0; i < 6; ++i) {
      OP_REQUIRES_OK(c, c->GetAttr(names[i], lists[i]));
      const bool untracked = i >= 4 && lists[i]->empty();  // no first_nonfinite records
      OP_REQUIRES(c, lists[i]->size() == types.size() || untracked,
                  absl::InvalidArgumentError("one tag and one metadata per input tensor and kind are needed"));
    }
    OP_REQUIRES(c, first_tags_.size() == first_metadata_.size(),
                absl::InvalidArgumentError("one tag and one metadata per input tensor and kind are needed"));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& record = ctx->input(1);
    const tensorflow::Tensor& step = ctx->input(2);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(record.shape()) &&
                         tensorflow::TensorShapeUtils::IsScalar(step.shape()),
                absl::InvalidArgumentError("record and step must be scalars"));
    tensorflow::Tensor* written = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &written));
    written->scalar<bool>()() = record.scalar<bool>()();
    if (!record.scalar<bool>()()) return;

    const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(ctx, 0);
    tensorflow::core::RefCountPtr<tensorflow::SummaryWriterInterface> writer;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, handle, &writer));
    tensorflow::OpInputList xs;
    OP_REQUIRES_OK(ctx, ctx->input_list("xs", &xs));
    const int num = xs.size();
    tensorflow::Tensor hist, stats;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_DOUBLE, tensorflow::TensorShape({num, k_, 3}), &hist));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_DOUBLE, tensorflow::TensorShape({num, kNumStats}), &stats));
    ComputeRecords(ctx, xs, k_, &hist, &stats);

    const int64_t at = step.scalar<int64_t>()();
    const std::string writer_key = handle.container() + "/" + handle.name() + "\n";
    auto s = stats.matrix<double>();
    for (int t = 0; t < num; ++t) {  // in tf.summary.write's order: each tensor's histogram, then its stats
      OP_REQUIRES_OK(ctx, writer->WriteTensor(at, hist.SubSlice(t), histogram_tags_[t], histogram_metadata_[t]));
      OP_REQUIRES_OK(ctx, writer->WriteTensor(at, stats.SubSlice(t), stats_tags_[t], stats_metadata_[t]));
      if (first_tags_.empty()) continue;  // not tracked
      const bool nonfinite = s(t, kNanStat) + s(t, kPosInfStat) + s(t, kNegInfStat) > 0;
      const int64_t first = FirstSteps().Update(writer_key + first_tags_[t], at, nonfinite);
      if (first >= 0) {
        tensorflow::Tensor value(tensorflow::DT_INT64, tensorflow::TensorShape({1}));
        value.flat<int64_t>()(0) = first;
        OP_REQUIRES_OK(ctx, writer->WriteTensor(at, value, first_tags_[t], first_metadata_[t]));
      }
    }
    if (flush_) OP_REQUIRES_OK(ctx, writer->Flush());
  }

 private:
  int k_;
  bool flush_;
  std::vector<std::string> histogram_tags_, histogram_metadata_, stats_tags_, stats_metadata_, first_tags_,
      first_metadata_;
};

REGISTER_KERNEL_BUILDER(Name("TbLayergradWriteHistogramsAndStats").Device(tensorflow::DEVICE_CPU),
                        WriteHistogramsAndStatsOp);

}  // namespace tb_layergrad
