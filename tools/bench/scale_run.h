// One configuration of tools/bench/scale_bench.cc's matrix, run: its rank
// threads (EMULATED devices, each with its own Client and ZenFlowOptimizer)
// against the --target daemons, and the daemons' figures (GetStats, their
// CPU and their zf-update threads' CPU) at the measured window's edges.
// Reads scale_bench's flags.
//
//   ZF_ASSIGN_OR_RETURN(ConfigResult r, RunConfig(cfg, param_pattern, grad_pattern));
#ifndef ZENFLOW_TOOLS_BENCH_SCALE_RUN_H_
#define ZENFLOW_TOOLS_BENCH_SCALE_RUN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

inline constexpr int64_t kScaleRows = 4096;     // rows of the 2-D tensors
inline constexpr int64_t kScaleVector = 4096;   // the 1-D tensor
inline constexpr int64_t kPatternFloats = int64_t{1} << 20;

// One configuration of the matrix.
struct Config {
  int ranks = 1;
  int jobs = 1;
  bool rank_ordered = false;
  int daemons = 1;  // the job spread over the first `daemons` targets
  bool daemons_series = false;  // a run of the several-daemons series (its daemons = 1 baseline too)
  std::string sums() const { return rank_ordered ? "rank_ordered" : "shared"; }
  std::string label() const {
    return absl::StrCat("r", ranks, "-j", jobs, "-", sums(), daemons > 1 ? absl::StrCat("-d", daemons) : "");
  }
};

struct ConfigResult {
  Config cfg;
  int warmup_steps = 0;
  int measured_steps = 0;
  double window_s = 0;
  int64_t shard_bytes = 0;
  int64_t rounds = 0;
  double accumulate_bytes_per_s = 0;
  double p50_ms = -1, p99_ms = -1, mean_update_ms = -1;
  double stall_fraction = 0;
  double mean_step_ms = 0;
  double stall_ms_per_step = 0;
  double send_blocked_ms_per_step = 0;
  double daemon_cpu_s = -1;
  double daemon_cpu_s_per_round = -1;
  double bench_cpu_s = 0;
  double other_cpu_s = -1;  // the host's other processes
  // The host's busy CPU seconds in the window (/proc/stat: all processes)
  // / (window_s x its online CPUs); -1: not measured. Near 1 the run had no
  // core to spare, and wall-time figures count the cores a thread waited for.
  double host_busy_fraction = -1;
  double shard_bytes_per_rank_per_step = 0;
  // The job's shard bytes over the whole run (every step, warm-up
  // included), read after the last round: exact, unlike the window's.
  double run_shard_bytes_per_rank_per_step = 0;
  double up_bytes_per_rank_per_step = 0;
  double setup_s = 0;
  double finish_ms = 0;
  int64_t job_memory_bytes = 0;
  // The daemons' CPU in the window spent by their zf-update threads (round
  // updates) and outside them; -1: not measured.
  double update_cpu_s = -1;
  double outside_update_cpu_s = -1;
  // shard_bytes / outside_update_cpu_s; -1: not measured.
  double ingest_bytes_per_cpu_s = -1;
};

// The --target list and the --daemon_pid list (pids may be left out).
std::vector<std::string> Targets();
std::vector<int> DaemonPids();

// Wall seconds of a steady clock.
double Now();

// kPatternFloats values uniform in [-scale, scale).
std::vector<float> RandomPattern(uint64_t seed, float scale);

// The job spec the ranks ask for (before the daemon normalizes it).
v1::JobSpec WantedJobSpec(const std::string& job_id, int world_size, bool rank_ordered);

// Runs `cfg` once; returns after every rank thread ended. A rank that fails
// ends the process (the others would wait on the daemon).
absl::StatusOr<ConfigResult> RunConfig(const Config& cfg, const std::vector<float>& param_pattern,
                                       const std::vector<float>& grad_pattern);

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_BENCH_SCALE_RUN_H_
