// What a job's ranks send it, as fuzz records (fuzz/input.h), and the
// properties every answer must have. The shard, hand_off and checkpoint
// targets drive their jobs with these.
//
//   FuzzInput in(data, size);
//   RunOps(job, &in);   // every remaining record is one op
//
// Record tags: tag % 4 is the op's kind, (tag / 4) % world_size the rank
// whose stream carries an up message.
#ifndef ZENFLOW_FUZZ_OPS_H_
#define ZENFLOW_FUZZ_OPS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/codec.h"
#include "fuzz/fuzz_job.h"
#include "fuzz/input.h"

namespace zenflow {
namespace fuzz {

enum OpKind : uint8_t {
  kOpGrpcUp = 0,     // a v1.UpMessage's bytes, read from the rank's gRPC stream
  kOpUcxUp = 1,      // a UCX frame (common/ucx_frame.h) of a v1.UpMessage
  kOpHandOff = 2,    // a v1.HandOffRequest's bytes (its rank is its own)
  kOpImportance = 3  // a v1.SubmitImportanceRequest's bytes
};

inline uint8_t OpTag(OpKind kind, int rank) { return static_cast<uint8_t>(kind + 4 * rank); }

// Applies every remaining record of `in` to the job. Aborts (FUZZ_CHECK)
// unless: a rejected op leaves the job's whole state (JobState) as it was;
// an accepted hand-off answers with exactly the daemon's state of the
// columns it hands over; each shard's payload decodes to the same bits at
// every SIMD level the CPU has (CheckCodec).
void RunOps(const FuzzJob& job, FuzzInput* in);

// Aborts unless Decode, DecodeAdd and AllFinite give the same bits at every
// SIMD level this CPU supports as the scalar code, and encoding the decoded
// values gives back `payload`'s bits (NaNs aside: only NaN-ness is kept).
void CheckCodec(DType dtype, absl::string_view payload);

}  // namespace fuzz
}  // namespace zenflow

#endif  // ZENFLOW_FUZZ_OPS_H_
