// scale_bench: how zenflowd's accumulation scales with the number of ranks
// feeding it: 1, 2, 4 and 8 ranks (EMULATED devices) as one job, and the
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
//                           (JobStats.rounds_updated, summed over the jobs).
//
//   scale_bench --target=127.0.0.1:50051 --daemon_pid=PID [--ranks=1,2,4,8]
//               [--params=8388608] [--steps=64] [--out=bench-results/scale.json]
// tools/bench_scale.sh builds it, measures the ceiling with adam_bench,
// starts zenflowd and runs it.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/json_writer.h"
#include "tools/bench/bench_main.h"
#include "tools/bench/cpu_time.h"
#include "common/mutex.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/kernels/emulated_backend.h"
#include "gpu_worker/engine/local_reducer.h"
#include "gpu_worker/engine/zenflow_optimizer.h"

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
ABSL_FLAG(std::string, ranks, "1,2,4,8", "rank counts to run");
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

namespace zenflow {
namespace {

constexpr int64_t kRows = 4096;
constexpr int64_t kVector = 4096;  // the 1-D tensor
constexpr int64_t kPatternFloats = int64_t{1} << 20;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Uniform in [-scale, scale).
std::vector<float> RandomPattern(uint64_t seed, float scale) {
  std::vector<float> v(kPatternFloats);
  for (float& x : v) {
    x = scale * static_cast<float>(static_cast<double>(NextRandom(&seed) >> 40) *
                                       (1.0 / (1ull << 23)) -
                                   1.0);
  }
  return v;
}

// The q-quantile of bucket counts (as v1.Histogram: counts[i] in
// (bounds[i-1], bounds[i]], the last above every bound), interpolated
// linearly inside its bucket from 0 for the first; the highest bound when it
// falls above them all. -1 without observations.
double BucketQuantile(const std::vector<double>& bounds, const std::vector<int64_t>& counts,
                      double q) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return -1;
  const double rank = q * static_cast<double>(total);
  double below = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0 && below + static_cast<double>(counts[i]) >= rank) {
      if (i >= bounds.size()) return bounds.empty() ? -1 : bounds.back();
      const double lo = i == 0 ? 0.0 : bounds[i - 1];
      return lo + (bounds[i] - lo) * (rank - below) / static_cast<double>(counts[i]);
    }
    below += static_cast<double>(counts[i]);
  }
  return bounds.empty() ? -1 : bounds.back();
}

// One configuration of the matrix.
struct Config {
  int ranks = 1;
  int jobs = 1;
  bool rank_ordered = false;
  int daemons = 1;  // the job spread over the first `daemons` targets
  std::string sums() const { return rank_ordered ? "rank_ordered" : "shared"; }
  std::string label() const {
    return absl::StrCat("r", ranks, "-j", jobs, "-", sums(), daemons > 1 ? absl::StrCat("-d", daemons) : "");
  }
};

// The --target list and the --daemon_pid list (pids may be left out).
std::vector<std::string> Targets() {
  return absl::StrSplit(absl::GetFlag(FLAGS_target), ',', absl::SkipEmpty());
}
std::vector<int> DaemonPids() {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_daemon_pid), ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(p, &v) && v > 0) out.push_back(v);
  }
  return out;
}

// One job's figures from each of its daemons, as one: bytes, memory and
// update times summed (each daemon's round update is an observation),
// rounds the fewest (a round is done when every daemon updated it).
v1::JobStats MergeJobStats(const std::vector<const v1::JobStats*>& parts) {
  v1::JobStats out = *parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const v1::JobStats& p = *parts[i];
    out.set_shard_bytes_received(out.shard_bytes_received() + p.shard_bytes_received());
    out.set_memory_bytes(out.memory_bytes() + p.memory_bytes());
    out.set_rounds_updated(std::min(out.rounds_updated(), p.rounds_updated()));
    v1::Histogram* h = out.mutable_round_update_seconds();
    const v1::Histogram& q = p.round_update_seconds();
    for (int k = 0; k < h->counts_size() && k < q.counts_size(); ++k) {
      h->set_counts(k, h->counts(k) + q.counts(k));
    }
    h->set_sum(h->sum() + q.sum());
    h->set_count(h->count() + q.count());
  }
  return out;
}

