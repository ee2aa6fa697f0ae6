// Test support: drives one job on a real zenflowd through the client library,
// one Client per rank, and checks every returned column against the
// independent RefOptimizer.
//
//   Harness h(daemon.target(), JobOptions{.job_id = "j", .world = 2});
//   ASSERT_OK(h.Setup());
//   ASSERT_OK(h.GoodRound(1e-2f));   // push S steps from every rank, close, check
#ifndef ZENFLOW_TESTS_TESTING_HARNESS_H_
#define ZENFLOW_TESTS_TESTING_HARNESS_H_

#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/client.h"
#include "common/codec.h"
#include "tests/testing/reference.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow::testing {

struct TensorDef {
  std::string name;
  int64_t rows = 1, cols = 1;
  bool one_d = false;
};

struct JobOptions {
  std::string job_id = "job";
  int world = 2;
  int interval = 4;  // S
  DType wire = DType::kF32;
  std::vector<TensorDef> tensors = {{"w", 8, 16, false}, {"b", 1, 16, true}};
  float topk = 0.25f;
  bool skip_nonfinite = false;
  float max_grad_norm = 0;
  v1::DeltaKind delta_kind = v1::DELTA_VALUES;
  // ZenFlowConfig.scale_round_step and local_step (docs/design.md rules 12
  // and 13); unset: the daemon's default. The harness checks the job as
  // CreateJob normalized it.
  std::optional<bool> scale_round_step;
  std::optional<bool> local_step;
  bool handoff_per_tensor = false;  // one HandOff call per tensor
  // The ranks' ClientOptions::max_shard_bytes: small, so that a step is
  // several shards even for small tensors.
  int64_t max_shard_bytes = 1024;
  // Set: every rank uses the UCX transport with these options (else the
  // test transport, TestTransport()).
  std::optional<UcxOptions> ucx;
  // The job's token, every rank's (see TestClientOptions).
  std::string token = "zenflow-test-token-0123456789";
  // TLS for every rank's client (ClientOptions.tls_ca, tls_cert, tls_key);
  // empty tls_ca: plaintext.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
};

// The data transport the tests use: ZF_TEST_TRANSPORT=ucx selects UCX (the
// *_ucx_test targets set it); anything else, gRPC.
Transport TestTransport();
// Client options for the test daemon with the test transport.
// Options for a client of `target`: the transport ZF_TEST_TRANSPORT names
// and the token kTestToken (every test rank of every job shares it, so a
// job's ranks reach it; tests of isolation make clients of their own).
inline constexpr char kTestToken[] = "zenflow-test-token-0123456789";
ClientOptions TestClientOptions(const std::string& target);
// Adds kTestToken to a raw call's metadata.
void AddTestToken(grpc::ClientContext* ctx);

// Deterministic gradient of element (r, c) of tensor ti at (rank, step).
float TestGrad(int rank, int64_t step, int ti, int64_t r, int64_t c);
// Deterministic initial parameter value.
float TestInit(int ti, int64_t r, int64_t c);

// Not thread-safe.
class Harness {
 public:
  Harness(std::string target, JobOptions opts);

  // Connects one client per rank, creates the job, uploads the initial
  // values and joins every rank.
  absl::Status Setup();
  // Creates the job only (for tests of the steps that follow).
  absl::Status Connect();
  absl::Status CreateJob();
  absl::Status Upload();
  absl::Status JoinAll();

  // Pushes the gradients of every remote column for `step` from `rank`
  // (GoodRound then does not push that step of that rank again).
  absl::Status PushStep(int rank, int64_t step);
  // The daemon skipped a round (non-finite gradients): the reference skips it.
  void SkipRound() { ++next_round_; }
  // The full row-major gradient of every tensor at (rank, step).
  std::vector<std::vector<float>> FullGrad(int rank, int64_t step) const;
  // A whole good round: every rank pushes S steps and closes; then every
  // rank's update must match the reference, bit-identical across ranks.
  absl::Status GoodRound(float lr);
  // The learning rate of the daemon's step for a round of S steps closed
  // with `lr` (docs/design.md rule 12: lr * S with scale_round_step).
  float RoundLr(float lr) const;
  // Waits for `round` on every rank and checks it against the reference
  // (which Round() on the reference must already reflect).
  absl::Status CheckRound(int64_t round);

  // Selection at the start of the next round: submits importance from every
  // rank (concurrently), checks every rank got the same selection, hands
  // off exact state and records the new remote sets.
  absl::Status Reselect(const std::vector<std::vector<float>>& importance_per_tensor);

  Client& client(int rank) { return *clients_[rank]; }
  int64_t next_round() const { return next_round_; }
  int64_t version() const { return version_; }
  const JobOptions& options() const { return opts_; }
  RefOptimizer& ref() { return *ref_; }
  const std::vector<std::vector<int32_t>>& remote() const { return remote_; }
  v1::JobSpec spec() const;
  // The spec as the daemon normalized it (after CreateJob).
  const v1::JobSpec& created() const { return created_; }
  // Rank 0's deltas of the last round CheckRound checked.
  const std::vector<v1::ParameterDelta>& last_deltas() const { return last_deltas_; }

 private:
  // Checks a delta's factored second moment (docs/design.md rule 13)
  // against the reference's v and counts of the tensor's remote columns.
  absl::Status CheckFactoredMoment(int64_t round, size_t ti, const v1::ParameterDelta& d) const;

  std::string target_;
  JobOptions opts_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::unique_ptr<RefOptimizer> ref_;
  std::vector<std::vector<int32_t>> remote_;     // per tensor, ascending
  std::vector<std::vector<int32_t>> important_;  // per tensor, ascending
  std::set<std::pair<int, int64_t>> pushed_;  // (rank, step) pushed by PushStep
  int64_t next_round_ = 0;
  int64_t version_ = 0;
  v1::JobSpec created_;
  std::vector<v1::ParameterDelta> last_deltas_;
};

}  // namespace zenflow::testing

#endif  // ZENFLOW_TESTS_TESTING_HARNESS_H_
