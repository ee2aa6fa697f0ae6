// Bad input against a real zenflowd over loopback gRPC: requests and shards a
// client must not send, and memory a job must not get. Each rejection has a
// specific status code and an actionable message, is counted, and leaves the
// job untouched — proven by a following good round that still matches the
// independent reference exactly as if the bad request had never been sent.
// The transports' bad input (UCX, raw streams, ranks that do not read) is in
// bad_input_transport_test.cc; the fixture in bad_input_fixture.h.
#include "tests/bad_input_fixture.h"

namespace zenflow::testing {
namespace {

using absl::StatusCode;

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

// Shards long enough that zenflowd's UCX receive scans them as it copies
// them in (UcxOptions::scan_nonfinite: the default check then does not read
// them again), in both wire dtypes: a NaN or Inf anywhere, the last value
// included, is still rejected with its place named, and the good shards
// that follow (every value of the same step, proven finite by the scan) are
// added exactly. Over gRPC
// the same shards take the check's own pass.
TEST_F(BadInputTest, NonFiniteValueInAScannedShardIsRejectedAndTheNextRoundIsExact) {
  for (DType wire : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(wire));
    JobOptions o;
    o.job_id = absl::StrCat("scanned-", DTypeName(wire));
    o.wire = wire;
    // Columns of 1024 rows: 2 or 4 KiB each.
    o.tensors = {{"w", 1024, 128, false}};
    o.max_shard_bytes = 1 << 20;  // the good steps go as one scanned shard each
    auto h = std::make_unique<Harness>(daemon_->target(), o);
    ASSERT_OK(h->Setup());
    ASSERT_OK(h->GoodRound(1e-2f));
    // One shard of the first 64 daemon columns (PushColumns would split a
    // payload at the client's max_shard_bytes; a shard is what is checked).
    std::vector<int32_t> cols = h->remote()[0];
    ASSERT_GE(cols.size(), 64u);
    cols.resize(64);
    const int64_t rows = 1024;
    const size_t bytes = cols.size() * rows * DTypeSize(wire);
    ASSERT_GE(bytes, UcxWorker::kScanMinBytes);
    ASSERT_LE(bytes, size_t{1} << 20);  // the test daemon's --max_message_bytes
    struct Bad {
      size_t col;  // index into cols
      int64_t row;
      float value;
    };
    for (const Bad& bad : {Bad{cols.size() - 1, 1023, std::numeric_limits<float>::quiet_NaN()},
                           Bad{40, 7, -std::numeric_limits<float>::infinity()}}) {
      std::vector<float> colmajor(cols.size() * rows);
      for (size_t i = 0; i < cols.size(); ++i) {
        for (int64_t r = 0; r < rows; ++r) colmajor[i * rows + r] = TestGrad(0, 4, 0, r, cols[i]);
      }
      colmajor[bad.col * rows + bad.row] = bad.value;
      v1::GradientShard shard;
      shard.set_step(4);
      shard.set_tensor("w");
      shard.set_selection_version(h->version());
      shard.set_dtype(wire == DType::kBF16 ? v1::DTYPE_BF16 : v1::DTYPE_FP32);
      shard.mutable_columns()->Add(cols.begin(), cols.end());
      std::string payload(bytes, '\0');
      Encode(wire, colmajor.data(), colmajor.size(), payload.data());
      shard.set_payload(std::move(payload));
      ExpectStatus(Rejection(*h, 0, std::move(shard)), StatusCode::kInvalidArgument,
                   absl::StrCat("non-finite gradient in column ", cols[bad.col], " row ", bad.row,
                                " of step 4"));
    }
    EXPECT_EQ(Rejected(*h, "INVALID_ARGUMENT"), 2);
    ASSERT_OK(h->GoodRound(1e-2f));  // step 4's good shards, and the round exact
    // Every accepted value was proven below 2^63 (by the receive scan over
    // UCX, by AllBounded over gRPC): both rounds were updated in one pass.
    absl::StatusOr<v1::GetStatsResponse> st = h->client(0).GetStats(o.job_id);
    ASSERT_OK(st.status());
    EXPECT_EQ(st->jobs(0).rounds_norm_first(), 0);
  }
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
// ---- Issue: seven ways one client could break zenflowd ----

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
               // 1% of the columns x 4 steps x 2 rounds, and their state);
               // per column 21 B of bookkeeping, per rank 664 B.
               "needs 176305280796 bytes (164.20 GiB) (8589934592 parameters");
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
  // (Bookkeeping: 17 B per column and its number, 4 B per column + 1; per
  // rank 24 B and 4 steps of 160 B. Deltas: the update holds at most one
  // round, fp32 values with bf16 m and v.)
  EXPECT_EQ(st->jobs(0).memory_bytes(), 16 * 20 + 4 * 17 + (4 + 1) * 4 + (24 + 4 * 160) +
                                            16 * (4 + 4) +
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
               "job 'big': allocating 2788009260 bytes for 134217728 parameters failed (out of "
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

// 2. Per-rank bookkeeping is part of the size, and does not multiply ranks
// by columns (issue 32): a world-4096 job of 32,768 parameters in one
// [1, 32768] tensor is charged under 64 MiB (it was 1.6 GB, and refused).
TEST_F(BadInputTest, PerRankBookkeepingCountsAgainstTheBudget) {
  auto h = MakeJob();
  Client& c = h->client(0);
  const int64_t before = Reserved(c);
  for (int world : {2, 4096}) {
    ASSERT_OK(c.CreateJob(SquareJob("wide", {{1, 1 << 15}}, world)).status());
    absl::StatusOr<v1::GetStatsResponse> st = c.GetStats("wide");
    ASSERT_OK(st.status());
    // Per column 17 B and its number among the daemon's (4 B, cols + 1);
    // per rank 24 B and 4 steps of 160 B (RankArrivals); the update
    // divergence's side buffers (328 sampled columns of 1 row, 4 steps, 2
    // rounds, the ranks' flags; docs/design.md rule 14).
    EXPECT_EQ(st->jobs(0).bookkeeping_bytes(),
              (1 << 15) * 17 + ((1 << 15) + 1) * 4 + world * (24 + 4 * 160) +
                  (328 * 4 * 2 * 4 + 328 * 4 * 2 * world + (1 << 15) * 8 + 328 * 5 * 4))
        << world;
    EXPECT_LT(st->jobs(0).memory_bytes(), int64_t{64} << 20) << world;
    EXPECT_EQ(Reserved(c), before + st->jobs(0).memory_bytes());
    ASSERT_OK(c.DeleteJob("wide"));
  }
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
  // Values of 2^63 or more: that round's update measured the norm first and
  // found the overflow; the good rounds, all below, took one pass.
  EXPECT_EQ(st->jobs(0).rounds_norm_first(), 1);
}

}  // namespace
}  // namespace zenflow::testing
