// `./zf bench memory`: does zenflowd hold what GetStats says a job costs?
// Starts a real zenflowd, creates a [4096, 8192] fp32 job (2 ranks), uploads
// its parameters, and compares the daemon's resident memory growth (VmRSS,
// against its own size before the job, measured in the same run) with the
// job's reported state and bookkeeping bytes (docs/operating.md#limits-and-memory).
// The delta reserve is charged at creation but allocated by round updates,
// which this run does not make. Twice, each in a fresh zenflowd: the job
// with optimizer_state "fp32" (the default; its keys at the top level) and
// with "8bit" (under "8bit"); bytes_per_param is memory_bytes / params of
// each.
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

namespace {

// One job's figures: what GetStats charges and the daemon's RSS growth.
struct Run {
  zenflow::v1::JobStats stats;
  int64_t baseline = 0, created = 0, uploaded = 0;
};

// A fresh zenflowd with the [4096, 8192] job of `optimizer_state`, uploaded.
bool Measure(const std::string& optimizer_state, Run* run) {
  zenflow::testing::DaemonProcess daemon;
  if (absl::Status s = daemon.Start({"--ucx=false"}); !s.ok()) {
    std::fprintf(stderr, "memory_bench: %s\n", s.ToString().c_str());
    return false;
  }
  zenflow::ClientOptions co;
  co.token = zenflow::testing::kTestToken;
  co.target = daemon.target();
  auto client = zenflow::Client::Connect(co);
  if (!client.ok()) return false;
  constexpr int64_t kRows = 4096, kCols = 8192;
  run->baseline = zenflow::ResidentBytes(daemon.pid());
  zenflow::v1::JobSpec spec;
  spec.set_job_id("memory");
  spec.set_world_size(2);
  spec.set_optimizer_state(optimizer_state);
  auto* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(kRows);
  t->add_shape(kCols);
  if (!(*client)->CreateJob(spec).ok()) return false;
  run->created = zenflow::ResidentBytes(daemon.pid());
  std::vector<float> init(kRows * kCols, 0.25f);
  if (!(*client)->UploadParameters("memory", {{"w", {kRows, kCols}, init.data()}}).ok()) {
    return false;
  }
  run->uploaded = zenflow::ResidentBytes(daemon.pid());
  auto stats = (*client)->GetStats("memory");
  if (!stats.ok()) return false;
  run->stats = stats->jobs(0);
  (void)daemon.Stop();
  return true;
}

// The run's keys (the fp32 run's at the top level, as before 8-bit state).
void Write(const Run& r, zenflow::JsonWriter* json) {
  const zenflow::v1::JobStats& j = r.stats;
  const int64_t allocated = j.state_bytes() + j.bookkeeping_bytes();
  json->Key("params").Int(j.params());
  json->Key("memory_bytes").Int(j.memory_bytes());
  json->Key("state_bytes").Int(j.state_bytes());
  json->Key("bookkeeping_bytes").Int(j.bookkeeping_bytes());
  json->Key("delta_bytes").Int(j.delta_bytes());
  json->Key("baseline_rss_bytes").Int(r.baseline);
  json->Key("rss_growth_create_bytes").Int(r.created - r.baseline);
  json->Key("rss_growth_upload_bytes").Int(r.uploaded - r.baseline);
  json->Key("create_rss_ratio").Double(static_cast<double>(r.created - r.baseline) / allocated);
  json->Key("upload_rss_ratio").Double(static_cast<double>(r.uploaded - r.baseline) / allocated);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  Run fp32, eight;
  if (!Measure("fp32", &fp32) || !Measure("8bit", &eight)) return 1;
  auto per_param = [](const Run& r) {
    return static_cast<double>(r.stats.memory_bytes()) / static_cast<double>(r.stats.params());
  };
  zenflow::JsonWriter json;
  json.BeginObject();
  Write(fp32, &json);
  json.Key("bytes_per_param").BeginObject();
  json.Key("fp32").Double(per_param(fp32));
  json.Key("8bit").Double(per_param(eight));
  json.EndObject();
  json.Key("8bit").BeginObject();
  Write(eight, &json);
  json.EndObject();
  json.EndObject();
  std::printf("%s\n", json.str().c_str());
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (absl::Status s = json.WriteFile(out); !s.ok()) {
      std::fprintf(stderr, "memory_bench: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}
