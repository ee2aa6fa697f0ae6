// The receive copy that also looks at the values: a transport that must
// copy a message out of its own buffers anyway (UCX's shared-memory
// fragments) copies it with CopyScanNonFinite, which notes on the way which
// wire dtypes' NaN / Inf bit patterns occur in it, and which dtypes' values
// reach 2^63 in magnitude. A shard whose payload the scan covers, with no
// such pattern for its dtype, is finite without a second read
// (server/job_rounds.cc, Job::AddShard): the bytes come from memory once for
// the check and once for the add, as a receive and an add alone would
// (docs/architecture.md#the-data-path). One whose values are also all below
// 2^63 ("bounded") cannot make its round's update overflow, so the update
// need not measure the round's gradient before it runs AdamW
// (server/round_update.h, RoundUpdateInput::bounded). AllBounded is the
// same test for a payload no copy scanned.
//
//   NonFiniteScan scan;
//   scan.Begin(n);
//   scan.Add(/*offset=*/0, CopyScanNonFinite(dst, src, n), n);
//   if (scan.Proves(DType::kBF16, payload_bytes)) ...         // no NaN or Inf
//   if (scan.ProvesBounded(DType::kBF16, payload_bytes)) ...  // and all < 2^63
#ifndef ZENFLOW_COMMON_COPY_SCAN_H_
#define ZENFLOW_COMMON_COPY_SCAN_H_

#include <cstddef>
#include <cstdint>

#include "common/codec.h"

namespace zenflow {

// Bit (1 << int(dtype)) of a scan's result: some whole value of `dtype`
// (4-byte words at multiples of 4 from the start for kF32, 2-byte words at
// multiples of 2 for kBF16 and kF16) has an all-ones exponent.
constexpr uint32_t NonFiniteBit(DType dtype) { return uint32_t{1} << static_cast<int>(dtype); }
// Bit (1 << (8 + int(dtype))): some whole value of `dtype` has a magnitude
// of 2^63 or more, or is non-finite (kF32 and kBF16 only: an fp16 value
// below 65520 is bounded when it is finite).
constexpr uint32_t LargeBit(DType dtype) { return uint32_t{1} << (8 + static_cast<int>(dtype)); }
constexpr uint32_t kAllNonFiniteBits =
    NonFiniteBit(DType::kF32) | NonFiniteBit(DType::kBF16) | NonFiniteBit(DType::kF16);
constexpr uint32_t kAllScanBits =
    kAllNonFiniteBits | LargeBit(DType::kF32) | LargeBit(DType::kBF16);

// The bound, as the bits of its exponent field: 2^63 in fp32 (exponent 190)
// and in bf16 (fp32's top half). A value whose masked exponent bits are at
// least these has a magnitude of 2^63 or more, or is NaN / Inf.
constexpr uint32_t kF32BoundBits = 0x5F000000u;
constexpr uint16_t kBf16BoundBits = 0x5F00u;

// True when all n encoded values are finite and of magnitude below 2^63
// (for kF16: finite). One read of src; the codec's SIMD level.
bool AllBounded(DType dtype, const void* src, size_t n);

// Copies n bytes from src to dst (they must not overlap) and returns the
// bits (NonFiniteBit, LargeBit) of the dtypes with a non-finite or a large
// value among the whole words of [0, n) (a word cut by n is copied, not
// scanned). One read of src; the
// SIMD level is the codec's (codec_internal::ActiveIsa).
uint32_t CopyScanNonFinite(void* dst, const void* src, size_t n);

namespace copy_scan_internal {
// The same at a given level (which must be supported), for tests.
uint32_t CopyScanNonFiniteWith(codec_internal::Isa isa, void* dst, const void* src, size_t n);
bool AllBoundedWith(codec_internal::Isa isa, DType dtype, const void* src, size_t n);
}  // namespace copy_scan_internal

// What the scans of a message's pieces prove, piece by piece as they arrive
// (in any order). Nothing is proven until Begin; a piece that does not start
// on a 4-byte boundary, or that cuts a word at its end (other than the
// message's), leaves the whole message unproven, as does a piece never
// scanned (the caller counts the bytes it scanned).
class NonFiniteScan {
 public:
  // A message of `total` bytes is about to be scanned.
  void Begin(size_t total) {
    begun_ = true;
    total_ = total;
    scanned_ = 0;
    seen_ = 0;
  }
  // The message's length (0 before Begin).
  size_t total() const { return total_; }
  // The scan of bytes [offset, offset + n) returned `bits`.
  void Add(size_t offset, uint32_t bits, size_t n) {
    const bool whole_words = offset % 4 == 0 && (n % 4 == 0 || offset + n == total_);
    seen_ |= whole_words ? bits : kAllScanBits;
    scanned_ += n;
  }
  // No scan (or a failed one): proves nothing.
  void Reset() { *this = NonFiniteScan(); }
  // True when the first `bytes` bytes of the message are values of `dtype`
  // that are all finite.
  bool Proves(DType dtype, size_t bytes) const {
    return begun_ && scanned_ == total_ && bytes <= total_ &&
           (seen_ & NonFiniteBit(dtype)) == 0;
  }
  // The same, and every value's magnitude is below 2^63.
  bool ProvesBounded(DType dtype, size_t bytes) const {
    return Proves(dtype, bytes) && (seen_ & LargeBit(dtype)) == 0;
  }

 private:
  bool begun_ = false;
  size_t total_ = 0;
  size_t scanned_ = 0;
  uint32_t seen_ = kAllScanBits;
};

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_COPY_SCAN_H_
