// Bad input against a real zenflowd over loopback gRPC: each rejection has a
// specific status code and an actionable message, is counted, and leaves the
// job untouched — proven by a following good round that still matches the
// independent reference exactly as if the bad request had never been sent.
#include <atomic>
#include <deque>
#include <limits>
#include <string>

#include <unistd.h>

#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/ucx.h"
#include "common/ucx_frame.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/harness.h"
#include "tests/testing/status_macros.h"

namespace zenflow::testing {
namespace {

using absl::StatusCode;

// A stub of our own on a client's channel, for requests the client library
// would never send.
std::unique_ptr<v1::ZenFlow::Stub> StubOf(Client& c) { return v1::ZenFlow::NewStub(c.channel()); }

class BadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new DaemonProcess();
    // A small message limit so that "oversized" is cheap to produce.
    // A 256 MiB memory budget and 64 KiB outboxes make "too large" and
    // "does not read" cheap to produce.
    const absl::Status s = daemon_->Start({"--max_message_bytes=1048576",
                                           "--memory_budget_bytes=268435456",
                                           "--max_outbox_bytes=65536"});
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    const absl::Status s = daemon_->Stop();
    EXPECT_TRUE(s.ok()) << "zenflowd must survive bad input and exit cleanly: " << s;
    delete daemon_;
  }

  // A fresh job (unique id per test), set up and past one good round.
  std::unique_ptr<Harness> MakeJob(JobOptions o = {}) {
    o.job_id = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto h = std::make_unique<Harness>(daemon_->target(), o);
    absl::Status s = h->Setup();
    if (s.ok()) s = h->GoodRound(1e-2f);
    EXPECT_TRUE(s.ok()) << s;
    return h;
  }

  // Sends one up message from `rank` and returns the in-band rejection.
  static absl::Status Rejection(Harness& h, int rank, v1::GradientShard shard) {
    Client& c = h.client(rank);
    c.TakeErrors();
    absl::Status push = c.PushShard(std::move(shard));
    if (!push.ok()) return push;
    if (!c.WaitForErrors(1, absl::Seconds(30))) return absl::OkStatus();
    std::vector<absl::Status> errs = c.TakeErrors();
    return errs.front();
  }

  static absl::Status CloseRejection(Harness& h, int rank, int64_t round, float lr) {
    Client& c = h.client(rank);
    c.TakeErrors();
    absl::Status push = c.CloseRound(round, lr);
    if (!push.ok()) return push;
    if (!c.WaitForErrors(1, absl::Seconds(30))) return absl::OkStatus();
    return c.TakeErrors().front();
  }

  static v1::GradientShard Shard(const Harness& h, int64_t step, std::vector<int32_t> cols,
                                 int rows = 8) {
    v1::GradientShard s;
    s.set_step(step);
    s.set_tensor("w");
    s.set_selection_version(h.version());
    s.set_dtype(v1::DTYPE_FP32);
    s.mutable_columns()->Add(cols.begin(), cols.end());
    std::vector<float> vals(cols.size() * rows, 0.5f);
    s.set_payload(reinterpret_cast<const char*>(vals.data()), vals.size() * 4);
    return s;
  }

  static int64_t Rejected(Harness& h, const std::string& code) {
    absl::StatusOr<v1::GetStatsResponse> st = h.client(0).GetStats(h.options().job_id);
    if (!st.ok() || st->jobs_size() != 1) return -1;
    auto it = st->jobs(0).rejected().find(code);
    return it == st->jobs(0).rejected().end() ? 0 : it->second;
  }

  static DaemonProcess* daemon_;
};

DaemonProcess* BadInputTest::daemon_ = nullptr;

// Polls `done` every 10 ms for up to 30 s (a bound on a failure, not a
// timing); its last answer.
bool WaitUntil(const std::function<bool()>& done) {
  for (int i = 0; i < 3000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

void ExpectStatus(const absl::Status& s, StatusCode code, const std::string& fragment) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), fragment)) << "message: " << s.message()
                                                        << "\nexpected to contain: " << fragment;
}

TEST_F(BadInputTest, UnknownJobIsNotFound) {
  auto h = MakeJob();
  ExpectStatus(h->client(0).GetJob("no-such-job").status(), StatusCode::kNotFound, "no job 'no-such-job'");
  ClientOptions co = TestClientOptions(daemon_->target());
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  ExpectStatus((*c)->JoinJob("no-such-job", 0).status(), StatusCode::kNotFound, "no job");
  ExpectStatus((*c)->Attach("no-such-job", 0), StatusCode::kNotFound, "no job");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, UnknownTensorIsNotFound) {
  auto h = MakeJob();
  v1::GradientShard s = Shard(*h, 4, {0});
  s.set_tensor("layers.9.nope");
  ExpectStatus(Rejection(*h, 0, s), StatusCode::kNotFound, "has no tensor 'layers.9.nope'");
  EXPECT_EQ(Rejected(*h, "NOT_FOUND"), 1);
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, UnknownRankIsRejected) {
  auto h = MakeJob();
  ClientOptions co = TestClientOptions(daemon_->target());
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  ExpectStatus((*c)->JoinJob(h->options().job_id, 5).status(), StatusCode::kOutOfRange,
               "rank 5 out of range [0, 2)");
  ExpectStatus((*c)->JoinJob(h->options().job_id, -1).status(), StatusCode::kOutOfRange,
               "out of range");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, RankNotJoinedCannotAttach) {
  JobOptions o;
  o.job_id = "not-joined";
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Connect());
  ASSERT_OK(h.CreateJob());
  ASSERT_OK(h.Upload());
  ExpectStatus(h.client(1).Attach("not-joined", 1), StatusCode::kNotFound,
               "rank 1 has not joined job 'not-joined' (call JoinJob first)");
  ASSERT_OK(h.JoinAll());
  ASSERT_OK(h.GoodRound(1e-2f));
}

TEST_F(BadInputTest, RankJoiningTwiceIsAlreadyExists) {
  auto h = MakeJob();
  ClientOptions co = TestClientOptions(daemon_->target());
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  ExpectStatus((*c)->JoinJob(h->options().job_id, 1).status(), StatusCode::kAlreadyExists,
               "rank 1 already joined");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, SecondUploadIsAlreadyExists) {
  auto h = MakeJob();
  std::vector<float> zeros(8 * 16, 0.0f);
  absl::Status s = h->client(0)
                       .UploadParameters(h->options().job_id,
                                         {{"w", {8, 16}, zeros.data()}, {"b", {16}, zeros.data()}})
                       .status();
  ExpectStatus(s, StatusCode::kAlreadyExists, "already uploaded");
  EXPECT_EQ(Rejected(*h, "ALREADY_EXISTS"), 1);
  ASSERT_OK(h->GoodRound(1e-2f));  // the first upload's values are still there
}

TEST_F(BadInputTest, UploadShapeMismatchIsInvalidAndStoresNothing) {
  JobOptions o;
  o.job_id = "upload-shape";
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Connect());
  ASSERT_OK(h.CreateJob());
  std::vector<float> zeros(8 * 16, 0.0f);
  ExpectStatus(
      h.client(0).UploadParameters("upload-shape", {{"w", {16, 8}, zeros.data()}}).status(),
      StatusCode::kInvalidArgument, "uploaded shape [16, 8] does not match the job's shape [8, 16]");
  // An incomplete upload commits nothing...
  ExpectStatus(h.client(0).UploadParameters("upload-shape", {{"w", {8, 16}, zeros.data()}}).status(),
               StatusCode::kFailedPrecondition, "tensor 'b' has 0 of 16 elements");
  // ...so the real upload is still the first one and the results are exact.
  ASSERT_OK(h.Upload());
  ASSERT_OK(h.JoinAll());
  ASSERT_OK(h.GoodRound(1e-2f));
}

TEST_F(BadInputTest, CreateJobBadSpecsAreInvalidArgument) {
  ClientOptions co = TestClientOptions(daemon_->target());
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  v1::JobSpec spec;
  spec.set_job_id("bad spec!");
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument, "job_id 'bad spec!' is invalid");
  spec.set_job_id("badspec");
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument, "no tensors");
  auto* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(4);
  t->add_shape(0);
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument, "shape [4, 0]");
  t->set_shape(1, 4);
  spec.mutable_zenflow()->set_update_interval(4);
  spec.mutable_zenflow()->set_select_interval(6);
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument,
               "select_interval 6 must be a positive multiple of update_interval 4");
  spec.mutable_zenflow()->set_select_interval(8);
  spec.mutable_zenflow()->mutable_apply_delay()->set_steps(5);
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument, "apply_delay.steps 5");
  spec.mutable_zenflow()->mutable_apply_delay()->set_overlap_step(true);
  spec.set_delta_kind(static_cast<v1::DeltaKind>(7));
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument,
               "delta_kind 7 is unknown");
  spec.set_delta_kind(v1::DELTA_ARITHMETIC);
  t->set_dtype(v1::DTYPE_BF16);
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument,
               "tensor 'w' is bf16: DELTA_ARITHMETIC needs fp32 parameters");
  t->set_dtype(v1::DTYPE_FP32);
  spec.mutable_zenflow()->set_predicted_step(true);
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument,
               "zenflow.predicted_step needs DELTA_VALUES");
  spec.mutable_zenflow()->clear_predicted_step();
  spec.mutable_zenflow()->set_local_step(true);
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument,
               "zenflow.local_step needs DELTA_VALUES");
  spec.mutable_zenflow()->clear_local_step();
  spec.mutable_zenflow()->set_fidelity_budget(std::numeric_limits<float>::quiet_NaN());
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kInvalidArgument,
               "zenflow.fidelity_budget nan must be finite");
  spec.mutable_zenflow()->clear_fidelity_budget();
  spec.clear_delta_kind();
  ASSERT_OK((*c)->CreateJob(spec).status());
  absl::StatusOr<v1::GetJobResponse> job = (*c)->GetJob("badspec");
  ASSERT_OK(job.status());
  EXPECT_EQ(job->spec().zenflow().apply_delay().steps(), 4) << "overlap_step means d = S";
  EXPECT_TRUE(job->spec().zenflow().predicted_step()) << "the predicted step is the default";
  EXPECT_FALSE(job->spec().zenflow().scale_round_step()) << "rule 12 is off by default";
  EXPECT_FALSE(job->spec().zenflow().local_step()) << "rule 13 is off by default";
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kAlreadyExists, "already exists");
  ASSERT_OK((*c)->DeleteJob("badspec"));
  ExpectStatus((*c)->GetJob("badspec").status(), StatusCode::kNotFound, "no job");
}

