// Who may touch a job, against a real zenflowd: per-job tokens, one answer
// for "no such job" and "not yours", the admin token, GetStats of the
// caller's jobs only, the audit log, the per-credential and per-daemon
// limits, and a UCX connection that only its own rank can send into.
#include <unistd.h>

#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "server/auth.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/files.h"
#include "tests/testing/harness.h"
#include "tests/testing/status_macros.h"
#include "zenflow/v1/zenflow.grpc.pb.h"

namespace zenflow::testing {
namespace {

constexpr char kAdmin[] = "admin-token-for-auth-test-0123";
constexpr char kOwner[] = "owner-token-0123456789abcdef";
constexpr char kOther[] = "other-tenant-token-0123456789";

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(getenv("TEST_TMPDIR"), "/auth_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "'").c_str()), 0);
    ASSERT_TRUE(WriteFile(dir_ + "/admin", absl::StrCat(kAdmin, "\n")));
  }

  // A daemon with the admin token and an audit log in the test's directory.
  absl::Status StartDaemon(std::vector<std::string> flags = {}) {
    flags.push_back("--admin_token_file=" + dir_ + "/admin");
    flags.push_back("--audit_log=" + audit());
    return daemon_.Start(flags);
  }
  std::string audit() const { return dir_ + "/audit.log"; }

