// scale_bench: how zenflowd's accumulation scales with the number of ranks
// feeding it: 1, 2, 4, 8 and 16 ranks (EMULATED devices) as one job, and the
// same ranks split over 2 jobs, each with per-rank sums (JobSpec
// rank_ordered_sums = true: "rank_ordered") and with one shared sum per round
// ("shared"), through the real worker engine and a real zenflowd.
//
// Every rank is a thread of this process with its own EMULATED GPU
// (gpu_worker/kernels/emulated_backend.h, --device_profile: modelled kernel
// and copy times, no host arithmetic), its own model buffers, Client and
// ZenFlowOptimizer (zenflow mode, k = --topk, S = --interval, bf16 wire,
// adaptive apply delay). Rank 0 of a job creates it and uploads the initial
// values; the others join. Every job has --params parameters (--tensors 2-D
// tensors [4096, params/4096/tensors] plus a 4096-value 1-D tensor), so every
// rank pushes the same bytes per step whatever the configuration, and the
// offered load grows with the ranks. Gradients are SYNTHETIC (written once);
// device time per step is --device_ms of sleep (forward and backward) plus
// the modelled time of Step()'s kernels and copies.
//
// The important columns' gradients (k of them) are reduced across a job's
// ranks before their AdamW (docs/design.md rule 4). On GPUs a device collective
// (NCCL) does that without touching the host or the daemon, so by default
// (--important_reduce=device) the ranks meet at an in-process rendezvous that
// stands for it (gpu_worker/engine/local_reducer.h, no arithmetic: emulated memory
// holds no numerics); --important_reduce=daemon sends them through zenflowd's
// AllReduce call instead (gRPC, host memory: 8 B per important value per
// rank and step, up and down), the engine's default without a collective.
//
// Why --device_ms defaults to 1: a rank's shards are 0.9 x params x 2 bytes
// per step (k = 0.1, bf16), 15 MB at the default 2^23 parameters, and their
// modelled device-to-host copy at 50 GB/s (h100-sxm) takes 0.3 ms. With 1 ms
// of forward and backward one rank's device could offer ~11.6 GB/s, two of
// them more than the host's bf16 accumulate rate (adam_bench's
// accumulate_bytes_per_s, ~18 GB/s here) and far more than the daemon takes
// in here (~1 GB/s): the daemon (and the host's cores it shares with the
// ranks' send paths), not the emulated devices, sets the pace. The stall
// and send-blocked figures show how.
//
// Why --params defaults to 2^23 per job: 8 ranks then hold 8 x 8 B/param of
// model and gradient (emulated device memory is host memory) and the daemon
// 20 B/param per job plus 8 B/param per extra rank with rank_ordered sums,
// about 1.5 GB at most; the whole matrix (14 runs of 128 steps) takes a few
// minutes here, with 14 rounds per job in each measured window.
//
// Per configuration (the measured window is the same for every rank: all
// ranks meet at a barrier before step 2S, after the warm-up stall_bench
// leaves out too, and after the last step; the last rank to arrive takes the
// snapshots):
//   accumulate_bytes_per_s  shard payload bytes the daemon accepted in the
//                           window (GetStats JobStats.shard_bytes_received,
//                           summed over the jobs) / the window's wall seconds;
//   round_update_p50_ms/p99_ms  quantiles of the daemon's round update times
//                           in the window (JobStats.round_update_seconds, its
//                           bucket counts in the window, jobs merged),
//                           INTERPOLATED linearly inside the bucket that holds
//                           the quantile (as Prometheus' histogram_quantile;
//                           the buckets are 1, 5, 10, 25, 50, 100, 250 ms ...,
//                           so read them as bucket-resolution figures);
//                           round_update_mean_ms is exact (sum / count);
//   stall_fraction          sum over ranks of StepStats.stall_seconds / sum
//                           of their step times (device sleep + Step(), as
//                           stall_bench's mean step) over the measured steps;
//   daemon_cpu_s_per_round  the daemon's utime + stime (/proc/<--daemon_pid>/
//                           stat) in the window / rounds updated in the window
//                           (JobStats.rounds_updated, summed over the jobs);
//   ingest_bytes_per_cpu_s  shard bytes in the window / the daemon's CPU in the
//                           window outside its zf-update threads (the round
//                           updates'; /proc/PID/task/TID at both edges);
//   ingest_fraction         that / ingest_ceiling_bytes_per_cpu_s, which is
//                           1/(1/r + 1/a) with r the raw UCP loop's bytes per
//                           receiving-thread CPU second and a the accumulate
//                           kernel's on one thread, both measured before
//                           and after the configurations (MeasureCeilings),
//                           each the better of the two;
//   round_update_fraction   the update's kernels (AdamW + delta encode of the
//                           job's daemon-hosted values on the daemon's
//                           update_threads, the faster of the two
//                           measurements) / the mean round update in the
//                           window;
//   round_update_cpu_fraction  the same kernels' CPU seconds per round / the
//                           daemon's zf-update threads' CPU seconds per round
//                           (the update's extra work, whatever the cores).
//   host_busy_fraction      the whole host's busy CPU in the window
//                           (/proc/stat) / (window x online CPUs): how
//                           full the cores were while the fractions above
//                           were measured.
// scale_run.cc runs one configuration; scale_report.cc computes the
// fractions and goals and writes the JSON.
//
//   scale_bench --target=127.0.0.1:50051 --daemon_pid=PID [--ranks=1,2,4,8,16]
//               [--params=8388608] [--steps=64] [--out=bench-results/scale.json]
// tools/bench_scale.sh builds it, measures the ceiling with adam_bench,
// starts zenflowd and runs it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/codec.h"
#include "common/dtype_proto.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "common/ucx.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/kernels/emulated_backend.h"
#include "tools/bench/bench_main.h"
#include "tools/bench/cpu_time.h"
#include "tools/bench/kernel_rates.h"
#include "tools/bench/raw_ucp.h"
#include "tools/bench/scale_report.h"
#include "tools/bench/scale_run.h"

