// zenflowd restarted on its --state_dir, as real processes: a SIGTERM saves
// every job and the next daemon continues it exactly; after a SIGKILL the
// next daemon restores the last checkpoint written.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "zenflow/v1/zenflow.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/harness.h"
#include "common/status_macros.h"
#include "tests/testing/status_macros.h"

namespace zenflow::testing {
namespace {

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(getenv("TEST_TMPDIR"), "/state_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "'").c_str()), 0);
  }
  // Starts a daemon on the state directory, on `port` (0: any).
  absl::Status StartDaemon(DaemonProcess* d, int port) {
    return d->Start({absl::StrCat("--listen=127.0.0.1:", port), "--state_dir=" + dir_});
  }
  absl::StatusOr<v1::GetJobResponse> Describe(const std::string& target, const std::string& job) {
    ClientOptions co = TestClientOptions(target);
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(co));
    return c->GetJob(job);
  }
  std::string dir_;
};

TEST_F(RestartTest, SigtermSavesEveryJobAndTheNextDaemonContinuesItExactly) {
  DaemonProcess first;
  ASSERT_OK(StartDaemon(&first, 0));
  const int port = first.port();
  JobOptions o;
  o.job_id = "saved";
  Harness h(first.target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(first.Stop());  // SIGTERM: the checkpoint is written before exit

  DaemonProcess second;
  ASSERT_OK(StartDaemon(&second, port));  // the same address: the ranks' target
  absl::StatusOr<v1::GetJobResponse> job = Describe(second.target(), "saved");
  ASSERT_OK(job.status());
  EXPECT_EQ(job->rounds_updated(), 2);
  EXPECT_TRUE(job->parameters_uploaded());
  EXPECT_EQ(job->joined_ranks_size(), 2);
  // The ranks connect again, attach (they joined before), and the next
  // rounds match the reference optimizer exactly, as if nothing happened.
  ASSERT_OK(h.Connect());
  for (int r = 0; r < 2; ++r) ASSERT_OK(h.client(r).Attach("saved", r));
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.GoodRound(1e-2f));
}

