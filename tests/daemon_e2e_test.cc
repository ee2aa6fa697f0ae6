// End-to-end tests of zenflowd: a real daemon process, real loopback gRPC,
// the client library, and an independent reference optimizer.
#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/selection.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/harness.h"
#include "tests/testing/status_macros.h"

namespace zenflow::testing {
namespace {

class DaemonE2ETest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new DaemonProcess();
    const absl::Status s = daemon_->Start({"--update_threads=2"});
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    const absl::Status s = daemon_->Stop();
    EXPECT_TRUE(s.ok()) << "zenflowd did not shut down cleanly: " << s;
    delete daemon_;
    daemon_ = nullptr;
  }
  static DaemonProcess* daemon_;
};

DaemonProcess* DaemonE2ETest::daemon_ = nullptr;

TEST_F(DaemonE2ETest, TwoRanksFourStepsFp32MatchReferenceAdamW) {
  JobOptions o;
  o.job_id = "fp32";
  o.wire = DType::kF32;
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  // Three rounds: bias correction by each column's own update count.
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.GoodRound(5e-3f));
  ASSERT_OK(h.GoodRound(2e-3f));
  absl::StatusOr<v1::GetStatsResponse> stats = h.client(0).GetStats("fp32");
  ASSERT_OK(stats.status());
  ASSERT_EQ(stats->jobs_size(), 1);
  EXPECT_EQ(stats->jobs(0).rounds_updated(), 3);
  EXPECT_EQ(stats->jobs(0).params(), 8 * 16 + 16);
  EXPECT_TRUE(stats->jobs(0).rejected().empty());
  // The data went the way this target says (the daemon offers both).
  EXPECT_TRUE(stats->ucx().enabled());
  if (TestTransport() == Transport::kUcx) {
    EXPECT_GE(stats->ucx().frames_received(), stats->jobs(0).shards_received());
    EXPECT_GT(stats->ucx().messages_sent(), 0);
    EXPECT_EQ(stats->ucx().connections(), 2);
  } else {
    EXPECT_EQ(stats->ucx().frames_received(), 0);
    EXPECT_EQ(stats->ucx().connections(), 0);
  }
}

// One-step rounds (not sync) carry the columns' m, v and update counts for
// the ranks' predicted step (checked against the reference in
// CheckRound), and only those: four-step rounds carry none (the other
// tests).
TEST_F(DaemonE2ETest, OneStepRoundsCarryTheStateForThePredictedStep) {
  JobOptions o;
  o.job_id = "one-step";
  o.interval = 1;
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  for (float lr : {1e-2f, 5e-3f, 2e-3f, 1e-3f}) ASSERT_OK(h.GoodRound(lr));
  // Reselection hands state both ways; the next rounds' state follows.
  std::vector<float> imp(16, 1.0f);
  imp[3] = imp[11] = 50.0f;
  ASSERT_OK(h.Reselect({imp, {}}));
  ASSERT_OK(h.GoodRound(1e-3f));
  ASSERT_OK(h.GoodRound(1e-3f));
}

