// The fixture of the bad-input tests (tests/bad_input_test.cc and
// tests/bad_input_transport_test.cc): one real zenflowd per test binary with
// small limits, a fresh job past one good round per test, and the helpers that
// read a rejection back. Each rejection has a specific status code and an
// actionable message, is counted, and leaves the job untouched.
#ifndef ZENFLOW_TESTS_BAD_INPUT_FIXTURE_H_
#define ZENFLOW_TESTS_BAD_INPUT_FIXTURE_H_

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


using absl::StatusCode;

// A stub of our own on a client's channel, for requests the client library
// would never send.
inline std::unique_ptr<v1::ZenFlow::Stub> StubOf(Client& c) { return v1::ZenFlow::NewStub(c.channel()); }

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

  static inline DaemonProcess* daemon_ = nullptr;
};

// Polls `done` every 10 ms for up to 30 s (a bound on a failure, not a
// timing); its last answer.
inline bool WaitUntil(const std::function<bool()>& done) {
  for (int i = 0; i < 3000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

inline void ExpectStatus(const absl::Status& s, StatusCode code, const std::string& fragment) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), fragment)) << "message: " << s.message()
                                                        << "\nexpected to contain: " << fragment;
}

// A job of fp32 tensors of these shapes, for the memory and transport limits.
inline v1::JobSpec SquareJob(const std::string& id, std::vector<std::vector<int64_t>> shapes,
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

}  // namespace zenflow::testing

#endif  // ZENFLOW_TESTS_BAD_INPUT_FIXTURE_H_
