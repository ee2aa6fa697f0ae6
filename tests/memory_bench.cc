// `./zf bench memory`: does zenflowd hold what GetStats says a job costs?
// Starts a real zenflowd, creates a [4096, 8192] fp32 job (2 ranks), uploads
// its parameters, and compares the daemon's resident memory growth (VmRSS,
// against its own size before the job, measured in the same run) with the
// job's reported state and bookkeeping bytes (README "Limits and memory").
// The delta reserve is charged at creation but allocated by round updates,
// which this run does not make.
//
//   bazel build //tests:memory_bench //server:zenflowd
//   ZENFLOWD=bazel-bin/server/zenflowd bazel-bin/tests/memory_bench --out=bench-results/memory.json
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/client.h"
#include "tests/testing/daemon_process.h"

ABSL_FLAG(std::string, out, "", "write the results as JSON here");

namespace {

int64_t Rss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      int64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
    std::getline(in, key);
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  zenflow::testing::DaemonProcess daemon;
  if (absl::Status s = daemon.Start({"--ucx=false"}); !s.ok()) {
    std::fprintf(stderr, "memory_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  zenflow::ClientOptions co;
  co.target = daemon.target();
  auto client = zenflow::Client::Connect(co);
  if (!client.ok()) return 1;
  constexpr int64_t kRows = 4096, kCols = 8192;
  const int64_t baseline = Rss(daemon.pid());
  zenflow::v1::JobSpec spec;
  spec.set_job_id("memory");
  spec.set_world_size(2);
  auto* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(kRows);
  t->add_shape(kCols);
  if (!(*client)->CreateJob(spec).ok()) return 1;
  const int64_t created = Rss(daemon.pid());
  std::vector<float> init(kRows * kCols, 0.25f);
  if (!(*client)->UploadParameters("memory", {{"w", {kRows, kCols}, init.data()}}).ok()) return 1;
  const int64_t uploaded = Rss(daemon.pid());
  auto stats = (*client)->GetStats("memory");
  if (!stats.ok()) return 1;
  const zenflow::v1::JobStats& j = stats->jobs(0);
  const int64_t allocated = j.state_bytes() + j.bookkeeping_bytes();
  const double create_ratio = static_cast<double>(created - baseline) / allocated;
  const double upload_ratio = static_cast<double>(uploaded - baseline) / allocated;
  char json[1024];
  std::snprintf(json, sizeof(json),
                "{\n  \"params\": %lld,\n  \"memory_bytes\": %lld,\n  \"state_bytes\": %lld,\n"
                "  \"bookkeeping_bytes\": %lld,\n  \"delta_bytes\": %lld,\n"
                "  \"baseline_rss_bytes\": %lld,\n  \"rss_growth_create_bytes\": %lld,\n"
                "  \"rss_growth_upload_bytes\": %lld,\n  \"create_rss_ratio\": %.4f,\n"
                "  \"upload_rss_ratio\": %.4f\n}\n",
                static_cast<long long>(j.params()), static_cast<long long>(j.memory_bytes()),
                static_cast<long long>(j.state_bytes()),
                static_cast<long long>(j.bookkeeping_bytes()),
                static_cast<long long>(j.delta_bytes()), static_cast<long long>(baseline),
                static_cast<long long>(created - baseline),
                static_cast<long long>(uploaded - baseline), create_ratio, upload_ratio);
  std::fputs(json, stdout);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) std::ofstream(out) << json;
  (void)daemon.Stop();
  return 0;
}
