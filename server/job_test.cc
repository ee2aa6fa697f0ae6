// Unit tests of the daemon core without a network: the round protocol and
// the update, checked against hand-computed AdamW (the spec's checks:
// job_spec_test.cc).
#include "server/job.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/mutex.h"
#include "gtest/gtest.h"
#include "server/job_test_support.h"
#include "server/registry.h"
#include "server/test_specs.h"

namespace zenflow {
namespace {

// Pushes every column of steps 2r and 2r+1 from rank 0.
void PushRound(Job* job, int64_t round) {
  for (int64_t step = 2 * round; step < 2 * round + 2; ++step) {
    ASSERT_TRUE(job->HandleUp(0, AllColumns(step, {1, 1, 1, 1, 1, 1}), Wire::kUcx).ok());
  }
}

TEST(JobTest, WorkerReportsAreCheckedThenSummedPerRank) {
  JobRegistry registry(RegistryOptions{});
  std::shared_ptr<Job> job = JoinedJob(&registry);
  PushRound(job.get(), 0);
  // More reports than the round has steps, a negative or absurd time, a
  // negative byte count or delay: refused, and the round stays open.
  absl::Status s = job->HandleUp(0, Close(0, 3, 0.1), Wire::kUcx);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("3 step reports for a round of 2 steps"), absl::string_view::npos);
  EXPECT_EQ(job->HandleUp(0, Close(0, 1, -1), Wire::kUcx).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job->HandleUp(0, Close(0, 1, 1e9), Wire::kUcx).code(),
            absl::StatusCode::kInvalidArgument);
  v1::UpMessage bytes = Close(0, 1, 0.1);
  bytes.mutable_close()->mutable_step_reports(0)->set_up_bytes(-5);
  EXPECT_EQ(job->HandleUp(0, bytes, Wire::kUcx).code(), absl::StatusCode::kInvalidArgument);
  v1::UpMessage delay = Close(0, 1, 0.1);
  delay.mutable_close()->set_apply_delay_steps(-1);
  EXPECT_EQ(job->HandleUp(0, delay, Wire::kUcx).code(), absl::StatusCode::kInvalidArgument);
  // The next good closes count exactly.
  ASSERT_TRUE(job->HandleUp(0, Close(0, 2, 0.25), Wire::kUcx).ok());
  PushRound(job.get(), 1);
  ASSERT_TRUE(job->HandleUp(0, Close(1, 1, 0.003), Wire::kUcx).ok());
  v1::JobStats st;
  job->Stats(&st);
  ASSERT_EQ(st.ranks_size(), 1);
  const v1::WorkerStats& w = st.ranks(0).worker();
  EXPECT_EQ(w.steps(), 3);
  EXPECT_DOUBLE_EQ(w.stall_seconds(), 0.25 + 0.25 + 0.003);
  EXPECT_DOUBLE_EQ(w.step_seconds(), 1.5);
  EXPECT_EQ(w.up_bytes(), 300);
  EXPECT_EQ(w.down_bytes(), 120);
  EXPECT_EQ(w.apply_delay_steps(), 1);
  EXPECT_EQ(w.staleness_steps(), 2);
  EXPECT_EQ(w.stall_per_step_seconds().count(), 3);
  // Shards went over UCX: the transport counters say so.
  for (const v1::TransportStats& t : st.transports()) {
    EXPECT_EQ(t.shards_received(), t.transport() == "ucx" ? 4 : 0) << t.transport();
  }
  EXPECT_EQ(st.world_size(), 1);
}

// Snapshots are taken between rounds; a job made from one continues
// exactly as the original: the same later rounds give bit-identical state.
TEST(JobCheckpointTest, AJobRestoredFromASnapshotContinuesBitIdentically) {
  JobRegistry registry(RegistryOptions{});
  std::shared_ptr<Job> job = JoinedJob(&registry);
  PushRound(job.get(), 0);
  ASSERT_TRUE(job->HandleUp(0, Close(0, 2, 0.1), Wire::kGrpc).ok());
  // Round 1 half-way: its first step's sums and arrivals are in the snapshot.
  ASSERT_TRUE(job->HandleUp(0, AllColumns(2, {0.5f, -1, 2, 0.25f, 3, -0.125f}), Wire::kGrpc).ok());
  absl::StatusOr<JobSnapshot> snap = job->Snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->rounds_updated, 1);

