// An UpMessage's shard payload kept out of protobuf's copies on the gRPC
// path (docs/protocol.md#transports):
//
//   client  UpMessageHead writes the message's bytes up to its payload's
//           bytes; the head and the payload (borrowed from the caller) go
//           to gRPC as two slices, so the payload is never copied in user
//           space.
//   daemon  ParseUpSplit reads a received message from gRPC's slices and
//           leaves the payload where it arrived: `ShardPayload` views of
//           those slices, which the accumulation reads column by column.
//
// Both speak the plain protobuf wire format: what UpMessageHead + payload
// make is the same message protobuf would parse, and ParseUpSplit gives up
// (the caller then parses with protobuf, which also says what is wrong)
// on any input it does not take exactly as protobuf would.
#ifndef ZENFLOW_COMMON_UP_WIRE_H_
#define ZENFLOW_COMMON_UP_WIRE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// The bytes of `msg` with `payload_size` bytes of shard payload, less those
// payload bytes (which follow the head on the wire). `msg` must hold a
// shard whose own payload is empty; it is unchanged when this returns.
std::string UpMessageHead(v1::UpMessage* msg, size_t payload_size);

// A shard's payload as consecutive pieces of memory someone else keeps
// alive (gRPC's slices, or a UCX receive buffer).
class ShardPayload {
 public:
  ShardPayload() = default;
  explicit ShardPayload(absl::string_view whole) { Append(whole); }
  void Append(absl::string_view piece) {
    if (piece.empty()) return;
    pieces_.push_back(piece);
    size_ += piece.size();
  }
  void Clear() {
    pieces_.clear();
    size_ = 0;
  }
  size_t size() const { return size_; }
  const std::vector<absl::string_view>& pieces() const { return pieces_; }
  // One piece (or none): the payload is contiguous at data().
  bool contiguous() const { return pieces_.size() <= 1; }
  const char* data() const { return pieces_.empty() ? nullptr : pieces_[0].data(); }
  // Copies bytes [offset, offset + n) to `out`.
  void CopyOut(size_t offset, size_t n, char* out) const;

 private:
  std::vector<absl::string_view> pieces_;
  size_t size_ = 0;
};

// Reads consecutive equal-sized runs (columns) of a ShardPayload: each in
// place when it lies in one piece, else gathered into a scratch buffer that
// stays small (one run).
class RunReader {
 public:
  RunReader(const ShardPayload& payload, size_t run_bytes)
      : payload_(payload), run_bytes_(run_bytes) {}
  // The next run; valid until the next call. Null after the last.
  const char* Next();

 private:
  const ShardPayload& payload_;
  const size_t run_bytes_;
  size_t piece_ = 0;   // the piece the next run starts in
  size_t in_piece_ = 0;  // and where in it
  size_t offset_ = 0;  // the next run's offset in the payload
  std::string scratch_;
};

// Parses the message whose bytes are `pieces`, in order, into `*msg` and
// `*payload`: every field as protobuf would parse it, except the shard's
// payload, which stays in the pieces (`*payload` views them; `msg`'s shard
// payload is empty). False when the message is not a shard in the plain
// form (one shard field, at most one payload field) or is not valid: then
// parse it with protobuf instead; `*msg` and `*payload` are unspecified.
bool ParseUpSplit(const std::vector<absl::string_view>& pieces, v1::UpMessage* msg,
                  ShardPayload* payload);

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_UP_WIRE_H_