ABSL_FLAG(std::string, target, "",
          "zenflowd address host:port (required), or several, comma-separated: the matrix runs "
          "on the first, the --daemons series spreads its job over the first N");
ABSL_FLAG(std::string, daemon_pid, "",
          "the --target daemons' process ids, comma-separated in the same order, for their CPU "
          "time (/proc/PID/stat); empty: not measured");
ABSL_FLAG(std::string, transport, "ucx",
          "data stream transport: ucx (shared memory with a local zenflowd) or grpc");
ABSL_FLAG(std::string, ucx_tls, "sm,self",
          "with --transport=ucx: UCX transports (UCX_TLS syntax); they must overlap the "
          "daemon's --ucx_tls");
ABSL_FLAG(std::string, device_profile, "h100-sxm",
          "every rank's EMULATED device (h100-sxm, h100-pcie, a100-sxm-80gb)");
ABSL_FLAG(int, device_ms, 1,
          "emulated forward + backward time per step, ms (small: the daemon sets the pace)");
ABSL_FLAG(int64_t, params, int64_t{1} << 23,
          "parameters per job in the 2-D tensors (plus a 4096-value 1-D tensor)");
ABSL_FLAG(int, tensors, 4, "2-D tensors the parameters are split over");
ABSL_FLAG(int, steps, 128, "steps per configuration, warm-up (2 x S) included");
ABSL_FLAG(double, topk, 0.1, "k, fraction of columns updated on the worker");
ABSL_FLAG(int, interval, 4, "update_interval S");
ABSL_FLAG(double, lr, 1e-3, "learning rate (constant)");
ABSL_FLAG(std::string, ranks, "1,2,4,8,16", "rank counts to run");
ABSL_FLAG(std::string, jobs, "1,2",
          "how many jobs the ranks are split over (a count that does not divide the ranks is "
          "skipped)");
ABSL_FLAG(std::string, sums, "rank_ordered,shared",
          "accumulation: rank_ordered (JobSpec rank_ordered_sums = true, per-rank buffers) "
          "and/or shared (one buffer per round)");