  JobRegistry other(RegistryOptions{});
  std::map<std::string, const std::string*> sections = SectionsOf(*snap);
  v1::JobSpec spec;
  ASSERT_TRUE(spec.ParseFromString(*sections.at("spec")));
  ASSERT_TRUE(other.CreateJob(spec).ok());
  std::shared_ptr<Job> copy = *other.Find("unit");
  ASSERT_TRUE(copy->LoadSnapshot(sections).ok());
  // The same rest of round 1 (step 2 again is a duplicate on both) and round 2.
  for (Job* j : {job.get(), copy.get()}) {
    ASSERT_TRUE(j->HandleUp(0, AllColumns(3, {1, 2, 3, 4, 5, 6}), Wire::kGrpc).ok());
    ASSERT_TRUE(j->HandleUp(0, Close(1, 2, 0.1), Wire::kGrpc).ok());
    PushRound(j, 2);
    ASSERT_TRUE(j->HandleUp(0, Close(2, 2, 0.1), Wire::kGrpc).ok());
    ASSERT_TRUE(j->Snapshot().ok());  // waits for the updates
  }
  absl::StatusOr<v1::ColumnState> a = job->ReadColumns("w", {0, 1, 2});
  absl::StatusOr<v1::ColumnState> b = copy->ReadColumns("w", {0, 1, 2});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
  EXPECT_EQ(a->update_counts(0), 3);
  // A snapshot whose sections do not fit is refused.
  std::string short_master = sections.at("t0.master")->substr(4);
  sections["t0.master"] = &short_master;
  absl::Status s = copy->LoadSnapshot(sections);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

// A checkpoint written before RankArrivals (per rank and column the last
// step received and the open round's count, t0.last and t0.hits; no
// arrivals section) still loads: the round goes on where it was.
TEST(JobCheckpointTest, PerColumnArrivalSectionsOfOlderCheckpointsLoad) {
  JobRegistry registry(RegistryOptions{});
  std::shared_ptr<Job> whole = JoinedJob(&registry);
  ASSERT_TRUE(whole->HandleUp(0, AllColumns(0, {1, 2, 3, 4, 5, 6}), Wire::kGrpc).ok());
  absl::StatusOr<JobSnapshot> snap = whole->Snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status();
  std::map<std::string, const std::string*> sections = SectionsOf(*snap);
  ASSERT_EQ(sections.count("arrivals"), 1u);
  sections.erase("arrivals");
  const std::vector<int64_t> last = {0, 0, 0};
  const std::vector<int32_t> hits = {1, 1, 1};
  const std::string last_bytes(reinterpret_cast<const char*>(last.data()), 3 * sizeof(int64_t));
  const std::string hits_bytes(reinterpret_cast<const char*>(hits.data()), 3 * sizeof(int32_t));
  sections["t0.last"] = &last_bytes;
  sections["t0.hits"] = &hits_bytes;
  JobRegistry second(RegistryOptions{});
  std::shared_ptr<Job> copy = LoadedCopy(&second, sections);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->HandleUp(0, AllColumns(0, {1, 2, 3, 4, 5, 6}), Wire::kGrpc).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(copy->HandleUp(0, Close(0, 2, 0.1), Wire::kGrpc).code(),
            absl::StatusCode::kFailedPrecondition) << "one of two steps";
  for (Job* j : {whole.get(), copy.get()}) {
    ASSERT_TRUE(j->HandleUp(0, AllColumns(1, {0.5f, -1, 2, 0.25f, 3, -0.125f}), Wire::kGrpc).ok());
    ASSERT_TRUE(j->HandleUp(0, Close(0, 2, 0.1), Wire::kGrpc).ok());
  }
  EXPECT_EQ(StateAfterUpdates(copy.get()), StateAfterUpdates(whole.get()));
  // A count of more steps than a round has (S = 2), or below 0, is refused
  // before any is walked (a fuzzed one of 2^31 - 1 took the restore minutes).
  for (int32_t bad : {3, -1, 0x7fffffff}) {
    const std::vector<int32_t> wrong = {1, bad, 1};
    const std::string wrong_bytes(reinterpret_cast<const char*>(wrong.data()),
                                  3 * sizeof(int32_t));
    sections["t0.hits"] = &wrong_bytes;
    JobRegistry third(RegistryOptions{});
    v1::JobSpec spec;
    ASSERT_TRUE(spec.ParseFromString(*sections.at("spec")));
    ASSERT_TRUE(third.CreateJob(spec).ok());
    const absl::Status s = (*third.Find(spec.job_id()))->LoadSnapshot(sections);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << bad << ": " << s;
    EXPECT_NE(s.message().find("steps of its open round"), absl::string_view::npos) << s;
  }
}

TEST(JobRegistryTest, JobsBeyondMaxJobsAreRefusedUntilOneIsDeleted) {
  RegistryOptions o;
  o.max_jobs = 2;
  JobRegistry registry(o);
  for (const char* id : {"a", "b"}) {
    v1::JobSpec spec = OneTensorSpec(1, 2);
    spec.set_job_id(id);
    ASSERT_TRUE(registry.CreateJob(spec).ok());
  }
  v1::JobSpec third = OneTensorSpec(1, 2);
  third.set_job_id("c");
  absl::Status s = registry.CreateJob(third).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("--max_jobs 2"), absl::string_view::npos) << s;
  ASSERT_TRUE(registry.DeleteJob("a").ok());
  EXPECT_TRUE(registry.CreateJob(third).ok());
  absl::StatusOr<v1::GetStatsResponse> st = registry.Stats("");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->max_jobs(), 2);
  EXPECT_EQ(st->jobs_size(), 2);
}

