// The ingest path of up messages; see ingest.h.
#include "server/ingest.h"

#include <utility>

#include "common/stream_error.h"

namespace zenflow {

absl::Status IngestUp(JobRegistry* registry, Job* job, int32_t rank, Wire wire, Mailbox* box,
                      absl::Status read, const v1::UpMessage& up,
                      const ShardPayload* payload) {
  absl::Status s = std::move(read);
  const bool parsed = s.ok();
  if (s.ok() && up.kind_case() == v1::UpMessage::kAttach) {
    s = absl::FailedPreconditionError(
        "this stream is already attached: attach travels over the gRPC stream, as its first "
        "message, once (never over UCX)");
  }
  if (s.ok()) s = job->HandleUp(rank, up, wire, payload);
  if (!s.ok()) {
    registry->CountRejection(s.code(), "stream");
    job->CountRejection(s.code());
    box->Push(StreamErrorMessage(s, parsed ? up.seq() : 0));
  }
  return s;
}

}  // namespace zenflow