ABSL_FLAG(double, accumulate_ceiling_bytes_per_s, 0,
          "the host's bf16 accumulate rate to quote as the ceiling (adam_bench's "
          "accumulate_bytes_per_s); 0: none");
ABSL_FLAG(std::string, accumulate_ceiling_source, "",
          "where --accumulate_ceiling_bytes_per_s comes from, in words");
ABSL_FLAG(std::string, important_reduce, "device",
          "how a job's ranks reduce their important columns' gradients: device (an in-process "
          "rendezvous standing for a device collective such as NCCL, whose bytes never touch "
          "the host: gpu_worker/engine/local_reducer.h without arithmetic) or daemon (zenflowd's "
          "AllReduce call over gRPC, through host memory)");
ABSL_FLAG(std::string, daemons, "",
          "daemon counts of the several-daemons series (e.g. 1,2,4; each at most the targets "
          "listed): one job of --daemons_ranks ranks, rank-ordered sums, spread over that many "
          "daemons; empty: no series");
ABSL_FLAG(int, daemons_ranks, 2, "ranks of the several-daemons series' job");
ABSL_FLAG(std::string, job_prefix, "scale-bench", "job ids are <prefix>-<config>-<job>-<pid>");
ABSL_FLAG(std::string, out, "bench-results/scale.json", "JSON result file");
ABSL_FLAG(double, ceiling_seconds, 1.0,
          "each of the 3 raw UCP receive measurements runs at least this long (and 256 MiB)");
ABSL_FLAG(std::string, placement, "",
          "which CPUs the daemons and this bench were given, in words (tools/bench_scale.sh "
          "sets it from ZF_DAEMON_CPUS / ZF_BENCH_CPUS); empty: the host's scheduler placed "
          "both on every CPU");
ABSL_FLAG(int, update_threads, 0,
          "threads to time the round update's kernels on; 0: the first daemon's own "
          "(GetStats update_threads, its --update_threads)");

namespace zenflow {
namespace {

// ceil(k * cols), a product within 1e-6 of an integer counting as that
// integer, clamped to [0, cols]: common/selection.h TopKCount's rule (that
// library is not visible to tools/bench). The run cross-checks the count
// against the shard bytes the ranks sent (values_from_shards).
int64_t ImportantColumns(float k, int64_t cols) {
  const double x = static_cast<double>(k) * static_cast<double>(cols);
  const double r = std::round(x);
  const int64_t n = std::fabs(x - r) < 1e-6 ? static_cast<int64_t>(r) : static_cast<int64_t>(std::ceil(x));
  return std::clamp<int64_t>(n, 0, cols);
}

// The ceilings of this run, measured before its configurations: the raw UCP
// receive rate per receiving-thread CPU second, the accumulate kernel on one
// thread, and the round update's kernels for the job's daemon-hosted values.
absl::StatusOr<ScaleCeilings> MeasureCeilings() {
  ScaleCeilings c;
  // The daemon-hosted values of a job: every 2-D tensor's columns but its
  // important ones (the 1-D tensor stays whole on the ranks).
  const v1::JobSpec spec = WantedJobSpec("ceiling", 1, false);
  int64_t values = 0;
  for (const v1::TensorSpec& t : spec.tensors()) {
    // 1-D and local tensors are whole on the ranks (common/geometry.h
    // AlwaysImportant); a 2-D [rows, cols] tensor keeps its important
    // columns there.
    if (t.shape_size() != 2 || t.local()) continue;
    values += t.shape(0) * (t.shape(1) - ImportantColumns(spec.zenflow().topk_ratio(), t.shape(1)));
  }
  ZF_ASSIGN_OR_RETURN(DType wire, FromProto(spec.wire_dtype(), "wire dtype"));
  // A tensor's dtype left unset is fp32 (the daemon's normalization).
  const v1::DType tensor_dtype = spec.tensors(0).dtype() == v1::DTYPE_UNSPECIFIED
                                     ? v1::DTYPE_FP32
                                     : spec.tensors(0).dtype();
  ZF_ASSIGN_OR_RETURN(DType value_dtype, FromProto(tensor_dtype, "tensor dtype"));
  c.accumulate_bytes_per_cpu_s_1thread = AccumulateBytesPerCpuSecond(wire, values);
  // Beside a copy of the wire bytes of a round's step (the receive copy's
  // traffic; at least 4 MiB).
  c.accumulate_bytes_per_cpu_s_1thread_beside_copy = AccumulateBytesPerCpuSecondBesideCopy(
      wire, values, values * static_cast<int64_t>(DTypeSize(wire)));

  // The deltas carry bf16 m and v in one-step rounds of a job with the
  // predicted step (on unless asked off, for values deltas), as the daemon
  // decides (server/job_rounds.cc WithMoments, common/geometry.h
  // RoundsMayCarryPredictedState: values deltas, an apply delay other than
  // sync, rounds of one step); the factored moment only with local_step,
  // which this job leaves off.
  const v1::ZenFlowConfig& z = spec.zenflow();
  const bool values_kind = spec.delta_kind() != v1::DELTA_ARITHMETIC;
  const bool predicted = z.has_predicted_step() ? z.predicted_step() : values_kind;
  const bool moments = predicted && values_kind &&
                       z.apply_delay().kind_case() != v1::ApplyDelay::kSync &&
                       z.update_interval() == 1 && !z.auto_update_interval();
  c.round_job = RoundKernelJob{values, value_dtype, moments};
  c.update_threads = absl::GetFlag(FLAGS_update_threads);
  if (c.update_threads <= 0) {
    ClientOptions co;
    co.target = Targets()[0];
    co.token = NewToken();
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(co));
    ZF_ASSIGN_OR_RETURN(v1::GetStatsResponse st, client->GetStats());
    c.update_threads = std::max(1, st.update_threads());
  }
  {
    ThreadPool pool(c.update_threads);
    c.round_update_kernel_s =
        RoundUpdateKernelSeconds(c.round_job, &pool, 7, &c.round_update_kernel_cpu_s);
  }