TEST_F(BadInputTest, PayloadSizeMismatchIsInvalidArgument) {
  auto h = MakeJob();
  v1::GradientShard s = Shard(*h, 4, {0, 1});
  s.mutable_payload()->resize(s.payload().size() - 4);
  ExpectStatus(Rejection(*h, 0, s), StatusCode::kInvalidArgument,
               "payload is 60 bytes but 2 columns x 8 rows of fp32 need 64 bytes");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, Int8ShardScalesMustMatchTheColumns) {
  auto h = MakeJob();
  v1::GradientShard s = Shard(*h, 4, {0, 1});
  s.set_dtype(v1::DTYPE_INT8);
  s.set_payload(std::string(2 * 8, '\1'));
  s.add_scales(0.5f);  // one scale for two columns
  ExpectStatus(Rejection(*h, 0, s), StatusCode::kInvalidArgument,
               "1 scales for 2 columns; int8 shards carry exactly one scale per column");
  s.add_scales(-1.0f);
  ExpectStatus(Rejection(*h, 0, s), StatusCode::kInvalidArgument,
               "scale of column 1 is -1; need finite >= 0");
  v1::GradientShard f = Shard(*h, 4, {0});
  f.add_scales(1.0f);  // scales on an fp32 shard
  ExpectStatus(Rejection(*h, 1, f), StatusCode::kInvalidArgument, "other dtypes none");
  s.mutable_payload()->resize(15);
  ExpectStatus(Rejection(*h, 0, s), StatusCode::kInvalidArgument,
               "payload is 15 bytes but 2 columns x 8 rows of int8 need 16 bytes");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, ColumnOutOfRangeIsOutOfRange) {
  auto h = MakeJob();
  ExpectStatus(Rejection(*h, 0, Shard(*h, 4, {3, 16})), StatusCode::kOutOfRange,
               "tensor 'w': column 16 out of range [0, 16)");
  ExpectStatus(Rejection(*h, 1, Shard(*h, 4, {-1})), StatusCode::kOutOfRange, "column -1 out of range");
  EXPECT_EQ(Rejected(*h, "OUT_OF_RANGE"), 2);
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, RepeatedColumnIsInvalidArgument) {
  auto h = MakeJob();
  ExpectStatus(Rejection(*h, 0, Shard(*h, 4, {5, 2, 5})), StatusCode::kInvalidArgument,
               "column 5 is repeated in one shard");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, ColumnSentTwiceForOneStepIsAlreadyExists) {
  auto h = MakeJob();
  ASSERT_OK(h->PushStep(0, 4));  // every column of step 4 from rank 0
  ExpectStatus(Rejection(*h, 0, Shard(*h, 4, {7})), StatusCode::kAlreadyExists,
               "column 7 of step 4 was already received from rank 0");
  ASSERT_OK(h->GoodRound(1e-2f));  // the duplicate was not added
}

TEST_F(BadInputTest, StepOfClosedRoundIsFailedPrecondition) {
  auto h = MakeJob();  // round 0 is closed and updated
  ExpectStatus(Rejection(*h, 0, Shard(*h, 3, {0})), StatusCode::kFailedPrecondition,
               "step 3 belongs to round 0, which rank 0 already closed");
  ExpectStatus(CloseRejection(*h, 1, 0, 1e-2f), StatusCode::kFailedPrecondition,
               "rank 1 already closed round 0");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, ReplayedMessagesTheJobHasAreDroppedWithoutAnError) {
  // What a rank resends after a reconnect
  // (docs/checkpoints.md#riding-through-a-daemon-restart):
  // what the job already has is acknowledged and dropped; the
  // same messages without `replay` are still rejected.
  auto h = MakeJob();  // round 0 is closed and updated
  ASSERT_OK(h->PushStep(0, 4));  // every column of step 4 from rank 0
  Client& c = h->client(0);
  c.TakeErrors();
  v1::UpMessage old_shard;
  *old_shard.mutable_shard() = Shard(*h, 3, {0});  // round 0: closed
  old_shard.set_replay(true);
  ASSERT_OK(c.PushUp(old_shard));
  v1::UpMessage old_close;
  old_close.mutable_close()->set_round(0);
  old_close.mutable_close()->set_lr(1e-2f);
  old_close.set_replay(true);
  ASSERT_OK(c.PushUp(old_close));
  v1::UpMessage have;
  *have.mutable_shard() = Shard(*h, 4, {7});  // step 4 column 7 is there
  have.set_replay(true);
  ASSERT_OK(c.PushUp(have));
  ASSERT_OK(c.Flush(absl::Seconds(30)));
  EXPECT_FALSE(c.WaitForErrors(1, absl::Seconds(1))) << c.TakeErrors().front();
  absl::StatusOr<v1::GetStatsResponse> st = c.GetStats(h->options().job_id);
  ASSERT_OK(st.status());
  EXPECT_EQ(st->jobs(0).replays_dropped(), 3);
  // Without `replay` the same shard is a duplicate.
  ExpectStatus(Rejection(*h, 0, Shard(*h, 4, {7})), StatusCode::kAlreadyExists,
               "column 7 of step 4 was already received from rank 0");
  ASSERT_OK(h->GoodRound(1e-2f));  // nothing was added twice: exact
}

// GetState and SetState (zenflow.torch's state_dict and load_state_dict):
// each bad request is refused with its code and nothing is written; then a
// good SetState is read back exactly, the next round equals the reference
// that starts from the same state, and a started job refuses SetState.
TEST_F(BadInputTest, StateCallsRefuseBadRequestsAndKeepTheJobExact) {
  JobOptions o;
  o.job_id = "StateCalls";
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Setup());  // no round yet
  auto stub = StubOf(h.client(0));
  RefTensor& w = h.ref().tensor(0);  // "w", 8 x 16, every column on the daemon
  const int64_t rows = w.rows, cols = w.cols;
  v1::ColumnState good;
  good.set_tensor("w");
  for (int64_t c = 0; c < cols; ++c) {
    good.add_columns(static_cast<int32_t>(c));
    for (int64_t r = 0; r < rows; ++r) {
      good.add_values(w.p[r * cols + c]);
      good.add_m(0.01f * static_cast<float>(r + 1) - 0.003f * static_cast<float>(c));
      good.add_v(1e-4f * static_cast<float>((r + c) % 7 + 1));
    }
    good.add_update_counts(3 + c % 2);
  }
  auto set = [&](const std::string& job, const v1::ColumnState& st) {
    v1::SetStateRequest req;
    req.set_job_id(job);
    *req.mutable_state() = st;
    v1::SetStateResponse resp;
    grpc::ClientContext ctx;
    AddTestToken(&ctx);
    const grpc::Status g = stub->SetState(&ctx, req, &resp);
    return absl::Status(static_cast<absl::StatusCode>(g.error_code()), g.error_message());
  };
  auto get = [&](const std::string& tensor, int first, int max, v1::GetStateResponse* resp) {
    v1::GetStateRequest req;
    req.set_job_id("StateCalls");
    req.set_tensor(tensor);
    req.set_first_column(first);
    req.set_max_columns(max);
    grpc::ClientContext ctx;
    AddTestToken(&ctx);
    const grpc::Status g = stub->GetState(&ctx, req, resp);
    return absl::Status(static_cast<absl::StatusCode>(g.error_code()), g.error_message());
  };
  ExpectStatus(set("no-such-job", good), StatusCode::kNotFound, "no job 'no-such-job'");
  v1::ColumnState bad = good;
  bad.set_tensor("nope");
  ExpectStatus(set("StateCalls", bad), StatusCode::kNotFound, "has no tensor 'nope'");
  bad = good;
  bad.set_columns(3, 16);
  ExpectStatus(set("StateCalls", bad), StatusCode::kInvalidArgument, "columns in [0, 16)");
  bad = good;
  bad.mutable_m()->RemoveLast();
  ExpectStatus(set("StateCalls", bad), StatusCode::kInvalidArgument, "127 m");
  bad = good;
  bad.set_columns(5, 4);
  ExpectStatus(set("StateCalls", bad), StatusCode::kInvalidArgument, "column 4 is repeated");
  bad = good;
  bad.set_m(9, std::numeric_limits<float>::quiet_NaN());
  ExpectStatus(set("StateCalls", bad), StatusCode::kInvalidArgument, "column 1 row 1");
  bad = good;
  bad.set_v(0, -1.0f);
  ExpectStatus(set("StateCalls", bad), StatusCode::kInvalidArgument, "v finite and >= 0");
  bad = good;
  bad.set_update_counts(2, -4);
  ExpectStatus(set("StateCalls", bad), StatusCode::kInvalidArgument, "update count -4");
  v1::GetStateResponse resp;
  ExpectStatus(get("w", 17, 0, &resp), StatusCode::kOutOfRange, "first_column 17");
  ExpectStatus(get("w", 0, -2, &resp), StatusCode::kInvalidArgument, "max_columns -2");
  ExpectStatus(get("nope", 0, 0, &resp), StatusCode::kNotFound, "has no tensor 'nope'");
  // Nothing was written: the daemon still has the uploaded values and zeros.
  ASSERT_OK(get("w", 0, 0, &resp));
  EXPECT_EQ(resp.state().columns_size(), cols);
  EXPECT_EQ(resp.state().m(9), 0.0f);
  EXPECT_EQ(resp.state().update_counts(2), 0);

  // Good: written, read back exactly (in parts), and the next round is the
  // reference's from the same state.
  ASSERT_OK(set("StateCalls", good));
  ASSERT_OK(set("StateCalls", good));  // every rank may send it
  absl::StatusOr<v1::ColumnState> back = h.client(1).GetState("StateCalls", "w");
  ASSERT_OK(back.status());
  EXPECT_EQ(back->SerializeAsString(), good.SerializeAsString());
  ASSERT_OK(get("w", 10, 4, &resp));
  EXPECT_EQ(resp.next_column(), 14);
  EXPECT_EQ(resp.columns(), 16);
  EXPECT_EQ(resp.state().columns(0), 10);
  EXPECT_EQ(resp.state().m(0), good.m(10 * rows));
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      w.m[r * cols + c] = good.m(c * rows + r);
      w.v[r * cols + c] = good.v(c * rows + r);
    }
    w.count[c] = good.update_counts(c);
  }
  ASSERT_OK(h.GoodRound(1e-2f));
  ExpectStatus(set("StateCalls", good), StatusCode::kFailedPrecondition, "has started");
  ASSERT_OK(h.GoodRound(1e-2f));
}

