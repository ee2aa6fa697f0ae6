// Prometheus metrics: zenflowd's GetStats snapshot (and a worker's own figures) rendered as
// metric families (docs/operating.md#metrics), and the /metrics endpoint that serves
// them (prometheus-cpp). The figures are GetStats' own, read at scrape time,
// so a scrape and a GetStats call agree, and a deleted job's series are gone
// from the next scrape.
//
//   ZF_ASSIGN_OR_RETURN(auto server, MetricsServer::Start("127.0.0.1:9464", [&] { return Stats(); }));
#ifndef ZENFLOW_COMMON_METRICS_H_
#define ZENFLOW_COMMON_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/metric_family.h"
#include "zenflow/v1/zenflow.pb.h"

namespace prometheus {
class Exposer;
}

namespace zenflow {

// Every zenflow_* family of one snapshot. Families without samples are
// left out. Pure: no clock, no I/O.
std::vector<prometheus::MetricFamily> RenderMetrics(const v1::GetStatsResponse& stats);

// The worker's own figures (zf_train --metrics_listen): the zenflow_worker_*
// families for one rank.
std::vector<prometheus::MetricFamily> RenderWorkerMetrics(const std::string& job, int32_t rank,
                                                          const v1::WorkerStats& worker);

// Serves /metrics over HTTP. Thread-safe; `collect` runs on the server's
// threads, once per scrape.
class MetricsServer {
 public:
  using CollectFn = std::function<std::vector<prometheus::MetricFamily>()>;
  // `address` is host:port (port 0 picks a free one). UNAVAILABLE when it
  // cannot be bound, INVALID_ARGUMENT when it is malformed.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              CollectFn collect);
  ~MetricsServer();
  // The port it listens on.
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  class Collector;
  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_METRICS_H_
