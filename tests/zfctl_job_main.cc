// A job for tests:zfctl_test to look at: creates it (the daemon makes its
// token), uploads one 8 x 16 tensor, joins `world` ranks, runs `rounds`
// rounds with every rank, then detaches every rank but rank 0, writes the
// token to --token_out and holds rank 0 attached until --release names a
// file that exists (or 300 s pass).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/client.h"

ABSL_FLAG(std::string, target, "", "zenflowd's HOST:PORT");
ABSL_FLAG(std::string, job, "job", "job id");
ABSL_FLAG(int, world, 2, "ranks");
ABSL_FLAG(int, rounds, 3, "rounds to run");
ABSL_FLAG(std::string, token_out, "",
          "where the job's token goes (written last: the job is ready)");
ABSL_FLAG(std::string, release, "", "hold rank 0 attached until this file exists; empty: exit");

namespace {

constexpr int64_t kRows = 8, kCols = 16;

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "zfctl_job: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string id = absl::GetFlag(FLAGS_job);
  const int world = absl::GetFlag(FLAGS_world);
  zenflow::ClientOptions co;
  co.target = absl::GetFlag(FLAGS_target);
  co.connect_timeout = absl::Seconds(30);
  std::vector<std::unique_ptr<zenflow::Client>> ranks;
  absl::StatusOr<std::unique_ptr<zenflow::Client>> first = zenflow::Client::Connect(co);
  if (!first.ok()) return Fail("connect", first.status());
  ranks.push_back(*std::move(first));
  zenflow::v1::JobSpec spec;
  spec.set_job_id(id);
  zenflow::v1::TensorSpec* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(kRows);
  t->add_shape(kCols);
  spec.set_world_size(world);
  spec.set_wire_dtype(zenflow::v1::DTYPE_FP32);
  spec.mutable_zenflow()->set_update_interval(1);
  if (auto s = ranks[0]->CreateJob(spec); !s.ok()) return Fail("CreateJob", s.status());
  std::vector<float> init(kRows * kCols, 0.5f);
  if (auto s = ranks[0]->UploadParameters(id, {{"w", {kRows, kCols}, init.data()}}); !s.ok()) {
    return Fail("UploadParameters", s.status());
  }
  co.token = ranks[0]->token();
  for (int r = 1; r < world; ++r) {
    absl::StatusOr<std::unique_ptr<zenflow::Client>> c = zenflow::Client::Connect(co);
    if (!c.ok()) return Fail("connect", c.status());
    ranks.push_back(*std::move(c));
  }
  for (int r = 0; r < world; ++r) {
    if (auto s = ranks[r]->JoinJob(id, r); !s.ok()) return Fail("JoinJob", s.status());
  }
  std::vector<int32_t> cols(kCols);
  for (int32_t c = 0; c < kCols; ++c) cols[c] = c;
  std::vector<float> grad(kRows * kCols, 0.01f);
  for (int64_t round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (auto& c : ranks) {
      if (auto s = c->PushColumns(round, "w", 0, cols, grad.data(), kRows, zenflow::DType::kF32);
          !s.ok()) {
        return Fail("PushColumns", s);
      }
      if (auto s = c->CloseRound(round, 1e-3f); !s.ok()) return Fail("CloseRound", s);
    }
    for (auto& c : ranks) {
      if (auto u = c->WaitRound(round, absl::Seconds(60)); !u.ok()) {
        return Fail("WaitRound", u.status());
      }
    }
  }
  ranks.resize(1);  // the other ranks detach
  {
    const std::string tmp = absl::GetFlag(FLAGS_token_out) + ".tmp";
    std::ofstream(tmp) << co.token << "\n";
    std::rename(tmp.c_str(), absl::GetFlag(FLAGS_token_out).c_str());
  }
  const std::string release = absl::GetFlag(FLAGS_release);
  const absl::Time until = absl::Now() + absl::Seconds(300);
  while (!release.empty() && access(release.c_str(), F_OK) != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  return 0;
}
