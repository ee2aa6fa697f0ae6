// Raw messages of the streaming calls; see raw_message.h.
#include "server/raw_message.h"

#include <string>

namespace zenflow {

// An up message read from gRPC's slices. A shard's payload stays in them
// (no copy, no allocation of its size): `*payload` views `*slices`, which
// keep them, and `*split` is set; everything else is parsed as protobuf
// would. Any other message, or a shard in another form, is parsed by
// protobuf (ParseRaw) with its payload in the message.
absl::Status ParseUpRaw(grpc::ByteBuffer* buf, int64_t index, v1::UpMessage* out,
                        std::vector<grpc::Slice>* slices, ShardPayload* payload, bool* split,
                        JobRegistry* registry) {
  *split = false;
  ZF_RETURN_IF_ERROR(registry->CheckMessageSize(buf->Length()));
  slices->clear();
  if (buf->Dump(slices).ok()) {
    std::vector<absl::string_view> pieces;
    pieces.reserve(slices->size());
    for (const grpc::Slice& s : *slices) {
      pieces.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    *split = ParseUpSplit(pieces, out, payload);
    if (*split) return absl::OkStatus();
  }
  slices->clear();
  payload->Clear();
  return ParseRaw(buf, index, out, registry);
}

}  // namespace zenflow