// Rule 12 (docs/design.md): the daemon's step of a four-step round has
// 4 x lr, or lr with scale_round_step off; the harness's reference AdamW
// (adamw_reference.h) takes the one the job asked for, so each job passes
// only if the daemon honours its own setting. Rule 13: every delta carries
// row_v, col_v and v_mean, which equal the means of the bias-corrected v
// the daemon holds (GetState) to fp32 rounding; off, none.
TEST_F(DaemonE2ETest, ScaledRoundStepAndFactoredMomentOfTheDaemonsV) {
  JobOptions o;
  o.job_id = "rule12-13";
  o.world = 2;
  o.interval = 4;
  o.scale_round_step = true;  // both off by default (docs/design.md rules 12, 13)
  o.local_step = true;
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_TRUE(h.created().zenflow().scale_round_step()) << "asked for";
  ASSERT_TRUE(h.created().zenflow().local_step()) << "asked for";
  EXPECT_EQ(h.RoundLr(1e-2f), 4e-2f);
  for (float lr : {1e-2f, 5e-3f}) ASSERT_OK(h.GoodRound(lr));
  std::vector<float> imp(16, 1.0f);
  imp[3] = imp[11] = 50.0f;
  ASSERT_OK(h.Reselect({imp, {}}));
  ASSERT_OK(h.GoodRound(2e-3f));

  absl::StatusOr<v1::ColumnState> st = h.client(0).GetState("rule12-13", "w");
  ASSERT_OK(st.status());
  const int64_t rows = 8;
  const int n = st->columns_size();
  ASSERT_EQ(n, 12) << "16 columns, 4 important (k 0.25)";
  std::vector<double> row(rows, 0.0), col(n, 0.0);
  double total = 0;
  for (int i = 0; i < n; ++i) {
    const double bc2 = 1.0 - std::pow(static_cast<double>(0.999f),
                                      static_cast<double>(st->update_counts(i)));
    for (int64_t r = 0; r < rows; ++r) {
      const double vh = static_cast<double>(st->v(static_cast<int>(i * rows + r))) / bc2;
      row[r] += vh;
      col[i] += vh;
      total += vh;
    }
  }
  int checked = 0;
  for (const v1::ParameterDelta& d : h.last_deltas()) {
    if (d.tensor() != "w") continue;
    ASSERT_EQ(d.row_v_size(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_NEAR(d.row_v(static_cast<int>(r)), row[r] / n, 4e-7 * row[r] / n) << "row " << r;
    }
    for (int i = 0; i < d.columns_size(); ++i) {
      const int at = static_cast<int>(std::find(st->columns().begin(), st->columns().end(),
                                                d.columns(i)) - st->columns().begin());
      ASSERT_LT(at, n);
      EXPECT_NEAR(d.col_v(i), col[at] / rows, 4e-7 * col[at] / rows) << "column " << d.columns(i);
      ++checked;
    }
    EXPECT_NEAR(d.v_mean(), total / (n * rows), 4e-7 * total / (n * rows));
  }
  EXPECT_EQ(checked, n);

  JobOptions off = o;
  off.job_id = "rule12-13-off";
  off.scale_round_step.reset();  // the defaults: both off
  off.local_step.reset();
  Harness g(daemon_->target(), off);
  ASSERT_OK(g.Setup());
  EXPECT_EQ(g.RoundLr(1e-2f), 1e-2f);
  ASSERT_OK(g.GoodRound(1e-2f));  // one step of lr, and no factored moment (CheckRound)
  ASSERT_OK(g.GoodRound(5e-3f));
  for (const v1::ParameterDelta& d : g.last_deltas()) EXPECT_EQ(d.row_v_size(), 0);
}

// The update divergence (docs/design.md rule 14): a one-step round's update
// is per-step AdamW, so its divergence is zero; one AdamW step for a round
// of four (the scaled round step, rule 12, off) is far from four steps.
TEST_F(DaemonE2ETest, UpdateDivergenceIsZeroForOneStepRoundsAndLargeForOneStepOfFour) {
  for (int interval : {1, 4}) {
    JobOptions o;
    o.job_id = absl::StrCat("divergence-", interval);
    o.interval = interval;
    o.tensors = {{"w", 8, 400, false}, {"b", 1, 16, true}};
    Harness h(daemon_->target(), o);
    ASSERT_OK(h.Connect());
    v1::JobSpec spec = h.spec();
    spec.mutable_zenflow()->set_scale_round_step(false);
    ASSERT_OK(h.client(0).CreateJob(spec).status());
    ASSERT_OK(h.Upload());
    ASSERT_OK(h.JoinAll());
    absl::StatusOr<v1::GetStatsResponse> stats = h.client(0).GetStats(o.job_id);
    ASSERT_OK(stats.status());
    EXPECT_FALSE(stats->jobs(0).has_update_divergence());  // nothing measured yet
    for (int r = 0; r < 3; ++r) ASSERT_OK(h.GoodRound(1e-2f));
    stats = h.client(0).GetStats(o.job_id);
    ASSERT_OK(stats.status());
    ASSERT_TRUE(stats->jobs(0).has_update_divergence()) << interval;
    const float d = stats->jobs(0).update_divergence();
    if (interval == 1) {
      EXPECT_LT(d, 1e-6f);
    } else {
      EXPECT_GT(d, 0.3f);
      EXPECT_LT(d, 2.0f);
    }
  }
}

TEST_F(DaemonE2ETest, TwoRanksFourStepsBf16MatchReferenceOnBf16Inputs) {
  JobOptions o;
  o.job_id = "bf16";
  o.wire = DType::kBF16;
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.GoodRound(1e-2f));
  // The wire really was bf16: 2 bytes per gradient value.
  absl::StatusOr<v1::GetStatsResponse> stats = h.client(0).GetStats("bf16");
  ASSERT_OK(stats.status());
  EXPECT_EQ(stats->jobs(0).shard_bytes_received(), 2 /*rounds*/ * 2 /*ranks*/ * 4 /*steps*/ *
                                                       (8 * 16 + 16) * 2 /*bytes*/);
}

