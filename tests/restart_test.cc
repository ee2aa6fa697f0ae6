// zenflowd restarted on its --state_dir, as real processes: a SIGTERM saves
// every job and the next daemon continues it exactly; after a SIGKILL the
// next daemon restores the last checkpoint written.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
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
}  // namespace zenflow::testing
