// How a zenflow.v1 stream message travels as one UCX message without
// copying its bulk payload:
//
//   [payload bytes][header: the message with its payload field empty][u32 header size][u32 magic]
//
// The payload comes first so that the receiver can shrink its buffer to the
// payload and move it into the message (no copy). The payload field is the
// GradientShard payload of an UpMessage or the ParameterDelta payload of a
// DownMessage; other messages travel as header only.
#ifndef ZENFLOW_COMMON_UCX_FRAME_H_
#define ZENFLOW_COMMON_UCX_FRAME_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "google/protobuf/io/coded_stream.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

inline constexpr uint32_t kUcxFrameMagic = 0x5a465531;  // "ZFU1"
inline constexpr size_t kUcxFrameTrailer = 8;

// The bulk payload field of a message, or null.
inline std::string* MutablePayloadField(v1::UpMessage* m) {
  return m->kind_case() == v1::UpMessage::kShard ? m->mutable_shard()->mutable_payload() : nullptr;
}
inline std::string* MutablePayloadField(v1::DownMessage* m) {
  return m->kind_case() == v1::DownMessage::kDelta ? m->mutable_delta()->mutable_payload()
                                                   : nullptr;
}

// Moves the payload out of `*m` into `*payload` and writes the header and
// trailer into `*header`. The frame is payload + header; RestorePayload puts
// the payload back.
template <typename Message>
void SplitFrame(Message* m, std::string* payload, std::string* header) {
  payload->clear();
  if (std::string* p = MutablePayloadField(m)) payload->swap(*p);
  header->clear();
  m->AppendToString(header);
  const uint32_t size = static_cast<uint32_t>(header->size());
  char trailer[kUcxFrameTrailer];
  std::memcpy(trailer, &size, 4);
  std::memcpy(trailer + 4, &kUcxFrameMagic, 4);
  header->append(trailer, kUcxFrameTrailer);
}

// For a message that must stay untouched (shared by several ranks'
// outboxes): the frame's header and trailer into `*header`; returns a view of
// the payload inside `m` (the frame is that view + header). Every field of
// ParameterDelta but its payload is copied here: a field added to
// ParameterDelta must be added below (ucx_test checks the round trip).
inline absl::string_view SplitFrameShared(const v1::DownMessage& m, std::string* header) {
  absl::string_view payload;
  header->clear();
  if (m.kind_case() == v1::DownMessage::kDelta) {
    const v1::ParameterDelta& d = m.delta();
    v1::DownMessage h;
    v1::ParameterDelta* o = h.mutable_delta();
    o->set_round(d.round());
    o->set_tensor(d.tensor());
    *o->mutable_columns() = d.columns();
    o->set_dtype(d.dtype());
    o->set_kind(d.kind());
    // The predicted step's state (one-step rounds only) rides in the header.
    o->set_m(d.m());
    o->set_v(d.v());
    *o->mutable_update_counts() = d.update_counts();
    // The local step's factored second moment (docs/design.md rule 13).
    *o->mutable_row_v() = d.row_v();
    *o->mutable_col_v() = d.col_v();
    o->set_v_mean(d.v_mean());
    h.AppendToString(header);
    payload = d.payload();
  } else {
    m.AppendToString(header);
  }
  const uint32_t size = static_cast<uint32_t>(header->size());
  char trailer[kUcxFrameTrailer];
  std::memcpy(trailer, &size, 4);
  std::memcpy(trailer + 4, &kUcxFrameMagic, 4);
  header->append(trailer, kUcxFrameTrailer);
  return payload;
}

template <typename Message>
void RestorePayload(Message* m, std::string* payload) {
  if (std::string* p = MutablePayloadField(m)) p->swap(*payload);
}

// Where a received frame's header lies: the payload is its first
// *payload_bytes, the header the *header_bytes after them.
inline absl::Status FrameLayout(const std::string& frame, size_t* payload_bytes,
                                uint32_t* header_bytes) {
  if (frame.size() < kUcxFrameTrailer) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX frame of ", frame.size(), " bytes is shorter than its trailer"));
  }
  uint32_t size = 0, magic = 0;
  std::memcpy(&size, frame.data() + frame.size() - 8, 4);
  std::memcpy(&magic, frame.data() + frame.size() - 4, 4);
  if (magic != kUcxFrameMagic) {
    return absl::InvalidArgumentError("UCX frame has a bad magic number (not a zenflow.v1 frame)");
  }
  if (size > frame.size() - kUcxFrameTrailer) {
    return absl::InvalidArgumentError(absl::StrCat("UCX frame header of ", size,
                                                   " bytes exceeds the frame's ", frame.size()));
  }
  *payload_bytes = frame.size() - kUcxFrameTrailer - size;
  *header_bytes = size;
  return absl::OkStatus();
}

