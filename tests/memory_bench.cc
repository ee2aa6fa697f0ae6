// `./zf bench memory`: does zenflowd hold what GetStats says a job costs?
// Starts a real zenflowd, creates a [4096, 8192] fp32 job (2 ranks), uploads
// its parameters, and compares the daemon's resident memory growth (VmRSS,
// against its own size before the job, measured in the same run) with the
// job's reported state and bookkeeping bytes (docs/operating.md#limits-and-memory).
// The delta reserve is charged at creation but allocated by round updates,
// which this run does not make.
//
//   bazel build //tests:memory_bench //server:zenflowd
//   ZENFLOWD=bazel-bin/server/zenflowd bazel-bin/tests/memory_bench --out=bench-results/memory.json
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "client/client.h"
#include "common/json_writer.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/harness.h"
#include "tools/child_process.h"

ABSL_FLAG(std::string, out, "", "write the results as JSON here");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  zenflow::testing::DaemonProcess daemon;
  if (absl::Status s = daemon.Start({"--ucx=false"}); !s.ok()) {
    std::fprintf(stderr, "memory_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  zenflow::ClientOptions co;
  co.token = zenflow::testing::kTestToken;
  co.target = daemon.target();
  auto client = zenflow::Client::Connect(co);
  if (!client.ok()) return 1;
  constexpr int64_t kRows = 4096, kCols = 8192;
  const int64_t baseline = zenflow::ResidentBytes(daemon.pid());
  zenflow::v1::JobSpec spec;
  spec.set_job_id("memory");
  spec.set_world_size(2);
  auto* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(kRows);
  t->add_shape(kCols);
  if (!(*client)->CreateJob(spec).ok()) return 1;
  const int64_t created = zenflow::ResidentBytes(daemon.pid());
  std::vector<float> init(kRows * kCols, 0.25f);
  if (!(*client)->UploadParameters("memory", {{"w", {kRows, kCols}, init.data()}}).ok()) return 1;
  const int64_t uploaded = zenflow::ResidentBytes(daemon.pid());
  auto stats = (*client)->GetStats("memory");
  if (!stats.ok()) return 1;
  const zenflow::v1::JobStats& j = stats->jobs(0);
  const int64_t allocated = j.state_bytes() + j.bookkeeping_bytes();
  const double create_ratio = static_cast<double>(created - baseline) / allocated;
  const double upload_ratio = static_cast<double>(uploaded - baseline) / allocated;
  zenflow::JsonWriter json;
  json.BeginObject();
  json.Key("params").Int(j.params());
  json.Key("memory_bytes").Int(j.memory_bytes());
  json.Key("state_bytes").Int(j.state_bytes());
  json.Key("bookkeeping_bytes").Int(j.bookkeeping_bytes());
  json.Key("delta_bytes").Int(j.delta_bytes());
  json.Key("baseline_rss_bytes").Int(baseline);
  json.Key("rss_growth_create_bytes").Int(created - baseline);
  json.Key("rss_growth_upload_bytes").Int(uploaded - baseline);
  json.Key("create_rss_ratio").Double(create_ratio);
  json.Key("upload_rss_ratio").Double(upload_ratio);
  json.EndObject();
  std::printf("%s\n", json.str().c_str());
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (absl::Status s = json.WriteFile(out); !s.ok()) {
      std::fprintf(stderr, "memory_bench: %s\n", std::string(s.message()).c_str());
      (void)daemon.Stop();
      return 1;
    }
  }
  (void)daemon.Stop();
  return 0;
}
