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

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/copy_scan.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// The bytes of `msg` with `payload_size` bytes of shard payload, less those
// payload bytes (which follow the head on the wire). `msg` must hold a
// shard whose own payload is empty; it is unchanged when this returns.
std::string UpMessageHead(v1::UpMessage* msg, size_t payload_size);

// A shard's payload as consecutive pieces of memory someone else keeps
// alive (gRPC's slices, or a UCX receive buffer). One piece is held inline
// (no allocation); more go to a vector whose room Clear keeps, so a
// payload object reused message after message allocates only when a
// message has more pieces than any before.
class ShardPayload {
 public:
  ShardPayload() = default;
  explicit ShardPayload(absl::string_view whole) { Append(whole); }
  void Append(absl::string_view piece) {
    if (piece.empty()) return;
    if (count_ == 0) {
      one_ = piece;
    } else {
      if (count_ == 1) {
        more_.clear();
        more_.push_back(one_);
      }
      more_.push_back(piece);
    }
    ++count_;
    size_ += piece.size();
  }
  void Clear() {
    count_ = 0;
    size_ = 0;
    more_.clear();
    scan_.Reset();
  }
  // What the transport's receive copy proved of the payload's values (a
  // UCX body received with UcxOptions::scan_nonfinite); unproven unless set.
  void set_scan(const NonFiniteScan& scan) { scan_ = scan; }
  const NonFiniteScan& scan() const { return scan_; }
  size_t size() const { return size_; }
  absl::Span<const absl::string_view> pieces() const {
    return count_ <= 1 ? absl::Span<const absl::string_view>(&one_, count_)
                       : absl::Span<const absl::string_view>(more_);
  }
  // One piece (or none): the payload is contiguous at data().
  bool contiguous() const { return count_ <= 1; }
  const char* data() const { return count_ == 0 ? nullptr : pieces()[0].data(); }
  // Copies bytes [offset, offset + n) to `out`.
  void CopyOut(size_t offset, size_t n, char* out) const;

 private:
  absl::string_view one_;
  std::vector<absl::string_view> more_;  // all the pieces, when more than one
  size_t count_ = 0;
  size_t size_ = 0;
  NonFiniteScan scan_;
};

// Calls fn(column, first_row, values, n) for every stretch of n values of
// columns [first, end) of a payload of `rows` values of `esize` bytes per
// column that lies in one piece, in order: the values are read where they
// are (no copy), except a value cut in two by a piece boundary, which is
// gathered (esize <= 8 bytes, on the stack) and passed alone. Stops, and
// returns false, when fn does. The payload must hold the columns.
template <typename Fn>
bool ForEachStretch(const ShardPayload& payload, size_t rows, size_t esize, size_t first,
                    size_t end, Fn&& fn);

// Parses the message whose bytes are `pieces`, in order, into `*msg` and
// `*payload`: every field as protobuf would parse it, except the shard's
// payload, which stays in the pieces (`*payload` views them; `msg`'s shard
// payload is empty). False when the message is not a shard in the plain
// form (one shard field, at most one payload field) or is not valid: then
// parse it with protobuf instead; `*msg` and `*payload` are unspecified.
// A `msg` that already holds a shard keeps it and its fields' room, so
// parsing message after message into one `msg` does not allocate once the
// room suffices (nor does this function otherwise, after a thread's first
// messages).
bool ParseUpSplit(const ShardPayload& pieces, v1::UpMessage* msg, ShardPayload* payload);

// Clears `msg` as msg->Clear() would, except that a shard it holds stays,
// empty, with its room (columns, scales) for the next ParseUpSplit; a
// payload's room is freed.
void ClearUpKeepingRoom(v1::UpMessage* msg);

// ---- Implementation ----

template <typename Fn>
bool ForEachStretch(const ShardPayload& payload, size_t rows, size_t esize, size_t first,
                    size_t end, Fn&& fn) {
  const absl::Span<const absl::string_view> ps = payload.pieces();
  size_t piece = 0, off = first * rows * esize;  // seek to column `first`
  while (piece < ps.size() && off >= ps[piece].size()) off -= ps[piece++].size();
  for (size_t col = first; col < end; ++col) {
    size_t row = 0;
    while (row < rows) {
      while (off == ps[piece].size()) {
        ++piece;
        off = 0;
      }
      const size_t whole = (ps[piece].size() - off) / esize;
      if (whole > 0) {
        const size_t n = std::min(whole, rows - row);
        if (!fn(col, row, ps[piece].data() + off, n)) return false;
        off += n * esize;
        row += n;
        continue;
      }
      char one[8];
      for (size_t got = 0; got < esize;) {
        while (off == ps[piece].size()) {
          ++piece;
          off = 0;
        }
        const size_t take = std::min(esize - got, ps[piece].size() - off);
        std::memcpy(one + got, ps[piece].data() + off, take);
        got += take;
        off += take;
      }
      if (!fn(col, row, static_cast<const char*>(one), size_t{1})) return false;
      ++row;
    }
  }
  return true;
}

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_UP_WIRE_H_
