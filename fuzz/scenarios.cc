// The fuzz targets' starting jobs; see scenarios.h.
#include "fuzz/scenarios.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {
namespace fuzz {
namespace {

void AddTensor(v1::JobSpec* spec, const char* name, std::vector<int64_t> shape,
               v1::DType dtype = v1::DTYPE_FP32) {
  v1::TensorSpec* t = spec->add_tensors();
  t->set_name(name);
  for (int64_t d : shape) t->add_shape(d);
  t->set_dtype(dtype);
}

// Every rank submits importance for `step`; the selection it completes.
absl::StatusOr<v1::Selection> SelectAll(const FuzzJob& job, int64_t step,
                                        absl::string_view scores) {
  // Shared: a call still waiting when this returns is answered at deletion.
  auto got = std::make_shared<std::optional<absl::StatusOr<v1::Selection>>>();
  for (int32_t r = 0; r < job.spec.world_size(); ++r) {
    v1::SubmitImportanceRequest req;
    req.set_job_id(job.spec.job_id());
    req.set_rank(r);
    req.set_step(step);
    for (int t = 0; t < job.spec.tensors_size(); ++t) {
      const v1::TensorSpec& ts = job.spec.tensors(t);
      if (ts.shape_size() != 2) continue;  // 1-D: always important
      v1::TensorImportance* ti = req.add_tensors();
      ti->set_tensor(ts.name());
      for (int64_t c = 0; c < ts.shape(1); ++c) {
        const size_t at = static_cast<size_t>(8 * t + c);
        ti->add_scores(scores.empty() ? 1.0f
                                      : static_cast<float>(static_cast<uint8_t>(
                                            scores[at % scores.size()])));
      }
    }
    got->reset();
    job.job->SubmitImportance(req, static_cast<uint64_t>(step * 16 + r + 1),
                              [got](absl::StatusOr<v1::Selection> s) { *got = std::move(s); });
    if (got->has_value() && !(*got)->ok()) return (*got)->status();
  }
  if (!got->has_value()) {
    return absl::InternalError(absl::StrCat("the selection at step ", step, " did not complete"));
  }
  return **got;
}

const v1::ColumnSet* ColumnsOf(const v1::Selection& s, const std::string& tensor) {
  for (const v1::ColumnSet& cs : s.important()) {
    if (cs.tensor() == tensor) return &cs;
  }
  return nullptr;
}

}  // namespace

v1::JobSpec ShardJobSpec(uint8_t config) {
  static const v1::DType kWire[] = {v1::DTYPE_BF16, v1::DTYPE_FP32, v1::DTYPE_FP16,
                                    v1::DTYPE_INT8};
  v1::JobSpec spec;
  spec.set_job_id("shard");
  AddTensor(&spec, "w", {3, 4});
  // (Arithmetic deltas are for fp32 tensors only.)
  AddTensor(&spec, "e", {2, 3}, (config & 64) ? v1::DTYPE_FP32 : v1::DTYPE_BF16);
  AddTensor(&spec, "b", {4});
  spec.set_world_size((config & 1) ? 2 : 1);
  spec.set_wire_dtype(kWire[(config >> 1) & 3]);
  spec.set_skip_nonfinite_rounds((config & 8) != 0);
  spec.set_mode((config & 16) ? v1::MODE_ZERO_OFFLOAD : v1::MODE_ZENFLOW);
  spec.set_rank_ordered_sums((config & 32) != 0);
  spec.set_delta_kind((config & 64) ? v1::DELTA_ARITHMETIC : v1::DELTA_VALUES);
  spec.mutable_zenflow()->set_update_interval(2);
  spec.mutable_zenflow()->set_topk_ratio(0.5f);
  spec.set_max_shard_bytes(1024);
  return spec;
}

absl::StatusOr<FuzzJob> StartShardJob(uint8_t config) {
  ZF_ASSIGN_OR_RETURN(FuzzJob job, CreateFuzzJob(ShardJobSpec(config)));
  ZF_RETURN_IF_ERROR(UploadAndJoin(job));
  return job;
}

std::vector<int32_t> LeavingColumns(const v1::Selection& prev, const v1::Selection& cur,
                                    const std::string& tensor) {
  std::vector<int32_t> out;
  const v1::ColumnSet* before = ColumnsOf(prev, tensor);
  const v1::ColumnSet* after = ColumnsOf(cur, tensor);
  if (before == nullptr) return out;
  for (int32_t c : before->columns()) {
    const bool stays = after != nullptr && std::find(after->columns().begin(),
                                                     after->columns().end(), c) !=
                                               after->columns().end();
    if (!stays) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<HandOffJob> StartHandOffJob(uint8_t config, absl::string_view scores1,
                                           absl::string_view scores2,
                                           const std::string& job_id) {
  v1::JobSpec spec;
  spec.set_job_id(job_id);
  AddTensor(&spec, "w", {2, 4});
  AddTensor(&spec, "u", {3, 2});
  AddTensor(&spec, "b", {3});
  spec.set_world_size((config & 1) ? 2 : 1);
  spec.set_wire_dtype(v1::DTYPE_FP32);
  spec.mutable_zenflow()->set_update_interval(1);
  spec.mutable_zenflow()->set_select_interval(1);
  spec.mutable_zenflow()->set_topk_ratio(0.5f);
  spec.mutable_zenflow()->mutable_apply_delay()->set_sync(true);
  HandOffJob h;
  ZF_ASSIGN_OR_RETURN(h.job, CreateFuzzJob(spec));
  ZF_RETURN_IF_ERROR(UploadAndJoin(h.job));
  ZF_ASSIGN_OR_RETURN(h.selection, SelectAll(h.job, 0, scores1));
  if ((config & 2) == 0) return h;

  const int world = h.job.spec.world_size();
  for (int32_t r = 0; r < world; ++r) {
    v1::HandOffRequest req;  // version 1 follows version 0: nothing leaves
    req.set_job_id(job_id);
    req.set_rank(r);
    req.set_version(h.selection.version());
    ZF_RETURN_IF_ERROR(h.job.job->HandOff(req).status());
  }
  for (int32_t r = 0; r < world; ++r) {
    for (const v1::TensorSpec& ts : h.job.spec.tensors()) {
      if (ts.shape_size() != 2) continue;
      const v1::ColumnSet* important = ColumnsOf(h.selection, ts.name());
      v1::UpMessage up;
      v1::GradientShard* shard = up.mutable_shard();
      shard->set_step(0);
      shard->set_tensor(ts.name());
      shard->set_selection_version(h.selection.version());
      shard->set_dtype(v1::DTYPE_FP32);
      std::vector<float> g;
      for (int32_t c = 0; c < ts.shape(1); ++c) {
        if (important != nullptr && std::find(important->columns().begin(),
                                              important->columns().end(),
                                              c) != important->columns().end()) {
          continue;
        }
        shard->add_columns(c);
        for (int64_t row = 0; row < ts.shape(0); ++row) g.push_back(0.125f * (c + 1) - row);
      }
      if (g.empty()) continue;
      shard->set_payload(g.data(), g.size() * sizeof(float));
      ZF_RETURN_IF_ERROR(Ingest(h.job, r, Wire::kGrpc, absl::OkStatus(), up));
    }
    v1::UpMessage close;
    close.mutable_close()->set_round(0);
    close.mutable_close()->set_lr(0.01f);
    ZF_RETURN_IF_ERROR(Ingest(h.job, r, Wire::kGrpc, absl::OkStatus(), close));
  }
  ZF_RETURN_IF_ERROR(JobState(h.job.job.get()).status());  // round 0's update is done
  h.previous = h.selection;
  ZF_ASSIGN_OR_RETURN(h.selection, SelectAll(h.job, 1, scores2));
  return h;
}

}  // namespace fuzz
}  // namespace zenflow
