// The client library against an in-process zenflowd on a loopback port,
// over both data transports.
#include "client/client.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/adamw.h"
#include "gtest/gtest.h"
#include "server/service.h"
#include "zenflow/v1/zenflow.grpc.pb.h"

namespace zenflow {
namespace {

constexpr int64_t kRows = 4;
constexpr int64_t kCols = 8;

float Init(int64_t r, int64_t c) { return 0.1f * static_cast<float>(r) - 0.05f * c; }
float Grad(int64_t step, int64_t r, int64_t c) {
  return std::sin(0.3f * static_cast<float>(step + 1) + 0.7f * r + 0.11f * c);
}

class ClientTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override { StartServer(""); }
  // (Re)starts the in-process daemon, with checkpoints in `state_dir` if set.
  // An empty state directory for this test and transport.
  std::string FreshStateDir(const std::string& name) const {
    const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/", name, "_",
                                         GetParam() == Transport::kUcx ? "ucx" : "grpc");
    EXPECT_EQ(system(absl::StrCat("rm -rf ", dir, " && mkdir -p ", dir).c_str()), 0);
    return dir;
  }
  // On `port` (0: any free one).
  void StartServer(const std::string& state_dir, int port = 0) {
    if (server_ != nullptr) {
      server_->Shutdown();
      server_.reset();
    }
    ServerOptions opts;
    opts.listen = absl::StrCat("127.0.0.1:", port);
    opts.state_dir = state_dir;
    opts.admin_token = "client-test-token-0123456789";  // Options().token: daemon-wide calls
    absl::StatusOr<std::unique_ptr<ZenFlowServer>> s = ZenFlowServer::Start(opts);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    if (GetParam() == Transport::kUcx) {
      ASSERT_NE(server_->ucx(), nullptr) << server_->ucx_status();
    }
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  ClientOptions Options() const {
    ClientOptions o;
    o.target = absl::StrCat("127.0.0.1:", server_->port());
    o.transport = GetParam();
    o.token = "client-test-token-0123456789";  // every client of a test shares the job
    return o;
  }
  std::unique_ptr<Client> NewClient() {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Options());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // A one-rank job of one kRows x kCols fp32 tensor, S = 1, fp32 shards,
  // new values as deltas.
  static v1::JobSpec Spec(const std::string& id) {
    v1::JobSpec spec;
    spec.set_job_id(id);
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name("w");
    t->add_shape(kRows);
    t->add_shape(kCols);
    t->set_dtype(v1::DTYPE_FP32);
    spec.set_world_size(1);
    spec.set_wire_dtype(v1::DTYPE_FP32);
    spec.set_delta_kind(v1::DELTA_VALUES);
    spec.mutable_zenflow()->set_update_interval(1);
    return spec;
  }
  void CreateAndUpload(Client* c, const std::string& id) {
    ASSERT_TRUE(c->CreateJob(Spec(id)).ok());
    init_.resize(kRows * kCols);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t col = 0; col < kCols; ++col) init_[r * kCols + col] = Init(r, col);
    }
    absl::StatusOr<v1::UploadParametersResponse> up =
        c->UploadParameters(id, {{"w", {kRows, kCols}, init_.data()}});
    ASSERT_TRUE(up.ok()) << up.status();
    EXPECT_EQ(up->elements(), kRows * kCols);
  }
  // Pushes every column's gradient of `step` (round `step`, as S = 1).
  absl::Status PushStep(Client* c, int64_t step) {
    std::vector<int32_t> cols(kCols);
    std::vector<float> colmajor(kRows * kCols);
    for (int64_t col = 0; col < kCols; ++col) {
      cols[col] = static_cast<int32_t>(col);
      for (int64_t r = 0; r < kRows; ++r) colmajor[col * kRows + r] = Grad(step, r, col);
    }
    return c->PushColumns(step, "w", /*version=*/0, cols, colmajor.data(), kRows, DType::kF32);
  }
  // Checks a round's deltas against AdamW run here on the same gradients.
  void ExpectRound(const RoundUpdate& u, int64_t round) {
    AdamWHyper h;
    h.lr = kLr;
    if (ref_p_.empty()) {
      ref_p_ = init_;
      ref_m_.assign(init_.size(), 0.f);
      ref_v_.assign(init_.size(), 0.f);
    }
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t col = 0; col < kCols; ++col) {
        const size_t i = r * kCols + col;
        const float g = Grad(round, r, col);
        AdamWReference(h, round + 1, 1.0f, &g, &ref_p_[i], &ref_m_[i], &ref_v_[i], 1);
      }
    }
    EXPECT_EQ(u.round, round);
    EXPECT_EQ(u.done.round(), round);
    EXPECT_FALSE(u.done.skipped_nonfinite());
    int64_t seen = 0;
    for (const v1::ParameterDelta& d : u.deltas) {
      ASSERT_EQ(d.tensor(), "w");
      ASSERT_EQ(d.payload().size(), d.columns_size() * kRows * sizeof(float));
      for (int j = 0; j < d.columns_size(); ++j) {
        for (int64_t r = 0; r < kRows; ++r) {
          float got;
          std::memcpy(&got, d.payload().data() + (j * kRows + r) * sizeof(float), sizeof(float));
          const float want = ref_p_[r * kCols + d.columns(j)];
          EXPECT_NEAR(got, want, 1e-6f * std::max(1.0f, std::fabs(want)))
              << "round " << round << " column " << d.columns(j) << " row " << r;
        }
        ++seen;
      }
    }
    EXPECT_EQ(seen, kCols);
  }
  // One round of `step`: push, close, wait, check.
  void GoodRound(Client* c, int64_t round) {
    ASSERT_TRUE(PushStep(c, round).ok());
    ASSERT_TRUE(c->CloseRound(round, kLr).ok());
    absl::StatusOr<RoundUpdate> u = c->WaitRound(round, absl::Seconds(60));
    ASSERT_TRUE(u.ok()) << u.status();
    ExpectRound(*u, round);
  }

  static constexpr float kLr = 1e-2f;
  std::unique_ptr<ZenFlowServer> server_;
  std::vector<float> init_, ref_p_, ref_m_, ref_v_;
};

