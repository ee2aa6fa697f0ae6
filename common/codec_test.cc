// Tests for common/codec: exact scalar conversions (exhaustive over all 16-bit
// patterns), hand-checked rounding cases, and equality of every SIMD path
// with the scalar path on random, misaligned data.

#include "common/codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

using codec_internal::Isa;
using codec_internal::SupportedIsas;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// Same bits, or both NaN (NaN payload propagation through an add may
// legitimately depend on operand order).
bool SameFloat(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return Bits(a) == Bits(b);
}

TEST(CodecTest, DTypeSizeAndName) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_STREQ(DTypeName(DType::kF32), "fp32");
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_STREQ(DTypeName(DType::kF16), "fp16");
}

TEST(CodecTest, SimdLevelIsConsistent) {
  const std::string level = CodecSimdLevel();
  EXPECT_TRUE(level == "avx512" || level == "avx2" || level == "scalar");
  EXPECT_EQ(level, IsaName(codec_internal::ActiveIsa()));
  EXPECT_TRUE(codec_internal::IsaSupported(Isa::kScalar));
}

TEST(CodecTest, Bf16ExhaustiveRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float f = Bf16ToFloat(b);
    ASSERT_EQ(Bits(f), h << 16) << h;
    const uint16_t back = FloatToBf16(f);
    if (std::isnan(f)) {
      // NaN stays NaN, becomes quiet, keeps sign and payload.
      ASSERT_EQ(back, b | 0x40) << h;
    } else {
      ASSERT_EQ(back, b) << h;
    }
  }
}

// Independent (double-precision) definition of binary16 values.
double F16Value(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  if (exp == 0) return sign * std::ldexp(static_cast<double>(mant), -24);
  if (exp == 31) {
    return mant == 0 ? sign * std::numeric_limits<double>::infinity()
                     : std::numeric_limits<double>::quiet_NaN();
  }
  return sign * std::ldexp(1.0 + mant / 1024.0, exp - 15);
}

TEST(CodecTest, F16ExhaustiveRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float f = F16ToFloat(b);
    const double expected = F16Value(b);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_EQ(Bits(f) >> 31, h >> 15) << h;
      ASSERT_EQ(FloatToF16(f), b | 0x200) << h;  // Quiet, payload kept.
    } else {
      ASSERT_EQ(static_cast<double>(f), expected) << h;
      ASSERT_EQ(std::signbit(f), (h >> 15) != 0) << h;
      ASSERT_EQ(FloatToF16(f), b) << h;
    }
  }
}

// Decoding / encoding all 65536 patterns in bulk with every ISA, at several
// byte offsets, agrees with the scalar conversions.
TEST(CodecTest, ExhaustiveBulkMatchesScalar) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> all(65536);
    std::vector<float> want(65536);
    for (uint32_t h = 0; h < 65536; ++h) {
      all[h] = static_cast<uint16_t>(h);
      want[h] =
          dtype == DType::kBF16 ? Bf16ToFloat(all[h]) : F16ToFloat(all[h]);
    }
    for (Isa isa : SupportedIsas()) {
      for (size_t offset : {0, 1, 3}) {
        SCOPED_TRACE(std::string(IsaName(isa)) + " " + DTypeName(dtype) +
                     " offset " + std::to_string(offset));
        std::vector<unsigned char> src(2 * 65536 + 8);
        std::memcpy(src.data() + offset, all.data(), 2 * 65536);
        std::vector<float> got(65536 + 4);
        codec_internal::DecodeWith(isa, dtype, src.data() + offset, 65536,
                                   got.data() + 1);
        for (uint32_t h = 0; h < 65536; ++h) {
          ASSERT_EQ(Bits(got[h + 1]), Bits(want[h])) << h;
        }
        // Encode the decoded values back.
        std::vector<unsigned char> enc(2 * 65536 + 8);
        codec_internal::EncodeWith(isa, dtype, got.data() + 1, 65536,
                                   enc.data() + offset);
        for (uint32_t h = 0; h < 65536; ++h) {
          uint16_t e;
          std::memcpy(&e, enc.data() + offset + 2 * h, 2);
          const uint16_t expect = dtype == DType::kBF16 ? FloatToBf16(want[h])
                                                        : FloatToF16(want[h]);
          ASSERT_EQ(e, expect) << h;
        }
      }
    }
  }
}

