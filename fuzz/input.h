// How the fuzz targets cut one input into parts, and how seed_writer makes
// inputs of that shape. A part is a record: a one-byte tag, a 16-bit
// little-endian length and that many bytes (fewer when the input ends
// first). Fixed-size fields are read as little-endian integers, as zero past
// the end.
//
//   FuzzInput in(data, size);
//   const uint8_t config = in.Byte();
//   while (std::optional<FuzzRecord> r = in.Record()) Handle(r->tag, r->body);
//
// Not thread-safe (one per input).
#ifndef ZENFLOW_FUZZ_INPUT_H_
#define ZENFLOW_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace zenflow {
namespace fuzz {

struct FuzzRecord {
  uint8_t tag = 0;
  absl::string_view body;
};

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}

  bool empty() const { return at_ >= size_; }
  size_t remaining() const { return size_ - at_; }

  // The next byte; 0 past the end.
  uint8_t Byte() { return at_ < size_ ? static_cast<uint8_t>(data_[at_++]) : 0; }

  uint16_t U16() {
    const uint16_t lo = Byte();
    return static_cast<uint16_t>(lo | (Byte() << 8));
  }

  // The next record, or nothing once fewer than its 3 header bytes are left.
  std::optional<FuzzRecord> Record() {
    if (remaining() < 3) return std::nullopt;
    FuzzRecord r;
    r.tag = Byte();
    const size_t len = U16();
    const size_t n = len < remaining() ? len : remaining();
    r.body = absl::string_view(data_ + at_, n);
    at_ += n;
    return r;
  }

  // Everything not read yet.
  absl::string_view Rest() {
    absl::string_view r(data_ + at_, remaining());
    at_ = size_;
    return r;
  }

 private:
  const char* data_;
  size_t size_;
  size_t at_ = 0;
};

// Builds inputs that FuzzInput reads back (seed_writer, tests).
class FuzzInputWriter {
 public:
  FuzzInputWriter& Byte(uint8_t b) {
    out_.push_back(static_cast<char>(b));
    return *this;
  }
  // `body` must be under 64 KiB.
  FuzzInputWriter& Record(uint8_t tag, absl::string_view body) {
    Byte(tag);
    Byte(static_cast<uint8_t>(body.size() & 0xff));
    Byte(static_cast<uint8_t>((body.size() >> 8) & 0xff));
    out_.append(body.data(), body.size());
    return *this;
  }
  FuzzInputWriter& Raw(absl::string_view bytes) {
    out_.append(bytes.data(), bytes.size());
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

}  // namespace fuzz
}  // namespace zenflow

#endif  // ZENFLOW_FUZZ_INPUT_H_
