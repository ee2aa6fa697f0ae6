// Test support: runs one rank of a small deterministic training job through
// the real worker engine (CPU backend) against a real zenflowd, and the same
// job through the independent simulator.
#ifndef ZENFLOW_TESTS_TESTING_ENGINE_DRIVER_H_
#define ZENFLOW_TESTS_TESTING_ENGINE_DRIVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_worker/engine/zenflow_optimizer.h"
#include "gpu_worker/engine/local_reducer.h"
#include "tests/testing/zenflow_sim.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow::testing {

struct EngineJob {
  std::string target;
  std::string job_id = "engine";
  SimConfig cfg;
  int64_t steps = 16;
  bool adaptive = false;  // overrides cfg.delay with adaptive
  // Set: the ranks reduce their important gradients through it (threads of
  // this process) instead of the daemon's AllReduce.
  LocalReducer* reducer = nullptr;
  bool rank_ordered_sums = false;  // JobSpec.rank_ordered_sums (reruns bit-identical)
  EngineOptions engine;            // the engine's options (staging)
  int64_t split_tensor_params = 0;  // ClientOptions.split_tensor_params (several daemons)
};

// The model: tensors with fixed targets; initial values.
std::vector<SimTensor> EngineModel();
// Deterministic gradient of every tensor at (rank, step) for parameters w.
std::vector<std::vector<float>> EngineGrad(const std::vector<std::vector<float>>& w, int rank,
                                           int64_t step, int select_interval);
float EngineLr(int64_t step);
v1::JobSpec EngineSpec(const EngineJob& job);

// Runs rank `rank` to the end; returns its final parameters per tensor (as
// fp32; with cfg.param_dtype bf16 / fp16 the parameters are held, uploaded
// and updated in that dtype).
// `totals`, if not null, receives the engine's totals (bytes up and down);
// `intervals`, if not null, every step's StepStats.update_interval. With
// cfg.auto_interval the engine takes its round lengths from
// cfg.interval_chooser, as the simulator does.
absl::StatusOr<std::vector<std::vector<float>>> RunEngineRank(
    const EngineJob& job, int rank, OptimizerTotals* totals = nullptr,
    std::vector<int32_t>* intervals = nullptr);
// Runs every rank, each in its own thread with its own connection;
// `intervals`, if not null, receives each rank's per-step update_interval.
// `totals`, if not null, each rank's OptimizerTotals.
absl::StatusOr<std::vector<std::vector<std::vector<float>>>> RunEngineRanks(
    const EngineJob& job, std::vector<std::vector<int32_t>>* intervals = nullptr,
    std::vector<OptimizerTotals>* totals = nullptr);
// The simulator's final parameters for the same job; `round_steps`, if not
// null, receives the steps of each of its rounds; `local_steps` the steps
// that ended with a local step (rule 13).
std::vector<std::vector<float>> RunSim(const EngineJob& job,
                                       std::vector<int32_t>* round_steps = nullptr,
                                       int* local_steps = nullptr);

// Max |a-b| / (atol + rtol|b|) over all values of every tensor; <= 1 passes.
// `where` receives the worst element.
double Mismatch(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                double atol, double rtol, std::string* where);

}  // namespace zenflow::testing

#endif  // ZENFLOW_TESTS_TESTING_ENGINE_DRIVER_H_
