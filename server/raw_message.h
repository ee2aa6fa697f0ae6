// The raw bytes of the streaming calls (Stream, UploadParameters) made
// into messages: the service parses them itself, so that an unparseable
// message gets a precise answer instead of looking like the end of the
// stream, and a shard's payload can stay in gRPC's slices.
#ifndef ZENFLOW_SERVER_RAW_MESSAGE_H_
#define ZENFLOW_SERVER_RAW_MESSAGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/up_wire.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "server/registry.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Parses a raw request; INVALID_ARGUMENT (saying which message of the
// stream) when the bytes are not a `Message`.
template <typename Message>
absl::Status ParseRaw(grpc::ByteBuffer* buf, int64_t index, Message* out,
                      JobRegistry* registry) {
  const size_t size = buf->Length();
  ZF_RETURN_IF_ERROR(registry->CheckMessageSize(size));
  grpc::Status g = grpc::SerializationTraits<Message>::Deserialize(buf, out);
  if (!g.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message #", index, " of this stream (", size, " bytes) is not a valid ",
        Message::descriptor()->full_name(), "; it was dropped"));
  }
  return absl::OkStatus();
}

// An up message read from gRPC's slices. A shard's payload stays in them
// (no copy, no allocation of its size): `*payload` views `*slices`, which
// keep them, and `*split` is set; everything else is parsed as protobuf
// would. Any other message, or a shard in another form, is parsed by
// protobuf (ParseRaw) with its payload in the message.
absl::Status ParseUpRaw(grpc::ByteBuffer* buf, int64_t index, v1::UpMessage* out,
                        std::vector<grpc::Slice>* slices, ShardPayload* payload, bool* split,
                        JobRegistry* registry);

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_RAW_MESSAGE_H_