TEST_P(ClientTest, ConnectGivesUpAfterItsTimeout) {
  ClientOptions o = Options();
  o.target = "127.0.0.1:1";  // nothing listens there
  o.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("127.0.0.1:1"), absl::string_view::npos) << c.status();
}

TEST_P(ClientTest, RoundsMatchAdamWAndAreCounted) {
  std::unique_ptr<Client> c = NewClient();
  ASSERT_NE(c, nullptr);
  CreateAndUpload(c.get(), "rounds");
  ASSERT_TRUE(c->JoinJob("rounds", 0).ok());
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->job_id(), "rounds");
  for (int64_t round = 0; round < 3; ++round) GoodRound(c.get(), round);
  EXPECT_TRUE(c->Flush(absl::Seconds(30)).ok());
  const ClientStats st = c->stats();
  EXPECT_EQ(st.rounds_received, 3);
  EXPECT_GE(st.messages_sent, 6);  // a shard and a close per round
  EXPECT_GT(st.bytes_sent, 3 * kRows * kCols * 4);
  EXPECT_GT(st.bytes_received, 3 * kRows * kCols * 4);
  EXPECT_EQ(st.stream_errors, 0);
  EXPECT_TRUE(c->stream_status().ok());
}

TEST_P(ClientTest, PushesBeforeAttachingAreRefused) {
  std::unique_ptr<Client> c = NewClient();
  ASSERT_NE(c, nullptr);
  CreateAndUpload(c.get(), "early");
  absl::Status s = PushStep(c.get(), 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(c->CloseRound(0, kLr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->WaitRound(0, absl::Seconds(5)).status().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(c->JoinJob("early", 0).ok());
  GoodRound(c.get(), 0);
}

TEST_P(ClientTest, ASecondAttachWhileAttachedIsRefusedAndChangesNothing) {
  std::unique_ptr<Client> c = NewClient();
  ASSERT_NE(c, nullptr);
  CreateAndUpload(c.get(), "twice");
  ASSERT_TRUE(c->JoinJob("twice", 0).ok());
  absl::Status s = c->Attach("twice", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("'twice' rank 0"), absl::string_view::npos) << s;
  GoodRound(c.get(), 0);
}

TEST_P(ClientTest, RejectedShardsComeBackInBandAndTheStreamGoesOn) {
  std::unique_ptr<Client> c = NewClient();
  ASSERT_NE(c, nullptr);
  CreateAndUpload(c.get(), "inband");
  ASSERT_TRUE(c->JoinJob("inband", 0).ok());
  std::vector<float> col(kRows, 1.f);
  ASSERT_TRUE(c->PushColumns(0, "w", 0, {static_cast<int32_t>(kCols)}, col.data(), kRows,
                             DType::kF32)
                  .ok());
  ASSERT_TRUE(c->WaitForErrors(1, absl::Seconds(60)));
  std::vector<absl::Status> errors = c->TakeErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), absl::StatusCode::kOutOfRange) << errors[0];  // column 8 of 8
  EXPECT_NE(errors[0].message().find("(message #1)"), absl::string_view::npos) << errors[0];
  GoodRound(c.get(), 0);
  EXPECT_TRUE(c->stream_status().ok());
}

// A close the daemon refuses in band (here: more steps than the round has)
// ends the wait for its round at once with the daemon's code and message,
// instead of a silent wait to the timeout; the corrected close then brings
// the round, exact, and the next round is exact too.
TEST_P(ClientTest, ARefusedCloseEndsTheRoundWaitWithTheDaemonsError) {
  std::unique_ptr<Client> c = NewClient();
  ASSERT_NE(c, nullptr);
  CreateAndUpload(c.get(), "refused");
  ASSERT_TRUE(c->JoinJob("refused", 0).ok());
  ASSERT_TRUE(PushStep(c.get(), 0).ok());
  ASSERT_TRUE(c->CloseRound(0, kLr, /*steps=*/2).ok());  // S = 1: the daemon refuses it
  // Ten minutes: without the refusal's early return the test runs into
  // its own timeout instead.
  absl::StatusOr<RoundUpdate> u = c->WaitRound(0, absl::Minutes(10));
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), absl::StatusCode::kInvalidArgument) << u.status();
  EXPECT_NE(u.status().message().find("refused the close of round 0"), absl::string_view::npos)
      << u.status();
  EXPECT_NE(u.status().message().find("steps 2 must be in [1, 1]"), absl::string_view::npos)
      << u.status();
  // Asked again, the same answer, at once.
  EXPECT_EQ(c->WaitRound(0, absl::Minutes(10)).status(), u.status());
  std::vector<absl::Status> errors = c->TakeErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), absl::StatusCode::kInvalidArgument) << errors[0];
  EXPECT_TRUE(c->stream_status().ok());
  // The corrected close clears the refusal: round 0 comes, exact.
  ASSERT_TRUE(c->CloseRound(0, kLr).ok());
  u = c->WaitRound(0, absl::Seconds(60));
  ASSERT_TRUE(u.ok()) << u.status();
  ExpectRound(*u, 0);
  GoodRound(c.get(), 1);
  EXPECT_EQ(c->stats().stream_errors, 1);
}