// One rank, S = 2, two steps: the update equals AdamW computed by hand.
TEST(JobTest, OneRankTwoStepsEqualsHandComputedAdamW) {
  JobRegistry registry(RegistryOptions{});
  v1::JobSpec spec = OneTensorSpec(1, 2);
  spec.mutable_adamw()->set_lr(0.1f);
  spec.mutable_adamw()->set_weight_decay(0.0f);
  ASSERT_TRUE(registry.CreateJob(spec).ok());
  auto job = *registry.Find("unit");
  v1::UploadParametersRequest chunk;
  chunk.set_tensor("w");
  chunk.add_shape(2);
  chunk.add_shape(3);
  {
    // An upload that stages part of a tensor and is abandoned leaves nothing
    // behind (its staging is the accumulation buffer of odd rounds).
    absl::StatusOr<std::unique_ptr<Job::Upload>> junk = Job::Upload::Begin(job);
    ASSERT_TRUE(junk.ok()) << junk.status();
    EXPECT_EQ(Job::Upload::Begin(job).status().code(), absl::StatusCode::kAborted)
        << "one upload at a time";
    const float bad[3] = {100, 200, 300};
    chunk.set_payload(reinterpret_cast<const char*>(bad), sizeof(bad));
    ASSERT_TRUE((*junk)->AddChunk(chunk).ok());
  }
  absl::StatusOr<std::unique_ptr<Job::Upload>> up = Job::Upload::Begin(job);
  ASSERT_TRUE(up.ok()) << up.status();
  const float init[6] = {1, 2, 3, 4, 5, 6};  // row-major [[1,2,3],[4,5,6]]
  chunk.set_payload(reinterpret_cast<const char*>(init), sizeof(init));
  ASSERT_TRUE((*up)->AddChunk(chunk).ok());
  ASSERT_TRUE((*up)->Commit().ok());
  up->reset();
  EXPECT_EQ(Job::Upload::Begin(job).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(job->Join(0).ok());
  // Column 1 gets gradients (col-major: rows 0,1) 1,3 at step 0 and 3,5 at step 1.
  for (int step = 0; step < 2; ++step) {
    const std::array<float, 6> g = {0, 0, 1.0f + 2 * step, 3.0f + 2 * step, 0, 0};
    ASSERT_TRUE(job->HandleUp(0, AllColumns(step, g), Wire::kGrpc).ok());
  }
  v1::UpMessage close;
  close.mutable_close()->set_round(0);
  close.mutable_close()->set_lr(0.1f);
  ASSERT_TRUE(job->HandleUp(0, close, Wire::kGrpc).ok());
  absl::StatusOr<v1::ColumnState> st = job->ReadColumns("w", {1, 0});
  ASSERT_TRUE(st.ok()) << st.status();
  // Mean gradient of column 1: (2, 4). First AdamW step: m = 0.1 g,
  // v = 0.001 g^2, m_hat = g, v_hat = g^2, p -= lr * g / (|g| + eps) = lr
  // (one step of lr for the two-step round: docs/design.md rule 12 is off by
  // default).
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
    Wire wire() const override { return Wire::kGrpc; }
    std::vector<std::string> written;
    void Write(const v1::DownMessage* msg) override {
      written.push_back(msg->done().DebugString());
    }
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

// Flow control: Full() once the queued bytes reach the limit; Resume() once
// the writer has drained them below half of it.
TEST(MailboxTest, FullUntilDrainedBelowHalfTheLimitThenResumes) {
  struct FakeWriter : Mailbox::Writer {
    Wire wire() const override { return Wire::kGrpc; }
    int writes = 0, resumes = 0;
    void Write(const v1::DownMessage*) override { ++writes; }
    void Resume() override { ++resumes; }
  } w;
  v1::DownMessage m;
  m.mutable_error()->set_message(std::string(100, 'x'));
  const int64_t size = static_cast<int64_t>(m.ByteSizeLong());
  Mailbox box(4 * size);
  ASSERT_TRUE(box.Attach(&w));
  for (int i = 0; i < 3; ++i) box.Push(m);
  EXPECT_EQ(box.bytes(), 3 * size);
  EXPECT_FALSE(box.Full(&w));
  box.Push(m);
  EXPECT_EQ(box.bytes(), 4 * size);
  EXPECT_TRUE(box.Full(&w));
  EXPECT_TRUE(box.paused());
  EXPECT_FALSE(box.WriteDone(&w, true));  // 3 left: not below half yet
  EXPECT_EQ(w.resumes, 0);
  EXPECT_FALSE(box.WriteDone(&w, true));  // 2 left: still not below half
  EXPECT_EQ(w.resumes, 0);
  EXPECT_FALSE(box.WriteDone(&w, true));  // 1 left: below half
  EXPECT_EQ(w.resumes, 1);
  EXPECT_FALSE(box.paused());
  EXPECT_FALSE(box.WriteDone(&w, true));
  EXPECT_EQ(box.bytes(), 0);
  EXPECT_EQ(w.writes, 4);
  // Shared messages are counted per outbox, held once.
  auto shared = std::make_shared<const v1::DownMessage>(m);
  Mailbox other(0);
  other.Push(shared);
  box.Push(shared);
  EXPECT_EQ(shared.use_count(), 3);
  EXPECT_FALSE(other.Full(&w)) << "0 means unlimited";
}

// While another job's update holds a driver (here: a task that does not end
// until released, standing for a very large update), a small job's round is
// updated on the other driver.
TEST(JobRegistryTest, ALargeUpdateDoesNotDelayAnotherJobsRound) {
  RegistryOptions o;
  o.update_drivers = 2;
  JobRegistry registry(o);
  Mutex mu;
  bool release = false;
  auto large = registry.scheduler()->NewStrand();
  large->Schedule([&] {
    MutexLock lock(&mu);
    mu.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return release; },
                        absl::Seconds(60));
  });
  v1::JobSpec spec = OneTensorSpec(1, 1);
  ASSERT_TRUE(registry.CreateJob(spec).ok());
  auto job = *registry.Find("unit");
  absl::StatusOr<std::unique_ptr<Job::Upload>> up = Job::Upload::Begin(job);
  ASSERT_TRUE(up.ok());
  v1::UploadParametersRequest chunk;
  chunk.set_tensor("w");
  chunk.add_shape(2);
  chunk.add_shape(3);
  const float init[6] = {1, 2, 3, 4, 5, 6};
  chunk.set_payload(reinterpret_cast<const char*>(init), sizeof(init));
  ASSERT_TRUE((*up)->AddChunk(chunk).ok());
  ASSERT_TRUE((*up)->Commit().ok());
  up->reset();
  ASSERT_TRUE(job->Join(0).ok());
  v1::UpMessage m;
  auto* sh = m.mutable_shard();
  sh->set_step(0);
  sh->set_tensor("w");
  sh->set_dtype(v1::DTYPE_FP32);
  for (int c = 0; c < 3; ++c) sh->add_columns(c);
  const float g[6] = {1, 1, 1, 1, 1, 1};
  sh->set_payload(reinterpret_cast<const char*>(g), sizeof(g));
  ASSERT_TRUE(job->HandleUp(0, m, Wire::kGrpc).ok());
  v1::UpMessage close;
  close.mutable_close()->set_round(0);
  close.mutable_close()->set_lr(0.1f);
  ASSERT_TRUE(job->HandleUp(0, close, Wire::kGrpc).ok());
  int64_t updated = 0;
  for (int i = 0; i < 3000 && updated == 0; ++i) {
    v1::GetJobResponse d;
    job->Describe(&d);
    updated = d.rounds_updated();
    if (updated == 0) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(updated, 1) << "the small job's round waited for the large update";
  MutexLock lock(&mu);
  release = true;
}

// A job over the budget reserves nothing: the same id and a fitting job
// are accepted right after.
TEST(JobRegistryTest, OverBudgetJobReservesNothing) {
  RegistryOptions o;
  o.memory_budget_bytes = 1 << 20;
  JobRegistry registry(o);
  v1::JobSpec spec = OneTensorSpec(1, 2);
  spec.mutable_tensors(0)->set_shape(0, 256);
  spec.mutable_tensors(0)->set_shape(1, 256);  // 64K params x 28 B > 1 MiB
  absl::StatusOr<v1::JobSpec> r = registry.CreateJob(spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("--memory_budget_bytes"), absl::string_view::npos);
  EXPECT_EQ(registry.Find("unit").status().code(), absl::StatusCode::kNotFound);
  spec.mutable_tensors(0)->set_shape(0, 16);
  ASSERT_TRUE(registry.CreateJob(spec).ok());
  absl::StatusOr<v1::GetStatsResponse> st = registry.Stats("");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->memory_reserved_bytes(), st->jobs(0).memory_bytes());
  ASSERT_TRUE(registry.DeleteJob("unit").ok());
  EXPECT_EQ(registry.Stats("")->memory_reserved_bytes(), 0);
}

