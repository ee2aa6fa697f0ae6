// Test support: a job of OneTensorSpec ("unit": w is 2 x 3) uploaded and
// joined, its shards and closes, its state and its snapshots, for the job
// tests (job_test.cc, job_sums_test.cc, job_adam8_test.cc, shard_path_test.cc,
// shard_alloc_test.cc).
#ifndef ZENFLOW_SERVER_JOB_TEST_SUPPORT_H_
#define ZENFLOW_SERVER_JOB_TEST_SUPPORT_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/job.h"
#include "server/registry.h"
#include "server/test_specs.h"

namespace zenflow {

// Uploads `init` as the rows x cols tensor "w" of `job`, then joins ranks
// 0..world-1.
inline void UploadWAndJoin(const std::shared_ptr<Job>& job, int64_t rows, int64_t cols,
                    const std::vector<float>& init, int world) {
  v1::UploadParametersRequest chunk;
  chunk.set_tensor("w");
  chunk.add_shape(rows);
  chunk.add_shape(cols);
  chunk.set_payload(reinterpret_cast<const char*>(init.data()), init.size() * sizeof(float));
  absl::StatusOr<std::unique_ptr<Job::Upload>> up = Job::Upload::Begin(job);
  EXPECT_TRUE(up.ok() && (*up)->AddChunk(chunk).ok() && (*up)->Commit().ok());
  for (int r = 0; r < world; ++r) EXPECT_TRUE(job->Join(r).ok());
}

// The job of `spec` (OneTensorSpec's "unit": w is 2 x 3), its parameters
// uploaded and its ranks joined.
inline std::shared_ptr<Job> JoinedJob(JobRegistry* registry, const v1::JobSpec& spec) {
  EXPECT_TRUE(registry->CreateJob(spec).ok());
  std::shared_ptr<Job> job = *registry->Find("unit");
  UploadWAndJoin(job, 2, 3, {1, 2, 3, 4, 5, 6}, spec.world_size());
  return job;
}

// A job of `world` ranks, S = 2, its parameters uploaded and the ranks
// joined.
inline std::shared_ptr<Job> JoinedJob(JobRegistry* registry, int world = 1,
                               bool rank_ordered_sums = false) {
  v1::JobSpec spec = OneTensorSpec(world, 2);
  spec.set_rank_ordered_sums(rank_ordered_sums);
  return JoinedJob(registry, spec);
}

// A shard of all three columns of "w" (2 rows each, column-major) for `step`.
inline v1::UpMessage AllColumns(int64_t step, const std::array<float, 6>& g) {
  v1::UpMessage m;
  auto* s = m.mutable_shard();
  s->set_step(step);
  s->set_tensor("w");
  s->set_dtype(v1::DTYPE_FP32);
  for (int c = 0; c < 3; ++c) s->add_columns(c);
  s->set_payload(reinterpret_cast<const char*>(g.data()), sizeof(float) * g.size());
  return m;
}

inline v1::UpMessage Close(int64_t round, int reports, double stall) {
  v1::UpMessage m;
  m.mutable_close()->set_round(round);
  m.mutable_close()->set_lr(0.1f);
  m.mutable_close()->set_apply_delay_steps(1);
  m.mutable_close()->set_staleness_steps(2);
  for (int i = 0; i < reports; ++i) {
    v1::StepReport* r = m.mutable_close()->add_step_reports();
    r->set_step_seconds(0.5);
    r->set_stall_seconds(stall);
    r->set_up_bytes(100);
    r->set_down_bytes(40);
  }
  return m;
}

// Rank r's gradient at `step` (every element alike): 1e8 absorbs a 1 added
// after it, so fp32 sums of these depend on the order of addition.
inline std::array<float, 6> OrderSensitive(int rank, int64_t step) {
  static constexpr float kValue[2][2] = {{1e8f, 1.0f}, {1.0f, -1e8f}};
  const float v = kValue[rank][step % 2];
  return {v, v, v, v, v, v};
}

inline std::string StateAfterUpdates(Job* job) {
  EXPECT_TRUE(job->Snapshot().ok());  // waits for the updates
  absl::StatusOr<v1::ColumnState> st = job->ReadColumns("w", {0, 1, 2});
  EXPECT_TRUE(st.ok()) << st.status();
  return st.ok() ? st->SerializeAsString() : "";
}

// The sections of `snap` by name, and a job of its spec in `registry`
// with them loaded (null when that fails).
inline std::map<std::string, const std::string*> SectionsOf(const JobSnapshot& snap) {
  std::map<std::string, const std::string*> sections;
  for (const auto& [name, bytes] : snap.sections) sections[name] = &bytes;
  return sections;
}

inline std::shared_ptr<Job> LoadedCopy(JobRegistry* registry,
                                const std::map<std::string, const std::string*>& sections) {
  v1::JobSpec spec;
  if (!spec.ParseFromString(*sections.at("spec")) || !registry->CreateJob(spec).ok()) return nullptr;
  std::shared_ptr<Job> copy = *registry->Find(spec.job_id());
  return copy->LoadSnapshot(sections).ok() ? copy : nullptr;
}

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_JOB_TEST_SUPPORT_H_