TEST_F(BadInputTest, StepTooFarAheadIsOutOfRange) {
  auto h = MakeJob();  // next round is 1 (steps 4..7)
  ExpectStatus(Rejection(*h, 0, Shard(*h, 8, {0})), StatusCode::kOutOfRange,
               "step 8 is in round 2, too far ahead: rank 0 has not closed round 1");
  ExpectStatus(CloseRejection(*h, 0, 2, 1e-2f), StatusCode::kOutOfRange, "round 2 is too far ahead");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, IncompleteRoundCannotClose) {
  auto h = MakeJob();
  for (int64_t step = 4; step < 7; ++step) ASSERT_OK(h->PushStep(0, step));  // 3 of 4 steps
  ExpectStatus(CloseRejection(*h, 0, 1, 1e-2f), StatusCode::kFailedPrecondition,
               "rank 0 cannot close round 1: tensor 'w' column 0 has gradients from 3 of 4 steps");
  ASSERT_OK(h->GoodRound(1e-2f));  // completes the round; exact
}

TEST_F(BadInputTest, LearningRateMustAgreeAcrossRanks) {
  auto h = MakeJob();
  for (int64_t step = 4; step < 8; ++step) ASSERT_OK(h->PushStep(0, step));
  for (int64_t step = 4; step < 8; ++step) ASSERT_OK(h->PushStep(1, step));
  ASSERT_OK(h->client(0).CloseRound(1, 1e-2f));
  // Rank 0's stream is ordered: once its second close is rejected, the
  // first one has been applied.
  ExpectStatus(CloseRejection(*h, 0, 1, 1e-2f), StatusCode::kFailedPrecondition,
               "rank 0 already closed round 1");
  ExpectStatus(CloseRejection(*h, 1, 1, 3e-2f), StatusCode::kInvalidArgument,
               "lr 0.03 differs from the lr 0.01 other ranks closed it with");
  ExpectStatus(CloseRejection(*h, 1, 1, -1.0f), StatusCode::kInvalidArgument, "must be finite and >= 0");
  // Rank 0's close stands; the harness closes rank 0 again (rejected as
  // already closed) and rank 1 properly, and the round is exact.
  ASSERT_OK(h->client(1).CloseRound(1, 1e-2f));
  h->client(0).TakeErrors();
  std::vector<std::vector<std::vector<float>>> grads;
  for (int rank = 0; rank < 2; ++rank) {
    for (int64_t step = 4; step < 8; ++step) grads.push_back(h->FullGrad(rank, step));
  }
  h->ref().Round(grads, h->RoundLr(1e-2f), h->remote(), h->remote(), false);
  ASSERT_OK(h->CheckRound(1));
}

TEST_F(BadInputTest, StaleColumnSetVersionIsFailedPrecondition) {
  JobOptions o;
  auto h = MakeJob(o);
  std::vector<float> imp(16);
  for (int c = 0; c < 16; ++c) imp[c] = static_cast<float>(c);
  ASSERT_OK(h->Reselect({imp, {}}));  // version 1: columns 12..15 important
  v1::GradientShard s = Shard(*h, 4, {0});
  s.set_selection_version(0);
  ExpectStatus(Rejection(*h, 0, s), StatusCode::kFailedPrecondition,
               "column-set version 0 is stale; the current version is 1");
  s.set_selection_version(7);
  ExpectStatus(Rejection(*h, 0, s), StatusCode::kFailedPrecondition, "version 7 is unknown");
  // An important column does not belong in a shard.
  ExpectStatus(Rejection(*h, 1, Shard(*h, 4, {13})), StatusCode::kInvalidArgument,
               "column 13 is important under selection version 1");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, NonFiniteGradientIsRejected) {
  auto h = MakeJob();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    v1::GradientShard s = Shard(*h, 4, {2, 3});
    float* vals = reinterpret_cast<float*>(s.mutable_payload()->data());
    vals[8 + 5] = bad;  // column 3, row 5
    ExpectStatus(Rejection(*h, 0, s), StatusCode::kInvalidArgument,
                 "non-finite gradient in column 3 row 5 of step 4");
  }
  EXPECT_EQ(Rejected(*h, "INVALID_ARGUMENT"), 2);
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, NonFiniteRoundIsSkippedWhenTheJobSaysSo) {
  JobOptions o;
  o.skip_nonfinite = true;
  o.world = 1;
  auto h = MakeJob(o);
  ASSERT_OK(h->GoodRound(1e-2f));  // round 1
  // Round 2: every column, but one value of step 9 is Inf.
  std::vector<int32_t> all(16);
  for (int c = 0; c < 16; ++c) all[c] = c;
  v1::GradientShard s = Shard(*h, 9, all);
  reinterpret_cast<float*>(s.mutable_payload()->data())[17] = std::numeric_limits<float>::infinity();
  ASSERT_OK(h->client(0).PushShard(s));
  v1::GradientShard b = Shard(*h, 9, all, 1);
  b.set_tensor("b");
  ASSERT_OK(h->client(0).PushShard(b));
  for (int64_t step : {8, 10, 11}) ASSERT_OK(h->PushStep(0, step));
  ASSERT_OK(h->client(0).CloseRound(2, 1e-2f));
  absl::StatusOr<RoundUpdate> u2 = h->client(0).WaitRound(2, absl::Seconds(30));
  ASSERT_OK(u2.status());
  EXPECT_TRUE(u2->done.skipped_nonfinite());
  EXPECT_TRUE(u2->deltas.empty());
  EXPECT_TRUE(h->client(0).TakeErrors().empty());
  h->SkipRound();
  // Round 3 equals a reference that never saw round 2.
  ASSERT_OK(h->GoodRound(1e-2f));
  absl::StatusOr<v1::GetStatsResponse> st = h->client(0).GetStats(h->options().job_id);
  ASSERT_OK(st.status());
  EXPECT_EQ(st->jobs(0).rounds_skipped_nonfinite(), 1);
}

TEST_F(BadInputTest, OversizedMessageIsResourceExhausted) {
  auto h = MakeJob();
  // The daemon accepts messages up to 1 MiB (--max_message_bytes). A 1.5 MiB
  // shard is rejected in-band and counted; the stream stays up.
  v1::GradientShard s = Shard(*h, 4, {0});
  s.mutable_payload()->assign(3 << 19, '\0');
  ExpectStatus(Rejection(*h, 0, s), StatusCode::kResourceExhausted,
               "exceeds the daemon's limit of 1048576 bytes (--max_message_bytes)");
  EXPECT_EQ(Rejected(*h, "RESOURCE_EXHAUSTED"), 1);
  ASSERT_OK(h->GoodRound(1e-2f));
  s = Shard(*h, 8, {0});
  s.mutable_payload()->assign(3 << 20, '\0');
  if (TestTransport() == Transport::kUcx) {
    // UCX has no message limit of its own: the daemon rejects in-band at
    // any size and the connection stays up.
    ExpectStatus(Rejection(*h, 0, s), StatusCode::kResourceExhausted,
                 "exceeds the daemon's limit of 1048576 bytes (--max_message_bytes)");
    EXPECT_EQ(Rejected(*h, "RESOURCE_EXHAUSTED"), 2);
    ASSERT_OK(h->GoodRound(1e-2f));
  } else {
    // Beyond twice the limit gRPC itself refuses the message and ends the
    // stream with RESOURCE_EXHAUSTED; the rank reattaches and carries on.
    ASSERT_OK(h->client(0).PushShard(s));
    absl::Status end = absl::OkStatus();
    for (int i = 0; i < 1000 && end.ok(); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
      end = h->client(0).stream_status();
    }
    EXPECT_EQ(end.code(), StatusCode::kResourceExhausted) << end;
    ASSERT_OK(h->client(0).Attach(h->options().job_id, 0));
    ASSERT_OK(h->GoodRound(1e-2f));
  }
  // Unary requests over the limit too.
  v1::JobSpec spec = h->spec();
  spec.set_job_id("huge");
  for (int i = 0; i < 30000; ++i) {
    auto* t = spec.add_tensors();
    t->set_name(absl::StrCat("extra_tensor_with_a_long_name_", i));
    t->add_shape(1);
  }
  ExpectStatus(h->client(0).CreateJob(spec).status(), StatusCode::kResourceExhausted,
               "--max_message_bytes");
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, TooManyParametersIsResourceExhausted) {
  ClientOptions co = TestClientOptions(daemon_->target());
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  v1::JobSpec spec;
  spec.set_job_id("too-big");
  auto* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(int64_t{1} << 20);
  t->add_shape(int64_t{1} << 20);
  ExpectStatus((*c)->CreateJob(spec).status(), StatusCode::kResourceExhausted, "--max_params");
}