// Four ranks push their shards of one job at once, in column chunks that
// cross the shared buffer's stripe blocks, while another thread takes
// snapshots (which quiesce the adds). The gradients are small integers, so
// every order of adding gives the same exact sums: the state must equal a
// run that pushed everything from one thread, in both accumulation modes.
TEST(JobTest, ShardsOfDifferentRanksAccumulateConcurrently) {
  constexpr int kWorld = 4, kRows = 64, kCols = 600, kChunk = 40;
  auto make = [&](JobRegistry* registry, bool rank_ordered) {
    v1::JobSpec spec;
    spec.set_job_id("wide");
    auto* t = spec.add_tensors();
    t->set_name("w");
    t->add_shape(kRows);
    t->add_shape(kCols);
    spec.set_world_size(kWorld);
    spec.set_wire_dtype(v1::DTYPE_FP32);
    spec.mutable_zenflow()->set_update_interval(2);
    spec.set_rank_ordered_sums(rank_ordered);
    EXPECT_TRUE(registry->CreateJob(spec).ok());
    std::shared_ptr<Job> job = *registry->Find("wide");
    std::vector<float> init(kRows * kCols);
    for (size_t i = 0; i < init.size(); ++i) init[i] = 0.01f * static_cast<float>(i % 97);
    UploadWAndJoin(job, kRows, kCols, init, kWorld);
    return job;
  };
  // Rank `rank`'s shards of rounds 0 and 1, then its closes.
  auto push_rank = [&](Job* job, int rank) {
    for (int64_t round = 0; round < 2; ++round) {
      for (int64_t step = 2 * round; step < 2 * round + 2; ++step) {
        for (int first = 0; first < kCols; first += kChunk) {
          v1::UpMessage m;
          v1::GradientShard* s = m.mutable_shard();
          s->set_step(step);
          s->set_tensor("w");
          s->set_dtype(v1::DTYPE_FP32);
          std::vector<float> g;
          for (int c = first; c < first + kChunk; ++c) {
            s->add_columns(c);
            for (int r = 0; r < kRows; ++r) {
              g.push_back(static_cast<float>((rank * 7 + step * 3 + c + r) % 9) - 4.0f);
            }
          }
          s->set_payload(reinterpret_cast<const char*>(g.data()), g.size() * sizeof(float));
          absl::Status st = job->HandleUp(rank, m, Wire::kGrpc);
          ASSERT_TRUE(st.ok()) << st;
        }
      }
      v1::UpMessage close;
      close.mutable_close()->set_round(round);
      close.mutable_close()->set_lr(0.1f);
      absl::Status st;
      // Round 1 reuses no buffer, but its close may not pass round 0's
      // update; nothing here waits for one, so just close.
      st = job->HandleUp(rank, close, Wire::kGrpc);
      ASSERT_TRUE(st.ok()) << st;
    }
  };
  std::vector<int32_t> all(kCols);
  for (int c = 0; c < kCols; ++c) all[c] = c;
  auto state = [&](Job* job) {
    EXPECT_TRUE(job->Snapshot().ok());  // waits for the updates
    absl::StatusOr<v1::ColumnState> st = job->ReadColumns("w", all);
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? st->SerializeAsString() : "";
  };
  for (bool rank_ordered : {false, true}) {
    SCOPED_TRACE(rank_ordered ? "rank-ordered sums" : "shared sums");
    JobRegistry one(RegistryOptions{});
    std::shared_ptr<Job> serial = make(&one, rank_ordered);
    for (int r = 0; r < kWorld; ++r) push_rank(serial.get(), r);
    const std::string want = state(serial.get());

    JobRegistry many(RegistryOptions{});
    std::shared_ptr<Job> job = make(&many, rank_ordered);
    std::atomic<bool> done{false};
    std::thread snapshots([&] {
      while (!done.load()) {
        absl::StatusOr<JobSnapshot> snap = job->Snapshot();
        EXPECT_TRUE(snap.ok()) << snap.status();
      }
    });
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r) ranks.emplace_back([&, r] { push_rank(job.get(), r); });
    for (std::thread& t : ranks) t.join();
    done = true;
    snapshots.join();
    v1::JobStats stats;
    job->Stats(&stats);
    EXPECT_EQ(stats.shards_received(), int64_t{kWorld} * 4 * (kCols / kChunk));
    EXPECT_EQ(state(job.get()), want);
  }
}

