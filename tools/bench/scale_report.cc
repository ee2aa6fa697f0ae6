#include "tools/bench/scale_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/json_writer.h"
#include "common/status_macros.h"

// scale_bench's flags (tools/bench/scale_bench.cc).
ABSL_DECLARE_FLAG(std::string, transport);
ABSL_DECLARE_FLAG(std::string, ucx_tls);
ABSL_DECLARE_FLAG(std::string, important_reduce);
ABSL_DECLARE_FLAG(int, device_ms);
ABSL_DECLARE_FLAG(int, tensors);
ABSL_DECLARE_FLAG(int, steps);
ABSL_DECLARE_FLAG(double, topk);
ABSL_DECLARE_FLAG(int, interval);
ABSL_DECLARE_FLAG(std::string, accumulate_ceiling_source);
ABSL_DECLARE_FLAG(int, daemons_ranks);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, placement);

namespace zenflow {

// The scale goals (docs/scale-benchmark.md).
constexpr double kIngestFractionMin = 0.75;
constexpr double kRoundUpdateFractionMin = 0.6;
constexpr double kIngestScalingMin = 0.95;

namespace {

// Receiving at r and accumulating at a bytes per CPU second, in series on
// one core; -1 when either is unmeasured.
double InSeries(double r, double a) {
  if (!(r > 0) || !(a > 0)) return -1;
  return 1.0 / (1.0 / r + 1.0 / a);
}

// The better of two measurements, either of which may be missing (-1).
double Higher(double a, double b) { return std::max(a, b); }
double Shorter(double a, double b) {
  if (!(a > 0)) return b;
  if (!(b > 0)) return a;
  return std::min(a, b);
}

}  // namespace

double ScaleCeilings::ingest_ceiling_bytes_per_cpu_s() const {
  return InSeries(raw_receive_bytes_per_cpu_s, accumulate_bytes_per_cpu_s_1thread);
}

double ScaleCeilings::ingest_ceiling_beside_copy_bytes_per_cpu_s() const {
  return InSeries(raw_receive_bytes_per_cpu_s, accumulate_bytes_per_cpu_s_1thread_beside_copy);
}

void ScaleCeilings::KeepBetter(const ScaleCeilings& other) {
  raw_receive_bytes_per_cpu_s =
      Higher(raw_receive_bytes_per_cpu_s, other.raw_receive_bytes_per_cpu_s);
  accumulate_bytes_per_cpu_s_1thread =
      Higher(accumulate_bytes_per_cpu_s_1thread, other.accumulate_bytes_per_cpu_s_1thread);
  accumulate_bytes_per_cpu_s_1thread_beside_copy =
      Higher(accumulate_bytes_per_cpu_s_1thread_beside_copy,
             other.accumulate_bytes_per_cpu_s_1thread_beside_copy);
  round_update_kernel_s = Shorter(round_update_kernel_s, other.round_update_kernel_s);
  round_update_kernel_cpu_s = Shorter(round_update_kernel_cpu_s, other.round_update_kernel_cpu_s);
}

std::vector<ScaleRunFractions> ComputeFractions(const ScaleReport& rep) {
  std::vector<ScaleRunFractions> out(rep.results.size());
  const double ceiling = rep.ceilings.ingest_ceiling_bytes_per_cpu_s();
  const double beside = rep.ceilings.ingest_ceiling_beside_copy_bytes_per_cpu_s();
  for (size_t i = 0; i < rep.results.size(); ++i) {
    const ConfigResult& r = rep.results[i];
    if (ceiling > 0 && r.ingest_bytes_per_cpu_s > 0) {
      out[i].ingest_fraction = r.ingest_bytes_per_cpu_s / ceiling;
    }
    if (beside > 0 && r.ingest_bytes_per_cpu_s > 0) {
      out[i].ingest_fraction_beside_copy = r.ingest_bytes_per_cpu_s / beside;
    }
    // The kernels are timed for a whole job's values on one daemon: a job
    // spread over several daemons updates a part on each.
    if (r.cfg.daemons == 1 && rep.ceilings.round_update_kernel_s > 0 && r.mean_update_ms > 0) {
      out[i].round_update_fraction = 1e3 * rep.ceilings.round_update_kernel_s / r.mean_update_ms;
    }
    if (r.cfg.daemons == 1 && rep.ceilings.round_update_kernel_cpu_s > 0 && r.update_cpu_s > 0 &&
        r.rounds > 0) {
      out[i].round_update_cpu_fraction =
          rep.ceilings.round_update_kernel_cpu_s / (r.update_cpu_s / static_cast<double>(r.rounds));
    }
  }
  return out;
}

namespace {

void OptionalDouble(JsonWriter* w, const char* key, double v) {
  w->Key(key);
  if (v < 0) {
    w->Null();
  } else {
    w->Double(v);
  }
}

void WriteRun(const ConfigResult& r, const ScaleRunFractions& f, double ceiling_s, JsonWriter* w) {
  w->BeginObject();
  w->Key("ranks").Int(r.cfg.ranks);
  w->Key("jobs").Int(r.cfg.jobs);
  w->Key("sums").String(r.cfg.sums());
  w->Key("daemons").Int(r.cfg.daemons);
  w->Key("series").String(r.cfg.daemons_series ? "daemons" : "matrix");
  w->Key("accumulate_bytes_per_s").Double(r.accumulate_bytes_per_s);
  OptionalDouble(w, "round_update_p50_ms", r.p50_ms);
  OptionalDouble(w, "round_update_p99_ms", r.p99_ms);
  w->Key("stall_fraction").Double(r.stall_fraction);
  OptionalDouble(w, "daemon_cpu_s_per_round", r.daemon_cpu_s_per_round);
  OptionalDouble(w, "ingest_bytes_per_cpu_s", r.ingest_bytes_per_cpu_s);
  OptionalDouble(w, "ingest_ceiling_bytes_per_cpu_s", ceiling_s);
  OptionalDouble(w, "ingest_fraction", f.ingest_fraction);
  OptionalDouble(w, "ingest_fraction_beside_copy", f.ingest_fraction_beside_copy);
  OptionalDouble(w, "round_update_fraction", f.round_update_fraction);
  OptionalDouble(w, "round_update_cpu_fraction", f.round_update_cpu_fraction);
  OptionalDouble(w, "daemon_update_cpu_s", r.update_cpu_s);
  OptionalDouble(w, "daemon_outside_update_cpu_s", r.outside_update_cpu_s);
  w->Key("rounds").Int(r.rounds);
  w->Key("ranks_per_job").Int(r.cfg.ranks / r.cfg.jobs);
  w->Key("round_update_mean_ms").Double(r.mean_update_ms);
  w->Key("measured_steps").Int(r.measured_steps);
  w->Key("warmup_steps").Int(r.warmup_steps);
  w->Key("window_s").Double(r.window_s);
  w->Key("shard_bytes").Int(r.shard_bytes);
  w->Key("shard_bytes_per_rank_per_step").Double(r.shard_bytes_per_rank_per_step);
  w->Key("wire_up_bytes_per_rank_per_step").Double(r.up_bytes_per_rank_per_step);
  w->Key("mean_step_ms").Double(r.mean_step_ms);
  w->Key("stall_ms_per_step").Double(r.stall_ms_per_step);
  w->Key("send_blocked_ms_per_step").Double(r.send_blocked_ms_per_step);
  OptionalDouble(w, "daemon_cpu_s", r.daemon_cpu_s);
  w->Key("bench_process_cpu_s").Double(r.bench_cpu_s);
  OptionalDouble(w, "other_processes_cpu_s", r.other_cpu_s);
  OptionalDouble(w, "host_busy_fraction", r.host_busy_fraction);
  w->Key("job_memory_bytes").Int(r.job_memory_bytes);
  w->Key("setup_s").Double(r.setup_s);
  w->Key("finish_ms").Double(r.finish_ms);
  w->EndObject();
}


// Whether every figure of the runs it applies to reaches `min`: true,
// false, or null (no run measured it).
void WriteMinGoal(const char* key, double min, const std::vector<double>& values,
                  const char* applies, JsonWriter* w) {
  w->Key(key).BeginObject();
  w->Key("min").Double(min);
  w->Key("applies_to").String(applies);
  double worst = -1;
  bool any = false, met = true;
  for (double v : values) {
    if (v < 0) {
      met = false;  // a run it applies to was not measured
      continue;
    }
    worst = any ? std::min(worst, v) : v;
    any = true;
    if (v < min) met = false;
  }
  OptionalDouble(w, "worst", any ? worst : -1);
  w->Key("met");
  if (values.empty()) {
    w->Null();
  } else {
    w->Bool(any && met);
  }
  w->EndObject();
}

void WriteGoals(const ScaleReport& rep, const std::vector<ScaleRunFractions>& f, JsonWriter* w) {
  std::vector<double> ingest, update;
  for (size_t i = 0; i < rep.results.size(); ++i) {
    if (rep.results[i].cfg.daemons != 1) continue;
    ingest.push_back(f[i].ingest_fraction);
    update.push_back(f[i].round_update_fraction);
  }
  // The 8- and 16-rank runs of each (jobs, sums) series of the matrix
  // against its 1-rank run.
  std::vector<double> scaling;
  w->Key("goals").BeginObject();
  WriteMinGoal("ingest_fraction_min", kIngestFractionMin, ingest, "every one-daemon run", w);
  WriteMinGoal("round_update_fraction_min", kRoundUpdateFractionMin, update,
               "every one-daemon run", w);
  w->Key("ingest_scaling_pairs").BeginArray();
  for (const ConfigResult& base : rep.results) {
    if (base.cfg.daemons_series || base.cfg.ranks != 1) continue;
    for (const ConfigResult& r : rep.results) {
      if (r.cfg.daemons_series || r.cfg.jobs != base.cfg.jobs ||
          r.cfg.rank_ordered != base.cfg.rank_ordered || (r.cfg.ranks != 8 && r.cfg.ranks != 16)) {
        continue;
      }
      const double ratio = base.ingest_bytes_per_cpu_s > 0 && r.ingest_bytes_per_cpu_s > 0
                               ? r.ingest_bytes_per_cpu_s / base.ingest_bytes_per_cpu_s
                               : -1;
      scaling.push_back(ratio);
      w->BeginObject();
      w->Key("label").String(r.cfg.label());
      w->Key("baseline").String(base.cfg.label());
      OptionalDouble(w, "ratio", ratio);
      w->EndObject();
    }
  }
  w->EndArray();
  WriteMinGoal("ingest_scaling_min", kIngestScalingMin, scaling,
               "ingest_bytes_per_cpu_s of the 8- and 16-rank runs / the 1-rank run of the same "
               "jobs/sums series (met null: no such pair ran)",
               w);
  w->EndObject();
}

void WriteCeilings(const ScaleReport& rep, JsonWriter* w) {
  const ScaleCeilings& c = rep.ceilings;
  OptionalDouble(w, "raw_receive_bytes_per_cpu_s", c.raw_receive_bytes_per_cpu_s);
  w->Key("raw_receive_message_bytes").Int(c.raw_message_bytes);
  w->Key("raw_receive_ucx_tls").String(c.raw_ucx_tls);
  OptionalDouble(w, "accumulate_bytes_per_cpu_s_1thread", c.accumulate_bytes_per_cpu_s_1thread);
  OptionalDouble(w, "ingest_ceiling_bytes_per_cpu_s", c.ingest_ceiling_bytes_per_cpu_s());
  OptionalDouble(w, "accumulate_bytes_per_cpu_s_1thread_beside_copy",
                 c.accumulate_bytes_per_cpu_s_1thread_beside_copy);
  OptionalDouble(w, "ingest_ceiling_beside_copy_bytes_per_cpu_s",
                 c.ingest_ceiling_beside_copy_bytes_per_cpu_s());
  w->Key("round_update_kernels").BeginObject();
  w->Key("what").String(c.round_job.Describe());
  w->Key("values").Int(c.round_job.values);
  w->Key("value_dtype").String(DTypeName(c.round_job.value_dtype));
  w->Key("moments").Bool(c.round_job.moments);
  // The check of `values`: what a rank of the first run sent per step over
  // the whole run, in bf16 values (every daemon-side column once per step).
  OptionalDouble(w, "values_from_shards",
                 rep.results.empty() ? -1 : rep.results[0].run_shard_bytes_per_rank_per_step / 2.0);
  w->Key("update_threads").Int(c.update_threads);
  OptionalDouble(w, "median_ms", c.round_update_kernel_s > 0 ? 1e3 * c.round_update_kernel_s : -1);
  OptionalDouble(w, "median_cpu_ms",
                 c.round_update_kernel_cpu_s > 0 ? 1e3 * c.round_update_kernel_cpu_s : -1);
  w->EndObject();
}

void WriteNewDefinitions(JsonWriter* w) {
  w->Key("ingest_bytes_per_cpu_s").String(
      "shard_bytes / the daemon's CPU seconds in the window outside round updates: the whole "
      "process's utime + stime delta (/proc/PID/stat) less that of its zf-update threads (the "
      "update scheduler's drivers and the update pool: /proc/PID/task/TID/stat where comm is "
      "zf-update, read at both edges; a thread only in the second snapshot counts from 0)");
  w->Key("ingest_ceiling_bytes_per_cpu_s").String(
      "1 / (1/raw_receive_bytes_per_cpu_s + 1/accumulate_bytes_per_cpu_s_1thread): receiving "
      "and accumulating a byte in series on one core, both measured in this run, before and "
      "after the configurations, each the better of the two (so are the round update kernels': "
      "the faster)");
  w->Key("raw_receive_bytes_per_cpu_s").String(
      "bytes received per CPU second of the receiving worker's progress thread "
      "(pthread_getcpuclockid) in a raw UCP loop between two UcxWorkers of the bench process "
      "(transport_bench's raw UCP), same UCX transports as the daemon (without CMA), messages "
      "of the client's max_shard_bytes, 64 MiB in flight; the best of 7");
  w->Key("accumulate_bytes_per_cpu_s_1thread").String(
      "DecodeAdd of the wire dtype (bf16) into fp32 on one thread, wire bytes per thread CPU "
      "second (CLOCK_THREAD_CPUTIME_ID), over a buffer of the job's daemon-hosted values; "
      "median pass");
  w->Key("ingest_fraction").String("ingest_bytes_per_cpu_s / ingest_ceiling_bytes_per_cpu_s");
  w->Key("accumulate_bytes_per_cpu_s_1thread_beside_copy").String(
      "the same accumulate while a second thread copies the wire bytes of a step over and over "
      "in 4 MiB pieces (the receive copy a UCX progress thread does beside the daemon's "
      "accumulate); the accumulating thread's CPU only: what the kernel gets on a host whose "
      "memory bandwidth the two share (a diagnostic; the goals use the alone figures)");
  w->Key("ingest_ceiling_beside_copy_bytes_per_cpu_s").String(
      "1 / (1/raw_receive_bytes_per_cpu_s + 1/accumulate_bytes_per_cpu_s_1thread_beside_copy)");
  w->Key("ingest_fraction_beside_copy").String(
      "ingest_bytes_per_cpu_s / ingest_ceiling_beside_copy_bytes_per_cpu_s");
  w->Key("round_update_fraction").String(
      "round_update_kernels.median_ms (AdamWUpdate then the delta Encode of the job's "
      "daemon-hosted values, on a ThreadPool of the daemon's update_threads, the faster of "
      "two measurements, before and after the configurations) / round_update_mean_ms; "
      "one-daemon runs only (null otherwise)");
  w->Key("round_update_cpu_fraction").String(
      "round_update_kernels.median_cpu_ms (the same kernels' CPU time per round, all pool "
      "threads: getrusage of the bench process) / (daemon_update_cpu_s / rounds): the update's "
      "work beyond its kernels, apart from the cores it did not get while ingest and the ranks "
      "ran beside it (round_update_fraction counts both); one-daemon runs only");
  w->Key("host_busy_fraction").String(
      "the host's busy CPU seconds in the window (/proc/stat, every process: the daemons, this "
      "bench with its ranks, the rest) / (window_s x the host's online CPUs): near 1 the run "
      "had no core to spare, so round_update_fraction (wall time) counts the cores the update "
      "waited for, which round_update_cpu_fraction leaves out (a diagnostic, not a goal)");
  w->Key("daemon_update_cpu_s").String(
      "CPU seconds of the daemon's zf-update threads in the window (round updates)");
  w->Key("goals").String(
      "each with its min, the worst value and met: ingest_fraction and round_update_fraction "
      "of every one-daemon run; ingest_scaling: ingest_bytes_per_cpu_s of the 8- and 16-rank "
      "runs of a jobs/sums series over its 1-rank run (ingest_scaling_pairs)");
}

// The aggregate goal (goal_met): in every (jobs, sums) series, no run
// accumulates less than 0.95 x the run with the next fewer ranks (unless it
// is within 5% of the ceiling, which it cannot pass).
bool AggregateGoalMet(const std::vector<ConfigResult>& results, double ceiling) {
  bool goal_met = true;
  for (size_t i = 0; i < results.size(); ++i) {
    for (size_t k = i + 1; k < results.size(); ++k) {
      const ConfigResult& a = results[i];
      const ConfigResult& b = results[k];
      if (a.cfg.jobs != b.cfg.jobs || a.cfg.rank_ordered != b.cfg.rank_ordered ||
          a.cfg.daemons != 1 || b.cfg.daemons != 1) {
        continue;
      }
      if (b.cfg.ranks <= a.cfg.ranks) continue;
      const bool at_ceiling = ceiling > 0 && b.accumulate_bytes_per_s >= 0.95 * ceiling;
      if (b.accumulate_bytes_per_s < 0.95 * a.accumulate_bytes_per_s && !at_ceiling) {
        goal_met = false;
      }
      break;  // the next run of the series only
    }
  }
  return goal_met;
}

}  // namespace

absl::Status WriteScaleReport(const ScaleReport& rep) {
  const double ceiling = rep.accumulate_ceiling_bytes_per_s;
  const ScaleCeilings& c = rep.ceilings;
  const std::vector<ScaleRunFractions> fractions = ComputeFractions(rep);
  const bool goal_met = AggregateGoalMet(rep.results, ceiling);
  JsonWriter json;
  json.BeginObject();
  json.Key("device_profile").String(rep.device_profile);
  json.Key("transport").String(absl::GetFlag(FLAGS_transport));
  json.Key("important_reduce").String(absl::GetFlag(FLAGS_important_reduce));
  json.Key("params_per_job").Int(rep.params_per_job);
  if (absl::GetFlag(FLAGS_transport) == "ucx") {
    json.Key("ucx_tls").String(absl::GetFlag(FLAGS_ucx_tls));
  }
  json.Key("emulated").Bool(true);
  // Where the run was measured: the host's CPUs, and whether the emulated
  // ranks shared the daemons' (docs/scale-ingest.md, "The ranks on cores
  // of their own").
  json.Key("host_cpus").Int(static_cast<int64_t>(std::thread::hardware_concurrency()));
  json.Key("placement")
      .String(absl::GetFlag(FLAGS_placement).empty()
                  ? "shared: the daemons and the emulated ranks on every CPU of the host"
                  : absl::GetFlag(FLAGS_placement));
  json.Key("device_ms").Int(absl::GetFlag(FLAGS_device_ms));
  json.Key("device_ms_choice").String(
      "small, so that the daemon sets the pace: device_offered_bytes_per_s_per_rank (a rank's "
      "shards / (device_ms + their modelled device-to-host copy)) is far above what the daemon "
      "takes in");
  json.Key("device_offered_bytes_per_s_per_rank").Double(rep.device_offered_bytes_per_s_per_rank);
  json.Key("tensors").Int(absl::GetFlag(FLAGS_tensors));
  json.Key("steps").Int(absl::GetFlag(FLAGS_steps));
  json.Key("warmup_steps").Int(rep.results.empty() ? 0 : rep.results[0].warmup_steps);
  json.Key("mode").String("zenflow");
  json.Key("wire_dtype").String("bf16");
  json.Key("zenflow_config").BeginObject();
  json.Key("topk_ratio").Double(absl::GetFlag(FLAGS_topk));
  json.Key("update_interval").Int(absl::GetFlag(FLAGS_interval));
  json.Key("apply_delay").String("adaptive");
  json.EndObject();
  json.Key("gradients").String("synthetic: written once, reused every step");
  json.Key("definitions").BeginObject();
  json.Key("window").String(
      "all ranks meet at a barrier before step 2 x S (warm-up left out) and after the last "
      "step; daemon figures are GetStats deltas between the two");
  json.Key("accumulate_bytes_per_s").String(
      "JobStats.shard_bytes_received in the window, summed over the jobs / window seconds");
  json.Key("round_update_p50_ms").String(
      "from the daemon's JobStats.round_update_seconds bucket counts in the window (jobs "
      "merged), interpolated linearly inside the bucket (bounds 1, 5, 10, 25, 50, 100, 250 ms, "
      "...): bucket resolution; round_update_mean_ms is exact");
  json.Key("stall_fraction").String(
      "sum over ranks of StepStats.stall_seconds / sum of step times (device_ms sleep + "
      "Step()), measured steps");
  json.Key("send_blocked_ms_per_step").String(
      "StepStats.send_blocked_seconds per rank and measured step: pushes waiting for the "
      "client's send window, i.e. the daemon's back-pressure");
  json.Key("daemon_cpu_s_per_round").String(
      "zenflowd's utime + stime (/proc/PID/stat) in the window / JobStats.rounds_updated in "
      "the window, summed over the jobs; with daemons > 1 the CPU of all of the job's daemons "
      "and its whole rounds (every daemon updated them); null when no --daemon_pid");
  json.Key("daemons").String(
      "runs with daemons > 1 (and their daemons = 1 baseline, the same job on one daemon) "
      "spread one job of daemons_ranks ranks, rank-ordered sums, over that many zenflowd "
      "processes ON ONE HOST: they share its cores, so read the protocol's overhead (the "
      "aggregate and the round update time against daemons = 1), not a speedup. "
      "round_update_* merge every daemon's updates of its part");
  json.Key("daemons_ranks").Int(absl::GetFlag(FLAGS_daemons_ranks));
  json.Key("other_processes_cpu_s").String(
      "the host's busy CPU seconds in the window (/proc/stat) less the daemon's and this "
      "process's: other load that competed for the cores (the figures are noisy when it is "
      "not near 0)");
  WriteNewDefinitions(&json);
  json.EndObject();
  json.Key("goal").String(
      "aggregate accumulate bytes/s does not fall as ranks grow (every run >= 0.95 x the run "
      "with fewer ranks of its jobs/sums series, or >= 0.95 x the ceiling)");
  json.Key("goal_met").Bool(goal_met);
  WriteGoals(rep, fractions, &json);
  json.Key("runtime_s").Double(rep.runtime_s);
  json.Key("accumulate_ceiling_source").String(absl::GetFlag(FLAGS_accumulate_ceiling_source));
  OptionalDouble(&json, "accumulate_ceiling_bytes_per_s", ceiling > 0 ? ceiling : -1);
  WriteCeilings(rep, &json);
  json.Key("runs").BeginArray();
  for (size_t i = 0; i < rep.results.size(); ++i) {
    WriteRun(rep.results[i], fractions[i], c.ingest_ceiling_bytes_per_cpu_s(), &json);
  }
  json.EndArray();
  json.EndObject();
  const std::string out = absl::GetFlag(FLAGS_out);
  ZF_RETURN_IF_ERROR(json.WriteFile(out));

  std::printf("\nscale_bench (EMULATED %s devices, %d ms/step, %lld params per job, %s, bf16, "
              "k=%g, S=%d; %d steps, warm-up %d)\n",
              rep.device_profile.c_str(), absl::GetFlag(FLAGS_device_ms),
              static_cast<long long>(rep.params_per_job),
              absl::GetFlag(FLAGS_transport).c_str(), absl::GetFlag(FLAGS_topk),
              absl::GetFlag(FLAGS_interval), absl::GetFlag(FLAGS_steps),
              rep.results.empty() ? 0 : rep.results[0].warmup_steps);
  std::printf("%5s %4s %-12s %7s %10s %8s %9s %9s %7s %12s %7s %11s %7s %7s %7s %7s\n",
              "ranks", "jobs", "sums", "daemons", "GB/s", "of ceil", "p50 ms", "p99 ms", "stall",
              "CPU s/round", "rounds", "GB/CPU-s", "ingest", "update", "upd-cpu", "busy");
  for (size_t i = 0; i < rep.results.size(); ++i) {
    const ConfigResult& r = rep.results[i];
    std::printf("%5d %4d %-12s %7d %10.2f %7.0f%% %9.1f %9.1f %7.3f %12.4f %7lld %11.2f %7.2f %7.2f "
                "%7.2f %7.2f\n",
                r.cfg.ranks, r.cfg.jobs, r.cfg.sums().c_str(), r.cfg.daemons,
                r.accumulate_bytes_per_s / 1e9,
                ceiling > 0 ? 100 * r.accumulate_bytes_per_s / ceiling : 0.0, r.p50_ms, r.p99_ms,
                r.stall_fraction, r.daemon_cpu_s_per_round, static_cast<long long>(r.rounds),
                r.ingest_bytes_per_cpu_s / 1e9, fractions[i].ingest_fraction,
                fractions[i].round_update_fraction, fractions[i].round_update_cpu_fraction,
                r.host_busy_fraction);
  }
  if (ceiling > 0) {
    std::printf("ceiling: %.2f GB/s bf16 accumulate (%s)\n", ceiling / 1e9,
                absl::GetFlag(FLAGS_accumulate_ceiling_source).c_str());
  }
  std::printf("goal (aggregate does not fall as ranks grow): %s\n", goal_met ? "met" : "NOT met");
  std::printf("ingest ceiling: %.2f GB per CPU s (raw UCP receive %.2f, accumulate %.2f on 1 "
              "thread; %.2f beside a copy, ceiling %.2f); round update kernels %.2f ms (%s, %d "
              "threads)\n",
              c.ingest_ceiling_bytes_per_cpu_s() / 1e9, c.raw_receive_bytes_per_cpu_s / 1e9,
              c.accumulate_bytes_per_cpu_s_1thread / 1e9,
              c.accumulate_bytes_per_cpu_s_1thread_beside_copy / 1e9,
              c.ingest_ceiling_beside_copy_bytes_per_cpu_s() / 1e9, 1e3 * c.round_update_kernel_s,
              c.round_job.Describe().c_str(), c.update_threads);
  std::printf("runtime %.1f s; JSON in %s\n", rep.runtime_s, out.c_str());
  return absl::OkStatus();
}

}  // namespace zenflow
