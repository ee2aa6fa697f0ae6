// One rank of the deterministic engine test job, as its own process (for the
// multi-process test): writes its final parameters to --out.
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "tests/testing/engine_driver.h"

ABSL_FLAG(std::string, target, "", "zenflowd address");
ABSL_FLAG(std::string, job, "procs", "job id");
ABSL_FLAG(int, rank, 0, "rank");
ABSL_FLAG(int, world, 2, "world size");
ABSL_FLAG(int, steps, 16, "steps");
ABSL_FLAG(std::string, out, "", "where to write the final parameters (raw fp32)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  zenflow::testing::EngineJob job;
  job.target = absl::GetFlag(FLAGS_target);
  job.job_id = absl::GetFlag(FLAGS_job);
  job.cfg.world = absl::GetFlag(FLAGS_world);
  job.cfg.S = 2;
  job.cfg.R = 4;
  job.cfg.delay = 1;
  job.steps = absl::GetFlag(FLAGS_steps);
  auto params = zenflow::testing::RunEngineRank(job, absl::GetFlag(FLAGS_rank));
  if (!params.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", absl::GetFlag(FLAGS_rank), params.status().ToString().c_str());
    return 1;
  }
  std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::binary);
  for (const auto& t : *params) out.write(reinterpret_cast<const char*>(t.data()), t.size() * 4);
  return out.good() ? 0 : 1;
}