  UcxOptions ucx;
  ucx.tls = absl::GetFlag(FLAGS_ucx_tls);
  ucx.without_cma = true;  // as zenflowd's data plane
  c.raw_ucx_tls = UcxTransports(ucx);
  const ClientOptions client;
  c.raw_message_bytes = client.max_shard_bytes;
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<RawUcp> raw, RawUcp::Create(ucx));
  const std::string payload(static_cast<size_t>(c.raw_message_bytes), '\x5a');
  const double min_s = absl::GetFlag(FLAGS_ceiling_seconds);
  const auto enough = [min_s](RawUcp::Clock::time_point t0, int64_t sent) {
    return sent >= (int64_t{256} << 20) &&
           std::chrono::duration<double>(RawUcp::Clock::now() - t0).count() >= min_s;
  };
  ZF_RETURN_IF_ERROR(raw->Run(payload, 32, client.max_inflight_bytes, enough).status());
  // The best of 7: the receiving thread's CPU per byte rises with anything
  // that slows the sender (its polling waits count), and on a shared host
  // one sample in three came out at half the others; a ceiling measured
  // low flatters every fraction.
  std::vector<double> rates;
  for (int rep = 0; rep < 7; ++rep) {
    ZF_ASSIGN_OR_RETURN(RawUcpSample s, raw->Run(payload, -1, client.max_inflight_bytes, enough));
    if (s.bytes_per_receiver_cpu_s() > 0) rates.push_back(s.bytes_per_receiver_cpu_s());
  }
  if (rates.empty()) return absl::InternalError("raw UCP: the receiver's CPU clock was not read");
  c.raw_receive_bytes_per_cpu_s = *std::max_element(rates.begin(), rates.end());
  return c;
}

