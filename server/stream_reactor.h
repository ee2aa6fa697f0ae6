// The reactor of a Stream call: a rank's data stream, which attaches it to
// its job and carries its shards and round closes up and its deltas down
// (or only the greeting, when the rank's data goes over UCX).
#ifndef ZENFLOW_SERVER_STREAM_REACTOR_H_
#define ZENFLOW_SERVER_STREAM_REACTOR_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "server/registry.h"
#include "server/service.h"
#include "server/ucx_plane.h"

namespace zenflow {

// Starts the call's reactor (owned by itself until gRPC is done with it,
// and by the UCX data plane while it ends the stream). `ucx` may be null
// (`*no_ucx_reason` says why). `refused`: the call is over the stream limit
// and ends at once with it.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartStreamReactor(
    ZenFlowService* service, JobRegistry* registry, UcxDataPlane* ucx,
    const std::string* no_ucx_reason, Who who, absl::Status refused);

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_STREAM_REACTOR_H_