// The daemon's figures at one edge of the measured window.
struct Snapshot {
  double wall = 0;
  double daemon_cpu_s = -1;  // -1: not measured
  double self_cpu_s = 0;
  double host_busy_s = -1;
  std::vector<v1::JobStats> jobs;  // by job index
};

struct RankResult {
  int steps_measured = 0;
  double step_s = 0;   // device sleep + Step()
  double stall_s = 0;
  double send_blocked_s = 0;
  double up_bytes = 0;  // data stream, up (serialized)
  double setup_s = 0;
  double finish_s = 0;
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
  double shard_bytes_per_rank_per_step = 0;
  double up_bytes_per_rank_per_step = 0;
  double setup_s = 0;
  double finish_ms = 0;
  int64_t job_memory_bytes = 0;
};

// A reusable barrier for the ranks of one configuration; the last thread to
// arrive runs `last` before the others go on. Thread-safe.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait(const std::function<void()>& last) {
    MutexLock lock(&mu_);
    const int64_t gen = generation_;
    if (++arrived_ == n_) {
      if (last) last();
      arrived_ = 0;
      ++generation_;
      return;
    }
    mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generation_ != gen; });
  }

 private:
  const int n_;
  Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// A bench tool fails fast: a rank that fails leaves the others of its job
// waiting on the daemon.
[[noreturn]] void Fail(const std::string& where, const absl::Status& s) {
  std::fprintf(stderr, "scale_bench: %s: %s\n", where.c_str(), s.ToString().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// One configuration's run: its rank threads (one per rank, each with its own
// emulated device, client and engine), their barrier and the daemon's
// figures at the window's edges. Run() once; it returns after every rank
// thread ended.
class ConfigRun {
 public:
  ConfigRun(const Config& cfg, const std::vector<float>& param_pattern,
            const std::vector<float>& grad_pattern)
      : cfg_(cfg),
        param_pattern_(param_pattern),
        grad_pattern_(grad_pattern),
        barrier_(cfg.ranks),
        rank0_clients_(cfg.jobs, nullptr),
        reducers_(cfg.jobs),
        job_ids_(cfg.jobs),
        ranks_(cfg.ranks) {
    for (int j = 0; j < cfg.jobs; ++j) {
      job_ids_[j] = absl::StrCat(absl::GetFlag(FLAGS_job_prefix), "-", cfg.label(), "-", j, "-",
                                 getpid());
      tokens_.push_back(NewToken());  // the job's, shared by its ranks
      if (absl::GetFlag(FLAGS_important_reduce) == "device") {
        reducers_[j] = std::make_unique<LocalReducer>(cfg.ranks / cfg.jobs,
                                                      LocalReducer::Arithmetic::kNone);
      }
    }
  }

  absl::StatusOr<ConfigResult> Run() {
    std::vector<std::thread> threads;
    for (int r = 0; r < cfg_.ranks; ++r) {
      threads.emplace_back([this, r] {
        const int per_job = cfg_.ranks / cfg_.jobs;
        absl::Status s = RunRank(r / per_job, r % per_job);
        if (!s.ok()) {
          Fail(absl::StrCat(cfg_.label(), " rank ", r % per_job, " of job ", r / per_job), s);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return Summarize();
  }

 private:
  absl::Status Snap(Snapshot* out) {
    out->wall = Now();
    const std::vector<int> pids = DaemonPids();
    if (!pids.empty()) {
      // The CPU of the daemons this configuration uses, summed.
      out->daemon_cpu_s = 0;
      for (int d = 0; d < cfg_.daemons && d < static_cast<int>(pids.size()); ++d) {
        ZF_ASSIGN_OR_RETURN(double cpu, ProcessCpuSeconds(pids[d]));
        out->daemon_cpu_s += cpu;
      }
    }
    out->self_cpu_s = SelfCpuSeconds();
    out->host_busy_s = HostBusySeconds();
    out->jobs.clear();
    std::vector<Client*> clients;
    {
      MutexLock lock(&mu_);
      clients = rank0_clients_;
    }
    for (int j = 0; j < cfg_.jobs; ++j) {
      ZF_ASSIGN_OR_RETURN(v1::GetStatsResponse st, clients[j]->GetStats(job_ids_[j]));
      // One JobStats per daemon the job is spread over.
      std::vector<const v1::JobStats*> found;
      for (const v1::JobStats& js : st.jobs()) {
        if (js.job_id() == job_ids_[j]) found.push_back(&js);
      }
      if (static_cast<int>(found.size()) != cfg_.daemons) {
        return absl::NotFoundError(absl::StrCat("GetStats has ", found.size(), " parts of job ",
                                                job_ids_[j], ", not ", cfg_.daemons));
      }
      out->jobs.push_back(MergeJobStats(found));
    }
    return absl::OkStatus();
  }

  void SnapOrFail(Snapshot* out) {
    absl::Status s = Snap(out);
    if (!s.ok()) Fail(absl::StrCat(cfg_.label(), " GetStats"), s);
  }

  absl::Status RunRank(int job, int rank) {
    const int per_job = cfg_.ranks / cfg_.jobs;
    RankResult& res = ranks_[job * per_job + rank];
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<worker::EmulatedBackend> be,
                        worker::MakeEmulatedBackend(absl::GetFlag(FLAGS_device_profile)));
    // The model: --tensors [4096, cols] tensors and one [4096].
    const int ntensors = absl::GetFlag(FLAGS_tensors);
    const int64_t cols = absl::GetFlag(FLAGS_params) / kRows / ntensors;
    std::vector<worker::DeviceBuffer> param(ntensors + 1), grad(ntensors + 1);
    std::vector<ParamSpec> specs;
    v1::JobSpec want;
    want.set_job_id(job_ids_[job]);
    for (int i = 0; i <= ntensors; ++i) {
      ParamSpec ps;
      ps.name = i < ntensors ? absl::StrCat("w", i) : "norm";
      ps.shape = i < ntensors ? std::vector<int64_t>{kRows, cols} : std::vector<int64_t>{kVector};
      const int64_t n = i < ntensors ? kRows * cols : kVector;
      ZF_RETURN_IF_ERROR(param[i].Reserve(be.get(), n * sizeof(float)));
      ZF_RETURN_IF_ERROR(grad[i].Reserve(be.get(), n * sizeof(float)));
      // Written once: the emulated device keeps the bytes of a large copy
      // the first time, so the packed shards carry these values every step.
      for (int64_t off = 0; off < n; off += kPatternFloats) {
        const int64_t len = std::min(kPatternFloats, n - off);
        ZF_RETURN_IF_ERROR(be->CopyToDevice(param[i].f32() + off, param_pattern_.data(), len * 4));
        ZF_RETURN_IF_ERROR(be->CopyToDevice(grad[i].f32() + off, grad_pattern_.data(), len * 4));
      }
      ps.param = param[i].f32();
      ps.grad = grad[i].f32();
      specs.push_back(ps);
      v1::TensorSpec* ts = want.add_tensors();
      ts->set_name(ps.name);
      ts->mutable_shape()->Add(ps.shape.begin(), ps.shape.end());
    }
    ZF_RETURN_IF_ERROR(be->Synchronize());
    want.set_world_size(per_job);
    want.set_mode(v1::MODE_ZENFLOW);
    want.set_wire_dtype(v1::DTYPE_BF16);
    want.set_rank_ordered_sums(cfg_.rank_ordered);
    const float lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
    want.mutable_adamw()->set_lr(lr);
    v1::ZenFlowConfig* z = want.mutable_zenflow();
    z->set_topk_ratio(static_cast<float>(absl::GetFlag(FLAGS_topk)));
    z->set_update_interval(absl::GetFlag(FLAGS_interval));
    z->mutable_apply_delay()->set_adaptive(true);

    const double t_setup = Now();
    ClientOptions co;
    {
      const std::vector<std::string> targets = Targets();
      co.target = absl::StrJoin(targets.begin(), targets.begin() + cfg_.daemons, ",");
    }
    co.token = tokens_[job];
    ZF_ASSIGN_OR_RETURN(co.transport, ParseTransport(absl::GetFlag(FLAGS_transport)));
    co.ucx.tls = absl::GetFlag(FLAGS_ucx_tls);
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(co));
    ZF_ASSIGN_OR_RETURN(v1::JobSpec spec,
                        JoinOrCreateJob(client.get(), want, rank, be.get(), specs));
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<ZenFlowOptimizer> opt,
                        ZenFlowOptimizer::Create(be.get(), client.get(), spec, rank, specs));
    if (reducers_[job] != nullptr) opt->set_gradient_reducer(reducers_[job]->ForRank(rank));
    res.setup_s = Now() - t_setup;
    if (rank == 0) {
      MutexLock lock(&mu_);
      rank0_clients_[job] = client.get();
      interval_ = std::max(1, spec.zenflow().update_interval());
    }
    barrier_.Wait(nullptr);  // every rank of every job set up: step together

    const int steps = absl::GetFlag(FLAGS_steps);
    const int warmup = std::min(steps, 2 * interval());
    const int device_ms = absl::GetFlag(FLAGS_device_ms);
    for (int t = 0; t < steps; ++t) {
      if (t == warmup) barrier_.Wait([this] { SnapOrFail(&start_); });
      const double t0 = Now();
      if (device_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(device_ms));
      ZF_RETURN_IF_ERROR(opt->Step(t, lr));
      const double t1 = Now();
      if (t < warmup) continue;
      const StepStats& st = opt->last_step();
      ++res.steps_measured;
      res.step_s += t1 - t0;
      res.stall_s += st.stall_seconds;
      res.send_blocked_s += st.send_blocked_seconds;
      res.up_bytes += static_cast<double>(st.bytes_sent);
    }
    barrier_.Wait([this] { SnapOrFail(&end_); });
    const double t_fin = Now();
    ZF_RETURN_IF_ERROR(opt->Finish());
    res.finish_s = Now() - t_fin;
    opt.reset();
    barrier_.Wait(nullptr);  // every rank done with its job
    if (rank == 0) ZF_RETURN_IF_ERROR(client->DeleteJob(job_ids_[job]));
    return absl::OkStatus();
  }

  int interval() {
    MutexLock lock(&mu_);
    return interval_;
  }

  absl::StatusOr<ConfigResult> Summarize() {
    ConfigResult r;
    r.cfg = cfg_;
    r.measured_steps = ranks_[0].steps_measured;
    r.warmup_steps = absl::GetFlag(FLAGS_steps) - r.measured_steps;
    if (r.measured_steps <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--steps=", absl::GetFlag(FLAGS_steps), " leaves no step after the ", r.warmup_steps,
          "-step warm-up"));
    }
    r.window_s = end_.wall - start_.wall;
    std::vector<double> bounds;
    std::vector<int64_t> counts;
    double update_sum = 0;
    int64_t update_count = 0;
    for (int j = 0; j < cfg_.jobs; ++j) {
      const v1::JobStats& a = start_.jobs[j];
      const v1::JobStats& b = end_.jobs[j];
      r.shard_bytes += b.shard_bytes_received() - a.shard_bytes_received();
      r.rounds += b.rounds_updated() - a.rounds_updated();
      r.job_memory_bytes += b.memory_bytes();
      const v1::Histogram& ha = a.round_update_seconds();
      const v1::Histogram& hb = b.round_update_seconds();
      if (bounds.empty()) {
        bounds.assign(hb.upper_bounds().begin(), hb.upper_bounds().end());
        counts.assign(hb.counts_size(), 0);
      }
      if (hb.counts_size() != static_cast<int>(counts.size()) ||
          ha.counts_size() != hb.counts_size()) {
        return absl::InternalError("round_update_seconds buckets differ between snapshots or jobs");
      }
      for (int i = 0; i < hb.counts_size(); ++i) counts[i] += hb.counts(i) - ha.counts(i);
      update_sum += hb.sum() - ha.sum();
      update_count += hb.count() - ha.count();
    }
    r.accumulate_bytes_per_s = r.window_s > 0 ? static_cast<double>(r.shard_bytes) / r.window_s : 0;
    r.p50_ms = BucketQuantile(bounds, counts, 0.5) * 1e3;
    r.p99_ms = BucketQuantile(bounds, counts, 0.99) * 1e3;
    if (update_count == 0) r.p50_ms = r.p99_ms = -1;
    r.mean_update_ms = update_count > 0 ? 1e3 * update_sum / update_count : -1;
    double step_s = 0, stall_s = 0, blocked_s = 0, up = 0, setup = 0, fin = 0;
    for (const RankResult& rr : ranks_) {
      step_s += rr.step_s;
      stall_s += rr.stall_s;
      blocked_s += rr.send_blocked_s;
      up += rr.up_bytes;
      setup = std::max(setup, rr.setup_s);
      fin = std::max(fin, rr.finish_s);
    }
    const double rank_steps = static_cast<double>(cfg_.ranks) * r.measured_steps;
    r.stall_fraction = step_s > 0 ? stall_s / step_s : 0;
    r.mean_step_ms = 1e3 * step_s / rank_steps;
    r.stall_ms_per_step = 1e3 * stall_s / rank_steps;
    r.send_blocked_ms_per_step = 1e3 * blocked_s / rank_steps;
    r.shard_bytes_per_rank_per_step = static_cast<double>(r.shard_bytes) / rank_steps;
    r.up_bytes_per_rank_per_step = up / rank_steps;
    r.setup_s = setup;
    r.finish_ms = 1e3 * fin;
    r.bench_cpu_s = end_.self_cpu_s - start_.self_cpu_s;
    if (start_.daemon_cpu_s >= 0) {
      r.daemon_cpu_s = end_.daemon_cpu_s - start_.daemon_cpu_s;
      r.daemon_cpu_s_per_round = r.rounds > 0 ? r.daemon_cpu_s / r.rounds : -1;
      if (start_.host_busy_s >= 0 && end_.host_busy_s >= 0) {
        r.other_cpu_s = std::max(
            0.0, end_.host_busy_s - start_.host_busy_s - r.daemon_cpu_s - r.bench_cpu_s);
      }
    }
    return r;
  }

  const Config cfg_;
  const std::vector<float>& param_pattern_;
  const std::vector<float>& grad_pattern_;
  Barrier barrier_;
  Mutex mu_;
  // Each job's rank 0 client, for GetStats (set before the first barrier).
  std::vector<Client*> rank0_clients_ ABSL_GUARDED_BY(mu_);
  // Per job with --important_reduce=device: its ranks' reduce rendezvous.
  std::vector<std::unique_ptr<LocalReducer>> reducers_;
  int interval_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::string> job_ids_;
  std::vector<std::string> tokens_;
  // Written by the last thread at a barrier, read after the threads end.
  Snapshot start_, end_;
  std::vector<RankResult> ranks_;  // by job * ranks per job + rank; each by its own thread
};

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

void OptionalDouble(JsonWriter* w, const char* key, double v) {
  w->Key(key);
  if (v < 0) {
    w->Null();
  } else {
    w->Double(v);
  }
}

void WriteRun(const ConfigResult& r, JsonWriter* w) {
  w->BeginObject();
  w->Key("ranks").Int(r.cfg.ranks);
  w->Key("jobs").Int(r.cfg.jobs);
  w->Key("sums").String(r.cfg.sums());
  w->Key("daemons").Int(r.cfg.daemons);
  w->Key("accumulate_bytes_per_s").Double(r.accumulate_bytes_per_s);
  OptionalDouble(w, "round_update_p50_ms", r.p50_ms);
  OptionalDouble(w, "round_update_p99_ms", r.p99_ms);
  w->Key("stall_fraction").Double(r.stall_fraction);
  OptionalDouble(w, "daemon_cpu_s_per_round", r.daemon_cpu_s_per_round);
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
  w->Key("job_memory_bytes").Int(r.job_memory_bytes);
  w->Key("setup_s").Double(r.setup_s);
  w->Key("finish_ms").Double(r.finish_ms);
  w->EndObject();
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_target).empty()) {
    return absl::InvalidArgumentError("--target is required");
  }
  const int ntensors = absl::GetFlag(FLAGS_tensors);
  const int64_t cols = absl::GetFlag(FLAGS_params) / kRows / std::max(1, ntensors);
  if (ntensors < 1 || cols < 1 || absl::GetFlag(FLAGS_device_ms) < 0 ||
      absl::GetFlag(FLAGS_steps) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensors and --steps must be >= 1, --device_ms >= 0 and --params at least ",
        kRows * std::max(1, ntensors)));
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
  const int64_t params = ntensors * kRows * cols + kVector;
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
               static_cast<long long>(params), ntensors, static_cast<long long>(kRows),
               static_cast<long long>(cols), static_cast<long long>(kVector),
               profile.name.c_str(), absl::GetFlag(FLAGS_device_ms),
               absl::GetFlag(FLAGS_transport).c_str(), absl::GetFlag(FLAGS_target).c_str());
  const double t_start = Now();
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
        ConfigRun run(cfg, param_pattern, grad_pattern);
        ZF_ASSIGN_OR_RETURN(ConfigResult r, run.Run());
        std::fprintf(stderr,
                     "scale_bench:   %.2f GB/s accumulated, %lld rounds, round update p50 %.1f "
                     "p99 %.1f ms (mean %.1f), stall %.3f, daemon %.4f CPU s/round, step %.1f "
                     "ms\n",
                     r.accumulate_bytes_per_s / 1e9, static_cast<long long>(r.rounds), r.p50_ms,
                     r.p99_ms, r.mean_update_ms, r.stall_fraction, r.daemon_cpu_s_per_round,
                     r.mean_step_ms);
        results.push_back(r);
      }
    }
  }
  // The several-daemons series: one job over 1, 2, 4 ... daemons.
  for (int d : daemon_counts) {
    Config cfg{absl::GetFlag(FLAGS_daemons_ranks), 1, true, d};
    std::fprintf(stderr, "scale_bench: %d rank(s) as 1 job over %d daemon(s) ...\n", cfg.ranks, d);
    ConfigRun run(cfg, param_pattern, grad_pattern);
    ZF_ASSIGN_OR_RETURN(ConfigResult r, run.Run());
    std::fprintf(stderr,
                 "scale_bench:   %.2f GB/s accumulated, %lld rounds, round update mean %.1f ms, "
                 "stall %.3f, daemons %.4f CPU s/round, step %.1f ms\n",
                 r.accumulate_bytes_per_s / 1e9, static_cast<long long>(r.rounds),
                 r.mean_update_ms, r.stall_fraction, r.daemon_cpu_s_per_round, r.mean_step_ms);
    results.push_back(r);
  }
  // The goal: in every (jobs, sums) series, no run accumulates less than
  // 0.95 x the run with the next fewer ranks (unless it is within 5% of the
  // ceiling, which it cannot pass).
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
  const double runtime_s = Now() - t_start;

  JsonWriter json;
  json.BeginObject();
  json.Key("device_profile").String(profile.name);
  json.Key("transport").String(absl::GetFlag(FLAGS_transport));
  json.Key("important_reduce").String(absl::GetFlag(FLAGS_important_reduce));
  json.Key("params_per_job").Int(params);
  if (absl::GetFlag(FLAGS_transport) == "ucx") {
    json.Key("ucx_tls").String(absl::GetFlag(FLAGS_ucx_tls));
  }
  json.Key("emulated").Bool(true);
  json.Key("device_ms").Int(absl::GetFlag(FLAGS_device_ms));
  json.Key("device_ms_choice").String(
      "small, so that the daemon sets the pace: device_offered_bytes_per_s_per_rank (a rank's "
      "shards / (device_ms + their modelled device-to-host copy)) is far above what the daemon "
      "takes in");
  json.Key("device_offered_bytes_per_s_per_rank").Double(offered);
  json.Key("tensors").Int(ntensors);
  json.Key("steps").Int(absl::GetFlag(FLAGS_steps));
  json.Key("warmup_steps").Int(results.empty() ? 0 : results[0].warmup_steps);
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
  json.EndObject();
  json.Key("goal").String(
      "aggregate accumulate bytes/s does not fall as ranks grow (every run >= 0.95 x the run "
      "with fewer ranks of its jobs/sums series, or >= 0.95 x the ceiling)");
  json.Key("goal_met").Bool(goal_met);
  json.Key("runtime_s").Double(runtime_s);
  json.Key("accumulate_ceiling_source").String(absl::GetFlag(FLAGS_accumulate_ceiling_source));
  OptionalDouble(&json, "accumulate_ceiling_bytes_per_s", ceiling > 0 ? ceiling : -1);
  json.Key("runs").BeginArray();
  for (const ConfigResult& r : results) WriteRun(r, &json);
  json.EndArray();
  json.EndObject();
  const std::string out = absl::GetFlag(FLAGS_out);
  ZF_RETURN_IF_ERROR(json.WriteFile(out));

  std::printf("\nscale_bench (EMULATED %s devices, %d ms/step, %lld params per job, %s, bf16, "
              "k=%g, S=%d; %d steps, warm-up %d)\n",
              profile.name.c_str(), absl::GetFlag(FLAGS_device_ms), static_cast<long long>(params),
              absl::GetFlag(FLAGS_transport).c_str(), absl::GetFlag(FLAGS_topk),
              absl::GetFlag(FLAGS_interval), absl::GetFlag(FLAGS_steps),
              results.empty() ? 0 : results[0].warmup_steps);
  std::printf("%5s %4s %-12s %7s %10s %8s %9s %9s %7s %12s %7s\n", "ranks", "jobs", "sums", "daemons", "GB/s",
              "of ceil", "p50 ms", "p99 ms", "stall", "CPU s/round", "rounds");
  for (const ConfigResult& r : results) {
    std::printf("%5d %4d %-12s %7d %10.2f %7.0f%% %9.1f %9.1f %7.3f %12.4f %7lld\n", r.cfg.ranks,
                r.cfg.jobs, r.cfg.sums().c_str(), r.cfg.daemons, r.accumulate_bytes_per_s / 1e9,
                ceiling > 0 ? 100 * r.accumulate_bytes_per_s / ceiling : 0.0, r.p50_ms, r.p99_ms,
                r.stall_fraction, r.daemon_cpu_s_per_round, static_cast<long long>(r.rounds));
  }
  if (ceiling > 0) {
    std::printf("ceiling: %.2f GB/s bf16 accumulate (%s)\n", ceiling / 1e9,
                absl::GetFlag(FLAGS_accumulate_ceiling_source).c_str());
  }
  std::printf("goal (aggregate does not fall as ranks grow): %s\n", goal_met ? "met" : "NOT met");
  std::printf("runtime %.1f s; JSON in %s\n", runtime_s, out.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  return zenflow::RunBenchMain(
      argc, argv, "scale_bench",
      "aggregate accumulate bytes/s, round update latency, stall and daemon CPU per round for "
      "1..8 EMULATED ranks on one job and over 2 jobs, per-rank vs shared sums (see --target).",
      zenflow::Run);
}
