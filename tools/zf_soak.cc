// zf_soak (`./zf soak`): a bounded loopback soak of zenflowd. It starts the
// real daemon as a child process on 127.0.0.1, then per transport (gRPC,
// UCX) runs `--jobs` jobs of `--ranks` ranks each for `--rounds` rounds at
// once, every rank a zenflow::Client in its own thread on its own
// connection, with selections and exact state hand-offs along the way. It
// checks that no update was lost or applied twice (every rank received every
// round exactly once; the daemon's final state and every rank's parameters
// equal a reference AdamW computed here, bit for bit), that the daemon's
// resident memory stays flat after warm-up, and that its threads (those of
// gRPC's self-sizing pools within a bound), file descriptors and
// shared-memory mappings are back where they were once the jobs are deleted
// and the clients gone. Results go to --out (JSON) and a table with an ASCII
// RSS curve to stdout; exit status 1 when a check fails.
//
//   bazel build //server:zenflowd //tools:zf_soak
//   bazel-bin/tools/zf_soak --zenflowd=bazel-bin/server/zenflowd --out=bench-results/soak.json
//
// The job model is in zf_soak_model.{h,cc}, a rank and the checks against the
// reference in zf_soak_rank.{h,cc}, the /proc sampling in proc_sample.{h,cc};
// here the passes and Main.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "tools/child_process.h"
#include "tools/proc_sample.h"
#include "tools/zf_soak_model.h"
#include "tools/zf_soak_rank.h"
#include "common/adamw.h"
#include "common/json_writer.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "tests/testing/adamw_reference.h"
#include "zenflow/v1/zenflow.pb.h"


ABSL_FLAG(std::string, zenflowd, "bazel-bin/server/zenflowd", "the daemon binary to start");
ABSL_FLAG(std::string, out, "bench-results/soak.json", "write the results as JSON here");
ABSL_FLAG(std::vector<std::string>, transports, std::vector<std::string>({"grpc", "ucx"}),
          "data transports to soak, in order (one pass each, one daemon for all)");
ABSL_FLAG(int, jobs, 2, "jobs per pass, run at once");
ABSL_FLAG(int, ranks, 8, "ranks per job (one thread and one connection each)");
ABSL_FLAG(int, rounds, 200, "rounds per job");
ABSL_FLAG(int, interval, 2, "update_interval S (steps per round)");
ABSL_FLAG(int, tensors, 3, "2-D tensors per job");
ABSL_FLAG(int, rows, 64,
          "rows of each tensor: a multiple of 16, so that every column the daemon updates goes "
          "through its vector kernel whole (no scalar tail: the comparison is bit for bit)");
ABSL_FLAG(int, cols, 256, "columns of each tensor");
ABSL_FLAG(double, topk, 0.25, "topk_ratio: the share of columns kept on the workers");
ABSL_FLAG(int, select_every, 25, "rounds between selections (0: no selection)");
ABSL_FLAG(int, sample_every, 5, "rounds between samples of the daemon's RSS, threads and fds");
ABSL_FLAG(int, warm_round, 20, "RSS growth is measured from the first sample at this round on");
ABSL_FLAG(int, warmup_rounds, 4,
          "rounds of the warm-up pass (every transport, same shape, a selection at round 2) "
          "run before the thread/fd baseline is taken");
ABSL_FLAG(int64_t, rss_bound_bytes, int64_t{8} << 20,
          "allowed RSS growth after warm-up: the larger of this and --rss_bound_ratio x the "
          "warm RSS");
ABSL_FLAG(double, rss_bound_ratio, 0.05, "see --rss_bound_bytes");
ABSL_FLAG(double, settle_s, 10,
          "how long the daemon may take to close streams and threads after the clients left");
ABSL_FLAG(int, update_threads, 2, "the daemon's --update_threads");
ABSL_FLAG(int, grpc_pool_slack, 4,
          "threads gRPC's own timer and executor pools may have gained since the baseline "
          "(they grow to the most ever busy at once and never shrink); every other thread "
          "must be back exactly");