TEST_F(DaemonE2ETest, OneRankLargeTensorSplitsIntoManyShards) {
  JobOptions o;
  o.job_id = "large";
  o.world = 1;
  o.interval = 2;
  o.tensors = {{"w", 96, 300, false}};
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-3f));
  ASSERT_OK(h.GoodRound(1e-3f));
}

TEST_F(DaemonE2ETest, ClippingUsesTheMeanGradientNorm) {
  JobOptions o;
  o.job_id = "clip";
  o.max_grad_norm = 0.5f;  // the test gradients' mean has a norm of several units
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.GoodRound(1e-2f));
  // The clip needs the norm before AdamW: every round took two passes.
  absl::StatusOr<v1::GetStatsResponse> st = h.client(0).GetStats(o.job_id);
  ASSERT_OK(st.status());
  EXPECT_EQ(st->jobs(0).rounds_norm_first(), 2);
}

// Expected top-k over the sum of both ranks' importance (0.25x + 0.75x).
std::vector<int32_t> ExpectedTopK(const std::vector<float>& imp, float k) {
  std::vector<float> sum(imp.size());
  for (size_t i = 0; i < imp.size(); ++i) sum[i] = imp[i] * 0.25f + imp[i] * 0.75f;
  std::vector<int32_t> idx(imp.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return sum[a] > sum[b]; });
  idx.resize(static_cast<size_t>(std::ceil(k * imp.size() - 1e-6)));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST_F(DaemonE2ETest, ReselectionHandsOffStateExactlyBothWays) {
  JobOptions o;
  o.job_id = "resel";
  o.topk = 0.25f;  // 4 of 16 columns of "w"; "b" (1-D) always important
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  // Warm-up round: every column through the daemon.
  ASSERT_OK(h.GoodRound(1e-2f));

  std::vector<float> imp1(16), imp2(16), imp3(16);
  for (int c = 0; c < 16; ++c) {
    imp1[c] = static_cast<float>((c * 7) % 16);   // top: 13, 6, 15(?)... computed below
    imp2[c] = static_cast<float>((c * 5 + 3) % 16);
    imp3[c] = c == 2 || c == 9 ? 100.0f : 1.0f;   // ties among the rest: lowest indices
  }
  for (const auto* imp : {&imp1, &imp2, &imp3}) {
    ASSERT_OK(h.Reselect({*imp, {}}));
    // The daemon's selection is the exact top-k of the summed importance.
    std::vector<int32_t> want = ExpectedTopK(*imp, 0.25f);
    std::vector<int32_t> remote_want;
    for (int32_t c = 0; c < 16; ++c) {
      if (!std::binary_search(want.begin(), want.end(), c)) remote_want.push_back(c);
    }
    EXPECT_EQ(h.remote()[0], remote_want);
    EXPECT_TRUE(h.remote()[1].empty()) << "1-D tensors are always important";
    ASSERT_OK(h.GoodRound(1e-2f));
    ASSERT_OK(h.GoodRound(5e-3f));
  }
  absl::StatusOr<v1::GetJobResponse> job = h.client(1).GetJob("resel");
  ASSERT_OK(job.status());
  EXPECT_EQ(job->selection_version(), 3);
  EXPECT_EQ(job->rounds_updated(), 7);
}

TEST_F(DaemonE2ETest, HandOffInOneCallPerTensorIsExact) {
  JobOptions o;
  o.job_id = "handoff-split";
  o.tensors = {{"w", 8, 16, false}, {"v", 4, 12, false}, {"b", 1, 16, true}};
  o.handoff_per_tensor = true;
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  std::vector<float> a(16), b(12), c(16), d(12);
  for (int i = 0; i < 16; ++i) {
    a[i] = static_cast<float>(i);
    c[i] = static_cast<float>((i * 5) % 16);
  }
  for (int i = 0; i < 12; ++i) {
    b[i] = static_cast<float>(12 - i);
    d[i] = static_cast<float>((i * 7) % 12);
  }
  ASSERT_OK(h.Reselect({a, b, {}}));
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.Reselect({c, d, {}}));  // columns leave and join in both tensors
  ASSERT_OK(h.GoodRound(1e-2f));
}

