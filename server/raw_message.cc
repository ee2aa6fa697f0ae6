// Raw messages of the streaming calls; see raw_message.h.
#include "server/raw_message.h"

#include <memory>
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
  // A shard's room (ParseUpSplit reuses the shard `out` holds) outlives the
  // other messages in between (a round's close): kept here meanwhile.
  thread_local std::unique_ptr<v1::GradientShard> spare;
  if (!out->has_shard() && spare != nullptr) out->set_allocated_shard(spare.release());
  slices->clear();
  if (buf->Dump(slices).ok()) {
    // The thread's view of the slices, whose room stays: no allocation
    // once a message of as many slices was read on this thread.
    thread_local ShardPayload pieces;
    pieces.Clear();
    for (const grpc::Slice& s : *slices) {
      pieces.Append(absl::string_view(reinterpret_cast<const char*>(s.begin()), s.size()));
    }
    *split = ParseUpSplit(pieces, out, payload);
    pieces.Clear();
    if (*split) return absl::OkStatus();
  }
  slices->clear();
  payload->Clear();
  if (out->has_shard() && spare == nullptr) {
    spare.reset(out->release_shard());
    spare->Clear();
    std::string().swap(*spare->mutable_payload());
  }
  return ParseRaw(buf, index, out, registry);
}

}  // namespace zenflow