TEST(CodecTest, Bf16RoundNearestEven) {
  const float ulp = std::ldexp(1.0f, -7);    // bf16 ulp at 1.0.
  const float half = std::ldexp(1.0f, -8);   // Half an ulp.
  const float tiny = std::ldexp(1.0f, -23);  // fp32 ulp at 1.0.
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + half), 0x3F80);         // Tie -> even.
  EXPECT_EQ(FloatToBf16(1.0f + half + tiny), 0x3F81);  // Above -> up.
  EXPECT_EQ(FloatToBf16(1.0f + half - tiny), 0x3F80);  // Below -> down.
  EXPECT_EQ(FloatToBf16(1.0f + ulp + half), 0x3F82);   // Tie, odd -> up.
  EXPECT_EQ(FloatToBf16(1.0f + ulp + half - tiny), 0x3F81);
  EXPECT_EQ(FloatToBf16(-(1.0f + half)), 0xBF80);
  EXPECT_EQ(FloatToBf16(-(1.0f + half + tiny)), 0xBF81);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // Largest float is above the largest bf16 plus half an ulp: overflows.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);
  // Signaling and quiet NaNs stay NaN and come back quiet.
  for (uint32_t nan_bits :
       {0x7F800001u, 0x7FC00000u, 0xFF800001u, 0x7FFFFFFFu, 0x7F80FFFFu}) {
    const uint16_t r = FloatToBf16(FromBits(nan_bits));
    EXPECT_EQ(r & 0x7FC0, 0x7FC0) << std::hex << nan_bits;
    EXPECT_EQ(r >> 15, nan_bits >> 31);
    EXPECT_TRUE(std::isnan(Bf16ToFloat(r)));
  }
}

TEST(CodecTest, F16RoundNearestEven) {
  const float half = std::ldexp(1.0f, -11);  // Half an fp16 ulp at 1.0.
  const float tiny = std::ldexp(1.0f, -23);
  EXPECT_EQ(FloatToF16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToF16(1.0f + half), 0x3C00);  // Tie -> even.
  EXPECT_EQ(FloatToF16(1.0f + half + tiny), 0x3C01);
  EXPECT_EQ(FloatToF16(1.0f + 3 * half), 0x3C02);  // Tie, odd -> up.
  EXPECT_EQ(FloatToF16(1.0f + 3 * half - 2 * tiny), 0x3C01);
  EXPECT_EQ(FloatToF16(-(1.0f + half + tiny)), 0xBC01);
  EXPECT_EQ(FloatToF16(-0.0f), 0x8000);
  // Overflow boundary: 65504 is the max; 65520 is the tie to Inf.
  EXPECT_EQ(FloatToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToF16(65519.996f), 0x7BFF);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7C00);
  EXPECT_EQ(FloatToF16(-1e6f), 0xFC00);
  EXPECT_EQ(FloatToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  // Subnormals.
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -14)), 0x0400);  // Min normal.
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);  // Min subnormal.
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);  // Tie -> even (0).
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25) * 1.0000001f), 0x0001);
  EXPECT_EQ(FloatToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 -> 2.
  EXPECT_EQ(FloatToF16(std::ldexp(5.0f, -25)), 0x0002);  // 2.5 -> 2.
  EXPECT_EQ(FloatToF16(std::ldexp(1023.5f, -24)), 0x0400);
  EXPECT_EQ(FloatToF16(std::ldexp(1022.5f, -24)), 0x03FE);
  EXPECT_EQ(FloatToF16(-std::ldexp(1.0f, -26)), 0x8000);
  EXPECT_EQ(FloatToF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  for (uint32_t nan_bits :
       {0x7F800001u, 0x7FC00000u, 0xFF800001u, 0x7FFFFFFFu}) {
    const uint16_t r = FloatToF16(FromBits(nan_bits));
    EXPECT_EQ(r & 0x7E00, 0x7E00) << std::hex << nan_bits;
    EXPECT_EQ(r >> 15, nan_bits >> 31);
  }
}

// Random floats: mostly ordinary magnitudes, with some raw bit patterns
// (NaN payloads, Inf, subnormals, exact ties) mixed in.
std::vector<float> RandomFloats(std::mt19937* rng, size_t n, bool specials) {
  std::uniform_real_distribution<float> normal(-4.0f, 4.0f);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int k = specials ? kind(*rng) : 0;
    if (k == 1) {
      out[i] = FromBits(bits(*rng));
    } else if (k == 2) {
      // Exact bf16 / fp16 ties.
      out[i] = FromBits((bits(*rng) & 0xFFFF0000u) | 0x8000u);
    } else if (k == 3) {
      out[i] = FromBits((bits(*rng) & 0xFFFFE000u) | 0x1000u);
    } else if (k == 4) {
      out[i] = std::ldexp(normal(*rng), -20);  // fp16 subnormal range.
    } else {
      out[i] = normal(*rng);
    }
  }
  return out;
}