TEST_F(DaemonE2ETest, ShardsWaitUntilEveryTensorIsHandedOff) {
  JobOptions o;
  o.job_id = "handoff-partial";
  o.world = 1;
  o.tensors = {{"w", 8, 16, false}, {"v", 4, 12, false}};
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  std::vector<v1::TensorImportance> imp(2);
  imp[0].set_tensor("w");
  imp[1].set_tensor("v");
  for (int i = 0; i < 16; ++i) imp[0].add_scores(static_cast<float>(i));
  for (int i = 0; i < 12; ++i) imp[1].add_scores(static_cast<float>(i));
  absl::StatusOr<v1::Selection> sel = h.client(0).SubmitImportance(0, imp);
  ASSERT_OK(sel.status());
  ASSERT_OK(h.client(0).HandOff(sel->version(), {}, {"w"}).status());
  v1::GradientShard s;
  s.set_step(0);
  s.set_tensor("w");
  s.set_selection_version(sel->version());
  s.set_dtype(v1::DTYPE_FP32);
  s.add_columns(0);
  s.set_payload(std::string(8 * 4, '\0'));
  ASSERT_OK(h.client(0).PushShard(s));
  ASSERT_TRUE(h.client(0).WaitForErrors(1, absl::Seconds(30)));
  const absl::Status err = h.client(0).TakeErrors()[0];
  EXPECT_EQ(err.code(), absl::StatusCode::kFailedPrecondition) << err;
  EXPECT_NE(err.message().find("must call HandOff"), std::string::npos) << err;
  // A leaving state for a tensor outside the call is refused.
  v1::ColumnState stray;
  stray.set_tensor("w");
  const absl::Status bad = h.client(0).HandOff(sel->version(), {stray}, {"v"}).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  ASSERT_OK(h.client(0).HandOff(sel->version(), {}, {"v"}).status());
  ASSERT_OK(h.client(0).PushShard(s));
  // The stream is ordered: if the next error is the one for a marker sent
  // after the shard, the shard was accepted.
  v1::GradientShard marker = s;
  marker.set_tensor("sync-marker");
  ASSERT_OK(h.client(0).PushShard(marker));
  ASSERT_TRUE(h.client(0).WaitForErrors(1, absl::Seconds(30)));
  const std::vector<absl::Status> errs = h.client(0).TakeErrors();
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].code(), absl::StatusCode::kNotFound) << errs[0];
  EXPECT_NE(errs[0].message().find("sync-marker"), std::string::npos) << errs[0];
}

TEST_F(DaemonE2ETest, ManyJobsAndRanksConcurrently) {
  constexpr int kJobs = 3;
  std::vector<absl::Status> results(kJobs);
  std::vector<std::thread> threads;
  for (int j = 0; j < kJobs; ++j) {
    threads.emplace_back([&, j] {
      JobOptions o;
      o.job_id = absl::StrCat("concurrent-", j);
      o.world = 2 + j % 2;
      o.wire = j == 1 ? DType::kBF16 : DType::kF32;
      Harness h(daemon_->target(), o);
      absl::Status s = h.Setup();
      for (int r = 0; s.ok() && r < 3; ++r) s = h.GoodRound(1e-2f);
      if (s.ok()) s = h.Reselect({std::vector<float>(16, 1.0f), {}});
      for (int r = 0; s.ok() && r < 2; ++r) s = h.GoodRound(1e-2f);
      results[j] = s;
    });
  }
  for (auto& t : threads) t.join();
  for (int j = 0; j < kJobs; ++j) EXPECT_TRUE(results[j].ok()) << "job " << j << ": " << results[j];
}

TEST_F(DaemonE2ETest, DeltasQueuedWhileDetachedArriveAfterReattach) {
  JobOptions o;
  o.job_id = "reattach";
  o.world = 1;
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  // A second client attaches to the same joined rank only after the first
  // one's stream is gone.
  ClientOptions co = TestClientOptions(daemon_->target());
  absl::StatusOr<std::unique_ptr<Client>> other = Client::Connect(co);
  ASSERT_OK(other.status());
  absl::Status busy = (*other)->Attach("reattach", 0);
  EXPECT_EQ(busy.code(), absl::StatusCode::kAlreadyExists) << busy;
  EXPECT_NE(busy.message().find("already has a stream"), std::string::npos) << busy;
}

