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
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

// Parses a received frame, consuming `frame` (its buffer becomes the payload).
template <typename Message>
absl::Status ParseFrame(std::string frame, Message* m) {
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
  const size_t payload = frame.size() - kUcxFrameTrailer - size;
  if (!m->ParseFromArray(frame.data() + payload, static_cast<int>(size))) {
    return absl::InvalidArgumentError("UCX frame header is not a valid zenflow.v1 message");
  }
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

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_UCX_FRAME_H_
