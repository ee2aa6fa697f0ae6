// The reactor of an UploadParameters call: the chunks of a job's
// parameters, read one at a time into a Job::Upload that commits at the
// client's half-close.
#ifndef ZENFLOW_SERVER_UPLOAD_REACTOR_H_
#define ZENFLOW_SERVER_UPLOAD_REACTOR_H_

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "server/registry.h"
#include "server/service.h"

namespace zenflow {

// Starts the call's reactor (owned by itself until gRPC is done with it).
// `refused`: the call is over the stream limit and ends at once with it.
grpc::ServerReadReactor<grpc::ByteBuffer>* StartUploadReactor(ZenFlowService* service,
                                                             JobRegistry* registry,
                                                             grpc::ByteBuffer* resp, Who who,
                                                             absl::Status refused);

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_UPLOAD_REACTOR_H_
