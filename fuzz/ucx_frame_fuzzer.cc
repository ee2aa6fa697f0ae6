// Fuzz target "ucx_frame": the UCX frame parser (common/ucx_frame.h
// ParseFrame) on the frames the daemon receives (v1.UpMessage, in
// UcxDataPlane::Handle) and those a worker receives (v1.DownMessage, in
// UcxDataStream), after the daemon's size check.
//
// Input: a byte (bit 0: a DownMessage frame, else an UpMessage frame), then
// the frame. Properties checked: a frame that parses, framed again with
// SplitFrame, parses to the same message; for a DownMessage, SplitFrameShared
// frames it (unknown fields aside) exactly as SplitFrame does.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/ucx_frame.h"
#include "fuzz/check.h"
#include "fuzz/fuzz_job.h"
#include "fuzz/input.h"

namespace zenflow {
namespace fuzz {
namespace {

template <typename Message>
bool ParseChecked(std::string frame, Message* m) {
  if (!Registry()->CheckMessageSize(frame.size()).ok()) return false;
  return ParseFrame(std::move(frame), m).ok();
}

template <typename Message>
void CheckRoundTrip(const Message& parsed) {
  Message copy = parsed;
  std::string payload, header;
  SplitFrame(&copy, &payload, &header);
  Message back;
  const absl::Status s = ParseFrame(payload + header, &back);
  FUZZ_CHECK(s.ok(), "a parsed frame, framed again, does not parse: ", s.ToString());
  FUZZ_CHECK(back.SerializeAsString() == parsed.SerializeAsString(),
             "a parsed frame, framed again, parses to another message: ",
             parsed.ShortDebugString(), " vs ", back.ShortDebugString());
}

void CheckSharedFraming(v1::DownMessage m) {
  m.DiscardUnknownFields();
  std::string header_shared;
  const std::string payload_shared(SplitFrameShared(m, &header_shared));
  std::string payload, header;
  SplitFrame(&m, &payload, &header);
  FUZZ_CHECK(payload_shared == payload && header_shared == header,
             "SplitFrameShared frames a message differently from SplitFrame: ",
             m.ShortDebugString());
}

}  // namespace
}  // namespace fuzz
}  // namespace zenflow

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zenflow;
  using namespace zenflow::fuzz;
  FuzzInput in(data, size);
  const bool down = (in.Byte() & 1) != 0;
  const absl::string_view frame = in.Rest();
  if (down) {
    v1::DownMessage m;
    if (!ParseChecked(std::string(frame), &m)) return 0;
    CheckRoundTrip(m);
    CheckSharedFraming(m);
  } else {
    v1::UpMessage m;
    if (!ParseChecked(std::string(frame), &m)) return 0;
    CheckRoundTrip(m);
  }
  return 0;
}
