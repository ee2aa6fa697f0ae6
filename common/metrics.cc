// zenflowd's Prometheus metrics; see metrics.h.
#include "common/metrics.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace zenflow {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<std::pair<std::string, std::string>>;

// Families in the order first named; samples appended to them.
class Families {
 public:
  void Gauge(const std::string& name, const std::string& help, const Labels& labels,
             double value) {
    Add(name, help, MetricType::Gauge, labels).gauge.value = value;
  }
  void Counter(const std::string& name, const std::string& help, const Labels& labels,
               double value) {
    Add(name, help, MetricType::Counter, labels).counter.value = value;
  }
  // A v1.Histogram (per-bucket counts, the last above every bound) as
  // Prometheus' cumulative buckets ending with +Inf.
  void Histogram(const std::string& name, const std::string& help, const Labels& labels,
                 const v1::Histogram& h) {
    ClientMetric& m = Add(name, help, MetricType::Histogram, labels);
    uint64_t cumulative = 0;
    for (int i = 0; i < h.upper_bounds_size(); ++i) {
      if (i < h.counts_size()) cumulative += static_cast<uint64_t>(h.counts(i));
      m.histogram.bucket.push_back({cumulative, h.upper_bounds(i)});
    }
    m.histogram.bucket.push_back(
        {static_cast<uint64_t>(h.count()), std::numeric_limits<double>::infinity()});
    m.histogram.sample_count = static_cast<uint64_t>(h.count());
    m.histogram.sample_sum = h.sum();
  }
  std::vector<MetricFamily> Take() {
    std::vector<MetricFamily> out;
    for (MetricFamily& f : families_) {
      if (!f.metric.empty()) out.push_back(std::move(f));
    }
    families_.clear();
    index_.clear();
    return out;
  }

 private:
  ClientMetric& Add(const std::string& name, const std::string& help, MetricType type,
                    const Labels& labels) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      it = index_.emplace(name, families_.size()).first;
      families_.push_back(MetricFamily{name, help, type, {}});
    }
    MetricFamily& f = families_[it->second];
    f.metric.emplace_back();
    for (const auto& [k, v] : labels) f.metric.back().label.push_back({k, v});
    return f.metric.back();
  }

  std::vector<MetricFamily> families_;
  std::map<std::string, size_t> index_;
};

void AddWorker(Families* f, const Labels& l, const v1::WorkerStats& w) {
  f->Counter("zenflow_worker_stall_seconds_total",
             "Time the worker's steps waited for the daemon's deltas (the GPU stall).", l,
             w.stall_seconds());
  f->Counter("zenflow_worker_step_seconds_total", "Wall time of the worker's steps.", l,
             w.step_seconds());
  f->Counter("zenflow_worker_steps_total", "Steps the worker reported.", l,
             static_cast<double>(w.steps()));
  f->Histogram("zenflow_worker_stall_per_step_seconds", "The GPU stall of each step.", l,
               w.stall_per_step_seconds());
  f->Counter("zenflow_worker_send_blocked_seconds_total",
             "Time the worker's steps were blocked on its send window.", l,
             w.send_blocked_seconds());
  f->Counter("zenflow_worker_up_bytes_total", "Bytes the worker sent to the daemon.", l,
             static_cast<double>(w.up_bytes()));
  f->Counter("zenflow_worker_down_bytes_total", "Bytes the worker received from the daemon.", l,
             static_cast<double>(w.down_bytes()));
}

}  // namespace

