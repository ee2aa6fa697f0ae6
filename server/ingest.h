// The one way an attached rank's up message enters its job, whichever
// transport carried it (the gRPC stream in service.cc, the UCX data plane
// in ucx_plane.cc): the message is applied, or it is rejected in-band -
// counted, and answered on the rank's mailbox with the status and the
// message's number - and the stream goes on.
//
//   absl::Status read = ParseFrame(std::move(frame), &up);      // transport-specific
//   IngestUp(registry, job, rank, box, std::move(read), up);
#ifndef ZENFLOW_SERVER_INGEST_H_
#define ZENFLOW_SERVER_INGEST_H_

#include <cstdint>

#include "absl/status/status.h"
#include "server/job.h"
#include "server/mailbox.h"
#include "server/registry.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// `read` is OK when `up` holds the message, else why its bytes could not be
// read (too large, not an UpMessage); the answer then carries number 0.
// `payload`: a shard's payload kept where it arrived (Job::HandleUp).
// Returns the rejection (OK when applied). Thread-safe as Job is.
absl::Status IngestUp(JobRegistry* registry, Job* job, int32_t rank, Wire wire, Mailbox* box,
                      absl::Status read, const v1::UpMessage& up,
                      const ShardPayload* payload = nullptr);

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_INGEST_H_
