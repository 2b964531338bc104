// TbLayergradWriteHistogramsAndStats: computes the records of several tensors (records.h)
// and writes them to a summary writer itself, as `tf.summary.write` would, when `record`
// is true; when it is false it does nothing.
//
// Why: through `tf.summary.write`, a logged step is a condition (`tf.cond` on
// `tf.summary.should_record_summaries()`) around several nodes per record. The condition
// is the costly part: its branch starts only once every gradient it reads exists, behind
// the backward pass, and costs a function call. This op takes the condition as an input
// instead (docs/DESIGN.md, "One write step"). For the same reason it applies the
// first-non-finite rule (docs/FORMAT.md, kind `first_nonfinite`) itself, to the running
// first steps it is given; the state stays where the TensorFlow-ops path keeps it too, in
// the one tracker's variable (tb_layergrad/summary/writer_state.py).
// The records are the same bytes as through `tf.summary.write` (docs/FORMAT.md).
//
// With `check`, a step that is not recorded still looks at every element once, for a NaN/Inf
// (GradientLogger's finiteness check of every training step): the answer is an output, and
// the step is written after all when `record_if_nonfinite` holds (the first such step of a
// run is written in full, on the schedule or not).
//
// The inputs are consecutive groups of `group_sizes` (the layers of one target and source, docs/FORMAT.md)
// and each group is ONE record per kind: stats [L, 12] float64, histogram counts [L, k] in the narrowest
// unsigned type that holds them, first_nonfinite [L] int64. The tag and metadata lists hold one entry per
// group, and the metadata is written only where `with_metadata` says (a tag's first record: TensorBoard
// keeps the first it sees).
#include "records.h"

#include <algorithm>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/kernels/summary_interface.h"

namespace tb_layergrad {

REGISTER_OP("TbLayergradWriteHistogramsAndStats")
    .Input("writer: resource")
    .Input("record: bool")
    .Input("record_if_nonfinite: bool")
    .Input("record_histograms: bool")
    .Input("step: int64")
    .Input("first_nonfinite: int64")
    .Input("with_metadata: bool")
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
    .Attr("check: bool = false")
    .Attr("group_sizes: list(int) >= 1")
    .Attr("block_steps: list(int) >= 1")
    .Output("written: bool")
    .Output("first_nonfinite_after: int64")
    .Output("nonfinite: bool")
    .Output("metadata_written: bool")
    .Output("stats: double")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(NumTensors(c, &n));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->MakeShape({n}));
      c->set_output(2, c->MakeShape({n}));
      c->set_output(3, c->input(6));
      c->set_output(4, c->MakeShape({n, kNumStats}));
      return absl::OkStatus();
    })
    .Doc(
        "The inputs form consecutive groups of group_sizes. When record is true: writes each group's stats "
        "[L, 12] and histogram counts [L, buckets] (in the narrowest unsigned type) to the summary writer at step, "
        "under the group's tag (suffixed with /<the first step of the block of block_steps steps holding step>) "
        "and serialized SummaryMetadata (only where with_metadata [3 * groups] says, for each group's "
        "histogram, stats and first_nonfinite record; metadata_written says which did); updates each input's "
        "first_nonfinite step (-1: none yet) with this step if it holds a NaN/Inf and, unless its tags are "
        "empty, writes the int64 [L] first_nonfinite record of each group with one; flushes the writer if flush. "
        "With check, when record is false, each input is scanned for a NaN/Inf and the records are written after "
        "all if one holds one and record_if_nonfinite is true. The histogram records are written only when "
        "record_histograms is true or an input holds a NaN/Inf (a step so written is written in full). Returns "
        "whether it wrote, the updated first_nonfinite steps (the input as it is when nothing was written), which "
        "inputs hold a NaN/Inf (all false when nothing was recorded or checked), metadata_written, and each "
        "input's stats [T, 12] as written (zeros when nothing was written) (tb_layergrad).");


