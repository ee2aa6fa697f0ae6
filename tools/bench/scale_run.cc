#include "tools/bench/scale_run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/mutex.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/engine/local_reducer.h"
#include "gpu_worker/engine/zenflow_optimizer.h"
#include "gpu_worker/kernels/emulated_backend.h"
#include "tools/bench/cpu_time.h"

// scale_bench's flags (tools/bench/scale_bench.cc).
ABSL_DECLARE_FLAG(std::string, target);
ABSL_DECLARE_FLAG(std::string, daemon_pid);
ABSL_DECLARE_FLAG(std::string, transport);
ABSL_DECLARE_FLAG(std::string, ucx_tls);
ABSL_DECLARE_FLAG(std::string, device_profile);
ABSL_DECLARE_FLAG(int, device_ms);
ABSL_DECLARE_FLAG(int64_t, params);
ABSL_DECLARE_FLAG(int, tensors);
ABSL_DECLARE_FLAG(int, steps);
ABSL_DECLARE_FLAG(double, topk);
ABSL_DECLARE_FLAG(int, interval);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(std::string, important_reduce);
ABSL_DECLARE_FLAG(std::string, job_prefix);

namespace zenflow {

// The daemon's name for its update threads (server/update_scheduler.h
// kUpdateThreadName; a bench binary does not depend on server/).
constexpr char kUpdateThreadName[] = "zf-update";


double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<float> RandomPattern(uint64_t seed, float scale) {
  std::vector<float> v(kPatternFloats);
  for (float& x : v) {
    x = scale * static_cast<float>(static_cast<double>(NextRandom(&seed) >> 40) *
                                       (1.0 / (1ull << 23)) -
                                   1.0);
  }
  return v;
}

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

v1::JobSpec WantedJobSpec(const std::string& job_id, int world_size, bool rank_ordered) {
  v1::JobSpec want;
  want.set_job_id(job_id);
  const int ntensors = absl::GetFlag(FLAGS_tensors);
  const int64_t cols = absl::GetFlag(FLAGS_params) / kScaleRows / std::max(1, ntensors);
  for (int i = 0; i <= ntensors; ++i) {
    v1::TensorSpec* ts = want.add_tensors();
    ts->set_name(i < ntensors ? absl::StrCat("w", i) : "norm");
    if (i < ntensors) {
      ts->add_shape(kScaleRows);
      ts->add_shape(cols);
    } else {
      ts->add_shape(kScaleVector);
    }
  }
  want.set_world_size(world_size);
  want.set_mode(v1::MODE_ZENFLOW);
  want.set_wire_dtype(v1::DTYPE_BF16);
  want.set_rank_ordered_sums(rank_ordered);
  want.mutable_adamw()->set_lr(static_cast<float>(absl::GetFlag(FLAGS_lr)));
  v1::ZenFlowConfig* z = want.mutable_zenflow();
  z->set_topk_ratio(static_cast<float>(absl::GetFlag(FLAGS_topk)));
  z->set_update_interval(absl::GetFlag(FLAGS_interval));
  z->mutable_apply_delay()->set_adaptive(true);
  return want;
}

namespace {

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
  std::vector<ThreadCpuSnapshot> daemon_threads;  // per daemon used, with daemon_cpu_s
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
      out->daemon_threads.clear();
      for (int d = 0; d < cfg_.daemons && d < static_cast<int>(pids.size()); ++d) {
        ZF_ASSIGN_OR_RETURN(ThreadCpuSnapshot threads, ReadThreadCpu(pids[d]));
        ZF_ASSIGN_OR_RETURN(double cpu, ProcessCpuSeconds(pids[d]));
        out->daemon_cpu_s += cpu;
        out->daemon_threads.push_back(std::move(threads));
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
    const v1::JobSpec want = WantedJobSpec(job_ids_[job], per_job, cfg_.rank_ordered);
    const int ntensors = want.tensors_size();
    std::vector<worker::DeviceBuffer> param(ntensors), grad(ntensors);
    std::vector<ParamSpec> specs;
    for (int i = 0; i < ntensors; ++i) {
      const v1::TensorSpec& ts = want.tensors(i);
      ParamSpec ps;
      ps.name = ts.name();
      ps.shape.assign(ts.shape().begin(), ts.shape().end());
      int64_t n = 1;
      for (int64_t d : ps.shape) n *= d;
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
    }
    ZF_RETURN_IF_ERROR(be->Synchronize());
    const float lr = want.adamw().lr();

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
    // Every rank done with its job, every round closed and updated: the
    // job's shard bytes over the whole run are exact here (the window's
    // edges leave shards in flight).
    barrier_.Wait([this] { SnapOrFail(&done_); });
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
    int64_t run_shard_bytes = 0;
    for (const v1::JobStats& js : done_.jobs) run_shard_bytes += js.shard_bytes_received();
    r.run_shard_bytes_per_rank_per_step =
        static_cast<double>(run_shard_bytes) /
        (static_cast<double>(cfg_.ranks) * absl::GetFlag(FLAGS_steps));
    r.up_bytes_per_rank_per_step = up / rank_steps;
    r.setup_s = setup;
    r.finish_ms = 1e3 * fin;
    r.bench_cpu_s = end_.self_cpu_s - start_.self_cpu_s;
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (start_.host_busy_s >= 0 && end_.host_busy_s >= 0 && cpus > 0 && r.window_s > 0) {
      r.host_busy_fraction = (end_.host_busy_s - start_.host_busy_s) /
                             (r.window_s * static_cast<double>(cpus));
    }
    if (start_.daemon_cpu_s >= 0) {
      r.daemon_cpu_s = end_.daemon_cpu_s - start_.daemon_cpu_s;
      r.daemon_cpu_s_per_round = r.rounds > 0 ? r.daemon_cpu_s / r.rounds : -1;
      // The round updates' CPU: the daemons' zf-update threads (the update
      // scheduler's drivers and the update pool); the rest is the ingest
      // path's and everything else the daemon does.
      r.update_cpu_s = 0;
      for (size_t d = 0; d < end_.daemon_threads.size() && d < start_.daemon_threads.size(); ++d) {
        r.update_cpu_s += NamedThreadsCpuDelta(start_.daemon_threads[d], end_.daemon_threads[d],
                                               kUpdateThreadName);
      }
      r.outside_update_cpu_s = std::max(0.0, r.daemon_cpu_s - r.update_cpu_s);
      r.ingest_bytes_per_cpu_s = r.outside_update_cpu_s > 0
                                     ? static_cast<double>(r.shard_bytes) / r.outside_update_cpu_s
                                     : -1;
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
  Snapshot start_, end_, done_;
  std::vector<RankResult> ranks_;  // by job * ranks per job + rank; each by its own thread
};

}  // namespace

absl::StatusOr<ConfigResult> RunConfig(const Config& cfg, const std::vector<float>& param_pattern,
                                       const std::vector<float>& grad_pattern) {
  ConfigRun run(cfg, param_pattern, grad_pattern);
  return run.Run();
}

}  // namespace zenflow