TEST(CodecTest, VectorPathsMatchScalarRandom) {
  std::mt19937 rng(1234);
  for (Isa isa : SupportedIsas()) {
    for (DType dtype : kAllDTypes) {
      const size_t es = DTypeSize(dtype);
      for (size_t n = 0; n <= 67; ++n) {
        for (size_t off : {0, 1, 2, 3, 5}) {
          SCOPED_TRACE(std::string(IsaName(isa)) + " " + DTypeName(dtype) +
                       " n=" + std::to_string(n) +
                       " off=" + std::to_string(off));
          // Float buffers are offset by whole elements (not vector-aligned);
          // encoded buffers by arbitrary bytes.
          const std::vector<float> values = RandomFloats(&rng, n, true);
          std::vector<float> src(n + 8);
          std::copy(values.begin(), values.end(), src.begin() + off);
          const float* fsrc = src.data() + off;

          std::vector<unsigned char> enc_s(n * es + 8), enc_v(n * es + 8);
          codec_internal::EncodeWith(Isa::kScalar, dtype, fsrc, n,
                                     enc_s.data() + off);
          codec_internal::EncodeWith(isa, dtype, fsrc, n, enc_v.data() + off);
          ASSERT_EQ(enc_s, enc_v);

          std::vector<float> dec_s(n + 8), dec_v(n + 8);
          codec_internal::DecodeWith(Isa::kScalar, dtype, enc_s.data() + off, n,
                                     dec_s.data() + off);
          codec_internal::DecodeWith(isa, dtype, enc_s.data() + off, n,
                                     dec_v.data() + off);
          for (size_t i = 0; i < n + 8; ++i) {
            ASSERT_EQ(Bits(dec_s[i]), Bits(dec_v[i])) << i;
          }

          const std::vector<float> base = RandomFloats(&rng, n, false);
          std::vector<float> acc_s(n + 8, 7.0f), acc_v(n + 8, 7.0f);
          std::copy(base.begin(), base.end(), acc_s.begin() + off);
          std::copy(base.begin(), base.end(), acc_v.begin() + off);
          codec_internal::DecodeAddWith(Isa::kScalar, dtype, enc_s.data() + off,
                                        n, acc_s.data() + off);
          codec_internal::DecodeAddWith(isa, dtype, enc_s.data() + off, n,
                                        acc_v.data() + off);
          for (size_t i = 0; i < n + 8; ++i) {
            ASSERT_TRUE(SameFloat(acc_s[i], acc_v[i]))
                << i << ": " << acc_s[i] << " vs " << acc_v[i];
          }
          // Elements outside [off, off + n) are untouched.
          for (size_t i = 0; i < off; ++i) ASSERT_EQ(acc_v[i], 7.0f);
          for (size_t i = off + n; i < n + 8; ++i) ASSERT_EQ(acc_v[i], 7.0f);

          size_t bad_s = 12345, bad_v = 54321;
          const bool ok_s = codec_internal::AllFiniteWith(
              Isa::kScalar, dtype, enc_s.data() + off, n, &bad_s);
          const bool ok_v = codec_internal::AllFiniteWith(
              isa, dtype, enc_s.data() + off, n, &bad_v);
          ASSERT_EQ(ok_s, ok_v);
          if (!ok_s) {
            ASSERT_EQ(bad_s, bad_v);
          }
        }
      }
    }
  }
}

TEST(CodecTest, DecodeAddMatchesScalarLarge) {
  std::mt19937 rng(99);
  const size_t n = 100003;
  const std::vector<float> values = RandomFloats(&rng, n, false);
  for (DType dtype : kAllDTypes) {
    std::vector<unsigned char> enc(n * DTypeSize(dtype) + 1);
    Encode(dtype, values.data(), n, enc.data() + 1);
    const std::vector<float> base = RandomFloats(&rng, n, false);
    std::vector<float> want = base;
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, enc.data() + 1 + 2 * i, 2);
      if (dtype == DType::kF32) {
        want[i] += values[i];
      } else {
        want[i] += dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
      }
    }
    std::vector<float> got = base;
    DecodeAdd(dtype, enc.data() + 1, n, got.data());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(want[i]), Bits(got[i])) << i;
  }
}