// Moves the frame's first `payload` bytes into *m's payload field (the
// buffer itself: no copy), after its header was parsed into *m.
template <typename Message>
absl::Status AttachPayload(std::string frame, size_t payload, Message* m) {
  std::string* field = MutablePayloadField(m);
  if (field == nullptr) {
    if (payload != 0) {
      return absl::InvalidArgumentError("UCX frame carries a payload its message has no field for");
    }
    return absl::OkStatus();
  }
  if (!field->empty()) {
    return absl::InvalidArgumentError("UCX frame has its payload inside the header");
  }
  frame.resize(payload);
  field->swap(frame);
  return absl::OkStatus();
}

// Parses a received frame, consuming `frame` (its buffer becomes the payload).
template <typename Message>
absl::Status ParseFrame(std::string frame, Message* m) {
  size_t payload = 0;
  uint32_t size = 0;
  absl::Status s = FrameLayout(frame, &payload, &size);
  if (!s.ok()) return s;
  if (!m->ParseFromArray(frame.data() + payload, static_cast<int>(size))) {
    return absl::InvalidArgumentError("UCX frame header is not a valid zenflow.v1 message");
  }
  return AttachPayload(std::move(frame), payload, m);
}

// Parses up frames into one reused message, whose shard (its strings,
// columns and scales) keeps its memory from frame to frame: once warm, a
// shard frame's parse allocates nothing from the heap (a fresh message
// allocates the shard, its tensor name and its columns for every frame).
// The payload buffer moves into the message as with ParseFrame. The result
// is that of ParseFrame into a new message. One thread at a time.
//
//   UpFrameParser parser;
//   absl::StatusOr<v1::UpMessage*> up = parser.Parse(std::move(frame));
//   ...  // *up is valid until the next Parse
class UpFrameParser {
 public:
  absl::StatusOr<v1::UpMessage*> Parse(std::string frame) {
    size_t payload = 0;
    uint32_t size = 0;
    absl::Status s = FrameLayout(frame, &payload, &size);
    if (!s.ok()) return s;
    const char* header = frame.data() + payload;
    bool parsed = false;
    if (OnlyShardKind(header, size)) {
      // Clear() would free the shard (the oneof's member); keep it, cleared.
      v1::GradientShard* shard =
          msg_.kind_case() == v1::UpMessage::kShard ? msg_.release_shard() : nullptr;
      msg_.Clear();
      if (shard != nullptr) {
        shard->Clear();
        msg_.set_allocated_shard(shard);
      }
      google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(header),
                                                static_cast<int>(size));
      parsed = msg_.MergeFromCodedStream(&in) && in.ConsumedEntireMessage();
    } else {
      parsed = msg_.ParseFromArray(header, static_cast<int>(size));
    }
    if (!parsed) {
      msg_.Clear();
      return absl::InvalidArgumentError("UCX frame header is not a valid zenflow.v1 message");
    }
    s = AttachPayload(std::move(frame), payload, &msg_);
    if (!s.ok()) return s;
    return &msg_;
  }

 private:
  // Whether a header's top-level fields include the shard (field 3) and no
  // other member of the kind oneof: then merging into a message that holds
  // a cleared shard gives what parsing into a new one would. Anything
  // unusual (a malformed header too) answers false: parsed as a new one.
  static bool OnlyShardKind(const char* p, uint32_t size) {
    const char* end = p + size;
    bool shard = false;
    auto varint = [&](uint64_t* v) {
      *v = 0;
      for (int shift = 0; shift < 64 && p < end; shift += 7) {
        const uint8_t b = static_cast<uint8_t>(*p++);
        *v |= static_cast<uint64_t>(b & 0x7f) << shift;
        if ((b & 0x80) == 0) return true;
      }
      return false;
    };
    while (p < end) {
      uint64_t tag = 0, n = 0;
      if (!varint(&tag)) return false;
      const uint64_t field = tag >> 3;
      switch (tag & 7) {
        case 0:
          if (!varint(&n)) return false;
          break;
        case 1:
          if (end - p < 8) return false;
          p += 8;
          break;
        case 5:
          if (end - p < 4) return false;
          p += 4;
          break;
        case 2:
          if (!varint(&n) || n > static_cast<uint64_t>(end - p)) return false;
          p += n;
          break;
        default:
          return false;
      }
      if (field == v1::UpMessage::kShardFieldNumber) {
        if ((tag & 7) != 2) return false;
        shard = true;
      } else if (field == v1::UpMessage::kAttachFieldNumber ||
                 field == v1::UpMessage::kCloseFieldNumber) {
        return false;
      }
    }
    return shard;
  }

  v1::UpMessage msg_;
};

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_UCX_FRAME_H_