TEST_F(DaemonE2ETest, AllReduceReturnsTheSameMeanToEveryRank) {
  JobOptions o;
  o.job_id = "allreduce";
  o.world = 3;
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  std::vector<absl::StatusOr<std::vector<std::vector<float>>>> out(3, absl::UnknownError(""));
  std::vector<std::vector<float>> a(3), b(3);
  for (int r = 0; r < 3; ++r) {
    a[r] = {1.0f * r, 0.1f + r, -3.0f};
    b[r] = {static_cast<float>(r * r)};
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { out[r] = h.client(r).AllReduce(7, {{"a", &a[r]}, {"b", &b[r]}}); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_OK(out[r].status());
    EXPECT_EQ(*out[r], *out[0]);
  }
  const float third = 1.0f / 3.0f;
  EXPECT_EQ((*out[0])[0], (std::vector<float>{(0.0f + 1.0f + 2.0f) * third,
                                               (0.1f + 1.1f + 2.1f) * third, (-9.0f) * third}));
  EXPECT_EQ((*out[0])[1], (std::vector<float>{(0.0f + 1.0f + 4.0f) * third}));
  // A rank whose parts differ in size from the first rank's is refused.
  std::vector<float> shorter = {1.0f};
  std::thread first([&] { out[0] = h.client(0).AllReduce(8, {{"a", &a[0]}}); });
  // Wait until rank 0's call is pending in the daemon.
  for (int i = 0; i < 3000; ++i) {
    absl::StatusOr<v1::GetStatsResponse> st = h.client(0).GetStats(h.options().job_id);
    ASSERT_OK(st.status());
    if (st->jobs(0).pending_rendezvous_bytes() > 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::StatusOr<std::vector<std::vector<float>>> bad = h.client(1).AllReduce(8, {{"a", &shorter}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  std::thread second([&] { out[1] = h.client(1).AllReduce(8, {{"a", &a[1]}}); });
  out[2] = h.client(2).AllReduce(8, {{"a", &a[2]}});
  first.join();
  second.join();
  ASSERT_OK(out[0].status());
  ASSERT_OK(out[2].status());
  EXPECT_EQ(*out[0], *out[2]);
  ASSERT_OK(h.GoodRound(1e-2f));
}

// UCX's TCP transport on the loopback device: the path ranks on other hosts
// take (shared memory is off on both sides).
TEST_F(DaemonE2ETest, UcxOverTcpLoopbackMatchesReference) {
  DaemonProcess tcp;
  ASSERT_OK(tcp.Start({"--ucx_tls=tcp,self", "--ucx_net_devices=lo"}));
  JobOptions o;
  o.job_id = "ucx_tcp";
  o.wire = DType::kBF16;
  o.ucx = UcxOptions{"tcp,self", "lo"};
  Harness h(tcp.target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.GoodRound(5e-3f));
  absl::StatusOr<v1::GetStatsResponse> stats = h.client(0).GetStats("ucx_tcp");
  ASSERT_OK(stats.status());
  EXPECT_EQ(stats->ucx().transports(), "tcp,self");
  EXPECT_EQ(stats->ucx().connections(), 2);
  EXPECT_GT(stats->ucx().frames_received(), 0);
  EXPECT_TRUE(tcp.Stop().ok());
}

TEST_F(DaemonE2ETest, DeleteJobEndsAttachedStreams) {
  JobOptions o;
  o.job_id = "deleted";
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.client(0).DeleteJob("deleted"));
  for (int r = 0; r < o.world; ++r) {
    absl::Status s = absl::OkStatus();
    for (int i = 0; i < 3000 && s.ok(); ++i) {
      s = h.client(r).stream_status();
      if (s.ok()) absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << "rank " << r << ": " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "'deleted' was deleted")) << s;
  }
  // The daemon goes on: a new job runs exact rounds.
  JobOptions o2;
  o2.job_id = "after_delete";
  Harness h2(daemon_->target(), o2);
  ASSERT_OK(h2.Setup());
  ASSERT_OK(h2.GoodRound(1e-2f));
}

TEST_F(DaemonE2ETest, HealthServiceReportsServing) {
  auto channel = grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  AddTestToken(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer request;  // HealthCheckRequest{service: ""}: zero bytes
  grpc::Slice empty("", 0);
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2)) << "HealthCheckResponse{status: SERVING}";
}

}  // namespace
}  // namespace zenflow::testing