namespace zenflow {
namespace soak {
namespace {

using Clock = std::chrono::steady_clock;

// ---- A pass: every job of one transport ------------------------------------------------

struct PassResult {
  std::string transport;
  double seconds = 0;
  std::vector<std::pair<int, ProcSample>> samples;  // (rounds every rank has, sample)
  ProcSample peak;  // largest threads and fds seen while the jobs ran
  ProcSample end;   // after the jobs were deleted and the clients gone, settled
  double settle_seconds = 0;
  std::string thread_diff, fd_diff;   // end vs baseline, by kind
  MemDetail mem_before, mem_end;      // just before the pass, and at its end
  std::string maps_diff;              // mem_end vs mem_before
  int own_threads_end = -1;           // outside gRPC's pools
  int pool_threads_end = -1;          // in them
  std::vector<std::string> failures;  // correctness
  std::vector<std::string> models;    // per job: see JobCheck::model
  int64_t values_compared = 0;
  int64_t rss_warm = -1, rss_max_after_warm = -1, rss_growth = 0, rss_bound = 0;
  int warm_sample_round = -1;
  bool exact = false, rss_flat = false, threads_back = false, fds_back = false, connections = false,
       shm_back = false;
};

absl::StatusOr<v1::JobSpec> MakeSpec(const Config& cfg, const std::string& id) {
  v1::JobSpec spec;
  spec.set_job_id(id);
  for (int ti = 0; ti < cfg.tensors; ++ti) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(TensorName(ti));
    t->add_shape(cfg.rows);
    t->add_shape(cfg.cols);
    t->set_dtype(v1::DTYPE_FP32);
  }
  spec.set_world_size(cfg.ranks);
  spec.set_mode(v1::MODE_ZENFLOW);
  spec.set_wire_dtype(v1::DTYPE_FP32);
  spec.set_delta_kind(v1::DELTA_VALUES);
  spec.set_rank_ordered_sums(true);
  spec.set_max_shard_bytes(16 << 10);  // several deltas per tensor and round
  v1::ZenFlowConfig* z = spec.mutable_zenflow();
  z->set_update_interval(cfg.interval);
  z->set_topk_ratio(cfg.topk);
  z->set_select_interval(std::max(1, cfg.select_every) * cfg.interval);
  z->set_full_warmup_rounds(0);
  z->mutable_apply_delay()->set_steps(1);
  // The reference (zf_soak_rank) is one AdamW step of lr per round, its
  // deltas values only: rules 12 and 13 (docs/design.md) off.
  z->set_scale_round_step(false);
  z->set_local_step(false);
  return spec;
}

// Runs cfg.jobs jobs over `transport` at once; while they run, samples the
// daemon every `sample_every` rounds (rounds every rank has received).
absl::StatusOr<PassResult> RunPass(const Config& cfg, Transport transport, const std::string& tag,
                                   const ChildProcess& daemon, int sample_every, const RefStep& adam) {
  PassResult res;
  res.transport = transport == Transport::kUcx ? "ucx" : "grpc";
  std::vector<std::unique_ptr<JobShared>> jobs;
  for (int j = 0; j < cfg.jobs; ++j) {
    auto job = std::make_unique<JobShared>();
    job->index = j;
    job->id = absl::StrCat("soak-", tag, "-", res.transport, "-", j);
    job->token = NewToken();
    ZF_ASSIGN_OR_RETURN(job->spec, MakeSpec(cfg, job->id));
    job->delete_while_attached = j % 2 == 1;
    jobs.push_back(std::move(job));
  }
  const int total = cfg.jobs * cfg.ranks;
  std::vector<std::atomic<int>> progress(total);
  for (auto& p : progress) p.store(0);
  std::vector<std::vector<RankResult>> results(cfg.jobs, std::vector<RankResult>(cfg.ranks));
  std::atomic<bool> stop{false};
  std::thread sampler([&] {
    int next = sample_every;
    while (!stop.load()) {
      int least = cfg.rounds;
      for (auto& p : progress) least = std::min(least, p.load(std::memory_order_relaxed));
      const ProcSample s = Sample(daemon.pid());
      res.peak.threads = std::max(res.peak.threads, s.threads);
      res.peak.fds = std::max(res.peak.fds, s.fds);
      res.peak.rss = std::max(res.peak.rss, s.rss);
      if (sample_every > 0 && least >= next) {
        res.samples.push_back({least, s});
        next = (least / sample_every + 1) * sample_every;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<Rank>> ranks;
  std::vector<std::thread> threads;
  for (int j = 0; j < cfg.jobs; ++j) {
    for (int r = 0; r < cfg.ranks; ++r) {
      const int g = j * cfg.ranks + r;
      ranks.push_back(std::make_unique<Rank>(cfg, jobs[j].get(), r, transport, daemon.target(), g,
                                             &progress[g], &results[j][r]));
    }
  }
  for (auto& r : ranks) threads.emplace_back([rank = r.get()] { rank->Run(); });
  for (auto& t : threads) t.join();
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  stop.store(true);
  sampler.join();
  for (int j = 0; j < cfg.jobs; ++j) {
    JobCheck check = CheckJob(cfg, j, results[j], adam);
    for (std::string& f : check.failures) {
      res.failures.push_back(absl::StrCat(jobs[j]->id, ": ", f));
    }
    res.models.push_back(check.model);
    res.values_compared += check.values_compared;
  }
  res.exact = res.failures.empty();
  return res;
}

// Polls the daemon until its threads outside gRPC's pools and its fds are
// back at the baseline's, or settle_s passed; returns the last reading.
ProcSample Settle(pid_t pid, int base_own_threads, int base_fds, double settle_s, double* seconds) {
  const auto t0 = Clock::now();
  for (;;) {
    ProcSample s = Sample(pid);
    const int own = CountThreads(ThreadNames(pid), false);
    if ((own == base_own_threads && s.fds == base_fds) ||
        std::chrono::duration<double>(Clock::now() - t0).count() >= settle_s) {
      *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Waits until the daemon's thread and fd counts hold still for a second
// (start-up, or streams closing), at most `limit_s`.
ProcSample Quiet(pid_t pid, double limit_s) {
  const auto t0 = Clock::now();
  ProcSample last = Sample(pid);
  auto still_since = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < limit_s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const ProcSample s = Sample(pid);
    if (s.threads != last.threads || s.fds != last.fds) {
      still_since = Clock::now();
      last = s;
    } else if (Clock::now() - still_since >= std::chrono::seconds(1)) {
      break;
    }
  }
  return Sample(pid);
}

std::string MiB(int64_t b) { return absl::StrFormat("%.1f", static_cast<double>(b) / (1 << 20)); }

// The RSS samples as an ASCII chart: MiB up, rounds across.
void PrintCurve(const PassResult& p) {
  if (p.samples.empty()) return;
  int64_t lo = p.samples[0].second.rss, hi = lo;
  for (const auto& [round, s] : p.samples) {
    lo = std::min(lo, s.rss);
    hi = std::max(hi, s.rss);
  }
  lo = std::min(lo, p.end.rss);
  hi = std::max(hi, p.end.rss);
  constexpr int kRowsHigh = 8;
  const double span = std::max<double>(static_cast<double>(hi - lo), 1 << 20);
  std::printf(
      "  %s: daemon RSS (MiB) by round (%zu samples, then 'E' = after the jobs were deleted)\n",
      p.transport.c_str(), p.samples.size());
  std::vector<int64_t> values;
  for (const auto& [round, s] : p.samples) values.push_back(s.rss);
  values.push_back(p.end.rss);
  for (int row = kRowsHigh; row >= 0; --row) {
    const double level = static_cast<double>(lo) + span * row / kRowsHigh;
    std::string line;
    for (size_t i = 0; i < values.size(); ++i) {
      const int at =
          static_cast<int>(std::lround((static_cast<double>(values[i]) - lo) / span * kRowsHigh));
      line += at == row ? (i + 1 == values.size() ? 'E' : '*') : ' ';
    }
    std::printf("  %7.1f |%s\n", level / (1 << 20), line.c_str());
  }
  std::printf("          +%s\n", std::string(values.size(), '-').c_str());
  std::printf("           round 0 .. %d\n", p.samples.back().first);
  std::string nums;
  for (const auto& [round, s] : p.samples) absl::StrAppend(&nums, " ", round, ":", MiB(s.rss));
  std::printf("  samples (round:MiB):%s end:%s\n", nums.c_str(), MiB(p.end.rss).c_str());
}

void WriteSample(JsonWriter& w, const ProcSample& s) {
  w.BeginObject();
  w.Key("rss_bytes").Int(s.rss);
  w.Key("threads").Int(s.threads);
  w.Key("fds").Int(s.fds);
  w.EndObject();
}

int Main() {
  Config cfg;
  cfg.jobs = absl::GetFlag(FLAGS_jobs);
  cfg.ranks = absl::GetFlag(FLAGS_ranks);
  cfg.rounds = absl::GetFlag(FLAGS_rounds);
  cfg.interval = absl::GetFlag(FLAGS_interval);
  cfg.tensors = absl::GetFlag(FLAGS_tensors);
  cfg.rows = absl::GetFlag(FLAGS_rows);
  cfg.cols = absl::GetFlag(FLAGS_cols);
  cfg.topk = static_cast<float>(absl::GetFlag(FLAGS_topk));
  cfg.select_every = absl::GetFlag(FLAGS_select_every);
  if (cfg.jobs < 1 || cfg.ranks < 1 || cfg.rounds < 1 || cfg.interval < 1 || cfg.tensors < 1 ||
      cfg.rows < 1 || cfg.rows % 16 != 0 || cfg.cols < 1 || !(cfg.topk >= 0 && cfg.topk < 1)) {
    std::fprintf(stderr,
                 "zf_soak: --jobs, --ranks, --rounds, --interval, --tensors and --cols "
                 "must be >= 1, --rows a positive multiple of 16 and --topk in [0, 1)\n");
    return 2;
  }
  std::vector<Transport> transports;
  for (const std::string& name : absl::GetFlag(FLAGS_transports)) {
    absl::StatusOr<Transport> t = ParseTransport(name);
    if (!t.ok()) {
      std::fprintf(stderr, "zf_soak: %s\n", t.status().ToString().c_str());
      return 2;
    }
    transports.push_back(*t);
  }
  // The daemon updates with the best kernel this CPU has (its GetStats says
  // which); the vector kernels fuse multiply-adds, the scalar one does not.
  RefStep adam;
  const SimdLevel simd = BestSimdLevel();
  adam.fused = simd != SimdLevel::kScalar;

  const auto t0 = Clock::now();
  ChildProcess daemon;
  if (absl::Status s =
          daemon.Start(absl::GetFlag(FLAGS_zenflowd),
                       {"--listen=127.0.0.1:0",
                        absl::StrCat("--update_threads=", absl::GetFlag(FLAGS_update_threads))},
                       "--port_file", "zf_soak");
      !s.ok()) {
    std::fprintf(stderr, "zf_soak: %s\n", s.ToString().c_str());
    return 1;
  }
  const pid_t pid = daemon.pid();
  std::printf(
      "zf_soak: zenflowd pid %d at %s (log %s); %d jobs x %d ranks x %d rounds, S=%d, "
      "%d tensors of %dx%d, topk %.2f, selection every %d rounds, fp32 wire, simd %s, %s "
      "reference\n",
      static_cast<int>(pid), daemon.target().c_str(), daemon.log().c_str(), cfg.jobs, cfg.ranks,
      cfg.rounds, cfg.interval, cfg.tensors, cfg.rows, cfg.cols, cfg.topk, cfg.select_every,
      SimdLevelName(simd), adam.fused ? "fused" : "plain");
  std::fflush(stdout);
  const ProcSample cold = Quiet(pid, 10);
  const std::map<std::string, int> cold_fds = FdKinds(pid), cold_threads = ThreadNames(pid);

  // Warm-up: the same shape for a few rounds (and one selection) on every
  // transport, so that what the daemon creates once and keeps (gRPC's
  // threads, the UCX data plane's) is there before the baseline.
  Config warm_cfg = cfg;
  warm_cfg.rounds = std::max(1, absl::GetFlag(FLAGS_warmup_rounds));
  warm_cfg.select_every = cfg.select_every > 0 ? std::max(1, warm_cfg.rounds / 2) : 0;
  std::vector<std::string> warm_failures;
  for (Transport t : transports) {
    absl::StatusOr<PassResult> w = RunPass(warm_cfg, t, "warmup", daemon, 0, adam);
    if (!w.ok()) {
      std::fprintf(stderr, "zf_soak: warm-up: %s\n", w.status().ToString().c_str());
      return 1;
    }
    for (const std::string& f : w->failures) warm_failures.push_back(absl::StrCat("warm-up: ", f));
  }
  const ProcSample base = Quiet(pid, absl::GetFlag(FLAGS_settle_s));
  const std::map<std::string, int> base_fds = FdKinds(pid), base_threads = ThreadNames(pid);
  const int base_own_threads = CountThreads(base_threads, false);
  const int base_pool_threads = CountThreads(base_threads, true);
  const int grpc_pool_slack = absl::GetFlag(FLAGS_grpc_pool_slack);
  std::printf(
      "zf_soak: daemon before any job: %s MiB, %d threads, %d fds; after the warm-up "
      "(baseline): %s MiB, %d threads, %d fds (warm-up added threads: %s; fds: %s)\n",
      MiB(cold.rss).c_str(), cold.threads, cold.fds, MiB(base.rss).c_str(), base.threads, base.fds,
      Diff(cold_threads, base_threads).c_str(), Diff(cold_fds, base_fds).c_str());
  std::fflush(stdout);

  const int warm_round = absl::GetFlag(FLAGS_warm_round);
  std::vector<PassResult> passes;
  for (Transport t : transports) {
    const MemDetail mem_before = ReadMemDetail(pid);
    absl::StatusOr<PassResult> r =
        RunPass(cfg, t, "main", daemon, std::max(1, absl::GetFlag(FLAGS_sample_every)), adam);
    if (!r.ok()) {
      std::fprintf(stderr, "zf_soak: %s\n", r.status().ToString().c_str());
      return 1;
    }
    PassResult& p = *r;
    p.end =
        Settle(pid, base_own_threads, base.fds, absl::GetFlag(FLAGS_settle_s), &p.settle_seconds);
    const std::map<std::string, int> end_threads = ThreadNames(pid);
    p.thread_diff = Diff(base_threads, end_threads);
    p.fd_diff = Diff(base_fds, FdKinds(pid));
    p.mem_before = mem_before;
    p.mem_end = ReadMemDetail(pid);
    p.maps_diff = MapsDiff(p.mem_before, p.mem_end);
    // Shared memory the pass's connections attached is detached again.
    p.shm_back = SharedMappings(p.mem_end) == SharedMappings(p.mem_before);
    p.own_threads_end = CountThreads(end_threads, false);
    p.pool_threads_end = CountThreads(end_threads, true);
    p.threads_back = p.own_threads_end == base_own_threads &&
                     p.pool_threads_end - base_pool_threads <= grpc_pool_slack;
    p.fds_back = p.end.fds == base.fds;
    // Each rank on its own connection: at least one more socket per rank
    // while the jobs ran.
    p.connections = p.peak.fds - base.fds >= cfg.jobs * cfg.ranks;
    for (const auto& [round, s] : p.samples) {
      if (round >= warm_round && p.rss_warm < 0) {
        p.rss_warm = s.rss;
        p.warm_sample_round = round;
      }
      if (p.rss_warm >= 0) p.rss_max_after_warm = std::max(p.rss_max_after_warm, s.rss);
    }
    if (p.rss_warm >= 0) {
      p.rss_max_after_warm = std::max(p.rss_max_after_warm, p.end.rss);
      p.rss_growth = p.rss_max_after_warm - p.rss_warm;
      p.rss_bound = std::max<int64_t>(absl::GetFlag(FLAGS_rss_bound_bytes),
                                      static_cast<int64_t>(absl::GetFlag(FLAGS_rss_bound_ratio) *
                                                           static_cast<double>(p.rss_warm)));
      p.rss_flat = p.rss_growth <= p.rss_bound;
    }
    std::printf(
        "zf_soak: %s pass: %.1f s, %s (%lld parameter values compared bit for bit; "
        "reference rounding per job: %s)\n",
        p.transport.c_str(), p.seconds, p.exact ? "exact" : "NOT EXACT",
        static_cast<long long>(p.values_compared), absl::StrJoin(p.models, ",").c_str());
    std::fflush(stdout);
    passes.push_back(std::move(p));
  }
  const absl::Status stopped = daemon.Stop();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  bool pass = warm_failures.empty() && stopped.ok();
  for (const PassResult& p : passes) {
    pass = pass && p.exact && p.rss_flat && p.threads_back && p.fds_back && p.connections &&
           p.shm_back;
  }

  JsonWriter w;
  w.BeginObject();
  w.Key("config").BeginObject();
  w.Key("jobs").Int(cfg.jobs);
  w.Key("ranks_per_job").Int(cfg.ranks);
  w.Key("rounds").Int(cfg.rounds);
  w.Key("update_interval").Int(cfg.interval);
  w.Key("tensors").Int(cfg.tensors);
  w.Key("rows").Int(cfg.rows);
  w.Key("cols").Int(cfg.cols);
  w.Key("topk_ratio").Float(cfg.topk);
  w.Key("select_every_rounds").Int(cfg.select_every);
  w.Key("wire_dtype").String("fp32");
  w.Key("simd").String(SimdLevelName(simd));
  w.Key("warm_round").Int(warm_round);
  w.Key("warmup_rounds").Int(warm_cfg.rounds);
  w.EndObject();
  w.Key("daemon").BeginObject();
  w.Key("before_any_job");
  WriteSample(w, cold);
  w.Key("baseline");
  WriteSample(w, base);
  w.Key("exit_ok").Bool(stopped.ok());
  w.EndObject();
  w.Key("transports").BeginArray();
  for (const PassResult& p : passes) {
    w.BeginObject();
    w.Key("transport").String(p.transport);
    w.Key("jobs").Int(cfg.jobs);
    w.Key("ranks").Int(cfg.jobs * cfg.ranks);
    w.Key("rounds").Int(cfg.rounds);
    w.Key("seconds").Double(p.seconds);
    w.Key("rss_samples").BeginArray();
    for (const auto& [round, s] : p.samples) w.BeginArray().Int(round).Int(s.rss).EndArray();
    w.EndArray();
    w.Key("rss_warm_round").Int(p.warm_sample_round);
    w.Key("rss_warm_bytes").Int(p.rss_warm);
    w.Key("rss_max_after_warm_bytes").Int(p.rss_max_after_warm);
    w.Key("rss_end_bytes").Int(p.end.rss);
    w.Key("rss_growth_bytes").Int(p.rss_growth);
    w.Key("rss_bound_bytes").Int(p.rss_bound);
    w.Key("threads").BeginObject();
    w.Key("baseline")
        .Int(base.threads)
        .Key("peak")
        .Int(p.peak.threads)
        .Key("end")
        .Int(p.end.threads);
    w.Key("end_vs_baseline").String(p.thread_diff);
    w.Key("outside_grpc_pools_baseline").Int(base_own_threads);
    w.Key("outside_grpc_pools_end").Int(p.own_threads_end);
    w.Key("grpc_pools_baseline").Int(base_pool_threads);
    w.Key("grpc_pools_end").Int(p.pool_threads_end);
    w.Key("grpc_pool_slack").Int(grpc_pool_slack);
    w.EndObject();
    w.Key("fds").BeginObject();
    w.Key("baseline").Int(base.fds).Key("peak").Int(p.peak.fds).Key("end").Int(p.end.fds);
    w.Key("end_vs_baseline").String(p.fd_diff);
    w.EndObject();
    w.Key("settle_seconds").Double(p.settle_seconds);
    w.Key("rss_by_kind").BeginObject();
    w.Key("before").BeginObject();
    w.Key("anon_bytes").Int(p.mem_before.anon);
    w.Key("file_bytes").Int(p.mem_before.file);
    w.Key("shmem_bytes").Int(p.mem_before.shmem);
    w.EndObject();
    w.Key("end").BeginObject();
    w.Key("anon_bytes").Int(p.mem_end.anon);
    w.Key("file_bytes").Int(p.mem_end.file);
    w.Key("shmem_bytes").Int(p.mem_end.shmem);
    w.EndObject();
    w.Key("mappings_added").String(p.maps_diff);
    w.Key("shared_mappings_before").Int(SharedMappings(p.mem_before));
    w.Key("shared_mappings_end").Int(SharedMappings(p.mem_end));
    w.EndObject();
    w.Key("values_compared").Int(p.values_compared);
    w.Key("reference_rounding").String(absl::StrJoin(p.models, ","));
    w.Key("checks").BeginObject();
    w.Key("exact_and_once").Bool(p.exact);
    w.Key("rss_flat").Bool(p.rss_flat);
    w.Key("threads_back").Bool(p.threads_back);
    w.Key("fds_back").Bool(p.fds_back);
    w.Key("own_connections").Bool(p.connections);
    w.Key("shared_memory_back").Bool(p.shm_back);
    w.EndObject();
    w.Key("failures").BeginArray();
    for (const std::string& f : p.failures) w.String(f);
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.Key("warmup_failures").BeginArray();
  for (const std::string& f : warm_failures) w.String(f);
  w.EndArray();
  w.Key("seconds").Double(seconds);
  w.Key("pass").Bool(pass);
  w.EndObject();
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (absl::Status s = w.WriteFile(out); !s.ok()) {
      std::fprintf(stderr, "zf_soak: %s\n", s.ToString().c_str());
      pass = false;
    }
  }

  std::printf(
      "\n| transport | jobs x ranks | rounds | seconds | RSS warm (r%d) MiB | RSS max after | "
      "growth / bound MiB | threads base/peak/end | of them gRPC pools base/end | "
      "fds base/peak/end | settle s | checks |\n",
      warm_round);
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const PassResult& p : passes) {
    std::vector<std::string> bad;
    if (!p.exact) bad.push_back("EXACT");
    if (!p.rss_flat) bad.push_back("RSS");
    if (!p.threads_back) bad.push_back("THREADS");
    if (!p.fds_back) bad.push_back("FDS");
    if (!p.connections) bad.push_back("CONNECTIONS");
    if (!p.shm_back) bad.push_back("SHARED MEMORY");
    std::printf(
        "| %s | %d x %d | %d | %.1f | %s | %s | %s / %s | %d/%d/%d | %d/%d | %d/%d/%d | %.2f | "
        "%s |\n",
        p.transport.c_str(), cfg.jobs, cfg.ranks, cfg.rounds, p.seconds, MiB(p.rss_warm).c_str(),
        MiB(p.rss_max_after_warm).c_str(), MiB(p.rss_growth).c_str(), MiB(p.rss_bound).c_str(),
        base.threads, p.peak.threads, p.end.threads, base_pool_threads, p.pool_threads_end,
        base.fds, p.peak.fds, p.end.fds, p.settle_seconds,
        bad.empty() ? "ok" : ("FAILED: " + absl::StrJoin(bad, ", ")).c_str());
  }
  std::printf("\n");
  for (const PassResult& p : passes) PrintCurve(p);
  for (const PassResult& p : passes) {
    std::printf(
        "zf_soak: %s: RSS from before the pass to its end: anon %s -> %s, file %s -> %s, "
        "shmem %s -> %s MiB; mappings: %s\n",
        p.transport.c_str(), MiB(p.mem_before.anon).c_str(), MiB(p.mem_end.anon).c_str(),
        MiB(p.mem_before.file).c_str(), MiB(p.mem_end.file).c_str(),
        MiB(p.mem_before.shmem).c_str(), MiB(p.mem_end.shmem).c_str(), p.maps_diff.c_str());
    std::printf(
        "zf_soak: %s: at the end (%.2f s after the last client left) the daemon has, vs "
        "the baseline, threads: %s; fds: %s%s\n",
        p.transport.c_str(), p.settle_seconds, p.thread_diff.c_str(), p.fd_diff.c_str(),
        p.threads_back ? ""
                       : absl::StrFormat(" (FAILED: threads outside gRPC's pools must be "
                                         "back exactly, the pools within +%d)",
                                         grpc_pool_slack)
                             .c_str());
    if (!p.rss_flat && p.rss_warm < 0) {
      std::printf("zf_soak: %s: no RSS sample at or after round %d: run more rounds\n",
                  p.transport.c_str(), warm_round);
    } else if (!p.rss_flat) {
      std::printf("zf_soak: %s: RSS grew %s MiB after round %d (bound %s MiB)\n",
                  p.transport.c_str(), MiB(p.rss_growth).c_str(), p.warm_sample_round,
                  MiB(p.rss_bound).c_str());
    }
    if (!p.shm_back) {
      std::printf(
          "zf_soak: %s: the daemon maps %d shared-memory segments more than before the pass "
          "(RssShmem %s -> %s MiB), with every connection of the pass closed and its jobs "
          "deleted: they stay attached\n",
          p.transport.c_str(), SharedMappings(p.mem_end) - SharedMappings(p.mem_before),
          MiB(p.mem_before.shmem).c_str(), MiB(p.mem_end.shmem).c_str());
    }
    if (!p.connections) {
      std::printf(
          "zf_soak: %s: the daemon's fds rose by %d at most while %d ranks ran: the ranks "
          "did not have a connection each\n",
          p.transport.c_str(), p.peak.fds - base.fds, cfg.jobs * cfg.ranks);
    }
    for (const std::string& f : p.failures)
      std::printf("zf_soak: %s: %s\n", p.transport.c_str(), f.c_str());
  }
  for (const std::string& f : warm_failures) std::printf("zf_soak: %s\n", f.c_str());
  if (!stopped.ok()) {
    std::printf("zf_soak: %s\nzenflowd's log:\n%s\n", stopped.ToString().c_str(),
                daemon.LogTail().c_str());
  }
  if (pass) daemon.RemoveFiles();
  std::printf("zf_soak: %s in %.1f s%s%s\n", pass ? "PASS" : "FAIL", seconds,
              out.empty() ? "" : "; results in ", out.c_str());
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace soak
}  // namespace zenflow

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "A bounded loopback soak of zenflowd: jobs x ranks x rounds over each transport, checked "
      "exactly against a reference AdamW, with the daemon's RSS, threads and fds sampled.");
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  return zenflow::soak::Main();
}