// A borrowed payload (sent without a copy over UCX) is released exactly
// once, and a bad shard sent that way is judged like any other.
TEST_F(BadInputTest, BorrowedShardIsReleasedOnceAndRejectedLikeACopy) {
  std::unique_ptr<Harness> h = MakeJob();
  Client& c = h->client(0);
  c.TakeErrors();
  std::vector<float> payload(8 * 3, 0.25f);
  const std::vector<int32_t> cols = {1, 2, 3};
  std::atomic<int> released{0};
  ASSERT_OK(c.PushEncodedBorrowed(4, "nope", h->version(), cols.data(), 3,
                                  reinterpret_cast<const char*>(payload.data()), 8, DType::kF32,
                                  [&] { released.fetch_add(1); }));
  ASSERT_OK(c.Flush(absl::Seconds(30)));
  ASSERT_TRUE(c.WaitForErrors(1, absl::Seconds(30)));
  ExpectStatus(c.TakeErrors().front(), StatusCode::kNotFound, "nope");
  // Over gRPC the release comes when gRPC unrefs the slice, which may be
  // after the daemon's answer arrived: wait for it, then check it ran once.
  EXPECT_TRUE(WaitUntil([&] { return released.load() >= 1; }));
  ASSERT_OK(h->GoodRound(1e-2f));
  EXPECT_EQ(released.load(), 1);
}

// ---- The UCX data plane, driven by hand ----

// A rank's side of a UCX connection without the client library: its own UCX
// worker, a raw gRPC stream for the attach, and the frames it receives.
class RawUcxRank {
 public:
  // The worker goes first: its sends in flight read frames_.
  ~RawUcxRank() { worker_.reset(); }
  absl::Status Start() {
    ZF_ASSIGN_OR_RETURN(worker_, UcxWorker::Create({}, [this](uint64_t tag, std::string f) {
                          MutexLock lock(&mu_);
                          got_.push_back({tag, std::move(f)});
                        }));
    return absl::OkStatus();
  }
  // Attaches over gRPC asking for UCX; returns the stream's end status if
  // the daemon refused.
  absl::Status Attach(v1::ZenFlow::Stub* stub, const std::string& job, int32_t rank, uint64_t tag,
                      std::string address) {
    ctx_ = std::make_unique<grpc::ClientContext>();
    AddTestToken(ctx_.get());
    stream_ = stub->Stream(ctx_.get());
    v1::UpMessage hello;
    hello.mutable_attach()->set_job_id(job);
    hello.mutable_attach()->set_rank(rank);
    hello.mutable_attach()->set_ucx_address(address);
    hello.mutable_attach()->set_ucx_tag(tag);
    stream_->Write(hello);
    v1::DownMessage greeting;
    if (!stream_->Read(&greeting)) {
      grpc::Status st = stream_->Finish();
      stream_.reset();
      return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
    }
    if (greeting.attached().ucx_address().empty()) {
      return absl::InternalError("greeting without the daemon's UCX address");
    }
    tag_ = tag;
    up_tag_ = greeting.attached().ucx_tag();
    if (up_tag_ == 0 || up_tag_ == tag) {
      return absl::InternalError("the daemon's tag for this connection must be its own");
    }
    daemon_address_ = greeting.attached().ucx_address();
    ZF_ASSIGN_OR_RETURN(ep_, worker_->Connect(daemon_address_));
    return absl::OkStatus();
  }
  // Connects to a daemon's UCX worker without attaching (an intruder).
  absl::Status ConnectOnly(const std::string& daemon_address) {
    ZF_ASSIGN_OR_RETURN(ep_, worker_->Connect(daemon_address));
    return absl::OkStatus();
  }
  void SendRaw(std::string frame) { SendRawWithTag(up_tag_, std::move(frame)); }
  void SendRawWithTag(uint64_t tag, std::string frame) {
    frames_.push_back(std::make_unique<std::string>(std::move(frame)));
    worker_->Send(ep_, tag, {*frames_.back()}, nullptr);
  }
  void Send(v1::UpMessage m) {
    std::string payload, header;
    SplitFrame(&m, &payload, &header);
    SendRaw(payload + header);
  }
  // The next down message (parsed), or an error after 30 s.
  absl::StatusOr<v1::DownMessage> Next() {
    MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !got_.empty(); },
                              absl::Seconds(30))) {
      return absl::DeadlineExceededError("no UCX message from the daemon");
    }
    auto [tag, frame] = std::move(got_.front());
    got_.pop_front();
    if (tag != tag_) return absl::InternalError("UCX message with another connection's tag");
    v1::DownMessage m;
    ZF_RETURN_IF_ERROR(ParseFrame(std::move(frame), &m));
    return m;
  }
  void Close() {
    if (stream_ == nullptr) return;
    (void)worker_->Flush(ep_, absl::Seconds(10));
    stream_->WritesDone();
    (void)stream_->Finish();
    stream_.reset();
  }
  const std::string& address() const { return worker_->address(); }
  const std::string& daemon_address() const { return daemon_address_; }
  uint64_t tag() const { return tag_; }
  uint64_t up_tag() const { return up_tag_; }
  absl::Status Flush() { return worker_->Flush(ep_, absl::Seconds(10)); }
  // Stops (or restarts) taking the daemon's messages off the wire.
  void PauseReceiving(bool p) { worker_->PauseReceiving(p); }
  // Waits for the daemon to end the lifeline; its status.
  absl::Status Ended() {
    v1::DownMessage m;
    while (stream_->Read(&m)) {
    }
    grpc::Status st = stream_->Finish();
    stream_.reset();
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  }

 private:
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::UpMessage, v1::DownMessage>> stream_;
  uint64_t tag_ = 0, up_tag_ = 0, ep_ = 0;
  std::string daemon_address_;
  std::vector<std::unique_ptr<std::string>> frames_;
  Mutex mu_;
  std::deque<std::pair<uint64_t, std::string>> got_ ABSL_GUARDED_BY(mu_);
};