class WriteHistogramsAndStatsOp : public tensorflow::OpKernel {
 public:
  explicit WriteHistogramsAndStatsOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    std::vector<tensorflow::DataType> types;
    OP_REQUIRES_OK(c, c->GetAttr("T", &types));
    OP_REQUIRES_OK(c, c->GetAttr("buckets", &k_));
    OP_REQUIRES_OK(c, c->GetAttr("flush", &flush_));
    OP_REQUIRES_OK(c, c->GetAttr("check", &check_));
    std::vector<int64_t> sizes;
    OP_REQUIRES_OK(c, c->GetAttr("group_sizes", &sizes));
    OP_REQUIRES_OK(c, c->GetAttr("block_steps", &block_steps_));
    OP_REQUIRES(c, block_steps_.size() == sizes.size(), absl::InvalidArgumentError("block_steps needs one entry per group"));
    for (const int64_t steps : block_steps_)
      OP_REQUIRES(c, steps >= 1, absl::InvalidArgumentError("block_steps must be >= 1"));
    int64_t begin = 0;
    for (const int64_t size : sizes) {
      OP_REQUIRES(c, size >= 1, absl::InvalidArgumentError("every group needs at least one tensor"));
      groups_.push_back({begin, begin + size});
      begin += size;
    }
    OP_REQUIRES(c, begin == static_cast<int64_t>(types.size()),
                absl::InvalidArgumentError("the group sizes must add up to the number of input tensors"));
    // One tag and metadata per group and kind.
    const size_t entries = groups_.size();
    const char* names[] = {"histogram_tags", "histogram_metadata", "stats_tags", "stats_metadata",
                           "first_nonfinite_tags", "first_nonfinite_metadata"};
    std::vector<std::string>* lists[] = {&histogram_tags_, &histogram_metadata_, &stats_tags_, &stats_metadata_,
                                         &first_tags_, &first_metadata_};
    for (int i = 0; i < 6; ++i) {
      OP_REQUIRES_OK(c, c->GetAttr(names[i], lists[i]));
      const bool untracked = i >= 4 && lists[i]->empty();  // no first_nonfinite records
      OP_REQUIRES(c, lists[i]->size() == entries || untracked,
                  absl::InvalidArgumentError("one tag and one metadata per group and kind are needed"));
    }
    OP_REQUIRES(c, first_tags_.size() == first_metadata_.size(),
                absl::InvalidArgumentError("one tag and one metadata per group and kind are needed"));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& record = ctx->input(1);
    const tensorflow::Tensor& record_if_nonfinite = ctx->input(2);
    const tensorflow::Tensor& record_histograms = ctx->input(3);
    const tensorflow::Tensor& step = ctx->input(4);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(record.shape()) &&
                         tensorflow::TensorShapeUtils::IsScalar(record_if_nonfinite.shape()) &&
                         tensorflow::TensorShapeUtils::IsScalar(record_histograms.shape()) &&
                         tensorflow::TensorShapeUtils::IsScalar(step.shape()),
                absl::InvalidArgumentError("record, record_if_nonfinite, record_histograms and step must be scalars"));
    const tensorflow::Tensor& firsts_in = ctx->input(5);
    const tensorflow::Tensor& with_metadata_in = ctx->input(6);
    tensorflow::OpInputList xs;
    OP_REQUIRES_OK(ctx, ctx->input_list("xs", &xs));
    const int num = xs.size();
    OP_REQUIRES(ctx, firsts_in.dims() == 1 && firsts_in.dim_size(0) == num,
                absl::InvalidArgumentError("first_nonfinite must hold one step per input tensor"));
    const int64_t flags = 3 * static_cast<int64_t>(groups_.size());
    OP_REQUIRES(ctx, with_metadata_in.dims() == 1 && with_metadata_in.dim_size(0) == flags,
                absl::InvalidArgumentError("with_metadata must hold three flags per group"));
    tensorflow::Tensor* written = nullptr;
    tensorflow::Tensor* firsts_out = nullptr;
    tensorflow::Tensor* nonfinite_out = nullptr;
    tensorflow::Tensor* metadata_out = nullptr;
    tensorflow::Tensor* stats_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &written));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tensorflow::TensorShape({num}), &firsts_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tensorflow::TensorShape({num}), &nonfinite_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, tensorflow::TensorShape({flags}), &metadata_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, tensorflow::TensorShape({num, kNumStats}), &stats_out));
    stats_out->matrix<double>().setZero();
    auto firsts = firsts_out->vec<int64_t>();
    firsts = firsts_in.vec<int64_t>();
    auto nonfinite = nonfinite_out->vec<bool>();
    nonfinite.setConstant(false);
    metadata_out->vec<bool>().setConstant(false);
    bool recorded = record.scalar<bool>()();
    if (!recorded && check_) {
      NonfiniteFlags(ctx, xs, nonfinite.data());
      bool any = false;
      for (int t = 0; t < num; ++t) any |= nonfinite(t);
      recorded = any && record_if_nonfinite.scalar<bool>()();
    }
    written->scalar<bool>()() = recorded;
    if (!recorded) return;

    const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(ctx, 0);
    tensorflow::core::RefCountPtr<tensorflow::SummaryWriterInterface> writer;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, handle, &writer));
    // The stats are the op's output too: a later consumer (the noise scale's batch gradient norms) reads them
    // instead of reading the tensors again.
    tensorflow::Tensor hist;
    tensorflow::Tensor& stats = *stats_out;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_DOUBLE, tensorflow::TensorShape({num, k_, 3}), &hist));
    ComputeRecords(ctx, xs, k_, &hist, &stats);

    const int64_t at = step.scalar<int64_t>()();
    auto s = stats.matrix<double>();
    bool histograms = record_histograms.scalar<bool>()();
    for (int t = 0; t < num; ++t) {
      nonfinite(t) = s(t, kNan) + s(t, kPosInf) + s(t, kNegInf) > 0;
      if (firsts(t) < 0 && nonfinite(t)) firsts(t) = at;
      histograms |= nonfinite(t);  // a step with a NaN/Inf is written in full
    }
    WriteGroups(ctx, writer.get(), at, hist, stats, *firsts_out, with_metadata_in, metadata_out, histograms);
    if (!ctx->status().ok()) return;
    if (flush_) OP_REQUIRES_OK(ctx, writer->Flush());
  }

 private:
  struct Group {
    int64_t begin, end;  // input tensors [begin, end)
  };

  // Each group's histogram counts (if `histograms`), then its stats, then (from its first NaN/Inf on)
  // its first steps.
  void WriteGroups(tensorflow::OpKernelContext* ctx, tensorflow::SummaryWriterInterface* writer, int64_t at,
                   const tensorflow::Tensor& hist, const tensorflow::Tensor& stats,
                   const tensorflow::Tensor& firsts_t, const tensorflow::Tensor& with_metadata_t,
                   tensorflow::Tensor* metadata_written_t, bool histograms) {
    auto firsts = firsts_t.vec<int64_t>();
    auto with_metadata = with_metadata_t.vec<bool>();
    auto metadata_written = metadata_written_t->vec<bool>();
    auto h = hist.tensor<double, 3>();
    for (size_t g = 0; g < groups_.size(); ++g) {
      // docs/FORMAT.md: a tag per block of steps, named by its first step (floor division).
      const int64_t steps = block_steps_[g];
      int64_t first = at / steps;
      if (at % steps != 0 && at < 0) --first;
      const std::string block = "/" + std::to_string(first * steps);
      const Group& group = groups_[g];
      const int64_t rows = group.end - group.begin;
      auto metadata = [&](int kind, const std::string& serialized) -> std::string {
        const bool first = with_metadata(3 * g + kind);
        metadata_written(3 * g + kind) = first;
        return first ? serialized : std::string();
      };
      if (histograms) {
        tensorflow::Tensor counts;
        OP_REQUIRES_OK(ctx, Counts(ctx, h, group, &counts));
        OP_REQUIRES_OK(ctx, writer->WriteTensor(at, counts, histogram_tags_[g] + block, metadata(0, histogram_metadata_[g])));
      }
      OP_REQUIRES_OK(ctx, writer->WriteTensor(at, stats.Slice(group.begin, group.end), stats_tags_[g] + block,
                                              metadata(1, stats_metadata_[g])));
      if (first_tags_.empty()) continue;
      bool any = false;
      for (int64_t t = group.begin; t < group.end; ++t) any |= firsts(t) >= 0;
      if (!any) continue;  // clean so far
      tensorflow::Tensor value(tensorflow::DT_INT64, tensorflow::TensorShape({rows}));
      for (int64_t t = group.begin; t < group.end; ++t) value.flat<int64_t>()(t - group.begin) = firsts(t);
      OP_REQUIRES_OK(ctx, writer->WriteTensor(at, value, first_tags_[g] + block, metadata(2, first_metadata_[g])));
    }
  }

  // A group's bucket counts [rows, k] in the narrowest unsigned type that holds its largest count.
  absl::Status Counts(tensorflow::OpKernelContext* ctx, tensorflow::TTypes<double, 3>::ConstTensor h,
                      const Group& group, tensorflow::Tensor* out) const {
    double largest = 0;
    for (int64_t t = group.begin; t < group.end; ++t)
      for (int i = 0; i < k_; ++i) largest = std::max(largest, h(t, i, 2));
    const tensorflow::DataType type = largest < 256.0          ? tensorflow::DT_UINT8
                                      : largest < 65536.0      ? tensorflow::DT_UINT16
                                      : largest < 4294967296.0 ? tensorflow::DT_UINT32
                                                               : tensorflow::DT_UINT64;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(type, tensorflow::TensorShape({group.end - group.begin, k_}), out));
    switch (type) {
      case tensorflow::DT_UINT8: Fill<uint8_t>(h, group, out); break;
      case tensorflow::DT_UINT16: Fill<uint16_t>(h, group, out); break;
      case tensorflow::DT_UINT32: Fill<uint32_t>(h, group, out); break;
      default: Fill<uint64_t>(h, group, out); break;
    }
    return absl::OkStatus();
  }

  template <typename Count>
  void Fill(tensorflow::TTypes<double, 3>::ConstTensor h, const Group& group, tensorflow::Tensor* out) const {
    auto counts = out->matrix<Count>();
    for (int64_t t = group.begin; t < group.end; ++t)
      for (int i = 0; i < k_; ++i) counts(t - group.begin, i) = static_cast<Count>(h(t, i, 2));
  }

  int k_;
  bool flush_;
  bool check_;
  std::vector<int64_t> block_steps_;
  std::vector<Group> groups_;
  std::vector<std::string> histogram_tags_, histogram_metadata_, stats_tags_, stats_metadata_, first_tags_,
      first_metadata_;
};

REGISTER_KERNEL_BUILDER(Name("TbLayergradWriteHistogramsAndStats").Device(tensorflow::DEVICE_CPU),
                        WriteHistogramsAndStatsOp);

}  // namespace tb_layergrad