TEST_F(RestartTest, AfterSigkillTheLastCheckpointComesBack) {
  DaemonProcess first;
  ASSERT_OK(StartDaemon(&first, 0));
  JobOptions o;
  o.job_id = "killed";
  Harness h(first.target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  {
    std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(h.client(0).channel());
    grpc::ClientContext ctx;
    AddTestToken(&ctx);
    v1::CheckpointRequest req;
    v1::CheckpointResponse resp;
    ASSERT_TRUE(stub->Checkpoint(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.checkpoints_size(), 1);
    EXPECT_EQ(resp.checkpoints(0).rounds_updated(), 1);
  }
  ASSERT_OK(h.GoodRound(1e-2f));  // after the checkpoint: lost with the process
  kill(first.pid(), SIGKILL);
  (void)first.Stop();  // reaps it

  DaemonProcess second;
  ASSERT_OK(StartDaemon(&second, 0));
  absl::StatusOr<v1::GetJobResponse> job = Describe(second.target(), "killed");
  ASSERT_OK(job.status());
  EXPECT_EQ(job->rounds_updated(), 1);
}

}  // namespace
TEST_F(RestartTest, ADeadRankFailsWhatWaitsOnItAndMayAttachAgain) {
  DaemonProcess d;
  ASSERT_OK(d.Start({"--listen=127.0.0.1:0", "--dead_rank_timeout_s=1"}));
  JobOptions o;
  o.job_id = "dead";
  Harness h(d.target(), o);  // creates and uploads the job; its own ranks stay out
  ASSERT_OK(h.Connect());
  ASSERT_OK(h.CreateJob());
  ASSERT_OK(h.Upload());
  const ClientOptions co = TestClientOptions(d.target());
  absl::StatusOr<std::unique_ptr<Client>> made0 = Client::Connect(co);
  absl::StatusOr<std::unique_ptr<Client>> made1 = Client::Connect(co);
  ASSERT_OK(made0.status());
  ASSERT_OK(made1.status());
  std::unique_ptr<Client> c0 = *std::move(made0), c1 = *std::move(made1);
  ASSERT_OK(c0->JoinJob("dead", 0).status());
  ASSERT_OK(c1->JoinJob("dead", 1).status());
  const std::vector<float> a = {1.f, 2.f}, b = {3.f, 6.f};
  c1.reset();  // rank 1's process is gone: its stream ends
  // Rank 0 waits on rank 1 in an all-reduce; a second later it is told.
  absl::StatusOr<std::vector<std::vector<float>>> r = c0->AllReduce(0, {{"g", &a}});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_NE(r.status().message().find("rank 1 of job 'dead' has had no data stream"),
            std::string::npos)
      << r.status();
  // Its stream ends with the same status (its rounds cannot complete).
  absl::Status s;
  for (int i = 0; i < 100 && (s = c0->stream_status()).ok(); ++i) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  // A restarted rank attaches again (it joined before), and so does rank 0:
  // the job goes on.
  made1 = Client::Connect(co);
  ASSERT_OK(made1.status());
  c1 = *std::move(made1);
  ASSERT_OK(c1->Attach("dead", 1));
  ASSERT_OK(c0->Attach("dead", 0));
  absl::StatusOr<std::vector<std::vector<float>>> r1;
  std::thread t([&] { r1 = c1->AllReduce(1, {{"g", &b}}); });
  absl::StatusOr<std::vector<std::vector<float>>> r0 = c0->AllReduce(1, {{"g", &a}});
  t.join();
  ASSERT_OK(r0.status());
  ASSERT_OK(r1.status());
  EXPECT_EQ((*r0)[0], (std::vector<float>{2.f, 4.f}));
  EXPECT_EQ((*r1)[0], (*r0)[0]);
  ASSERT_OK(d.Stop());
}

TEST_F(RestartTest, ACheckpointWhoseSnapshotDoesNotFitTheBudgetIsRefused) {
  // The job's footprint, measured on a daemon with room to spare.
  JobOptions o;
  o.job_id = "big";
  o.tensors = {{"w", 256, 1024, false}};
  int64_t memory = 0, copy = 0;
  {
    DaemonProcess probe;
    ASSERT_OK(probe.Start({"--listen=127.0.0.1:0"}));
    Harness h(probe.target(), o);
    ASSERT_OK(h.Setup());
    absl::StatusOr<v1::GetStatsResponse> st = h.client(0).GetStats("big");
    ASSERT_OK(st.status());
    memory = st->jobs(0).memory_bytes();
    copy = st->jobs(0).state_bytes() + st->jobs(0).bookkeeping_bytes();
    ASSERT_OK(probe.Stop());
  }
  // A budget the job fits in, but not the job and its snapshot.
  DaemonProcess d;
  ASSERT_OK(d.Start({"--listen=127.0.0.1:0", "--state_dir=" + dir_,
                     absl::StrCat("--memory_budget_bytes=", memory + copy / 2)}));
  Harness h(d.target(), o);
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(h.client(0).channel());
  grpc::ClientContext ctx;
  AddTestToken(&ctx);
  v1::CheckpointRequest req;
  req.set_job_id("big");
  v1::CheckpointResponse resp;
  const grpc::Status g = stub->Checkpoint(&ctx, req, &resp);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << g.error_message();
  EXPECT_NE(g.error_message().find("a checkpoint of job 'big' copies"), std::string::npos)
      << g.error_message();
  // Nothing was written, nothing stays reserved, and the job goes on exactly.
  EXPECT_EQ(system(absl::StrCat("test -z \"$(ls '", dir_, "/big' 2>/dev/null)\"").c_str()), 0);
  ASSERT_OK(h.GoodRound(1e-2f));
  absl::StatusOr<v1::GetStatsResponse> st = h.client(0).GetStats("big");
  ASSERT_OK(st.status());
  EXPECT_EQ(st->jobs(0).memory_bytes(), memory);
  ASSERT_OK(d.Stop());  // the save at SIGTERM fails the same way, logged
}

}  // namespace zenflow::testing
