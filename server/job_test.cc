// Unit tests of the daemon core without a network: spec normalization, the
// round protocol and the update, checked against hand-computed AdamW.
#include "server/job.h"

#include <cmath>
#include <cstring>

#include "common/codec.h"
#include "gtest/gtest.h"
#include "server/registry.h"

namespace zenflow {
namespace {

v1::JobSpec OneTensorSpec(int world, int interval) {
  v1::JobSpec spec;
  spec.set_job_id("unit");
  auto* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(2);
  t->add_shape(3);
  spec.set_world_size(world);
  spec.set_wire_dtype(v1::DTYPE_FP32);
  spec.mutable_zenflow()->set_update_interval(interval);
  return spec;
}

TEST(NormalizeJobSpecTest, FillsDefaults) {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  spec.set_wire_dtype(v1::DTYPE_UNSPECIFIED);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_FLOAT_EQ(spec.adamw().lr(), 1e-3f);
  EXPECT_FLOAT_EQ(spec.adamw().beta1(), 0.9f);
  EXPECT_FLOAT_EQ(spec.adamw().beta2(), 0.999f);
  EXPECT_FLOAT_EQ(spec.adamw().weight_decay(), 0.01f);
  EXPECT_FLOAT_EQ(spec.zenflow().topk_ratio(), 0.1f);
  EXPECT_EQ(spec.zenflow().select_interval(), 100);
  EXPECT_TRUE(spec.zenflow().apply_delay().adaptive());
  EXPECT_EQ(spec.wire_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(spec.max_shard_bytes(), 4 << 20);
}

TEST(NormalizeJobSpecTest, ZeroOffloadForcesItsSettings) {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  spec.set_mode(v1::MODE_ZERO_OFFLOAD);
  spec.mutable_zenflow()->set_topk_ratio(0.5f);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_EQ(spec.zenflow().topk_ratio(), 0.0f);
  EXPECT_EQ(spec.zenflow().update_interval(), 1);
  EXPECT_TRUE(spec.zenflow().apply_delay().sync());
}

TEST(NormalizeJobSpecTest, ExplicitZeroTopkAndWeightDecayAreKept) {
  v1::JobSpec spec = OneTensorSpec(1, 4);
  spec.mutable_zenflow()->set_topk_ratio(0.0f);
  spec.mutable_adamw()->set_weight_decay(0.0f);
  ASSERT_TRUE(NormalizeJobSpec(&spec, 64 << 20).ok());
  EXPECT_EQ(spec.zenflow().topk_ratio(), 0.0f);
  EXPECT_EQ(spec.adamw().weight_decay(), 0.0f);
}

// One rank, S = 2, two steps: the update equals AdamW computed by hand.
TEST(JobTest, OneRankTwoStepsEqualsHandComputedAdamW) {
  JobRegistry registry(RegistryOptions{});
  v1::JobSpec spec = OneTensorSpec(1, 2);
  spec.mutable_adamw()->set_lr(0.1f);
  spec.mutable_adamw()->set_weight_decay(0.0f);
  ASSERT_TRUE(registry.CreateJob(spec).ok());
  auto job = *registry.Find("unit");
  Job::Upload up(job);
  v1::UploadParametersRequest chunk;
  chunk.set_tensor("w");
  chunk.add_shape(2);
  chunk.add_shape(3);
  const float init[6] = {1, 2, 3, 4, 5, 6};  // row-major [[1,2,3],[4,5,6]]
  chunk.set_payload(reinterpret_cast<const char*>(init), sizeof(init));
  ASSERT_TRUE(up.AddChunk(chunk).ok());
  ASSERT_TRUE(up.Commit().ok());
  ASSERT_TRUE(job->Join(0).ok());
  // Column 1 gets gradients (col-major: rows 0,1) 1,3 at step 0 and 3,5 at step 1.
  for (int step = 0; step < 2; ++step) {
    v1::UpMessage m;
    auto* s = m.mutable_shard();
    s->set_step(step);
    s->set_tensor("w");
    s->set_dtype(v1::DTYPE_FP32);
    for (int c = 0; c < 3; ++c) s->add_columns(c);
    const float g[6] = {0, 0, 1.0f + 2 * step, 3.0f + 2 * step, 0, 0};
    s->set_payload(reinterpret_cast<const char*>(g), sizeof(g));
    ASSERT_TRUE(job->HandleUp(0, m).ok());
  }
  v1::UpMessage close;
  close.mutable_close()->set_round(0);
  close.mutable_close()->set_lr(0.1f);
  ASSERT_TRUE(job->HandleUp(0, close).ok());
  absl::StatusOr<v1::ColumnState> st = job->ReadColumns("w", {1, 0});
  ASSERT_TRUE(st.ok()) << st.status();
  // Mean gradient of column 1: (2, 4). First AdamW step: m = 0.1 g,
  // v = 0.001 g^2, m_hat = g, v_hat = g^2, p -= lr * g / (|g| + eps) = lr.
  EXPECT_NEAR(st->values(0), 2.0f - 0.1f, 1e-6);
  EXPECT_NEAR(st->values(1), 5.0f - 0.1f, 1e-6);
  EXPECT_NEAR(st->m(0), 0.2f, 1e-7);
  EXPECT_NEAR(st->v(1), 0.016f, 1e-6);
  EXPECT_EQ(st->update_counts(0), 1);
  // Column 0 had zero gradient: m = v = 0, p unchanged (no weight decay).
  EXPECT_EQ(st->values(2), 1.0f);
  EXPECT_EQ(st->values(3), 4.0f);
  EXPECT_EQ(st->update_counts(1), 1);
}

TEST(MailboxTest, QueuesUntilAWriterAttachesThenWritesOneAtATime) {
  struct FakeWriter : Mailbox::Writer {
    std::vector<std::string> written;
    void Write(v1::DownMessage* msg) override { written.push_back(msg->done().DebugString()); }
  } w;
  Mailbox box;
  v1::DownMessage a, b;
  a.mutable_done()->set_round(1);
  b.mutable_done()->set_round(2);
  box.Push(a);
  box.Push(b);
  EXPECT_EQ(box.queued(), 2u);
  ASSERT_TRUE(box.Attach(&w));
  EXPECT_EQ(w.written.size(), 1u);  // one write in flight
  FakeWriter other;
  EXPECT_FALSE(box.Attach(&other));
  EXPECT_FALSE(box.WriteDone(&w, true));
  EXPECT_EQ(w.written.size(), 2u);
  EXPECT_TRUE(box.Detach(&w));  // second write still in flight
  EXPECT_TRUE(box.WriteDone(&w, false));  // failed: goes back to the queue
  EXPECT_EQ(box.queued(), 1u);
  ASSERT_TRUE(box.Attach(&other));
  ASSERT_EQ(other.written.size(), 1u);
  EXPECT_NE(other.written[0].find("round: 2"), std::string::npos);
}

}  // namespace
}  // namespace zenflow