// Rounds of changing length (auto_update_interval, S_max = 4): every rank
// closes a round with the same steps, its shards belong to its open round,
// and every rejection below leaves the state as a run without them has it,
// through a snapshot taken mid-round too.
TEST(JobTest, AutoIntervalRoundsOfChangingLength) {
  auto make = [](JobRegistry* registry) {
    v1::JobSpec spec = OneTensorSpec(2, 4);
    spec.mutable_zenflow()->set_auto_update_interval(true);
    spec.set_rank_ordered_sums(true);
    return JoinedJob(registry, spec);
  };
  auto close = [](int64_t round, int32_t steps) {
    v1::UpMessage m;
    m.mutable_close()->set_round(round);
    m.mutable_close()->set_lr(0.1f);
    m.mutable_close()->set_steps(steps);
    return m;
  };
  auto push = [](Job* job, int rank, int64_t step) {
    return job->HandleUp(rank, AllColumns(step, OrderSensitive(rank, step)), Wire::kGrpc);
  };
  // The good sequence: rounds of 3, 1 and 2 steps, then round 3 half-way.
  auto good = [&](Job* job, bool with_errors) {
    for (int rank : {0, 1}) {
      for (int64_t step : {0, 1, 2}) ASSERT_TRUE(push(job, rank, step).ok());
    }
    for (int rank : {0, 1}) ASSERT_TRUE(job->HandleUp(rank, close(0, 3), Wire::kGrpc).ok());
    for (int rank : {0, 1}) ASSERT_TRUE(push(job, rank, 3).ok());
    ASSERT_TRUE(job->HandleUp(0, close(1, 1), Wire::kGrpc).ok());
    if (with_errors) {
      // Another length than rank 0's.
      absl::Status s = job->HandleUp(1, close(1, 2), Wire::kGrpc);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("steps 2 differ from the 1 steps other ranks closed it with"),
                absl::string_view::npos) << s;
    }
    ASSERT_TRUE(job->HandleUp(1, close(1, 1), Wire::kGrpc).ok());
    if (with_errors) {
      // Round 2 starts at step 4: step 3 is closed, step 8 beyond S_max.
      absl::Status s = push(job, 0, 3);
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_NE(s.message().find("starts at step 4"), absl::string_view::npos) << s;
      s = push(job, 0, 8);
      EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
      EXPECT_NE(s.message().find("at most 4 steps"), absl::string_view::npos) << s;
    }
    // Round 2 reuses round 0's buffers: its update must be done (a worker's
    // apply delay sees to that).
    ASSERT_TRUE(job->Snapshot().ok());
    for (int rank : {0, 1}) {
      for (int64_t step : {4, 5}) ASSERT_TRUE(push(job, rank, step).ok());
    }
    if (with_errors) {
      // One step, but gradients of two were sent.
      absl::Status s = job->HandleUp(0, close(2, 1), Wire::kGrpc);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("sent gradients of step 5"), absl::string_view::npos) << s;
    }
    for (int rank : {0, 1}) ASSERT_TRUE(job->HandleUp(rank, close(2, 2), Wire::kGrpc).ok());
    ASSERT_TRUE(job->Snapshot().ok());  // round 1's update: round 3 reuses its buffers
    ASSERT_TRUE(push(job, 0, 6).ok());
  };
  JobRegistry clean_registry(RegistryOptions{});
  std::shared_ptr<Job> clean = make(&clean_registry);
  good(clean.get(), false);
  JobRegistry registry(RegistryOptions{});
  std::shared_ptr<Job> job = make(&registry);
  good(job.get(), true);
  v1::JobStats stats;
  job->Stats(&stats);
  EXPECT_EQ(stats.last_round_steps(), 2);
  EXPECT_EQ(stats.rounds_updated() + stats.update_queue_depth(), 3);

  // Mid-round 3 (rank 0 sent step 6): a snapshot restores the open round.
  absl::StatusOr<JobSnapshot> snap = job->Snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status();
  std::map<std::string, const std::string*> sections = SectionsOf(*snap);
  JobRegistry second(RegistryOptions{});
  v1::JobSpec spec;
  ASSERT_TRUE(spec.ParseFromString(*sections.at("spec")));
  ASSERT_TRUE(second.CreateJob(spec).ok());
  std::shared_ptr<Job> copy = *second.Find("unit");
  ASSERT_TRUE(copy->LoadSnapshot(sections).ok());
  for (Job* j : {clean.get(), job.get(), copy.get()}) {
    // Rank 0's round 3 goes on at step 7; rank 1 sends steps 6 and 7.
    absl::Status s = push(j, 0, 6);
    EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
    ASSERT_TRUE(push(j, 0, 7).ok());
    ASSERT_TRUE(push(j, 1, 6).ok());
    ASSERT_TRUE(push(j, 1, 7).ok());
    for (int rank : {0, 1}) ASSERT_TRUE(j->HandleUp(rank, close(3, 2), Wire::kGrpc).ok());
  }
  const std::string want = StateAfterUpdates(clean.get());
  EXPECT_EQ(StateAfterUpdates(job.get()), want);
  EXPECT_EQ(StateAfterUpdates(copy.get()), want);
}

}  // namespace
}  // namespace zenflow

