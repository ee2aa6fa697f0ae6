// When a job ends (docs/protocol.md, "When a job ends"), against a real
// zenflowd: the ranks' finish (DeleteJob finished_rank) deletes the job once
// every rank has finished, and a rank that finishes early leaves it to the
// others; keep keeps it, checkpointed with --state_dir; --job_idle_ttl_s
// reaps a job with no rank attached (checkpoint and audit line) and leaves
// one with attached ranks; CreateJob of a taken id tells the job's own token
// what holds it and what to do, and any other token only that it is taken.
#include <dirent.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/files.h"
#include "tests/testing/harness.h"
#include "tests/testing/status_macros.h"

namespace zenflow::testing {
namespace {

constexpr char kOwner[] = "owner-token-for-job-end-test-0123";
constexpr char kOther[] = "other-token-for-job-end-test-4567";

class JobEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(getenv("TEST_TMPDIR"), "/job_end_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(system(absl::StrCat("rm -rf '", dir_, "' && mkdir -p '", dir_, "/state'").c_str()),
              0);
  }

  absl::Status StartDaemon(std::vector<std::string> flags = {}, bool state_dir = true) {
    flags.push_back("--audit_log=" + audit());
    if (state_dir) flags.push_back("--state_dir=" + dir_ + "/state");
    return daemon_.Start(flags);
  }
  std::string audit() const { return dir_ + "/audit.log"; }

  std::unique_ptr<Client> As(const std::string& token) {
    ClientOptions co = TestClientOptions(daemon_.target());
    co.token = token;
    co.daemon_wait = absl::ZeroDuration();  // a test fails fast
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(co);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  // The admin (the test daemon's admin token is the tests' token) learns
  // whether a job exists: NOT_FOUND once it is gone.
  absl::StatusCode JobState(const std::string& id) {
    std::unique_ptr<Client> admin = As(kTestToken);
    return admin == nullptr ? absl::StatusCode::kUnknown : admin->GetJob(id).status().code();
  }

  // The owner's two-rank job with one good round done, its ranks attached.
  std::unique_ptr<Harness> OwnersJob(const std::string& id) {
    JobOptions o;
    o.job_id = id;
    o.token = kOwner;
    auto h = std::make_unique<Harness>(daemon_.target(), o);
    { const absl::Status s = h->Setup(); EXPECT_TRUE(s.ok()) << s; }
    { const absl::Status s = h->GoodRound(1e-2f); EXPECT_TRUE(s.ok()) << s; }
    return h;
  }

  std::vector<std::string> Checkpoints(const std::string& id) {
    std::vector<std::string> out;
    DIR* d = opendir((dir_ + "/state/" + id).c_str());
    if (d == nullptr) return out;
    while (dirent* e = readdir(d)) {
      if (absl::EndsWith(e->d_name, ".zfck")) out.push_back(e->d_name);
    }
    closedir(d);
    return out;
  }

  std::string dir_;
  DaemonProcess daemon_;
};

TEST_F(JobEndTest, TheLastRanksFinishDeletesTheJobAndAnEarlyOneLeavesItToTheOthers) {
  ASSERT_OK(StartDaemon());
  std::unique_ptr<Harness> h = OwnersJob("ft");
  // Rank 0 is done first: the job stays for rank 1, and saying it twice
  // counts once.
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::DeleteJobResponse> r = h->client(0).FinishJob("ft", 0, false);
    ASSERT_OK(r.status());
    EXPECT_EQ(r->ranks_finished(), 1);
    EXPECT_FALSE(r->deleted());
    EXPECT_FALSE(r->kept());
  }
  // The job goes on: another round updates, and its state reads back.
  ASSERT_OK(h->GoodRound(1e-2f));
  ASSERT_OK(h->client(1).GetState("ft", "w").status());
  EXPECT_EQ(h->client(1).FinishJob("ft", 2, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::DeleteJobResponse> last = h->client(1).FinishJob("ft", 1, false);
  ASSERT_OK(last.status());
  EXPECT_EQ(last->ranks_finished(), 2);
  EXPECT_TRUE(last->deleted());
  EXPECT_EQ(JobState("ft"), absl::StatusCode::kNotFound);
  const std::string log = ReadFile(audit());
  EXPECT_TRUE(absl::StrContains(log, "event=delete job='ft'")) << log;
  EXPECT_TRUE(absl::StrContains(log, "detail='every rank finished'")) << log;
  // The id is free again: a second run gets it.
  h.reset();
  std::unique_ptr<Harness> again = OwnersJob("ft");
  EXPECT_EQ(JobState("ft"), absl::StatusCode::kOk);
}

TEST_F(JobEndTest, AKeptJobIsCheckpointedAndASecondRunIsToldWhatHoldsTheId) {
  ASSERT_OK(StartDaemon());
  std::unique_ptr<Harness> h = OwnersJob("kept");
  ASSERT_OK(h->client(0).FinishJob("kept", 0, false).status());
  absl::StatusOr<v1::DeleteJobResponse> r = h->client(1).FinishJob("kept", 1, /*keep=*/true);
  ASSERT_OK(r.status());
  EXPECT_TRUE(r->kept());
  EXPECT_FALSE(r->deleted());
  EXPECT_EQ(JobState("kept"), absl::StatusCode::kOk);
  EXPECT_EQ(Checkpoints("kept").size(), 1u);
  EXPECT_TRUE(absl::StrContains(ReadFile(audit()), "event=keep job='kept'"));

  // A second run with the job's token: the cause and what to do.
  v1::JobSpec spec = h->spec();
  std::unique_ptr<Client> owner = As(kOwner);
  absl::Status taken = owner->CreateJob(spec).status();
  EXPECT_EQ(taken.code(), absl::StatusCode::kAlreadyExists) << taken;
  for (const char* want : {"job 'kept' already exists on this daemon: held since",
                           "2 of 2 ranks attached, 2 finished", "zfctl delete kept",
                           "./zf ctl delete kept", "pick another job name", "keep_job"}) {
    EXPECT_TRUE(absl::StrContains(taken.message(), want)) << want << " in " << taken;
  }
  // Another token learns only that the id is taken (docs/security.md), and
  // what to do.
  for (const std::string& token : {std::string(kOther), std::string()}) {
    std::unique_ptr<Client> other = As(token);
    absl::Status s = other->CreateJob(spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "job id 'kept' is taken on this daemon")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "pick another job name")) << s;
    for (const char* hidden : {"held since", "attached,", "rounds updated"}) {
      EXPECT_FALSE(absl::StrContains(s.message(), hidden)) << hidden << " in " << s;
    }
  }
  // Deleted by its owner, the name is free: the second run succeeds.
  ASSERT_OK(owner->DeleteJob("kept"));
  EXPECT_TRUE(Checkpoints("kept").empty());
  ASSERT_OK(owner->CreateJob(spec).status());
}