// Attaches `rank` with the library once a raw stream of it has let go: the
// daemon closes a raw UCX connection asynchronously after its stream ends.
absl::Status AttachOnceFree(Client& c, const std::string& job, int32_t rank) {
  absl::Status s = absl::UnavailableError("not tried");
  for (int i = 0; i < 100 && !s.ok(); ++i) {
    s = c.Attach(job, rank);
    if (!s.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  return s;
}

// A one-rank job whose rank 0 is joined but not attached.
std::unique_ptr<Harness> JoinedNotAttached(const std::string& target) {
  JobOptions o;
  o.job_id = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  o.world = 1;
  auto h = std::make_unique<Harness>(target, o);
  absl::Status s = h->Connect();
  if (s.ok()) s = h->CreateJob();
  if (s.ok()) s = h->Upload();
  if (s.ok()) {
    grpc::ClientContext ctx;
    AddTestToken(&ctx);
    v1::JoinJobRequest req;
    req.set_job_id(o.job_id);
    req.set_rank(0);
    v1::JoinJobResponse resp;
    grpc::Status g = StubOf(h->client(0))->JoinJob(&ctx, req, &resp);
    if (!g.ok()) s = absl::InternalError(g.error_message());
  }
  EXPECT_TRUE(s.ok()) << s;
  return h;
}

TEST_F(BadInputTest, UcxAttachWithBadTagOrAddressIsInvalidArgument) {
  std::unique_ptr<Harness> h = JoinedNotAttached(daemon_->target());
  RawUcxRank raw;
  ASSERT_OK(raw.Start());
  const std::string job = h->options().job_id;
  ExpectStatus(raw.Attach(StubOf(h->client(0)).get(), job, 0, /*tag=*/0, raw.address()),
               StatusCode::kInvalidArgument, "ucx_tag must be nonzero");
  ExpectStatus(raw.Attach(StubOf(h->client(0)).get(), job, 0, /*tag=*/(uint64_t{1} << 63) | 5,
                          raw.address()),
               StatusCode::kInvalidArgument, "below 2^63");
  ExpectStatus(raw.Attach(StubOf(h->client(0)).get(), job, 0, 7, "abc"), StatusCode::kInvalidArgument,
               "is not a UCX worker address");
  // Junk where the address should be: refused, the same way every time, and
  // the daemon stays up.
  std::string noise(200, '\0');
  uint32_t x = 12345;
  for (char& ch : noise) {
    x = x * 1664525u + 1013904223u;
    ch = static_cast<char>(x >> 24);
  }
  // Also junk behind a genuine header byte (what a corrupted address looks like).
  std::string tail_ff = raw.address().substr(0, 1) + std::string(95, '\xff');
  std::string tail_noise = raw.address().substr(0, 1) + noise;
  std::string tail_zero = raw.address().substr(0, 1) + std::string(95, '\0');
  for (const std::string& junk : {std::string(96, '\x01'), std::string(96, '\xff'), noise, tail_ff,
                                  tail_noise, tail_zero}) {
    absl::Status st = raw.Attach(StubOf(h->client(0)).get(), job, 0, 7, junk);
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(absl::StrContains(st.message(), "cannot reach the rank's UCX worker")) << st;
  }
  ExpectStatus(raw.Attach(StubOf(h->client(0)).get(), "no_such_job", 0, 7, raw.address()),
               StatusCode::kNotFound, "no_such_job");
  // The rank is still free: the library attaches it and a round is exact.
  ASSERT_OK(h->client(0).Attach(job, 0));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// A UCX connection belongs to the stream that attached it: frames from
// another process's UCX worker, even with the tag the rank chose, are
// dropped (the rank's frames carry the daemon's random tag, told only on
// its authenticated stream), and the job is untouched.
TEST_F(BadInputTest, UcxFramesFromAnotherProcessAreDropped) {
  std::unique_ptr<Harness> h = JoinedNotAttached(daemon_->target());
  RawUcxRank raw;
  ASSERT_OK(raw.Start());
  const std::string job = h->options().job_id;
  ASSERT_OK(raw.Attach(StubOf(h->client(0)).get(), job, 0, 0x1111222233334444ull, raw.address()));
  auto dropped = [&]() -> int64_t {
    absl::StatusOr<v1::GetStatsResponse> st = h->client(0).GetStats("");
    return st.ok() ? st->ucx().frames_dropped() : -1;
  };
  const int64_t before = dropped();
  ASSERT_GE(before, 0);
  RawUcxRank intruder;
  ASSERT_OK(intruder.Start());
  ASSERT_OK(intruder.ConnectOnly(raw.daemon_address()));
  v1::UpMessage up;
  up.set_seq(1);
  *up.mutable_shard() = Shard(*h, 0, {0});
  std::string payload, header;
  SplitFrame(&up, &payload, &header);
  const std::vector<uint64_t> guesses = {raw.tag(), raw.tag() + 1, 1, raw.up_tag() ^ 1};
  for (uint64_t tag : guesses) intruder.SendRawWithTag(tag, payload + header);
  ASSERT_OK(intruder.Flush());
  for (int i = 0; i < 300 && dropped() < before + static_cast<int64_t>(guesses.size()); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(dropped(), before + static_cast<int64_t>(guesses.size()));
  raw.Close();
  // Had a shard been taken, the rank's own push of column 0 for that step
  // would be refused and the round would differ: it is exact.
  ASSERT_OK(AttachOnceFree(h->client(0), job, 0));
  ASSERT_OK(h->GoodRound(1e-2f));
  EXPECT_TRUE(h->client(0).TakeErrors().empty());
}

// UCX workers rotate (UcxDataPlane): a rank that attaches again and again
// while another job's rank stays attached moves the daemon to new workers,
// never keeping more than the one the attached rank is on and the current
// one, and both jobs' rounds stay exact.
TEST_F(BadInputTest, UcxWorkersRotateUnderReattachesWhileAnotherRankStays) {
  if (TestTransport() != Transport::kUcx) GTEST_SKIP() << "the UCX target runs it";
  JobOptions stay_opts;
  stay_opts.job_id = "rotate_stays";
  stay_opts.world = 1;
  Harness stay(daemon_->target(), stay_opts);
  ASSERT_OK(stay.Setup());
  ASSERT_OK(stay.GoodRound(1e-2f));
  JobOptions again_opts;
  again_opts.job_id = "rotate_again";
  again_opts.world = 1;
  Harness again(daemon_->target(), again_opts);
  ASSERT_OK(again.Connect());
  ASSERT_OK(again.CreateJob());
  ASSERT_OK(again.Upload());
  auto workers = [&]() -> int64_t {
    absl::StatusOr<v1::GetStatsResponse> st = stay.client(0).GetStats("");
    return st.ok() ? st->ucx().workers() : -1;
  };
  int64_t most = 0;
  for (int i = 0; i < 40; ++i) {
    ClientOptions co = TestClientOptions(daemon_->target());
    co.transport = Transport::kUcx;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(co);
    ASSERT_OK(c.status());
    if (i == 0) {
      ASSERT_OK((*c)->JoinJob("rotate_again", 0).status());
    } else {
      ASSERT_OK(AttachOnceFree(**c, "rotate_again", 0));
    }
    most = std::max(most, workers());
  }  // each client's stream ends as it goes
  std::printf("UCX workers at most %lld during 40 attaches\n", static_cast<long long>(most));
  EXPECT_GE(most, 1);
  EXPECT_LE(most, 2) << "closed connections' workers must go";
  ASSERT_OK(AttachOnceFree(again.client(0), "rotate_again", 0));
  ASSERT_OK(again.GoodRound(1e-2f));
  ASSERT_OK(stay.GoodRound(1e-2f));
  EXPECT_LE(workers(), 2);
}

TEST_F(BadInputTest, UcxMalformedFramesAreRejectedInBand) {
  std::unique_ptr<Harness> h = JoinedNotAttached(daemon_->target());
  RawUcxRank raw;
  ASSERT_OK(raw.Start());
  const std::string job = h->options().job_id;
  ASSERT_OK(raw.Attach(StubOf(h->client(0)).get(), job, 0, 0x1234567887654321ull, raw.address()));
  auto expect_error = [&](StatusCode code, const std::string& fragment) {
    absl::StatusOr<v1::DownMessage> m = raw.Next();
    ASSERT_OK(m.status());
    ASSERT_EQ(m->kind_case(), v1::DownMessage::kError) << m->DebugString();
    ExpectStatus(absl::Status(static_cast<StatusCode>(m->error().code()), m->error().message()),
                 code, fragment);
  };
  raw.SendRaw("short");
  expect_error(StatusCode::kInvalidArgument, "shorter than its trailer");
  raw.SendRaw(std::string(64, 'x'));
  expect_error(StatusCode::kInvalidArgument, "bad magic");
  // A well-formed frame of a bad message is judged like one from gRPC.
  v1::UpMessage up;
  up.set_seq(5);
  *up.mutable_shard() = Shard(*h, 0, {0});
  up.mutable_shard()->set_tensor("nope");
  raw.Send(up);
  expect_error(StatusCode::kNotFound, "nope");
  v1::UpMessage again;
  again.mutable_attach()->set_job_id(job);
  raw.Send(again);
  expect_error(StatusCode::kFailedPrecondition, "attach travels over the gRPC stream");
  raw.Close();
  EXPECT_GE(Rejected(*h, "INVALID_ARGUMENT"), 2);
  // Nothing changed: the library attaches the rank and a round is exact.
  ASSERT_OK(AttachOnceFree(h->client(0), job, 0));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// ---- Issue: seven ways one client could break zenflowd ----

v1::JobSpec SquareJob(const std::string& id, std::vector<std::vector<int64_t>> shapes,
                      int world = 1) {
  v1::JobSpec spec;
  spec.set_job_id(id);
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto* t = spec.add_tensors();
    t->set_name(absl::StrCat("t", i));
    for (int64_t d : shapes[i]) t->add_shape(d);
  }
  spec.set_world_size(world);
  // The sizes below are of the values, m, v and deltas; the local step's
  // few floats per row and column are counted in server/job_spec_test.cc.
  spec.mutable_zenflow()->set_local_step(false);
  return spec;
}

int64_t Reserved(Client& c) {
  absl::StatusOr<v1::GetStatsResponse> st = c.GetStats("");
  return st.ok() ? st->memory_reserved_bytes() : -1;
}

// 1. Sizes that overflow, or that the budget cannot hold, are refused before
// anything is allocated, and nothing stays reserved: the id, the parameter
// count and the bytes are free again at once.
TEST_F(BadInputTest, JobThatCannotBeAllocatedReservesNothing) {
  auto h = MakeJob();
  Client& c = h->client(0);
  const int64_t before = Reserved(c);
  ASSERT_GT(before, 0);
  const int64_t big = int64_t{1} << 31;
  ExpectStatus(c.CreateJob(SquareJob("huge", {{big, big}, {big, big}})).status(),
               StatusCode::kResourceExhausted, "overflows 64 bits");
  ExpectStatus(c.CreateJob(SquareJob("huge", {{big, big}, {big, big}, {big, big}, {big, big}}))
                   .status(),
               StatusCode::kResourceExhausted, "overflows 64 bits");
  ExpectStatus(c.CreateJob(SquareJob("huge", {{1 << 17, 1 << 17}})).status(),
               StatusCode::kResourceExhausted, "of at most 17179869184 (--max_params)");
  ExpectStatus(c.CreateJob(SquareJob("huge", {{1 << 17, 1 << 16}})).status(),
               StatusCode::kResourceExhausted,
               // 36 B per parameter: master, m, v, two sums; two rounds of
               // fp32 deltas with bf16 m and v (the default update_interval
               // auto may send the predicted step's state), and the update
               // divergence's side buffers (docs/design.md rule 14: about
               // 1% of the columns x 4 steps x 2 rounds, and their state).
               "needs 313711203456 bytes (292.17 GiB) (8589934592 parameters");
  ExpectStatus(c.CreateJob(SquareJob("huge", {{1, big}})).status(),
               StatusCode::kResourceExhausted, "of its memory budget of 268435456 bytes");
  EXPECT_EQ(Reserved(c), before);
  // The id was never taken; a job that fits is created under it.
  ExpectStatus(c.DeleteJob("huge"), StatusCode::kNotFound, "no job 'huge'");
  ASSERT_OK(c.CreateJob(SquareJob("huge", {{4, 4}})).status());
  absl::StatusOr<v1::GetStatsResponse> st = c.GetStats("huge");
  ASSERT_OK(st.status());
  // ... + the update divergence's side buffers (one sampled column of 4
  // rows: 4 steps x 2 rounds of fp32 values, a flag per step and round, a
  // slot per column, the sample's copied state of 5 floats per value).
  EXPECT_EQ(st->jobs(0).memory_bytes(), 16 * 20 + 4 * 17 + 4 * 12 + 2 * 16 * (4 + 4) +
                                            (4 * 4 * 2 * 4 + 4 * 2 + 4 * 8 + 4 * 5 * 4));
  EXPECT_EQ(Reserved(c), before + st->jobs(0).memory_bytes());
  ASSERT_OK(c.DeleteJob("huge"));
  EXPECT_EQ(Reserved(c), before);
  ASSERT_OK(h->GoodRound(1e-2f));
}

// 1. The budget may promise more than the process can get (other processes,
// a lower limit): an allocation that fails is RESOURCE_EXHAUSTED with the
// sizes, nothing stays reserved, and the daemon carries on. Here the daemon
// runs under a 2 GiB address-space limit with an 8 GiB budget.
TEST_F(BadInputTest, JobWhoseAllocationFailsIsResourceExhausted) {
  if (access("/usr/bin/prlimit", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/prlimit";
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a ThreadSanitizer build cannot start under an address-space limit";
#endif
  if (TestTransport() == Transport::kUcx) {
    GTEST_SKIP() << "CreateJob does not depend on the data transport (runs in bad_input_test)";
  }
  DaemonProcess small;
  small.set_command_prefix({"/usr/bin/prlimit", "--as=2147483648", "--"});
  ASSERT_OK(small.Start({"--ucx=false", "--memory_budget_bytes=8589934592"}));
  ClientOptions co;
  co.token = kTestToken;
  co.target = small.target();
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  // 2^27 parameters: 4.90 GB as allocated, within the budget, not the limit.
  ExpectStatus((*c)->CreateJob(SquareJob("big", {{1 << 14, 1 << 13}})).status(),
               StatusCode::kResourceExhausted,
               "job 'big': allocating 4902003344 bytes for 134217728 parameters failed (out of "
               "memory); nothing was kept");
  EXPECT_EQ(Reserved(**c), 0);
  JobOptions o;
  o.job_id = "big";  // the id is free
  o.world = 1;
  Harness h(small.target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.GoodRound(1e-2f));
  EXPECT_TRUE(small.Stop().ok());
}

// 2. Per-rank bookkeeping (12 B per rank x column) is part of the size.
TEST_F(BadInputTest, PerRankBookkeepingCountsAgainstTheBudget) {
  auto h = MakeJob();
  Client& c = h->client(0);
  ExpectStatus(c.CreateJob(SquareJob("wide", {{1, 1 << 15}}, 4096)).status(),
               StatusCode::kResourceExhausted,
               // + the update divergence's (docs/design.md rule 14): 328
               // sampled columns x 4 steps of fp32 values for 2 rounds, their
               // flags per rank, a slot per column, the sample's state.
               "per-column and per-rank bookkeeping 1622196896");
  ASSERT_OK(c.CreateJob(SquareJob("wide", {{1, 1 << 15}}, 2)).status());
  absl::StatusOr<v1::GetStatsResponse> st = c.GetStats("wide");
  ASSERT_OK(st.status());
  // ... + the update divergence's side buffers (328 sampled columns of 1
  // row, 4 steps, 2 rounds, 2 ranks' flags; docs/design.md rule 14).
  EXPECT_EQ(st->jobs(0).bookkeeping_bytes(), (1 << 15) * 17 + (1 << 15) * 2 * 12 +
                                                 (328 * 4 * 2 * 4 + 328 * 4 * 2 * 2 +
                                                  (1 << 15) * 8 + 328 * 5 * 4));
  ASSERT_OK(c.DeleteJob("wide"));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// 3. Ids and names have documented limits, and a message quotes at most a
// short prefix of any input.
TEST_F(BadInputTest, LongIdsAndNamesAreQuotedShort) {
  auto h = MakeJob();
  Client& c = h->client(0);
  const std::string long_id(900 << 10, 'j');
  absl::Status s = c.CreateJob(SquareJob(long_id, {{2, 2}})).status();
  ExpectStatus(s, StatusCode::kInvalidArgument, "...' (921600 bytes) is invalid: use 1-128");
  EXPECT_LT(s.message().size(), 300u);
  s = c.GetJob(long_id).status();
  ExpectStatus(s, StatusCode::kInvalidArgument, "(921600 bytes)");
  EXPECT_LT(s.message().size(), 300u);
  v1::JobSpec spec = SquareJob("names", {{2, 2}});
  spec.mutable_tensors(0)->set_name(std::string(300, 'n'));
  ExpectStatus(c.CreateJob(spec).status(), StatusCode::kInvalidArgument,
               "(300 bytes) is longer than 256 bytes");
  v1::GradientShard shard = Shard(*h, 4, {0});
  shard.set_tensor(std::string(512 << 10, 't'));
  s = Rejection(*h, 0, shard);
  ExpectStatus(s, StatusCode::kNotFound, "has no tensor 'tttt");
  EXPECT_LT(s.message().size(), 300u);
  ASSERT_OK(h->GoodRound(1e-2f));
}

// 4. An int8 value times its column's scale must be finite.
TEST_F(BadInputTest, Int8ShardThatDecodesToInfIsRejected) {
  auto h = MakeJob();
  v1::GradientShard s = Shard(*h, 4, {0, 1});
  s.set_dtype(v1::DTYPE_INT8);
  std::string q(2 * 8, '\1');
  q[8 + 3] = 127;  // column 1, row 3
  s.set_payload(q);
  s.add_scales(0.5f);
  s.add_scales(3e38f);
  ExpectStatus(Rejection(*h, 0, s), StatusCode::kInvalidArgument,
               "non-finite gradient in column 1 row 3 of step 4 (int8 127 x scale 3e+38)");
  ASSERT_OK(h->GoodRound(1e-2f));
}

// 4. Finite shards whose sum is not finite: the round is skipped (it cannot
// be rejected any more), reported, and the next round is exact.
TEST_F(BadInputTest, FiniteShardsThatSumToInfSkipTheRound) {
  JobOptions o;
  o.world = 1;
  auto h = MakeJob(o);
  const int64_t round = h->next_round();
  std::vector<int32_t> all(16);
  for (int c = 0; c < 16; ++c) all[c] = c;
  for (int64_t step = round * 4; step < round * 4 + 4; ++step) {
    v1::GradientShard w = Shard(*h, step, all);
    float* v = reinterpret_cast<float*>(w.mutable_payload()->data());
    for (int r = 0; r < 8; ++r) v[r] = 3e38f;  // column 0: finite, sums to Inf
    ASSERT_OK(h->client(0).PushShard(w));
    v1::GradientShard b = Shard(*h, step, all, 1);
    b.set_tensor("b");
    ASSERT_OK(h->client(0).PushShard(b));
  }
  ASSERT_OK(h->client(0).CloseRound(round, 1e-2f));
  absl::StatusOr<RoundUpdate> u = h->client(0).WaitRound(round, absl::Seconds(30));
  ASSERT_OK(u.status());
  EXPECT_TRUE(u->done.skipped_nonfinite());
  EXPECT_TRUE(u->deltas.empty());
  EXPECT_TRUE(h->client(0).TakeErrors().empty());
  h->SkipRound();
  ASSERT_OK(h->GoodRound(1e-2f));
  absl::StatusOr<v1::GetStatsResponse> st = h->client(0).GetStats(h->options().job_id);
  ASSERT_OK(st.status());
  EXPECT_EQ(st->jobs(0).rounds_overflowed(), 1);
  EXPECT_EQ(st->jobs(0).rounds_skipped_nonfinite(), 1);
}

// A Stream call that sends raw bytes (what a broken or hostile client sends).
std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> RawStream(
    grpc::ChannelInterface* channel, grpc::ClientContext* ctx) {
  static const grpc::internal::RpcMethod method(
      "/zenflow.v1.ZenFlow/Stream", grpc::internal::RpcMethod::BIDI_STREAMING);
  return std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel, method, ctx));
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer Up(const v1::UpMessage& m) {
  grpc::ByteBuffer b;
  bool own = false;
  (void)grpc::SerializationTraits<v1::UpMessage>::Serialize(m, &b, &own);
  return b;
}

absl::StatusOr<v1::DownMessage> ReadDownMessageRaw(grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>& s) {
  grpc::ByteBuffer b;
  if (!s.Read(&b)) return absl::UnavailableError("stream ended");
  // Parsed by protobuf straight from gRPC's slices (no copy here: under
  // ThreadSanitizer, reading them from test code looks like a race with
  // the uninstrumented gRPC thread that filled them).
  v1::DownMessage m;
  if (!grpc::SerializationTraits<v1::DownMessage>::Deserialize(&b, &m).ok()) {
    return absl::InternalError("unparseable down message");
  }
  return m;
}

v1::UpMessage AttachMsg(const std::string& job, int rank) {
  v1::UpMessage m;
  m.mutable_attach()->set_job_id(job);
  m.mutable_attach()->set_rank(rank);
  return m;
}

// 5. Bytes that are not an UpMessage get an in-band INVALID_ARGUMENT; the
// stream stays up and the next message is handled.
TEST_F(BadInputTest, UnparseableStreamMessageIsRejectedInBand) {
  std::unique_ptr<Harness> h = JoinedNotAttached(daemon_->target());
  const std::string job = h->options().job_id;
  grpc::ClientContext ctx;
  AddTestToken(&ctx);
  auto stream = RawStream(h->client(0).channel().get(), &ctx);
  ASSERT_TRUE(stream->Write(Up(AttachMsg(job, 0))));
  absl::StatusOr<v1::DownMessage> hello = ReadDownMessageRaw(*stream);
  ASSERT_OK(hello.status());
  ASSERT_EQ(hello->kind_case(), v1::DownMessage::kAttached);
  ASSERT_TRUE(stream->Write(Bytes(std::string("\xff\xff\xff\xff\xff", 5))));
  absl::StatusOr<v1::DownMessage> err = ReadDownMessageRaw(*stream);
  ASSERT_OK(err.status());
  ASSERT_EQ(err->kind_case(), v1::DownMessage::kError) << err->DebugString();
  ExpectStatus(absl::Status(static_cast<StatusCode>(err->error().code()), err->error().message()),
               StatusCode::kInvalidArgument,
               "message #2 of this stream (5 bytes) is not a valid zenflow.v1.UpMessage");
  // Still up: the next message is judged on its own.
  v1::UpMessage next;
  next.set_seq(9);
  *next.mutable_shard() = Shard(*h, 0, {0});
  next.mutable_shard()->set_tensor("nope");
  ASSERT_TRUE(stream->Write(Up(next)));
  err = ReadDownMessageRaw(*stream);
  ASSERT_OK(err.status());
  EXPECT_EQ(err->error().seq(), 9u);
  EXPECT_EQ(err->error().code(), static_cast<int>(StatusCode::kNotFound));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_OK(h->client(0).Attach(job, 0));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// 5, for UploadParameters: a chunk that does not parse ends the upload with
// INVALID_ARGUMENT (it is not taken for the end of the stream, which would
// commit), and nothing is stored.
TEST_F(BadInputTest, UnparseableUploadChunkEndsTheUploadAndStoresNothing) {
  JobOptions o;
  o.job_id = "upload_garbage";
  Harness h(daemon_->target(), o);
  ASSERT_OK(h.Connect());
  ASSERT_OK(h.CreateJob());
  static const grpc::internal::RpcMethod method(
      "/zenflow.v1.ZenFlow/UploadParameters", grpc::internal::RpcMethod::CLIENT_STREAMING);
  grpc::ClientContext ctx;
  AddTestToken(&ctx);
  grpc::ByteBuffer resp;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> up(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          h.client(0).channel().get(), method, &ctx, &resp));
  // A whole first tensor, then garbage.
  std::vector<float> zeros(8 * 16, 0.0f);
  v1::UploadParametersRequest chunk;
  chunk.set_job_id("upload_garbage");
  chunk.set_tensor("w");
  chunk.add_shape(8);
  chunk.add_shape(16);
  chunk.set_payload(reinterpret_cast<const char*>(zeros.data()), zeros.size() * 4);
  ASSERT_TRUE(up->Write(Bytes(chunk.SerializeAsString())));
  up->Write(Bytes(std::string("\xff\xff\xff", 3)));
  up->WritesDone();
  grpc::Status g = up->Finish();
  ExpectStatus(absl::Status(static_cast<StatusCode>(g.error_code()), g.error_message()),
               StatusCode::kInvalidArgument,
               "message #2 of this stream (3 bytes) is not a valid zenflow.v1.UploadParametersRequest");
  ASSERT_OK(h.Upload());  // the real upload is the first one that commits
  ASSERT_OK(h.JoinAll());
  ASSERT_OK(h.GoodRound(1e-2f));
}

int64_t PendingRendezvousBytes(Harness& h) {
  absl::StatusOr<v1::GetStatsResponse> st = h.client(0).GetStats(h.options().job_id);
  return st.ok() ? st->jobs(0).pending_rendezvous_bytes() : -1;
}

// Waits until the daemon holds no pending rendezvous payload.
bool PendingDrains(Harness& h) {
  return WaitUntil([&] { return PendingRendezvousBytes(h) == 0; });
}

// 6. A rendezvous call whose deadline passes is withdrawn with its memory; a
// retry of the same step works; a second call for the same step replaces
// the first.
TEST_F(BadInputTest, AbandonedRendezvousIsWithdrawnAndRetryable) {
  auto h = MakeJob();
  const std::string job = h->options().job_id;
  auto all_reduce = [&](int rank, int64_t step, const std::vector<float>& v, absl::Duration d) {
    v1::AllReduceRequest req;
    req.set_job_id(job);
    req.set_rank(rank);
    req.set_step(step);
    auto* p = req.add_parts();
    p->set_name("g");
    p->set_payload(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    grpc::ClientContext ctx;
    AddTestToken(&ctx);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + d));
    v1::AllReduceResponse resp;
    grpc::Status g = StubOf(h->client(rank))->AllReduce(&ctx, req, &resp);
    std::vector<float> out;
    if (g.ok()) {
      out.resize(resp.parts(0).payload().size() / 4);
      std::memcpy(out.data(), resp.parts(0).payload().data(), out.size() * 4);
    }
    return std::make_pair(g, out);
  };
  const std::vector<float> junk(1 << 16, 1000.0f);  // 256 KiB a call
  for (int i = 0; i < 5; ++i) {
    auto [g, out] = all_reduce(0, 7, junk, absl::Milliseconds(100));
    EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << g.error_message();
    ASSERT_TRUE(PendingDrains(*h)) << "attempt " << i << " left "
                                   << PendingRendezvousBytes(*h) << " bytes";
  }
  // A retry that completes: only the new values count.
  std::vector<float> a(1 << 16, 1.0f), b(1 << 16, 3.0f);
  std::pair<grpc::Status, std::vector<float>> r0;
  std::thread first([&] { r0 = all_reduce(0, 7, a, absl::Seconds(30)); });
  auto r1 = all_reduce(1, 7, b, absl::Seconds(30));
  first.join();
  ASSERT_TRUE(r0.first.ok()) << r0.first.error_message();
  ASSERT_TRUE(r1.first.ok()) << r1.first.error_message();
  EXPECT_EQ(r0.second, std::vector<float>(1 << 16, 2.0f));
  EXPECT_EQ(r1.second, r0.second);
  // Two live calls of rank 0 for one step: the second replaces the first.
  std::pair<grpc::Status, std::vector<float>> old_call, new_call;
  std::thread t1([&] { old_call = all_reduce(0, 8, junk, absl::Seconds(30)); });
  WaitUntil([&] { return PendingRendezvousBytes(*h) > 0; });
  std::thread t2([&] { new_call = all_reduce(0, 8, a, absl::Seconds(30)); });
  t1.join();
  EXPECT_EQ(old_call.first.error_code(), grpc::StatusCode::ABORTED)
      << old_call.first.error_message();
  r1 = all_reduce(1, 8, b, absl::Seconds(30));
  t2.join();
  ASSERT_TRUE(new_call.first.ok()) << new_call.first.error_message();
  EXPECT_EQ(new_call.second, std::vector<float>(1 << 16, 2.0f));
  EXPECT_EQ(PendingRendezvousBytes(*h), 0);
  // SubmitImportance: the same.
  v1::SubmitImportanceRequest sreq;
  sreq.set_job_id(job);
  sreq.set_rank(0);
  sreq.set_step(h->next_round() * 4);
  auto* ti = sreq.add_tensors();
  ti->set_tensor("w");
  for (int c = 0; c < 16; ++c) ti->add_scores(100.0f - c);
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    AddTestToken(&ctx);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
    v1::SubmitImportanceResponse sresp;
    grpc::Status g = StubOf(h->client(0))->SubmitImportance(&ctx, sreq, &sresp);
    EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << g.error_message();
    ASSERT_TRUE(PendingDrains(*h));
  }
  // The abandoned scores are gone: the selection follows the new ones.
  std::vector<float> imp(16);
  for (int c = 0; c < 16; ++c) imp[c] = static_cast<float>(c);
  ASSERT_OK(h->Reselect({imp, {}}));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// A world-1 zero_offload job of one [rows, 512] tensor (2 KiB x rows of
// deltas a round), uploaded, rank 0 joined but not attached.
absl::Status CreateBigJoinedJob(Client& c, const std::string& id, int64_t rows) {
  v1::JobSpec spec = SquareJob(id, {{rows, 512}});
  spec.set_mode(v1::MODE_ZERO_OFFLOAD);  // S = 1, every column remote
  ZF_RETURN_IF_ERROR(c.CreateJob(spec).status());
  std::vector<float> init(rows * 512, 0.5f);
  ZF_RETURN_IF_ERROR(c.UploadParameters(id, {{"t0", {rows, 512}, init.data()}}).status());
  grpc::ClientContext jctx;
  AddTestToken(&jctx);
  v1::JoinJobRequest req;
  req.set_job_id(id);
  v1::JoinJobResponse resp;
  grpc::Status g = StubOf(c)->JoinJob(&jctx, req, &resp);
  if (!g.ok()) return absl::InternalError(g.error_message());
  return absl::OkStatus();
}

v1::UpMessage BigShard(int64_t step, int64_t rows) {
  const std::vector<uint16_t> g(rows * 512, 0x3c23);  // bf16 0.01
  v1::UpMessage m;
  v1::GradientShard* sh = m.mutable_shard();
  sh->set_step(step);
  sh->set_tensor("t0");
  sh->set_dtype(v1::DTYPE_BF16);
  for (int col = 0; col < 512; ++col) sh->add_columns(col);
  sh->set_payload(reinterpret_cast<const char*>(g.data()), g.size() * 2);
  return m;
}

v1::UpMessage Close(int64_t round) {
  v1::UpMessage close;
  close.mutable_close()->set_round(round);
  close.mutable_close()->set_lr(1e-3f);
  return close;
}

// 7. A rank that does not read: once its outbox holds --max_outbox_bytes the
// daemon stops reading from it (gRPC's flow control then stops its sends);
// when it reads again, everything it was sent arrives and reading resumes.
// The rank closes 40 rounds of a 128 KiB tensor without reading a delta
// (it paces its closes by GetStats, as it must not run two rounds ahead of
// the updates).
TEST_F(BadInputTest, RankThatDoesNotReadIsPausedNotBuffered) {
  if (TestTransport() == Transport::kUcx) {
    GTEST_SKIP() << "over UCX the flow control is the daemon's parking of frames; see docs/operating.md#a-rank-that-does-not-read-its-stream";
  }
  auto h = MakeJob();
  ClientOptions co = TestClientOptions(daemon_->target());
  co.transport = Transport::kGrpc;
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  ASSERT_OK(CreateBigJoinedJob(**c, "no_reader", 64));
  // Its own connection, with HTTP/2's receive window left at 64 KiB (no BDP
  // probing), so that little of what it does not read fits in the pipes.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetMaxReceiveMessageSize(-1);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(daemon_->target(), grpc::InsecureChannelCredentials(), args);
  grpc::ClientContext ctx;
  AddTestToken(&ctx);
  auto stream = RawStream(channel.get(), &ctx);
  ASSERT_TRUE(stream->Write(Up(AttachMsg("no_reader", 0))));
#if defined(__SANITIZE_THREAD__)
  constexpr int kRounds = 12;  // TSan checks every byte read from gRPC's buffers: slow
#else
  constexpr int kRounds = 40;
#endif
  std::thread writer([&] {
    for (int r = 0; r < kRounds; ++r) {
      for (int i = 0; i < 60000; ++i) {
        absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader");
        if (!st.ok() || st->jobs(0).rounds_updated() >= r - 1) break;
        absl::SleepFor(absl::Milliseconds(1));
      }
      if (!stream->Write(Up(BigShard(r, 64)))) return;
      if (!stream->Write(Up(Close(r)))) return;
    }
  });
  v1::JobStats job;
  WaitUntil([&] {
    absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader");
    if (!st.ok()) return false;
    job = st->jobs(0);
    return job.ranks_size() == 1 && job.ranks(0).reading_paused();
  });
  ASSERT_EQ(job.ranks_size(), 1);
  ASSERT_TRUE(job.ranks(0).reading_paused())
      << "the daemon kept reading a rank that does not read: " << job.DebugString();
  // The limit, plus at most the rounds closed before reading stopped (one
  // round's deltas are 128 KiB here; two can be in flight).
  EXPECT_GE(job.ranks(0).outbox_bytes(), 65536);
  EXPECT_LT(job.ranks(0).outbox_bytes(), 65536 + 3 * (150 << 10));
  EXPECT_LT(job.rounds_updated(), kRounds);
  // Now read: the greeting, then every round's deltas and RoundDone, in
  // order; nothing was lost or rejected.
  absl::StatusOr<v1::DownMessage> m = ReadDownMessageRaw(*stream);
  ASSERT_OK(m.status());
  EXPECT_EQ(m->kind_case(), v1::DownMessage::kAttached);
  int64_t done = 0, deltas = 0;
  while (done < kRounds) {
    m = ReadDownMessageRaw(*stream);
    ASSERT_TRUE(m.ok()) << "after " << done << " rounds: " << m.status();
    ASSERT_NE(m->kind_case(), v1::DownMessage::kError) << m->error().message();
    if (m->kind_case() == v1::DownMessage::kDelta) ++deltas;
    if (m->kind_case() == v1::DownMessage::kDone) {
      ASSERT_EQ(m->done().round(), done);
      ++done;
    }
  }
  EXPECT_GE(deltas, kRounds);
  writer.join();
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader");
  ASSERT_OK(st.status());
  EXPECT_EQ(st->jobs(0).rounds_updated(), kRounds);
  EXPECT_EQ(st->jobs(0).ranks(0).outbox_bytes(), 0);
  EXPECT_TRUE(st->jobs(0).rejected().empty());
  ASSERT_OK((*c)->DeleteJob("no_reader"));
  ASSERT_OK(h->GoodRound(1e-2f));
}

// 7, over UCX: a rank whose UCX worker does not take the daemon's messages.
// Its outbox fills, its frames are parked instead of handled, and once they
// pass --max_outbox_bytes + --max_message_bytes it is cut off: connection
// closed, lifeline ended with RESOURCE_EXHAUSTED, the daemon unharmed.
TEST_F(BadInputTest, UcxRankThatDoesNotReadIsCutOff) {
  auto h = MakeJob();
  ClientOptions co = TestClientOptions(daemon_->target());
  co.transport = Transport::kGrpc;
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  ASSERT_OK(CreateBigJoinedJob(**c, "no_reader_ucx", 256));
  RawUcxRank raw;
  ASSERT_OK(raw.Start());
  ASSERT_OK(raw.Attach(StubOf(**c).get(), "no_reader_ucx", 0, 0x5eed, raw.address()));
  // Waits until the job has updated `rounds` rounds and the rank's outbox
  // holds at least `min_outbox` bytes (at most `max_outbox`); returns the
  // outbox bytes.
  auto wait_for = [&](int64_t rounds, int64_t min_outbox,
                      int64_t max_outbox = std::numeric_limits<int64_t>::max()) -> int64_t {
    int64_t outbox = -1;
    const bool ok = WaitUntil([&] {
      absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader_ucx");
      if (!st.ok()) return false;
      const v1::JobStats& j = st->jobs(0);
      outbox = j.ranks(0).outbox_bytes();
      return j.rounds_updated() >= rounds && outbox >= min_outbox && outbox <= max_outbox;
    });
    return ok ? outbox : -1;
  };
  raw.PauseReceiving(true);
  // Round 0; its deltas fill the outbox (they cannot leave).
  raw.Send(BigShard(0, 256));
  raw.Send(Close(0));
  ASSERT_GE(wait_for(1, 65536), 65536);
  // Round 1 is parked until the rank takes its messages again; then it is
  // handled and updated.
  raw.Send(BigShard(1, 256));
  raw.Send(Close(1));
  raw.PauseReceiving(false);
  // Round 1 updated and its deltas taken by the rank (else round 2's frames
  // would be parked behind them, not handled).
  ASSERT_GE(wait_for(2, 0, 0), 0) << "parked frames were not handled after the outbox drained";
  // Not reading again: round 2 fills the outbox...
  raw.PauseReceiving(true);
  raw.Send(BigShard(2, 256));
  raw.Send(Close(2));
  const int64_t outbox = wait_for(3, 65536);
  ASSERT_GE(outbox, 65536);
  // ...and its frames are parked, not handled: 8 more rounds (2 MiB) pass
  // the limit of what it may leave waiting.
  for (int r = 3; r < 11; ++r) {
    raw.Send(BigShard(r, 256));
    raw.Send(Close(r));
  }
  absl::Status end = raw.Ended();
  ExpectStatus(end, StatusCode::kResourceExhausted,
               absl::StrCat("rank 0 of job 'no_reader_ucx' has more than 1114112 bytes of "
                            "messages waiting in the daemon while its outbox holds ",
                            outbox, " bytes (--max_outbox_bytes 65536)"));
  absl::StatusOr<v1::GetStatsResponse> st = (*c)->GetStats("no_reader_ucx");
  ASSERT_OK(st.status());
  EXPECT_EQ(st->ucx().connections_cut(), 1);
  // What waits for the rank is its outbox, bounded: the limit plus the
  // rounds closed before it filled.
  EXPECT_LT(st->jobs(0).ranks(0).outbox_bytes(), 65536 + 3 * (600 << 10));
  EXPECT_EQ(st->jobs(0).rounds_updated(), 3) << "parked frames were handled";
  ASSERT_OK((*c)->DeleteJob("no_reader_ucx"));
  ASSERT_OK(h->GoodRound(1e-2f));
}

TEST_F(BadInputTest, UcxAttachToDaemonWithoutUcxIsFailedPrecondition) {
  DaemonProcess plain;
  ASSERT_OK(plain.Start({"--ucx=false"}));
  ClientOptions co;
  co.token = kTestToken;
  co.target = plain.target();
  co.transport = Transport::kUcx;
  JobOptions o;
  o.job_id = "no_ucx";
  o.world = 1;
  Harness h(plain.target(), o);
  ASSERT_OK(h.Connect());
  ASSERT_OK(h.CreateJob());
  ASSERT_OK(h.Upload());
  auto c = Client::Connect(co);
  ASSERT_OK(c.status());
  ExpectStatus((*c)->JoinJob("no_ucx", 0).status(), StatusCode::kFailedPrecondition,
               "--ucx=false");
  // The same rank attaches over gRPC.
  ClientOptions grpc_co;
  grpc_co.token = kTestToken;
  grpc_co.target = plain.target();
  auto g = Client::Connect(grpc_co);
  ASSERT_OK(g.status());
  ASSERT_OK((*g)->Attach("no_ucx", 0));
  EXPECT_TRUE(plain.Stop().ok());
}

}  // namespace
}  // namespace zenflow::testing