  // A client of the daemon sending `token` (empty: none).
  std::unique_ptr<Client> As(const std::string& token) {
    ClientOptions co = TestClientOptions(daemon_.target());
    co.token = token;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(co);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // The owner's two-rank job with one good round done.
  std::unique_ptr<Harness> OwnersJob(const std::string& id = "victim") {
    JobOptions o;
    o.job_id = id;
    o.token = kOwner;
    auto h = std::make_unique<Harness>(daemon_.target(), o);
    { const absl::Status s_ = (h->Setup()); EXPECT_TRUE(s_.ok()) << s_; }
    { const absl::Status s_ = (h->GoodRound(1e-2f)); EXPECT_TRUE(s_.ok()) << s_; }
    return h;
  }

  std::string dir_;
  DaemonProcess daemon_;
};

TEST_F(AuthTest, CallsWithoutATokenAreUnauthenticated) {
  ASSERT_OK(StartDaemon());
  std::unique_ptr<Harness> owner = OwnersJob();
  std::unique_ptr<Client> anon = As("");
  EXPECT_EQ(anon->GetJob("victim").status().code(), absl::StatusCode::kUnauthenticated);
  absl::Status s = anon->JoinJob("victim", 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "authorization: Bearer")) << s;
  EXPECT_EQ(anon->DeleteJob("victim").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->GetStats("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->GetStats("victim").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->Attach("victim", 0).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->AllReduce(0, {}).status().code(), absl::StatusCode::kUnauthenticated);

  // Malformed metadata: not Bearer, a token too short, two entries.
  std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(anon->channel());
  for (const std::vector<std::string>& values :
       std::vector<std::vector<std::string>>{{"Basic dXNlcjpwYXNz"},
                                             {"Bearer short"},
                                             {"Bearer bad token with spaces!"},
                                             {absl::StrCat("Bearer ", kOwner),
                                              absl::StrCat("Bearer ", kOther)}}) {
    grpc::ClientContext ctx;
    for (const std::string& v : values) ctx.AddMetadata("authorization", v);
    v1::GetJobRequest req;
    req.set_job_id("victim");
    v1::GetJobResponse resp;
    grpc::Status g = stub->GetJob(&ctx, req, &resp);
    EXPECT_EQ(g.error_code(), grpc::StatusCode::UNAUTHENTICATED) << values[0];
  }
  // The owner's job went on untouched: the next round is exact.
  ASSERT_OK(owner->GoodRound(1e-2f));
}

TEST_F(AuthTest, AnotherTokenLearnsNothingAndCannotTouchTheJob) {
  ASSERT_OK(StartDaemon());
  std::unique_ptr<Harness> owner = OwnersJob();
  std::unique_ptr<Client> other = As(kOther);
  // The same answer for the owner's job as for a job that does not exist.
  absl::Status mine = other->GetJob("victim").status();
  absl::Status none = other->GetJob("nosuch").status();
  EXPECT_EQ(mine.code(), absl::StatusCode::kPermissionDenied) << mine;
  EXPECT_EQ(none.code(), absl::StatusCode::kPermissionDenied) << none;
  EXPECT_EQ(std::string(mine.message()),
            absl::StrReplaceAll(none.message(), {{"'nosuch'", "'victim'"}}));
  EXPECT_EQ(other->JoinJob("victim", 1).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other->Attach("victim", 1).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other->DeleteJob("victim").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other->DeleteJob("nosuch").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other->GetStats("victim").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(other->GetState("victim", "w").status().code(), absl::StatusCode::kPermissionDenied);
  v1::ColumnState cs;
  cs.set_tensor("w");
  EXPECT_EQ(other->SetState("victim", cs).code(), absl::StatusCode::kPermissionDenied);
  // Client::AllReduce names the client's own job: a raw call names the victim.
  {
    std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(other->channel());
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kOther));
    v1::AllReduceRequest req;
    req.set_job_id("victim");
    req.set_rank(0);
    v1::AllReduceResponse resp;
    EXPECT_EQ(stub->AllReduce(&ctx, req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  // Uploading into it is refused too.
  std::vector<float> zeros(8 * 16, 0.f);
  EXPECT_EQ(other->UploadParameters("victim", {{"w", {8, 16}, zeros.data()}}).status().code(),
            absl::StatusCode::kPermissionDenied);
  // GetStats of every job shows the caller's jobs only: none.
  absl::StatusOr<v1::GetStatsResponse> st = other->GetStats("");
  ASSERT_OK(st.status());
  EXPECT_EQ(st->jobs_size(), 0);
  EXPECT_EQ(st->calls_size(), 0) << "daemon-wide counts are the admin's";
  // The owner's job is intact: the next round is exact on both ranks.
  ASSERT_OK(owner->GoodRound(1e-2f));
  absl::StatusOr<v1::GetStatsResponse> own = owner->client(0).GetStats("");
  ASSERT_OK(own.status());
  ASSERT_EQ(own->jobs_size(), 1);
  EXPECT_EQ(own->jobs(0).job_id(), "victim");
  // A name collision is visible (names are one namespace), nothing more.
  v1::JobSpec spec = owner->spec();
  EXPECT_EQ(other->CreateJob(spec).status().code(), absl::StatusCode::kAlreadyExists);
}

// Ranks other than 0 poll GetJob until rank 0 created their job: answered
// PERMISSION_DENIED (as for another's job), but not counted as rejections,
// which alert. A GetJob of a job that exists with another token is.
TEST_F(AuthTest, WaitingForAJobIsNotARejection) {
  ASSERT_OK(StartDaemon());
  std::unique_ptr<Harness> owner = OwnersJob();
  std::unique_ptr<Client> other = As(kOther);
  std::unique_ptr<Client> admin = As(kAdmin);
  auto get_job_rejections = [&]() -> int64_t {
    absl::StatusOr<v1::GetStatsResponse> st = admin->GetStats("");
    EXPECT_TRUE(st.ok()) << st.status();
    int64_t n = 0;
    if (!st.ok()) return -1;
    for (const v1::RejectionCount& r : st->rejections()) {
      if (r.reason() == "get_job") n += r.count();
    }
    return n;
  };
  const int64_t before = get_job_rejections();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(other->GetJob("not-yet").status().code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(get_job_rejections(), before);
  EXPECT_EQ(other->GetJob("victim").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(get_job_rejections(), before + 1);
  // The waits are still in the audit log.
  const std::string log = ReadFile(audit());
  int waits = 0;
  for (size_t at = log.find("event=denied call=GetJob job='not-yet'"); at != std::string::npos;
       at = log.find("event=denied call=GetJob job='not-yet'", at + 1)) {
    ++waits;
  }
  EXPECT_EQ(waits, 5) << log;
  ASSERT_OK(owner->GoodRound(1e-2f));
}

TEST_F(AuthTest, CreateJobWithoutATokenReturnsOneThatWorks) {
  ASSERT_OK(StartDaemon());
  std::unique_ptr<Client> a = As("");
  JobOptions o;
  o.job_id = "fresh";
  o.world = 1;
  Harness h(daemon_.target(), o);
  absl::StatusOr<v1::JobSpec> spec = a->CreateJob(h.spec());
  ASSERT_OK(spec.status());
  const std::string token = a->token();
  EXPECT_EQ(token.size(), 43u) << token;
  ASSERT_OK(a->GetJob("fresh").status());  // the client adopted it
  // A second client with that token reaches the job; one with its own does not.
  { const absl::Status s_ = (As(token)->GetJob("fresh").status()); EXPECT_TRUE(s_.ok()) << s_; }
  EXPECT_EQ(As(kOther)->GetJob("fresh").status().code(), absl::StatusCode::kPermissionDenied);
  // A caller that brings its token gets none back.
  std::unique_ptr<Client> b = As(kOther);
  o.job_id = "brought";
  Harness h2(daemon_.target(), o);
  ASSERT_OK(b->CreateJob(h2.spec()).status());
  EXPECT_EQ(b->token(), kOther);
  // A token too weak to be one is refused at creation.
  std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(b->channel());
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer 1234");
  v1::CreateJobRequest req;
  *req.mutable_spec() = h2.spec();
  req.mutable_spec()->set_job_id("weak");
  v1::CreateJobResponse resp;
  EXPECT_EQ(stub->CreateJob(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // (The admin may learn that it does not exist.)
  EXPECT_EQ(As(kAdmin)->GetJob("weak").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AuthTest, TheAdminTokenReachesEveryJob) {
  ASSERT_OK(StartDaemon({"--state_dir=" + dir_}));
  std::unique_ptr<Harness> owner = OwnersJob();
  std::unique_ptr<Client> admin = As(kAdmin);
  ASSERT_OK(admin->GetJob("victim").status());
  absl::StatusOr<v1::GetStatsResponse> all = admin->GetStats("");
  ASSERT_OK(all.status());
  EXPECT_EQ(all->jobs_size(), 1);
  EXPECT_GT(all->calls_size(), 0);
  // Checkpointing every job is the admin's call only.
  std::unique_ptr<Client> other = As(kOwner);
  for (Client* c : {other.get(), admin.get()}) {
    std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(c->channel());
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + c->token());
    v1::CheckpointRequest req;
    v1::CheckpointResponse resp;
    grpc::Status g = stub->Checkpoint(&ctx, req, &resp);
    if (c == admin.get()) {
      EXPECT_TRUE(g.ok()) << g.error_message();
    } else {
      EXPECT_EQ(g.error_code(), grpc::StatusCode::PERMISSION_DENIED) << g.error_message();
    }
  }
  ASSERT_OK(owner->GoodRound(1e-2f));
  ASSERT_OK(admin->DeleteJob("victim"));
}

TEST_F(AuthTest, TheJobsTokenSurvivesARestart) {
  ASSERT_OK(StartDaemon({"--state_dir=" + dir_}));
  const int port = daemon_.port();
  std::unique_ptr<Harness> owner = OwnersJob();
  ASSERT_OK(daemon_.Stop());  // SIGTERM writes the checkpoint
  ASSERT_OK(StartDaemon({"--state_dir=" + dir_, absl::StrCat("--listen=127.0.0.1:", port)}));
  { const absl::Status s_ = (As(kOwner)->GetJob("victim").status()); EXPECT_TRUE(s_.ok()) << s_; }
  EXPECT_EQ(As(kOther)->GetJob("victim").status().code(), absl::StatusCode::kPermissionDenied);
  // The digest, not the token, is what the checkpoint holds.
  std::string files;
  ASSERT_EQ(system(absl::StrCat("grep -rl '", kOwner, "' '", dir_, "/victim' > '", dir_,
                                "/found' 2>/dev/null; true").c_str()),
            0);
  EXPECT_EQ(ReadFile(dir_ + "/found"), "");
}

TEST_F(AuthTest, TheAuditLogSaysWhoDidWhat) {
  ASSERT_OK(StartDaemon());
  std::unique_ptr<Harness> owner = OwnersJob();
  std::unique_ptr<Client> other = As(kOther);
  EXPECT_EQ(other->DeleteJob("victim").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(As("")->GetJob("victim").status().code(), absl::StatusCode::kUnauthenticated);
  ASSERT_OK(owner->client(0).DeleteJob("victim"));
  const std::string log = ReadFile(audit());
  auto has = [&](const std::string& pattern) {
    return std::regex_search(log, std::regex(pattern));
  };
  const std::string peer = R"(peer='ipv4:127\.0\.0\.1:[0-9]+')";
  const std::string owner_id = CredentialId(TokenDigest(kOwner));
  EXPECT_TRUE(has("event=create job='victim' " + peer + " credential=" + owner_id + " result=OK"))
      << log;
  EXPECT_TRUE(has("event=join job='victim' " + peer + " credential=" + owner_id + " result=OK"))
      << log;
  EXPECT_TRUE(has("event=attach job='victim' " + peer + " credential=" + owner_id + " result=OK"))
      << log;
  EXPECT_TRUE(has("event=denied call=DeleteJob job='victim' " + peer + " credential=" +
                  CredentialId(TokenDigest(kOther)) + " result=PERMISSION_DENIED"))
      << log;
  EXPECT_TRUE(has("event=denied call=GetJob job='victim' " + peer +
                  " credential=none result=UNAUTHENTICATED"))
      << log;
  EXPECT_TRUE(has("event=delete job='victim' " + peer + " credential=" + owner_id + " result=OK"))
      << log;
  // The token itself is never written.
  EXPECT_FALSE(absl::StrContains(log, kOwner));
  EXPECT_FALSE(absl::StrContains(log, kOther));
}

TEST_F(AuthTest, LimitsPerCredentialPerJobAndPerDaemon) {
  ASSERT_OK(StartDaemon({"--max_jobs_per_credential=2", "--max_world_size=4",
                         "--max_params_per_credential=300", "--max_streams=3"}));
  JobOptions o;
  o.world = 1;
  o.token = kOwner;
  auto spec_of = [&](const std::string& id, int world) {
    o.job_id = id;
    o.world = world;
    return Harness(daemon_.target(), o).spec();
  };
  std::unique_ptr<Client> a = As(kOwner);
  std::unique_ptr<Client> b = As(kOther);
  // 8x16 + 16 = 144 parameters a job: two fit in 300, a third would not.
  ASSERT_OK(a->CreateJob(spec_of("a1", 1)).status());
  ASSERT_OK(a->CreateJob(spec_of("a2", 1)).status());
  absl::Status s = a->CreateJob(spec_of("a3", 1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_jobs_per_credential")) << s;
  ASSERT_OK(b->CreateJob(spec_of("b1", 1)).status());  // another token's own limit
  ASSERT_OK(a->DeleteJob("a2"));
  // Room for one job again, but not for its parameters with a bigger one.
  o.tensors = {{"w", 8, 32, false}};  // 256 parameters; 144 + 256 > 300
  s = a->CreateJob(spec_of("a4", 1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_params_per_credential")) << s;
  o.tensors = {{"w", 8, 16, false}, {"b", 1, 16, true}};
  s = b->CreateJob(spec_of("b2", 5)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_world_size")) << s;

  // Streams: three may be open; the fourth is refused until one closes.
  ASSERT_OK(a->DeleteJob("a1"));
  ASSERT_OK(b->DeleteJob("b1"));
  o.token = kOwner;
  o.job_id = "streams";
  o.world = 4;
  Harness h(daemon_.target(), o);
  ASSERT_OK(h.Connect());
  ASSERT_OK(h.CreateJob());
  ASSERT_OK(h.Upload());
  for (int r = 0; r < 3; ++r) ASSERT_OK(h.client(r).JoinJob("streams", r).status());
  s = h.client(3).JoinJob("streams", 3).status();
  if (s.ok()) s = h.client(3).stream_status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_streams")) << s;
}

// Idle calls cannot hold the stream slots: a Stream that sends no attach
// and an upload that sends no chunk are ended, and their slots come back.
TEST_F(AuthTest, IdleStreamsAreEndedAndTheirSlotsComeBack) {
  ASSERT_OK(StartDaemon({"--max_streams=2", "--attach_timeout_s=1"}));
  std::unique_ptr<Client> c = As(kOwner);
  std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(c->channel());
  grpc::ClientContext sctx, uctx;
  sctx.AddMetadata("authorization", absl::StrCat("Bearer ", kOwner));
  uctx.AddMetadata("authorization", absl::StrCat("Bearer ", kOwner));
  auto idle_stream = stub->Stream(&sctx);
  v1::UploadParametersResponse uresp;
  auto idle_upload = stub->UploadParameters(&uctx, &uresp);
  // Both slots are held: a third stream is refused meanwhile (if the sweep
  // has not freed them yet, the attach below simply works).
  v1::DownMessage down;
  EXPECT_FALSE(idle_stream->Read(&down));
  grpc::Status g = idle_stream->Finish();
  EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << g.error_message();
  EXPECT_TRUE(absl::StrContains(g.error_message(), "--attach_timeout_s")) << g.error_message();
  g = idle_upload->Finish();
  EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << g.error_message();
  // The slots are back: a job's two ranks attach and run an exact round.
  // (The daemon lets go of a slot when the call is done on its side, a
  // moment after the client saw the call's status; RESOURCE_EXHAUSTED says
  // to retry, so retry, each time as a new job.)
  JobOptions o;
  o.token = kOwner;
  std::unique_ptr<Harness> h;
  absl::Status setup;
  for (int attempt = 0; attempt < 100; ++attempt) {
    o.job_id = absl::StrCat("after_idle_", attempt);
    h.reset();  // closes the previous attempt's streams
    h = std::make_unique<Harness>(daemon_.target(), o);
    setup = h->Setup();
    if (setup.code() != absl::StatusCode::kResourceExhausted) break;
    h.reset();
    (void)c->DeleteJob(o.job_id);  // (it may not have been made)
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_OK(setup);
  ASSERT_OK(h->GoodRound(1e-2f));
}

}  // namespace
}  // namespace zenflow::testing