std::vector<MetricFamily> RenderMetrics(const v1::GetStatsResponse& s) {
  Families f;
  f.Gauge("zenflow_build_info", "zenflowd's version, source commit and SIMD level; always 1.",
          {{"version", s.version()}, {"commit", s.commit()}, {"simd", s.simd()}}, 1);
  f.Gauge("zenflow_process_resident_memory_bytes", "zenflowd's resident memory.", {},
          static_cast<double>(s.resident_bytes()));
  f.Counter("zenflow_process_cpu_seconds_total", "CPU time zenflowd used (user + system).", {},
            s.cpu_seconds());
  f.Gauge("zenflow_memory_budget_bytes", "The memory budget for jobs (--memory_budget_bytes).",
          {}, static_cast<double>(s.memory_budget_bytes()));
  f.Gauge("zenflow_memory_reserved_bytes", "Bytes of the budget the open jobs hold.", {},
          static_cast<double>(s.memory_reserved_bytes()));
  f.Gauge("zenflow_jobs", "Open jobs.", {}, static_cast<double>(s.jobs_size()));
  f.Gauge("zenflow_jobs_limit", "The most jobs zenflowd holds at once (--max_jobs).", {},
          static_cast<double>(s.max_jobs()));
  for (const v1::RejectionCount& r : s.rejections()) {
    f.Counter("zenflow_rejections_total", "Requests and stream messages refused, by code and where.",
              {{"code", r.code()}, {"reason", r.reason()}}, static_cast<double>(r.count()));
  }
  for (const v1::CallCount& c : s.calls()) {
    f.Counter("zenflow_grpc_calls_total", "gRPC calls finished, by method and status code.",
              {{"method", c.method()}, {"code", c.code()}}, static_cast<double>(c.count()));
  }
  if (s.ucx().enabled()) {
    f.Gauge("zenflow_ucx_connections", "Ranks attached over UCX now.", {},
            static_cast<double>(s.ucx().connections()));
    f.Counter("zenflow_ucx_connections_cut_total",
              "UCX connections closed because the rank did not take what it was sent.", {},
              static_cast<double>(s.ucx().connections_cut()));
  }
  for (const v1::JobStats& j : s.jobs()) {
    const Labels job = {{"job", j.job_id()}};
    int attached = 0;
    int32_t delay = 0, staleness = 0;
    for (const v1::RankStats& r : j.ranks()) {
      attached += r.attached() ? 1 : 0;
      delay = std::max(delay, r.worker().apply_delay_steps());
      staleness = std::max(staleness, r.worker().staleness_steps());
    }
    f.Gauge("zenflow_job_ranks_attached", "Ranks with a data stream attached.", job, attached);
    f.Gauge("zenflow_job_world_size", "The job's ranks.", job, j.world_size());
    f.Gauge("zenflow_job_parameters", "Parameters the job hosts.", job,
            static_cast<double>(j.params()));
    f.Gauge("zenflow_job_state_bytes", "fp32 master, m, v and accumulation buffers.", job,
            static_cast<double>(j.state_bytes()));
    for (const v1::TransportStats& t : j.transports()) {
      const Labels jt = {{"job", j.job_id()}, {"transport", t.transport()}};
      f.Counter("zenflow_job_shards_received_total", "Gradient shards accepted.", jt,
                static_cast<double>(t.shards_received()));
      f.Counter("zenflow_job_received_bytes_total", "Payload bytes of the accepted shards.", jt,
                static_cast<double>(t.shard_bytes_received()));
      f.Counter("zenflow_job_deltas_sent_total", "Parameter deltas written to ranks.", jt,
                static_cast<double>(t.deltas_sent()));
      f.Counter("zenflow_job_sent_bytes_total", "Bytes of the deltas written to ranks.", jt,
                static_cast<double>(t.delta_bytes_sent()));
    }
    f.Counter("zenflow_job_rounds_completed_total", "Rounds whose update finished (skipped too).",
              job, static_cast<double>(j.rounds_updated()));
    f.Counter("zenflow_job_rounds_skipped_total", "Rounds skipped for non-finite gradients.", job,
              static_cast<double>(j.rounds_skipped_nonfinite()));
    f.Histogram("zenflow_job_round_update_seconds", "Time of each round's update.", job,
                j.round_update_seconds());
    f.Histogram("zenflow_job_round_accumulate_seconds",
                "Time from a round's first shard to its last close.", job,
                j.round_accumulate_seconds());
    f.Gauge("zenflow_job_update_queue_depth", "Rounds closed whose update has not finished.",
            job, static_cast<double>(j.update_queue_depth()));
    f.Gauge("zenflow_job_update_interval_steps",
            "Steps of the last fully closed round: the update interval S in use (with "
            "update_interval auto it changes from round to round).",
            job, static_cast<double>(j.last_round_steps()));
    if (j.has_update_divergence()) {
      f.Gauge("zenflow_job_update_divergence",
              "The last measured round's update divergence: ||applied - per-step AdamW|| / "
              "||per-step AdamW|| of the daemon's columns, on a ~1% sample (docs/design.md rule "
              "14).",
              job, static_cast<double>(j.update_divergence()));
    }
    f.Gauge("zenflow_job_apply_delay_steps",
            "The apply delay the ranks report (the largest), in steps.", job, delay);
    f.Gauge("zenflow_job_staleness_steps",
            "Steps between a round's gradients and the step its update was applied at, as the "
            "ranks last reported (the largest).",
            job, staleness);
    for (const v1::RankStats& r : j.ranks()) {
      if (r.worker().steps() == 0) continue;  // nothing reported yet
      AddWorker(&f, {{"job", j.job_id()}, {"rank", absl::StrCat(r.rank())}}, r.worker());
    }
  }
  return f.Take();
}

std::vector<MetricFamily> RenderWorkerMetrics(const std::string& job, int32_t rank,
                                              const v1::WorkerStats& worker) {
  Families f;
  AddWorker(&f, {{"job", job}, {"rank", absl::StrCat(rank)}}, worker);
  return f.Take();
}

class MetricsServer::Collector : public prometheus::Collectable {
 public:
  explicit Collector(CollectFn fn) : fn_(std::move(fn)) {}
  std::vector<MetricFamily> Collect() const override { return fn_(); }

 private:
  const CollectFn fn_;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                     CollectFn collect) {
  std::vector<std::string> parts = absl::StrSplit(address, absl::MaxSplits(':', 1));
  int port = 0;
  if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", address, "' must be host:port, e.g. 127.0.0.1:9464"));
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->collector_ = std::make_shared<Collector>(std::move(collect));
  try {
    // One thread: a scrape is cheap and scrapers are few.
    s->exposer_ = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  s->exposer_->RegisterCollectable(s->collector_);
  const std::vector<int> ports = s->exposer_->GetListeningPorts();
  s->port_ = ports.empty() ? port : ports.front();
  return s;
}

MetricsServer::~MetricsServer() {
  if (exposer_ != nullptr) exposer_->RemoveCollectable(collector_);
  exposer_.reset();
}

}  // namespace zenflow