namespace zenflow {
namespace {

// A shard's payload in pieces (gRPC's slices: columns and even values cut
// across them) is checked and added exactly as the same bytes in one piece,
// for every dtype; a non-finite value in a cut column is refused alike, and
// the next good shard gives the same state.
TEST(JobTest, PayloadInPiecesAccumulatesAsOnePiece) {
  constexpr int kRows = 24, kCols = 40;
  auto make = [&](JobRegistry* registry) {
    v1::JobSpec spec;
    spec.set_job_id("pieces");
    auto* t = spec.add_tensors();
    t->set_name("w");
    t->add_shape(kRows);
    t->add_shape(kCols);
    spec.set_world_size(1);
    spec.set_wire_dtype(v1::DTYPE_FP32);
    spec.mutable_zenflow()->set_update_interval(4);
    EXPECT_TRUE(registry->CreateJob(spec).ok());
    std::shared_ptr<Job> job = *registry->Find("pieces");
    UploadWAndJoin(job, kRows, kCols, std::vector<float>(kRows * kCols, 0.5f), 1);
    return job;
  };
  // Step `step`'s shard of columns [first, first + n) in `dtype`.
  auto shard = [&](int64_t step, int first, int n, v1::DType dtype, bool nan) {
    v1::UpMessage m;
    v1::GradientShard* s = m.mutable_shard();
    s->set_step(step);
    s->set_tensor("w");
    s->set_dtype(dtype);
    std::vector<float> g;
    for (int c = first; c < first + n; ++c) {
      s->add_columns(c);
      for (int r = 0; r < kRows; ++r) {
        g.push_back(0.125f * static_cast<float>((step * 5 + c * 3 + r) % 11) - 0.5f);
      }
    }
    if (nan && dtype != v1::DTYPE_INT8) g[g.size() / 2 + 1] = std::nanf("");
    std::string bytes;
    if (dtype == v1::DTYPE_INT8) {
      // (NaN for int8: a scale that makes the column's values overflow)
      for (int i = 0; i < n; ++i) {
        s->add_scales(nan && i == n / 2 ? 3e38f : 0.01f * static_cast<float>(i + 1));
      }
      for (float v : g) bytes.push_back(static_cast<char>(static_cast<int>(v * 8)));
    } else {
      const DType dt = dtype == v1::DTYPE_BF16 ? DType::kBF16 : DType::kF32;
      bytes.resize(g.size() * DTypeSize(dt));
      Encode(dt, g.data(), g.size(), bytes.data());
    }
    s->set_payload(bytes);
    return m;
  };
  std::vector<int32_t> all(kCols);
  for (int c = 0; c < kCols; ++c) all[c] = c;
  auto state = [&](Job* job) {
    EXPECT_TRUE(job->Snapshot().ok());
    absl::StatusOr<v1::ColumnState> st = job->ReadColumns("w", all);
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? st->SerializeAsString() : "";
  };
  JobRegistry one_registry(RegistryOptions{}), pieces_registry(RegistryOptions{});
  std::shared_ptr<Job> one = make(&one_registry), cut = make(&pieces_registry);
  uint32_t seed = 7;
  auto both = [&](const v1::UpMessage& m) {
    const absl::Status a = one->HandleUp(0, m, Wire::kGrpc);
    if (!m.has_shard()) {
      EXPECT_EQ(a, cut->HandleUp(0, m, Wire::kGrpc));
      return a;
    }
    v1::UpMessage head = m;
    const std::string bytes = head.shard().payload();
    head.mutable_shard()->clear_payload();
    ShardPayload payload;
    for (size_t at = 0; at < bytes.size();) {
      seed = seed * 1103515245u + 12345u;
      const size_t n = std::min<size_t>(bytes.size() - at, 1 + (seed >> 16) % 61);
      payload.Append(absl::string_view(bytes).substr(at, n));
      at += n;
    }
    EXPECT_FALSE(payload.contiguous());
    const absl::Status b = cut->HandleUp(0, head, Wire::kGrpc, &payload);
    EXPECT_EQ(a, b);
    return b;
  };
  const v1::DType dtypes[] = {v1::DTYPE_FP32, v1::DTYPE_BF16, v1::DTYPE_INT8};
  for (int64_t step = 0; step < 4; ++step) {
    const v1::DType dt = dtypes[step % 3];
    ASSERT_TRUE(both(shard(step, 0, 17, dt, false)).ok());
    const absl::Status bad = both(shard(step, 17, 23, dt, true));
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(bad.message().find("non-finite"), std::string::npos) << bad;
    ASSERT_TRUE(both(shard(step, 17, 23, dt, false)).ok());
  }
  v1::UpMessage close;
  close.mutable_close()->set_round(0);
  close.mutable_close()->set_lr(0.1f);
  ASSERT_TRUE(both(close).ok());
  EXPECT_EQ(state(one.get()), state(cut.get()));
}

}  // namespace
}  // namespace zenflow
