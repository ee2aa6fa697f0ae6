// The jobs the fuzz targets start from, shared with seed_writer (which
// writes valid messages for them). A `config` byte, the first byte of an
// input, picks a job's variant.
//
//   ZF_ASSIGN_OR_RETURN(FuzzJob job, StartShardJob(config));
//   ZF_ASSIGN_OR_RETURN(HandOffJob h, StartHandOffJob(config, scores1, scores2, "handoff"));
#ifndef ZENFLOW_FUZZ_SCENARIOS_H_
#define ZENFLOW_FUZZ_SCENARIOS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_job.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace fuzz {

// The shard target's job "shard": tensors w [3, 4] (fp32), e [2, 3] (bf16
// parameters) and b [4]; zenflow with S = 2 and k = 0.5 unless bit 4 asks
// for zero_offload. Bits: 0 two ranks (else one); 1-2 the wire dtype (bf16,
// fp32, fp16, int8); 3 skip_nonfinite_rounds; 4 zero_offload; 5
// rank_ordered_sums; 6 arithmetic deltas.
v1::JobSpec ShardJobSpec(uint8_t config);
// That job created, its parameters uploaded and its ranks joined.
absl::StatusOr<FuzzJob> StartShardJob(uint8_t config);

// The hand-off target's job: tensors w [2, 4], u [3, 2] and b [3] (1-D,
// always important); zenflow with S = 1, R = 1, k = 0.5, sync apply delay,
// fp32 wire; one rank, or two with bit 0 of `config`.
struct HandOffJob {
  FuzzJob job;
  v1::Selection previous;   // the one before (version 0: nothing important)
  v1::Selection selection;  // the job's current one
};
// Creates the job `job_id`, uploads, joins, and makes selection 1 at step 0
// from `scores1` (column c of tensor t scores byte (8 t + c) of it, cycled;
// every column 1 when empty). With bit 1 of `config`, it goes on: every
// rank hands off version 1, sends round 0's unimportant columns and closes
// it, and selection 2 is made at step 1 from `scores2`, so that columns
// leave the ranks' important sets.
absl::StatusOr<HandOffJob> StartHandOffJob(uint8_t config, absl::string_view scores1,
                                           absl::string_view scores2,
                                           const std::string& job_id);

// The columns of `tensor` that are important in `prev` and not in `cur`
// (the state a hand-off to `cur` carries), ascending.
std::vector<int32_t> LeavingColumns(const v1::Selection& prev, const v1::Selection& cur,
                                    const std::string& tensor);

}  // namespace fuzz
}  // namespace zenflow

#endif  // ZENFLOW_FUZZ_SCENARIOS_H_
