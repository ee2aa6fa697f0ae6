// Fuzz target "shard": a rank's up messages (gradient shards and round
// closes), as bytes read from its gRPC stream or as UCX frames, into a real
// job through IngestUp and Job::HandleUp, as the service feeds them; every
// shard's payload also goes through the codec at every SIMD level.
//
// Input: a config byte (ShardJobSpec: ranks, wire dtype, modes), then ops
// (fuzz/ops.h). Properties checked: those of RunOps.
#include <cstddef>
#include <cstdint>

#include "fuzz/check.h"
#include "fuzz/fuzz_job.h"
#include "fuzz/input.h"
#include "fuzz/ops.h"
#include "fuzz/scenarios.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zenflow::fuzz;
  FuzzInput in(data, size);
  const uint8_t config = in.Byte();
  absl::StatusOr<FuzzJob> job = StartShardJob(config);
  FUZZ_CHECK(job.ok(), "the shard job of config ", config,
             " could not be started: ", job.status().ToString());
  RunOps(*job, &in);
  DeleteAllJobs();
  return 0;
}