TEST_F(JobEndTest, AnIdleJobIsCheckpointedAndDeletedAndOneWithAttachedRanksIsNot) {
  ASSERT_OK(StartDaemon({"--job_idle_ttl_s=0.5"}));
  std::unique_ptr<Harness> busy = OwnersJob("busy");
  // A job nobody attaches to (a run that died after CreateJob).
  std::unique_ptr<Client> owner = As(kOwner);
  v1::JobSpec idle = busy->spec();
  idle.set_job_id("idle");
  ASSERT_OK(owner->CreateJob(idle).status());
  absl::StatusCode idle_state = absl::StatusCode::kOk;
  for (int i = 0; i < 300 && idle_state == absl::StatusCode::kOk; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    idle_state = JobState("idle");
  }
  EXPECT_EQ(idle_state, absl::StatusCode::kNotFound);
  const std::string log = ReadFile(audit());
  EXPECT_TRUE(absl::StrContains(log, "event=expire job='idle' peer='zenflowd'")) << log;
  EXPECT_TRUE(absl::StrContains(log, "no rank attached for")) << log;
  EXPECT_TRUE(absl::StrContains(log, "checkpointed")) << log;
  EXPECT_EQ(Checkpoints("idle").size(), 1u);  // it comes back at the next start
  // Its ranks attached all along, the other job lives (several TTLs passed).
  EXPECT_EQ(JobState("busy"), absl::StatusCode::kOk);
  ASSERT_OK(busy->GoodRound(1e-2f));
  // Once its ranks are gone, it goes too.
  busy.reset();
  absl::StatusCode busy_state = absl::StatusCode::kOk;
  for (int i = 0; i < 300 && busy_state == absl::StatusCode::kOk; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    busy_state = JobState("busy");
  }
  EXPECT_EQ(busy_state, absl::StatusCode::kNotFound);
}

// Riding-through ranks forget what the daemon has durably: a daemon
// without --state_dir keeps nothing over a restart, so every updated round
// counts (no replay log for it); one with --state_dir counts what its
// checkpoints hold (none yet here).
TEST_F(JobEndTest, ADaemonWithoutStateDirMarksEveryUpdatedRoundDurable) {
  for (bool state_dir : {false, true}) {
    ASSERT_OK(StartDaemon({}, state_dir));
    std::unique_ptr<Harness> h = OwnersJob("durable");
    ASSERT_OK(h->GoodRound(1e-2f));
    absl::StatusOr<v1::GetStatsResponse> st = h->client(0).GetStats("durable");
    ASSERT_OK(st.status());
    ASSERT_EQ(st->jobs_size(), 1);
    EXPECT_EQ(st->jobs(0).rounds_updated(), 2);
    EXPECT_EQ(st->jobs(0).durable_rounds(), state_dir ? 0 : 2) << "state_dir " << state_dir;
    h.reset();
    ASSERT_OK(daemon_.Stop());
  }
}

TEST_F(JobEndTest, TheIdleTtlFlagIsChecked) {
  EXPECT_FALSE(StartDaemon({"--job_idle_ttl_s=-1"}).ok());
}

}  // namespace
}  // namespace zenflow::testing