absl::StatusOr<std::vector<int>> ParseInts(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(piece, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", piece, "' is not a positive integer"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_target).empty()) {
    return absl::InvalidArgumentError("--target is required");
  }
  const int ntensors = absl::GetFlag(FLAGS_tensors);
  const int64_t cols = absl::GetFlag(FLAGS_params) / kScaleRows / std::max(1, ntensors);
  if (ntensors < 1 || cols < 1 || absl::GetFlag(FLAGS_device_ms) < 0 ||
      absl::GetFlag(FLAGS_steps) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensors and --steps must be >= 1, --device_ms >= 0 and --params at least ",
        kScaleRows * std::max(1, ntensors)));
  }
  ZF_ASSIGN_OR_RETURN(std::vector<int> rank_counts, ParseInts("ranks", absl::GetFlag(FLAGS_ranks)));
  ZF_ASSIGN_OR_RETURN(std::vector<int> job_counts, ParseInts("jobs", absl::GetFlag(FLAGS_jobs)));
  std::vector<bool> sums;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sums), ',', absl::SkipEmpty())) {
    if (s != "rank_ordered" && s != "shared") {
      return absl::InvalidArgumentError(
          absl::StrCat("--sums: '", s, "' is neither rank_ordered nor shared"));
    }
    sums.push_back(s == "rank_ordered");
  }
  if (sums.empty()) return absl::InvalidArgumentError("--sums is empty");
  ZF_ASSIGN_OR_RETURN(worker::DeviceProfile profile,
                      worker::FindDeviceProfile(absl::GetFlag(FLAGS_device_profile)));
  ZF_RETURN_IF_ERROR(ParseTransport(absl::GetFlag(FLAGS_transport)).status());
  const std::string reduce = absl::GetFlag(FLAGS_important_reduce);
  if (reduce != "device" && reduce != "daemon") {
    return absl::InvalidArgumentError(
        absl::StrCat("--important_reduce must be device or daemon, not '", reduce, "'"));
  }
  for (int pid : DaemonPids()) ZF_RETURN_IF_ERROR(ProcessCpuSeconds(pid).status());
  std::vector<int> daemon_counts;
  if (!absl::GetFlag(FLAGS_daemons).empty()) {
    ZF_ASSIGN_OR_RETURN(daemon_counts, ParseInts("daemons", absl::GetFlag(FLAGS_daemons)));
  }
  for (int d : daemon_counts) {
    if (d > static_cast<int>(Targets().size())) {
      return absl::InvalidArgumentError(absl::StrCat("--daemons: ", d, " daemons but --target lists ",
                                                     Targets().size()));
    }
  }
  if (absl::GetFlag(FLAGS_daemons_ranks) < 1) {
    return absl::InvalidArgumentError("--daemons_ranks must be >= 1");
  }
  const int64_t params = ntensors * kScaleRows * cols + kScaleVector;
  const double ceiling = absl::GetFlag(FLAGS_accumulate_ceiling_bytes_per_s);
  // What one rank's emulated device could hand the daemon per second: its
  // bf16 shards of the columns it does not update itself, after device_ms
  // and their device-to-host copy.
  const double shard_bytes = 2.0 * (1.0 - absl::GetFlag(FLAGS_topk)) * static_cast<double>(params);
  const double offered =
      shard_bytes / (1e-3 * absl::GetFlag(FLAGS_device_ms) +
                     worker::DeviceToHostCostSeconds(profile, shard_bytes));

  std::fprintf(stderr,
               "scale_bench: %lld params per job (%d x [%lld, %lld] + [%lld]), EMULATED devices "
               "%s, %d ms forward+backward per step, %s, daemon %s\n",
               static_cast<long long>(params), ntensors, static_cast<long long>(kScaleRows),
               static_cast<long long>(cols), static_cast<long long>(kScaleVector),
               profile.name.c_str(), absl::GetFlag(FLAGS_device_ms),
               absl::GetFlag(FLAGS_transport).c_str(), absl::GetFlag(FLAGS_target).c_str());
  const double t_start = Now();
  std::fprintf(stderr, "scale_bench: ceilings (raw UCP receive, accumulate, round update kernels) ...\n");
  ZF_ASSIGN_OR_RETURN(ScaleCeilings ceilings, MeasureCeilings());
  std::fprintf(stderr,
               "scale_bench:   raw UCP receive %.2f GB per receiver CPU s, accumulate %.2f GB per "
               "CPU s (1 thread): ingest ceiling %.2f GB per CPU s; round update kernels %.2f ms\n",
               ceilings.raw_receive_bytes_per_cpu_s / 1e9,
               ceilings.accumulate_bytes_per_cpu_s_1thread / 1e9,
               ceilings.ingest_ceiling_bytes_per_cpu_s() / 1e9, 1e3 * ceilings.round_update_kernel_s);
  const std::vector<float> param_pattern = RandomPattern(1, 0.02f);
  const std::vector<float> grad_pattern = RandomPattern(7, 1e-3f);
  std::vector<ConfigResult> results;
  for (int n : rank_counts) {
    for (int jobs : job_counts) {
      if (n < jobs || n % jobs != 0) continue;
      for (bool ro : sums) {
        Config cfg{n, jobs, ro};
        std::fprintf(stderr, "scale_bench: %d rank(s) as %d job(s), %s sums ...\n", n, jobs,
                     cfg.sums().c_str());
        ZF_ASSIGN_OR_RETURN(ConfigResult r, RunConfig(cfg, param_pattern, grad_pattern));
        std::fprintf(stderr,
                     "scale_bench:   %.2f GB/s accumulated, %lld rounds, round update p50 %.1f "
                     "p99 %.1f ms (mean %.1f), stall %.3f, daemon %.4f CPU s/round, step %.1f "
                     "ms, ingest %.2f GB per CPU s\n",
                     r.accumulate_bytes_per_s / 1e9, static_cast<long long>(r.rounds), r.p50_ms,
                     r.p99_ms, r.mean_update_ms, r.stall_fraction, r.daemon_cpu_s_per_round,
                     r.mean_step_ms, r.ingest_bytes_per_cpu_s / 1e9);
        results.push_back(r);
      }
    }
  }
  // The several-daemons series: one job over 1, 2, 4 ... daemons.
  for (int d : daemon_counts) {
    Config cfg{absl::GetFlag(FLAGS_daemons_ranks), 1, true, d, /*daemons_series=*/true};
    std::fprintf(stderr, "scale_bench: %d rank(s) as 1 job over %d daemon(s) ...\n", cfg.ranks, d);
    ZF_ASSIGN_OR_RETURN(ConfigResult r, RunConfig(cfg, param_pattern, grad_pattern));
    std::fprintf(stderr,
                 "scale_bench:   %.2f GB/s accumulated, %lld rounds, round update mean %.1f ms, "
                 "stall %.3f, daemons %.4f CPU s/round, step %.1f ms\n",
                 r.accumulate_bytes_per_s / 1e9, static_cast<long long>(r.rounds),
                 r.mean_update_ms, r.stall_fraction, r.daemon_cpu_s_per_round, r.mean_step_ms);
    results.push_back(r);
  }
  // The ceilings again, after the configurations: each is the better of
  // the two measurements (a shared host can slow either one; a ceiling
  // measured low would flatter every fraction).
  std::fprintf(stderr, "scale_bench: ceilings again, after the configurations ...\n");
  ZF_ASSIGN_OR_RETURN(ScaleCeilings after, MeasureCeilings());
  ceilings.KeepBetter(after);
  ScaleReport rep;
  rep.device_profile = profile.name;
  rep.params_per_job = params;
  rep.device_offered_bytes_per_s_per_rank = offered;
  rep.accumulate_ceiling_bytes_per_s = ceiling;
  rep.ceilings = ceilings;
  rep.results = std::move(results);
  rep.runtime_s = Now() - t_start;
  return WriteScaleReport(rep);
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  return zenflow::RunBenchMain(
      argc, argv, "scale_bench",
      "aggregate accumulate bytes/s, ingest bytes per daemon CPU second and round update time "
      "against their kernels, stall and daemon CPU per round for 1..16 EMULATED ranks on one "
      "job and over 2 jobs, per-rank vs shared sums (see --target).",
      zenflow::Run);
}