// Encodes a finite buffer, plants `bad` at `pos` (and another bad value
// later), and checks every ISA reports `pos`.
TEST(CodecTest, AllFiniteFindsFirstBad) {
  const float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(7);
  for (DType dtype : kAllDTypes) {
    const size_t es = DTypeSize(dtype);
    for (size_t n :
         {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 129, 1000}) {
      std::vector<float> values = RandomFloats(&rng, n, false);
      // Finite extremes must not be flagged.
      values[0] = dtype == DType::kF16 ? 65504.0f : 3.0e38f;
      if (n > 1) values[1] = -0.0f;
      if (n > 2) values[2] = std::ldexp(1.0f, -24);
      std::vector<unsigned char> clean(n * es + 3);
      Encode(dtype, values.data(), n, clean.data() + 3 - (n % 3));
      for (Isa isa : SupportedIsas()) {
        const unsigned char* p = clean.data() + 3 - (n % 3);
        size_t bad = 777;
        ASSERT_TRUE(codec_internal::AllFiniteWith(isa, dtype, p, n, &bad));
        EXPECT_EQ(bad, 777u);  // Untouched on success.
        ASSERT_TRUE(codec_internal::AllFiniteWith(isa, dtype, p, n, nullptr));
      }
      std::vector<size_t> positions = {0, n / 2, n - 1};
      if (n > 3) positions.push_back(n - 3);  // In the vector tail.
      for (size_t pos : positions) {
        for (float special : {kNaN, kInf, -kInf}) {
          std::vector<float> dirty = values;
          dirty[pos] = special;
          if (pos + 1 < n) dirty[n - 1] = kNaN;  // A later bad value.
          std::vector<unsigned char> enc(n * es + 1);
          Encode(dtype, dirty.data(), n, enc.data() + 1);
          for (Isa isa : SupportedIsas()) {
            SCOPED_TRACE(std::string(IsaName(isa)) + " " + DTypeName(dtype) +
                         " n=" + std::to_string(n) + " pos=" +
                         std::to_string(pos) + " v=" + std::to_string(special));
            size_t bad = 777;
            EXPECT_FALSE(codec_internal::AllFiniteWith(
                isa, dtype, enc.data() + 1, n, &bad));
            EXPECT_EQ(bad, pos);
            EXPECT_FALSE(codec_internal::AllFiniteWith(
                isa, dtype, enc.data() + 1, n, nullptr));
          }
          size_t bad = 777;
          EXPECT_FALSE(AllFinite(dtype, enc.data() + 1, n, &bad));
          EXPECT_EQ(bad, pos);
        }
      }
    }
    // Empty input is finite.
    size_t bad = 5;
    EXPECT_TRUE(AllFinite(dtype, nullptr, 0, &bad));
    EXPECT_EQ(bad, 5u);
  }
}

TEST(CodecTest, Fp16OverflowIsNotFinite) {
  const float big = 70000.0f;  // Finite in fp32 but Inf in fp16.
  uint16_t h;
  Encode(DType::kF16, &big, 1, &h);
  size_t bad = 9;
  EXPECT_FALSE(AllFinite(DType::kF16, &h, 1, &bad));
  EXPECT_EQ(bad, 0u);
}

TEST(CodecTest, F32EncodeDecodeIsCopy) {
  std::mt19937 rng(3);
  const std::vector<float> values = RandomFloats(&rng, 37, true);
  std::vector<unsigned char> enc(37 * 4 + 1);
  Encode(DType::kF32, values.data(), 37, enc.data() + 1);
  EXPECT_EQ(std::memcmp(enc.data() + 1, values.data(), 37 * 4), 0);
  std::vector<float> dec(37);
  Decode(DType::kF32, enc.data() + 1, 37, dec.data());
  EXPECT_EQ(std::memcmp(dec.data(), values.data(), 37 * 4), 0);
}

}  // namespace
}  // namespace zenflow

namespace zenflow {
namespace {

// Every ISA's int8 decode-add gives the scalar expression's bits (the
// product rounded, then the sum), at every length and tail.
TEST(CodecTest, DecodeAddInt8MatchesScalar) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17},
                   size_t{33}, size_t{100}, size_t{4096 + 5}}) {
    std::vector<int8_t> q(n);
    for (int8_t& x : q) x = static_cast<int8_t>(rng());
    if (n > 0) q[0] = -128;
    std::vector<float> base(n);
    for (float& x : base) x = u(rng);
    for (float scale : {0.0f, 1.0f, 0.0123f, 3.7e-5f, 1.5e30f}) {
      std::vector<float> want = base;
      for (size_t i = 0; i < n; ++i) want[i] += static_cast<float>(q[i]) * scale;
      for (codec_internal::Isa isa :
           {codec_internal::Isa::kScalar, codec_internal::Isa::kAvx2, codec_internal::Isa::kAvx512}) {
        if (!codec_internal::IsaSupported(isa)) continue;
        std::vector<float> got = base;
        codec_internal::DecodeAddInt8With(isa, q.data(), n, scale, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
            << "isa " << static_cast<int>(isa) << " n " << n << " scale " << scale;
      }
    }
  }
}

}  // namespace
}  // namespace zenflow
