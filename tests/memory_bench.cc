// `./zf bench memory`: does zenflowd hold what GetStats says a job costs?
// Starts a real zenflowd, creates a [4096, 8192] fp32 job (2 ranks), uploads
// its parameters, and compares the daemon's resident memory growth (VmRSS,
// against its own size before the job, measured in the same run) with the
// job's reported state and bookkeeping bytes (docs/operating.md#limits-and-memory).
// Then both ranks run --rounds rounds of one step each (every column on the
// daemon, gradients on the bf16 wire, each rank taking every delta) and
// the daemon's peak RSS (VmHWM: creation, upload and rounds, outboxes
// included) is compared with what the job charges plus the outbox bound
// (--max_outbox_bytes, passed to zenflowd): rounds_peak_ratio. Twice, each
// in a fresh zenflowd: the job with optimizer_state "fp32" (the default;
// its keys at the top level) and with "8bit" (under "8bit");
// bytes_per_param is memory_bytes / params of each.
//
//   bazel build //tests:memory_bench //server:zenflowd
//   ZENFLOWD=bazel-bin/server/zenflowd bazel-bin/tests/memory_bench --out=bench-results/memory.json
#include <algorithm>
#include <cstdio>
#include <memory>
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
ABSL_FLAG(int, rounds, 50, "rounds to run after the upload");
ABSL_FLAG(int64_t, max_outbox_bytes, int64_t{256} << 20, "zenflowd's per-rank outbox limit");

namespace {

// One job's figures: what GetStats charges and the daemon's RSS growth.
struct Run {
  zenflow::v1::JobStats stats;
  int64_t baseline = 0, created = 0, uploaded = 0;
  int64_t rounds = 0;
  int64_t peak = 0;            // VmHWM after the rounds
  int64_t rounds_max_rss = 0;  // the largest VmRSS sampled after each round
};

// The peak resident memory of process `pid` (VmHWM), bytes; -1 if unknown.
int64_t PeakResidentBytes(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long v = 0;
    if (std::sscanf(line, "VmHWM: %lld kB", &v) == 1) kb = v;
  }
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

// `rounds` rounds of one step from both ranks of the job: every column's
// gradient pushed, the round closed, every delta taken.
bool RunRounds(const std::string& target, int64_t rows, int64_t cols, int rounds, pid_t pid,
               Run* run) {
  std::vector<std::unique_ptr<zenflow::Client>> ranks;
  int64_t version = 0;
  for (int r = 0; r < 2; ++r) {
    zenflow::ClientOptions co;
    co.token = zenflow::testing::kTestToken;
    co.target = target;
    auto c = zenflow::Client::Connect(co);
    if (!c.ok()) return false;
    auto joined = (*c)->JoinJob("memory", r);
    if (!joined.ok()) {
      std::fprintf(stderr, "memory_bench: join: %s\n", joined.status().ToString().c_str());
      return false;
    }
    version = joined->selection().version();
    ranks.push_back(*std::move(c));
  }
  std::vector<int32_t> all(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) all[static_cast<size_t>(c)] = static_cast<int32_t>(c);
  std::vector<float> grad(static_cast<size_t>(rows * cols));
  for (int64_t round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < grad.size(); ++i) {
      grad[i] = 1e-3f * static_cast<float>(static_cast<int64_t>((i * 7 + round * 13) % 17) - 8);
    }
    for (auto& c : ranks) {
      absl::Status s =
          c->PushColumns(round, "w", version, all, grad.data(), rows, zenflow::DType::kBF16);
      if (s.ok()) s = c->CloseRound(round, 1e-3f, 1);
      if (!s.ok()) {
        std::fprintf(stderr, "memory_bench: round %lld: %s\n", static_cast<long long>(round),
                     s.ToString().c_str());
        return false;
      }
    }
    for (auto& c : ranks) {
      auto u = c->WaitRound(round, absl::Seconds(120));
      if (!u.ok()) {
        std::fprintf(stderr, "memory_bench: round %lld: %s\n", static_cast<long long>(round),
                     u.status().ToString().c_str());
        return false;
      }
    }
    run->rounds_max_rss = std::max(run->rounds_max_rss, zenflow::ResidentBytes(pid));
    ++run->rounds;
  }
  run->peak = PeakResidentBytes(pid);
  return true;
}

// A fresh zenflowd with the [4096, 8192] job of `optimizer_state`, uploaded.
bool Measure(const std::string& optimizer_state, Run* run) {
  zenflow::testing::DaemonProcess daemon;
  const std::string outbox =
      "--max_outbox_bytes=" + std::to_string(absl::GetFlag(FLAGS_max_outbox_bytes));
  if (absl::Status s = daemon.Start({"--ucx=false", outbox}); !s.ok()) {
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
  spec.set_wire_dtype(zenflow::v1::DTYPE_BF16);  // the rounds' gradients
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
  if (!RunRounds(daemon.target(), kRows, kCols, absl::GetFlag(FLAGS_rounds), daemon.pid(), run)) {
    return false;
  }
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
  // The rounds: the peak against the charge plus the outbox bound.
  const int64_t bound = j.memory_bytes() + absl::GetFlag(FLAGS_max_outbox_bytes);
  json->Key("rounds").Int(r.rounds);
  json->Key("max_outbox_bytes").Int(absl::GetFlag(FLAGS_max_outbox_bytes));
  json->Key("rounds_peak_rss_growth_bytes").Int(r.peak - r.baseline);
  json->Key("rounds_max_sampled_rss_growth_bytes").Int(r.rounds_max_rss - r.baseline);
  json->Key("rounds_peak_ratio").Double(static_cast<double>(r.peak - r.baseline) / bound);
  json->Key("rounds_peak_vs_memory_bytes").Double(static_cast<double>(r.peak - r.baseline) /
                                                   j.memory_bytes());
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