TEST_P(ClientTest, ADeletedJobEndsTheStreamWithTheDaemonsReasonAndTheClientCanReattach) {
  std::unique_ptr<Client> c = NewClient();
  std::unique_ptr<Client> admin = NewClient();
  ASSERT_NE(c, nullptr);
  ASSERT_NE(admin, nullptr);
  CreateAndUpload(c.get(), "gone");
  ASSERT_TRUE(c->JoinJob("gone", 0).ok());
  GoodRound(c.get(), 0);
  ASSERT_TRUE(admin->DeleteJob("gone").ok());
  absl::StatusOr<RoundUpdate> u = c->WaitRound(1, absl::Minutes(5));
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().code(), absl::StatusCode::kDeadlineExceeded) << u.status();
  const absl::Status end = c->stream_status();
  EXPECT_FALSE(end.ok());
  EXPECT_EQ(u.status(), end);
  EXPECT_EQ(PushStep(c.get(), 1).code(), end.code());
  // A new job on the same client: a fresh stream, the same numbers as a
  // fresh client would get.
  ref_p_.clear();
  CreateAndUpload(c.get(), "again");
  ASSERT_TRUE(c->JoinJob("again", 0).ok());
  EXPECT_TRUE(c->stream_status().ok());
  GoodRound(c.get(), 0);
}

