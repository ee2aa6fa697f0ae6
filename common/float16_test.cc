// Tests for common/float16.h, the scalar conversions the codec and the CUDA
// kernels share. codec_test checks them case by case and exhaustively over
// the 16-bit patterns; this file pins them, over a sweep of the fp32
// patterns, to the codec's output from before they moved into this header,
// and to every bulk codec path (F16C hardware conversion included).

#include "common/float16.h"

#include <string>
#include <vector>

#include "common/codec.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

using codec_internal::Isa;

// Every kStride-th fp32 bit pattern: about 16.7M values that reach every
// exponent, both signs, NaNs, infinities and the fp16 subnormal range, with
// mantissas that are not round-trip values.
constexpr uint64_t kStride = 257;

float FromBits(uint32_t u) { return float16_internal::BitCast<float>(u); }

uint32_t Bits(float f) { return float16_internal::BitCast<uint32_t>(f); }

// FNV-1a 64 over little-endian values.
class Fnv {
 public:
  void Add(uint32_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      h_ ^= (v >> (8 * i)) & 0xFFu;
      h_ *= 0x100000001B3ull;
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xCBF29CE484222325ull;
};

// The checksums were recorded from the codec's own scalar functions at
// commit a8608b7, before they moved into float16.h (the moved code was also
// compared with them on all 2^32 inputs then). A mismatch means the rounding
// changed; SweepMatchesEveryCodecPath below shows where.
TEST(Float16Test, SweepMatchesRecordedCodecOutput) {
  Fnv bf16, f16;
  for (uint64_t i = 0; i < (uint64_t{1} << 32); i += kStride) {
    const float f = FromBits(static_cast<uint32_t>(i));
    bf16.Add(FloatToBf16(f), 2);
    f16.Add(FloatToF16(f), 2);
  }
  EXPECT_EQ(bf16.value(), 0xEF95E2C44C559F63ull);
  EXPECT_EQ(f16.value(), 0xEA79EFDE54D6EFA9ull);

  Fnv from_bf16, from_f16;
  for (uint32_t h = 0; h < 65536; ++h) {
    from_bf16.Add(Bits(Bf16ToFloat(static_cast<uint16_t>(h))), 4);
    from_f16.Add(Bits(F16ToFloat(static_cast<uint16_t>(h))), 4);
  }
  EXPECT_EQ(from_bf16.value(), 0x43A13836C4CA3B25ull);
  EXPECT_EQ(from_f16.value(), 0x5D79F1B086F30345ull);
}

TEST(Float16Test, SweepMatchesEveryCodecPath) {
  std::vector<float> values;
  values.reserve(static_cast<size_t>((uint64_t{1} << 32) / kStride + 1));
  for (uint64_t i = 0; i < (uint64_t{1} << 32); i += kStride) {
    values.push_back(FromBits(static_cast<uint32_t>(i)));
  }
  std::vector<uint16_t> encoded(values.size());
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!codec_internal::IsaSupported(isa)) continue;
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " isa " +
                   std::to_string(static_cast<int>(isa)));
      codec_internal::EncodeWith(isa, dtype, values.data(), values.size(),
                                 encoded.data());
      for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t want = dtype == DType::kBF16 ? FloatToBf16(values[i])
                                                    : FloatToF16(values[i]);
        ASSERT_EQ(encoded[i], want) << "fp32 bits " << std::hex
                                    << Bits(values[i]);
      }
    }
  }
}

}  // namespace
}  // namespace zenflow
