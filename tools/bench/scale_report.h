// scale_bench's results: the per-run figures against the ceilings measured
// before and after the configurations (docs/scale-benchmark.md, "Ingest and round update
// against their kernels"), the goals, and the JSON report and table.
//
//   ScaleReport rep{...};
//   ZF_RETURN_IF_ERROR(WriteScaleReport(&rep));  // fills the fractions, writes --out, prints
#ifndef ZENFLOW_TOOLS_BENCH_SCALE_REPORT_H_
#define ZENFLOW_TOOLS_BENCH_SCALE_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/bench/kernel_rates.h"
#include "tools/bench/scale_run.h"

namespace zenflow {

// Measured once per bench run, before the configurations (an idle daemon).
struct ScaleCeilings {
  // Bytes received per CPU second of the receiving worker's progress
  // thread in the raw UCP loop (tools/bench/raw_ucp.h), same UCX transports
  // as the daemon; and its message size and transports.
  double raw_receive_bytes_per_cpu_s = -1;
  int64_t raw_message_bytes = 0;
  std::string raw_ucx_tls;
  // DecodeAdd of the wire dtype into fp32 on one thread, wire bytes per CPU second.
  double accumulate_bytes_per_cpu_s_1thread = -1;
  // The same while another thread copies (AccumulateBytesPerCpuSecondBesideCopy):
  // what the accumulate gets where the receive copy runs beside it.
  double accumulate_bytes_per_cpu_s_1thread_beside_copy = -1;
  // 1 / (1/raw + 1/accumulate): receive, then accumulate, in series on one core.
  double ingest_ceiling_bytes_per_cpu_s() const;
  // The same with the accumulate's rate beside a copy.
  double ingest_ceiling_beside_copy_bytes_per_cpu_s() const;
  // Keeps, of this and `other` (a second measurement), the higher rates and
  // the shorter kernel times; a figure one of them lacks (-1) is the other's.
  void KeepBetter(const ScaleCeilings& other);
  // The round update's kernels (AdamW + delta encode) for the job's
  // daemon-hosted values on update_threads threads, median seconds.
  RoundKernelJob round_job;
  int update_threads = 0;
  double round_update_kernel_s = -1;
  double round_update_kernel_cpu_s = -1;  // CPU seconds of those kernels per round (all threads)
};

struct ScaleRunFractions {
  double ingest_fraction = -1;         // ingest_bytes_per_cpu_s / the ingest ceiling
  double ingest_fraction_beside_copy = -1;  // ... / ingest_ceiling_beside_copy_bytes_per_cpu_s
  double round_update_fraction = -1;   // kernel seconds / mean round update; one daemon only
  // The kernels' CPU seconds per round / the daemon's zf-update threads'
  // CPU seconds per round: the update's extra work apart from the cores it
  // did not get (one daemon only).
  double round_update_cpu_fraction = -1;
};

struct ScaleReport {
  std::string device_profile;
  int64_t params_per_job = 0;
  double device_offered_bytes_per_s_per_rank = 0;
  double accumulate_ceiling_bytes_per_s = 0;  // --accumulate_ceiling_bytes_per_s (adam_bench), 0: none
  ScaleCeilings ceilings;
  std::vector<ConfigResult> results;
  double runtime_s = 0;
};

// Per run of rep.results (same order).
std::vector<ScaleRunFractions> ComputeFractions(const ScaleReport& rep);

// Writes --out and prints the table. Reads scale_bench's flags.
absl::Status WriteScaleReport(const ScaleReport& rep);

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_BENCH_SCALE_REPORT_H_
