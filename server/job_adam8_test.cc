// A job with 8-bit optimizer state (JobSpec.optimizer_state "8bit") through
// the daemon core: updates on the code grid that follow fp32's, the 8-bit
// form in checkpoints (restored bit-identically), fp32 checkpoints loading,
// SetState quantizing and GetState answering fp32, and the spec's checks.
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/adam8.h"
#include "gtest/gtest.h"
#include "server/job.h"
#include "server/job_test_support.h"
#include "server/job_spec.h"
#include "server/registry.h"
#include "server/test_specs.h"

namespace zenflow {
namespace {

constexpr int64_t kRows = 32, kCols = 3;

v1::JobSpec Spec(const std::string& state) {
  v1::JobSpec spec = OneTensorSpec(1, 2);
  spec.mutable_tensors(0)->set_shape(0, kRows);
  spec.set_optimizer_state(state);
  return spec;
}

std::vector<float> Values(uint32_t seed, float scale) {
  std::vector<float> x(kRows * kCols);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < x.size(); ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = scale * (static_cast<float>(s >> 8) / 16777216.0f - 0.4f) * (1 + (i % 7));
  }
  return x;
}

std::shared_ptr<Job> Joined(JobRegistry* registry, const v1::JobSpec& spec) {
  EXPECT_TRUE(registry->CreateJob(spec).ok());
  std::shared_ptr<Job> job = *registry->Find("unit");
  UploadWAndJoin(job, kRows, kCols, Values(1, 1.0f), 1);
  return job;
}

// Round `round`: two steps' shards of every column, then the close.
void Round(Job* job, int64_t round) {
  for (int64_t step = 2 * round; step < 2 * round + 2; ++step) {
    const std::vector<float> g = Values(100 + static_cast<uint32_t>(step), 0.01f);
    v1::UpMessage m;
    auto* s = m.mutable_shard();
    s->set_step(step);
    s->set_tensor("w");
    s->set_dtype(v1::DTYPE_FP32);
    for (int c = 0; c < kCols; ++c) s->add_columns(c);
    s->set_payload(reinterpret_cast<const char*>(g.data()), sizeof(float) * g.size());
    ASSERT_TRUE(job->HandleUp(0, m, Wire::kGrpc).ok());
  }
  v1::UpMessage close;
  close.mutable_close()->set_round(round);
  close.mutable_close()->set_lr(1e-2f);
  for (int i = 0; i < 2; ++i) close.mutable_close()->add_step_reports()->set_step_seconds(0.1);
  ASSERT_TRUE(job->HandleUp(0, close, Wire::kGrpc).ok());
}

v1::ColumnState State(Job* job) {
  EXPECT_TRUE(job->Snapshot().ok());  // waits for the updates
  absl::StatusOr<v1::ColumnState> st = job->ReadColumns("w", {0, 1, 2});
  EXPECT_TRUE(st.ok()) << st.status();
  return st.ok() ? *st : v1::ColumnState();
}

// m and v quantized and dequantized again (what an 8-bit store keeps of them).
void OnGrid(const float* m, const float* v, std::vector<float>* qm, std::vector<float>* qv) {
  const int64_t per = Adam8BlocksPerColumn(kRows);
  std::vector<uint8_t> m8(kRows * kCols), v8(kRows * kCols);
  std::vector<float> ms(kCols * per), vs(kCols * per);
  Adam8Quantize(SimdLevel::kScalar, kRows, kCols, m, v, {m8.data(), ms.data(), v8.data(), vs.data()});
  qm->resize(m8.size());
  qv->resize(v8.size());
  Adam8Dequantize(SimdLevel::kScalar, kRows, kCols, {m8.data(), ms.data(), v8.data(), vs.data()},
                  qm->data(), qv->data());
}

TEST(JobAdam8Test, UpdatesStayOnTheCodeGridAndFollowFp32) {
  JobRegistry r32(RegistryOptions{}), r8(RegistryOptions{});
  std::shared_ptr<Job> j32 = Joined(&r32, Spec("fp32"));
  std::shared_ptr<Job> j8 = Joined(&r8, Spec("8bit"));
  for (int64_t round = 0; round < 4; ++round) {
    for (Job* j : {j32.get(), j8.get()}) {
      Round(j, round);
      ASSERT_TRUE(j->Snapshot().ok());  // waits for the update
    }
  }
  const v1::ColumnState a = State(j32.get()), b = State(j8.get());
  ASSERT_EQ(b.m_size(), kRows * kCols);
  std::vector<float> qm, qv;
  OnGrid(b.m().data(), b.v().data(), &qm, &qv);
  float mmax = 0;
  for (float x : a.m()) mmax = std::max(mmax, std::fabs(x));
  for (int i = 0; i < b.m_size(); ++i) {
    // GetState's values are the stored codes' values, exactly.
    EXPECT_EQ(qm[i], b.m(i)) << i;
    EXPECT_EQ(qv[i], b.v(i)) << i;
    EXPECT_NEAR(b.m(i), a.m(i), std::fabs(a.m(i)) / 4 + mmax * 1e-2f) << i;
    EXPECT_NEAR(b.v(i), a.v(i), a.v(i) / 4) << i;
    EXPECT_NEAR(b.values(i), a.values(i), 4 * 1e-2f * 0.25f) << i;  // 4 steps of lr
  }
  EXPECT_EQ(b.update_counts(0), 4);
}

TEST(JobAdam8Test, CheckpointsHoldTheEightBitFormAndRestoreBitIdentically) {
  JobRegistry registry(RegistryOptions{});
  std::shared_ptr<Job> job = Joined(&registry, Spec("8bit"));
  Round(job.get(), 0);
  absl::StatusOr<JobSnapshot> snap = job->Snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status();
  std::map<std::string, const std::string*> sections = SectionsOf(*snap);
  EXPECT_EQ(sections.count("t0.m"), 0u);
  EXPECT_EQ(sections.count("t0.v"), 0u);
  ASSERT_EQ(sections.count("t0.m8"), 1u);
  EXPECT_EQ(sections.at("t0.m8")->size(), static_cast<size_t>(kRows * kCols));
  EXPECT_EQ(sections.at("t0.v8.scale")->size(), kCols * sizeof(float));

  JobRegistry other(RegistryOptions{});
  ASSERT_TRUE(other.CreateJob(Spec("8bit")).ok());
  std::shared_ptr<Job> copy = *other.Find("unit");
  ASSERT_TRUE(copy->LoadSnapshot(sections).ok());
  Round(job.get(), 1);
  Round(copy.get(), 1);
  EXPECT_EQ(State(job.get()).SerializeAsString(), State(copy.get()).SerializeAsString());

  // A scale that is not finite is refused as data loss.
  std::string bad = *sections.at("t0.m8.scale");
  const float inf = INFINITY;
  std::memcpy(&bad[0], &inf, sizeof(inf));
  sections["t0.m8.scale"] = &bad;
  JobRegistry third(RegistryOptions{});
  ASSERT_TRUE(third.CreateJob(Spec("8bit")).ok());
  EXPECT_EQ((*third.Find("unit"))->LoadSnapshot(sections).code(), absl::StatusCode::kDataLoss);
}

// A checkpoint of fp32 state (the format before 8-bit state, which fp32
// jobs still write) loads into an fp32 job unchanged and into an 8-bit job
// quantized.
TEST(JobAdam8Test, Fp32CheckpointsStillLoad) {
  JobRegistry registry(RegistryOptions{});
  std::shared_ptr<Job> job = Joined(&registry, Spec(""));
  Round(job.get(), 0);
  const v1::ColumnState want = State(job.get());
  absl::StatusOr<JobSnapshot> snap = job->Snapshot();
  ASSERT_TRUE(snap.ok());
  std::map<std::string, const std::string*> sections = SectionsOf(*snap);
  ASSERT_EQ(sections.count("t0.m"), 1u);
  ASSERT_EQ(sections.count("t0.m8"), 0u);
  for (const std::string state : {"fp32", "8bit"}) {
    JobRegistry other(RegistryOptions{});
    ASSERT_TRUE(other.CreateJob(Spec(state)).ok());
    std::shared_ptr<Job> copy = *other.Find("unit");
    ASSERT_TRUE(copy->LoadSnapshot(sections).ok()) << state;
    const v1::ColumnState got = State(copy.get());
    if (state == "fp32") {
      EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
      continue;
    }
    std::vector<float> qm, qv;
    OnGrid(want.m().data(), want.v().data(), &qm, &qv);
    for (int i = 0; i < got.m_size(); ++i) {
      EXPECT_EQ(got.values(i), want.values(i)) << i;
      EXPECT_EQ(got.m(i), qm[i]) << i;
      EXPECT_EQ(got.v(i), qv[i]) << i;
    }
  }
}

TEST(JobAdam8Test, SetStateQuantizesAndGetStateAnswersFp32) {
  JobRegistry registry(RegistryOptions{});
  std::shared_ptr<Job> job = Joined(&registry, Spec("8bit"));
  v1::SetStateRequest req;
  req.set_job_id("unit");
  v1::ColumnState* st = req.mutable_state();
  st->set_tensor("w");
  const std::vector<float> vals = Values(7, 2.0f), m = Values(8, 0.1f), v0 = Values(9, 0.01f);
  std::vector<float> v(v0.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = v0[i] * v0[i];
  for (int c = 0; c < kCols; ++c) {
    st->add_columns(c);
    st->add_update_counts(5 + c);
  }
  st->mutable_values()->Add(vals.begin(), vals.end());
  st->mutable_m()->Add(m.begin(), m.end());
  st->mutable_v()->Add(v.begin(), v.end());
  // A negative v is refused, and the store keeps its state.
  v1::SetStateRequest negative = req;
  negative.mutable_state()->set_v(4, -1.0f);
  EXPECT_EQ(job->SetState(negative).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(job->SetState(req).ok());
  v1::GetStateRequest get;
  get.set_job_id("unit");
  get.set_tensor("w");
  absl::StatusOr<v1::GetStateResponse> got = job->GetState(get);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<float> qm, qv;
  OnGrid(m.data(), v.data(), &qm, &qv);
  const v1::ColumnState& s = got->state();
  ASSERT_EQ(s.m_size(), kRows * kCols);
  for (int i = 0; i < s.m_size(); ++i) {
    EXPECT_EQ(s.values(i), vals[i]) << i;
    EXPECT_EQ(s.m(i), qm[i]) << i;
    EXPECT_EQ(s.v(i), qv[i]) << i;
    EXPECT_NEAR(s.m(i), m[i], std::fabs(m[i]) / 16 + 1e-6f) << i;
  }
  EXPECT_EQ(s.update_counts(2), 7);
}

TEST(JobAdam8Test, SpecNamesTheFormatAndChargesItsBytes) {
  v1::JobSpec spec = Spec("");
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_EQ(spec.optimizer_state(), "fp32");
  v1::JobSpec bad = Spec("int8");
  const absl::Status s = NormalizeJobSpec(&bad, 64 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("optimizer_state 'int8' is unknown"), absl::string_view::npos) << s;
  // A 4096 x 4096 tensor: m and v from 8 B to 2 B and two scales per 256.
  v1::JobSpec big = Spec("fp32");
  big.mutable_tensors(0)->set_shape(0, 4096);
  big.mutable_tensors(0)->set_shape(1, 4096);
  ASSERT_TRUE(NormalizeJobSpec(&big, 64 << 20).ok());
  absl::StatusOr<JobFootprint> f32 = ComputeJobFootprint(big);
  big.set_optimizer_state("8bit");
  absl::StatusOr<JobFootprint> f8 = ComputeJobFootprint(big);
  ASSERT_TRUE(f32.ok() && f8.ok());
  const int64_t n = int64_t{4096} * 4096;
  EXPECT_EQ(f32->state_bytes - f8->state_bytes, 8 * n - (2 * n + 2 * 4 * (n / 256)));
  EXPECT_EQ(f32->bookkeeping_bytes, f8->bookkeeping_bytes);
  // Tensors of fewer than 16 rows keep fp32 state.
  v1::JobSpec small = Spec("8bit");
  small.mutable_tensors(0)->set_shape(0, 8);
  v1::JobSpec small32 = small;
  small32.set_optimizer_state("fp32");
  EXPECT_EQ(ComputeJobFootprint(small)->state_bytes, ComputeJobFootprint(small32)->state_bytes);
}

}  // namespace
}  // namespace zenflow