TEST_P(ClientTest, WaitForUploadSeesAnotherRanksUpload) {
  std::unique_ptr<Client> c = NewClient();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->WaitForUpload("later", absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(c->CreateJob(Spec("later")).ok());
  EXPECT_EQ(c->WaitForUpload("later", absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  CreateAndUpload(c.get(), "later2");
  absl::StatusOr<v1::GetJobResponse> job = c->WaitForUpload("later2", absl::Seconds(30));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->parameters_uploaded());
  EXPECT_EQ(c->WaitForUpload("bad id!", absl::Seconds(30)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

absl::StatusOr<v1::CheckpointResponse> Checkpoint(Client* c, const std::string& job) {
  std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(c->channel());
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + c->token());
  v1::CheckpointRequest req;
  req.set_job_id(job);
  v1::CheckpointResponse resp;
  grpc::Status g = stub->Checkpoint(&ctx, req, &resp);
  if (!g.ok()) return absl::Status(static_cast<absl::StatusCode>(g.error_code()), g.error_message());
  return resp;
}

TEST_P(ClientTest, AJobSurvivesARestartFromItsNewestWholeCheckpoint) {
  std::unique_ptr<Client> plain = NewClient();
  ASSERT_NE(plain, nullptr);
  absl::Status none = Checkpoint(plain.get(), "").status();
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition) << none;
  plain.reset();
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/state_", GetParam() == Transport::kUcx ? "ucx" : "grpc");
  ASSERT_EQ(system(absl::StrCat("rm -rf ", dir, " && mkdir -p ", dir).c_str()), 0);
  StartServer(dir);
  std::unique_ptr<Client> c = NewClient();
  ASSERT_NE(c, nullptr);
  CreateAndUpload(c.get(), "keep");
  ASSERT_TRUE(c->JoinJob("keep", 0).ok());
  GoodRound(c.get(), 0);
  GoodRound(c.get(), 1);
  absl::StatusOr<v1::CheckpointResponse> first = Checkpoint(c.get(), "keep");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->checkpoints_size(), 1);
  EXPECT_EQ(first->checkpoints(0).rounds_updated(), 2);
  EXPECT_GT(first->checkpoints(0).bytes(), 3 * kRows * kCols * 4);
  const std::vector<float> p2 = ref_p_, m2 = ref_m_, v2 = ref_v_;  // the state after round 1
  GoodRound(c.get(), 2);
  absl::StatusOr<v1::CheckpointResponse> second = Checkpoint(c.get(), "");
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->checkpoints_size(), 1);
  EXPECT_EQ(second->checkpoints(0).rounds_updated(), 3);
  EXPECT_EQ(Checkpoint(c.get(), "no such").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Checkpoint(c.get(), "nojob").status().code(), absl::StatusCode::kNotFound);
  // The newest file is damaged: the restart refuses it and uses the one before.
  {
    // One byte's bits flipped (writing a fixed byte left the file as it
    // was when that byte already had the value: once in CI).
    std::fstream f(second->checkpoints(0).path(), std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(8192);
    char b = 0;
    ASSERT_TRUE(f.get(b).good());
    f.seekp(8192);
    f.put(static_cast<char>(~b));
    ASSERT_TRUE(f.good());
  }
  c.reset();
  StartServer(dir);
  c = NewClient();
  ASSERT_NE(c, nullptr);
  absl::StatusOr<v1::GetStatsResponse> st = c->GetStats("keep");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->jobs(0).rounds_updated(), 2);
  // The rank (joined before, and restored so) attaches again, and round 2
  // runs again from the restored state.
  ref_p_ = p2;
  ref_m_ = m2;
  ref_v_ = v2;
  EXPECT_EQ(c->JoinJob("keep", 0).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(c->Attach("keep", 0).ok());
  GoodRound(c.get(), 2);
  GoodRound(c.get(), 3);
  // A deleted job's checkpoints go with it: nothing comes back next time.
  ASSERT_TRUE(c->DeleteJob("keep").ok());
  c.reset();
  StartServer(dir);
  c = NewClient();
  EXPECT_EQ(c->GetStats("keep").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(ClientTest, ARankRidesThroughADaemonRestartFromAnOlderCheckpoint) {
  const std::string dir = FreshStateDir("ride");
  StartServer(dir);
  const int port = server_->port();
  ClientOptions o = Options();
  o.daemon_wait = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Client>> made = Client::Connect(o);
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Client> c = *std::move(made);
  CreateAndUpload(c.get(), "ride");
  ASSERT_TRUE(c->JoinJob("ride", 0).ok());
  GoodRound(c.get(), 0);
  GoodRound(c.get(), 1);
  ASSERT_TRUE(Checkpoint(c.get(), "ride").ok());  // rounds 0 and 1 are durable
  GoodRound(c.get(), 2);  // its RoundDone says so: the log forgets rounds 0 and 1
  EXPECT_GT(c->stats().replay_log_entries, 0);
  ASSERT_TRUE(PushStep(c.get(), 3).ok());
  // The daemon goes (without a checkpoint: round 2 and round 3's shards are
  // lost) and comes back on the same address and directory.
  StartServer(dir, port);
  // The close (or, if it went into the dying stream, the wait) rides
  // through: the client re-attaches, replays round 2 and round 3, drops
  // round 2's second update and gets round 3 as if nothing had happened.
  ASSERT_TRUE(c->CloseRound(3, kLr).ok());
  absl::StatusOr<RoundUpdate> u = c->WaitRound(3, absl::Seconds(60));
  ASSERT_TRUE(u.ok()) << u.status();
  ExpectRound(*u, 3);
  const ClientStats st = c->stats();
  EXPECT_EQ(st.reconnects, 1);
  EXPECT_EQ(st.rounds_dropped_duplicate, 1);
  GoodRound(c.get(), 4);
  absl::StatusOr<v1::GetStatsResponse> js = c->GetStats("ride");
  ASSERT_TRUE(js.ok()) << js.status();
  EXPECT_EQ(js->jobs(0).rounds_updated(), 5);
  EXPECT_EQ(js->jobs(0).rejected_size(), 0);
}

// Attaches rank 0 of `job` over a raw stream with Attach.rounds_done (if
// set) and reads the greeting, then, when `until_done`, what follows up to
// a RoundDone; then half-closes. Every message read goes to `got`; the
// call's status is returned. Retries while the rank's previous stream is
// still being let go (ALREADY_EXISTS).
grpc::Status RawAttach(Client* c, const std::string& job, std::optional<int64_t> rounds_done,
                       bool until_done, std::vector<v1::DownMessage>* got) {
  std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(c->channel());
  grpc::Status st;
  for (int attempt = 0; attempt < 100; ++attempt) {
    got->clear();
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + c->token());
    auto s = stub->Stream(&ctx);
    v1::UpMessage hello;
    hello.mutable_attach()->set_job_id(job);
    hello.mutable_attach()->set_rank(0);
    if (rounds_done.has_value()) hello.mutable_attach()->set_rounds_done(*rounds_done);
    s->Write(hello);
    v1::DownMessage m;
    while (s->Read(&m)) {
      got->push_back(m);
      if (!until_done || m.has_done()) break;
    }
    s->WritesDone();
    while (s->Read(&m)) got->push_back(m);
    st = s->Finish();
    if (st.error_code() != grpc::StatusCode::ALREADY_EXISTS) return st;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return st;
}

// zenflowd killed after a round's checkpoint but before that round's deltas
// reached the rank (seen once in ride_through_test: the rank then waited
// forever). Restored, the daemon sends that round again to a rank that
// says it lacks it, identical to the original; a rank that lacks more is
// refused; one that lacks nothing gets nothing again; then the job goes on
// exactly.
TEST_P(ClientTest, ARoundLostInARestartIsSentAgainIdentically) {
  if (GetParam() == Transport::kUcx) {
    GTEST_SKIP() << "driven by a raw gRPC stream; the daemon's UCX attach sends the same messages";
  }
  const std::string dir = FreshStateDir("lost");
  StartServer(dir);
  std::unique_ptr<Client> c = NewClient();
  ASSERT_NE(c, nullptr);
  CreateAndUpload(c.get(), "lost");
  ASSERT_TRUE(c->JoinJob("lost", 0).ok());
  GoodRound(c.get(), 0);
  GoodRound(c.get(), 1);
  ASSERT_TRUE(PushStep(c.get(), 2).ok());
  ASSERT_TRUE(c->CloseRound(2, kLr).ok());
  absl::StatusOr<RoundUpdate> original = c->WaitRound(2, absl::Seconds(60));
  ASSERT_TRUE(original.ok()) << original.status();
  ExpectRound(*original, 2);
  absl::StatusOr<v1::CheckpointResponse> ck = Checkpoint(c.get(), "lost");
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_EQ(ck->checkpoints(0).rounds_updated(), 3);
  c.reset();
  StartServer(dir);  // restored with 3 rounds updated
  c = NewClient();
  ASSERT_NE(c, nullptr);

  // Lacking round 2: its deltas and RoundDone again, byte for byte.
  std::vector<v1::DownMessage> got;
  grpc::Status st = RawAttach(c.get(), "lost", 2, /*until_done=*/true, &got);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(got.size(), original->deltas.size() + 2);
  EXPECT_TRUE(got[0].has_attached());
  EXPECT_EQ(got[0].attached().rounds_updated(), 3);
  for (size_t i = 0; i < original->deltas.size(); ++i) {
    ASSERT_TRUE(got[i + 1].has_delta());
    EXPECT_EQ(got[i + 1].delta().SerializeAsString(), original->deltas[i].SerializeAsString())
        << "delta message " << i;
  }
  ASSERT_TRUE(got.back().has_done());
  EXPECT_EQ(got.back().done().SerializeAsString(), original->done.SerializeAsString());

  // Lacking rounds 1 and 2: refused, with why.
  st = RawAttach(c.get(), "lost", 1, /*until_done=*/true, &got);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("the deltas of rounds 1..2 never reached the rank"),
            std::string::npos)
      << st.error_message();
  st = RawAttach(c.get(), "lost", -1, /*until_done=*/true, &got);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  // Lacking nothing (and without the field): the greeting only.
  for (std::optional<int64_t> done : {std::optional<int64_t>(3), std::optional<int64_t>()}) {
    st = RawAttach(c.get(), "lost", done, /*until_done=*/false, &got);
    EXPECT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(got[0].has_attached());
  }

  // The job goes on exactly from round 2's state.
  absl::Status a = absl::UnavailableError("not tried");
  for (int i = 0; i < 100 && !a.ok(); ++i) {
    a = c->Attach("lost", 0);
    if (!a.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(a.ok()) << a;
  GoodRound(c.get(), 3);
  GoodRound(c.get(), 4);
}

TEST_P(ClientTest, WithoutDaemonWaitARestartEndsTheWait) {
  const std::string dir = FreshStateDir("nowait");
  StartServer(dir);
  const int port = server_->port();
  std::unique_ptr<Client> c = NewClient();
  ASSERT_NE(c, nullptr);
  CreateAndUpload(c.get(), "nowait");
  ASSERT_TRUE(c->JoinJob("nowait", 0).ok());
  GoodRound(c.get(), 0);
  ASSERT_TRUE(PushStep(c.get(), 1).ok());
  StartServer(dir, port);
  absl::StatusOr<RoundUpdate> u = c->WaitRound(1, absl::Seconds(60));
  EXPECT_FALSE(u.ok());
  EXPECT_EQ(c->stats().reconnects, 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, ClientTest,
                         ::testing::Values(Transport::kGrpc, Transport::kUcx),
                         [](const ::testing::TestParamInfo<Transport>& info) {
                           return info.param == Transport::kUcx ? "ucx" : "grpc";
                         });

}  // namespace
}  // namespace zenflow
