// The main() of the benches that run one absl-flags-driven Run(): malloc
// tuned for bulk buffers, flags parsed, a failed run reported as
// "NAME: STATUS" with exit status 1.
#ifndef ZENFLOW_TOOLS_BENCH_BENCH_MAIN_H_
#define ZENFLOW_TOOLS_BENCH_BENCH_MAIN_H_

#include <cstdio>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "common/malloc_tuning.h"

namespace zenflow {

inline int RunBenchMain(int argc, char** argv, const char* name, const char* usage,
                        absl::Status (*run)()) {
  TuneMallocForBulkBuffers();
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = run();
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_BENCH_BENCH_MAIN_H_
