// The metrics rendering of a GetStats snapshot, and the /metrics endpoint
// over a real loopback HTTP connection.
#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include <cmath>

namespace zenflow {
namespace {

v1::GetStatsResponse Snapshot() {
  v1::GetStatsResponse s;
  s.set_version("0.1.0");
  s.set_commit("abc");
  s.set_simd("avx2");
  s.set_memory_budget_bytes(1000);
  s.set_memory_reserved_bytes(400);
  s.set_max_jobs(64);
  s.set_resident_bytes(5000);
  s.set_cpu_seconds(1.5);
  v1::RejectionCount* r = s.add_rejections();
  r->set_code("INVALID_ARGUMENT");
  r->set_reason("stream");
  r->set_count(3);
  v1::CallCount* c = s.add_calls();
  c->set_method("CreateJob");
  c->set_code("OK");
  c->set_count(2);
  s.mutable_ucx()->set_enabled(true);
  s.mutable_ucx()->set_connections(2);
  v1::JobStats* j = s.add_jobs();
  j->set_job_id("j1");
  j->set_world_size(2);
  j->set_params(128);
  j->set_rounds_updated(7);
  j->set_update_queue_depth(1);
  j->set_last_round_steps(3);
  j->set_update_divergence(0.125f);
  v1::TransportStats* t = j->add_transports();
  t->set_transport("ucx");
  t->set_shards_received(10);
  t->set_shard_bytes_received(4096);
  v1::Histogram* h = j->mutable_round_update_seconds();
  h->add_upper_bounds(0.01);
  h->add_upper_bounds(0.1);
  h->add_counts(2);  // <= 0.01
  h->add_counts(3);  // (0.01, 0.1]
  h->add_counts(1);  // above
  h->set_count(6);
  h->set_sum(0.5);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankStats* rs = j->add_ranks();
    rs->set_rank(rank);
    rs->set_attached(rank == 0);
    rs->mutable_worker()->set_steps(rank == 0 ? 8 : 0);  // rank 1 reported nothing yet
    rs->mutable_worker()->set_stall_seconds(0.25);
    rs->mutable_worker()->set_step_seconds(2.0);
    rs->mutable_worker()->set_apply_delay_steps(rank + 1);
  }
  return s;
}

// family name -> the family.
std::map<std::string, prometheus::MetricFamily> ByName(std::vector<prometheus::MetricFamily> fs) {
  std::map<std::string, prometheus::MetricFamily> out;
  for (auto& f : fs) {
    EXPECT_EQ(out.count(f.name), 0u) << f.name << " twice";
    out[f.name] = std::move(f);
  }
  return out;
}

std::string Label(const prometheus::ClientMetric& m, const std::string& name) {
  for (const auto& l : m.label) {
    if (l.name == name) return l.value;
  }
  return "";
}

TEST(RenderMetricsTest, EveryFigureOfTheSnapshotBecomesItsSeries) {
  auto f = ByName(RenderMetrics(Snapshot()));
  ASSERT_EQ(f.count("zenflow_build_info"), 1u);
  EXPECT_EQ(Label(f["zenflow_build_info"].metric[0], "version"), "0.1.0");
  EXPECT_EQ(Label(f["zenflow_build_info"].metric[0], "simd"), "avx2");
  EXPECT_EQ(f["zenflow_memory_reserved_bytes"].metric[0].gauge.value, 400);
  EXPECT_EQ(f["zenflow_jobs"].metric[0].gauge.value, 1);
  EXPECT_EQ(f["zenflow_jobs_limit"].metric[0].gauge.value, 64);
  EXPECT_EQ(f["zenflow_process_cpu_seconds_total"].type, prometheus::MetricType::Counter);
  const auto& rej = f["zenflow_rejections_total"].metric[0];
  EXPECT_EQ(Label(rej, "code"), "INVALID_ARGUMENT");
  EXPECT_EQ(Label(rej, "reason"), "stream");
  EXPECT_EQ(rej.counter.value, 3);
  EXPECT_EQ(Label(f["zenflow_grpc_calls_total"].metric[0], "method"), "CreateJob");
  EXPECT_EQ(f["zenflow_ucx_connections"].metric[0].gauge.value, 2);
  EXPECT_EQ(f["zenflow_job_ranks_attached"].metric[0].gauge.value, 1);
  EXPECT_EQ(Label(f["zenflow_job_ranks_attached"].metric[0], "job"), "j1");
  EXPECT_EQ(f["zenflow_job_rounds_completed_total"].metric[0].counter.value, 7);
  EXPECT_EQ(f["zenflow_job_update_queue_depth"].metric[0].gauge.value, 1);
  EXPECT_EQ(f["zenflow_job_update_interval_steps"].metric[0].gauge.value, 3);
  EXPECT_EQ(f["zenflow_job_update_divergence"].metric[0].gauge.value, 0.125);
  EXPECT_EQ(Label(f["zenflow_job_update_divergence"].metric[0], "job"), "j1");
  EXPECT_EQ(f["zenflow_job_apply_delay_steps"].metric[0].gauge.value, 2);  // the largest
  const auto& shards = f["zenflow_job_shards_received_total"].metric[0];
  EXPECT_EQ(Label(shards, "transport"), "ucx");
  EXPECT_EQ(shards.counter.value, 10);
  // Cumulative buckets ending with +Inf, which holds every observation.
  const auto& hist = f["zenflow_job_round_update_seconds"].metric[0].histogram;
  ASSERT_EQ(hist.bucket.size(), 3u);
  EXPECT_EQ(hist.bucket[0].cumulative_count, 2u);
  EXPECT_EQ(hist.bucket[1].cumulative_count, 5u);
  EXPECT_EQ(hist.bucket[2].cumulative_count, 6u);
  EXPECT_TRUE(std::isinf(hist.bucket[2].upper_bound));
  EXPECT_EQ(hist.sample_count, 6u);
  // Only ranks that reported get worker series.
  ASSERT_EQ(f["zenflow_worker_stall_seconds_total"].metric.size(), 1u);
  EXPECT_EQ(Label(f["zenflow_worker_stall_seconds_total"].metric[0], "rank"), "0");
  EXPECT_EQ(f["zenflow_worker_steps_total"].metric[0].counter.value, 8);
}

TEST(RenderMetricsTest, ADeletedJobsSeriesAreGone) {
  v1::GetStatsResponse s = Snapshot();
  s.clear_jobs();
  auto f = ByName(RenderMetrics(s));
  EXPECT_EQ(f.count("zenflow_job_ranks_attached"), 0u);
  EXPECT_EQ(f.count("zenflow_worker_stall_seconds_total"), 0u);
  EXPECT_EQ(f["zenflow_jobs"].metric[0].gauge.value, 0);
}

// GET /metrics on 127.0.0.1:port; the whole response.
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(MetricsServerTest, ServesWhatCollectGivesAtEachScrape) {
  int scrapes = 0;
  absl::StatusOr<std::unique_ptr<MetricsServer>> m =
      MetricsServer::Start("127.0.0.1:0", [&scrapes] {
        ++scrapes;
        v1::WorkerStats w;
        w.set_steps(scrapes);
        return RenderWorkerMetrics("job-a", 3, w);
      });
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_GT((*m)->port(), 0);
  const std::string first = Scrape((*m)->port());
  EXPECT_NE(first.find("200 OK"), std::string::npos) << first;
  EXPECT_NE(first.find("zenflow_worker_steps_total{job=\"job-a\",rank=\"3\"} 1"),
            std::string::npos)
      << first;
  const std::string second = Scrape((*m)->port());
  EXPECT_NE(second.find("zenflow_worker_steps_total{job=\"job-a\",rank=\"3\"} 2"),
            std::string::npos)
      << second;
}

TEST(MetricsServerTest, BadOrTakenAddressesAreRefused) {
  auto none = [] { return std::vector<prometheus::MetricFamily>(); };
  EXPECT_EQ(MetricsServer::Start("9464", none).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsServer::Start("127.0.0.1:99999", none).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<MetricsServer>> first = MetricsServer::Start("127.0.0.1:0", none);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), none);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

}  // namespace
}  // namespace zenflow
