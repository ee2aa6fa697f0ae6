// Tests for the shard path's fused kernels (DecodeAddFinite,
// DecodeAddInt8Finite, Int8AllFinite): every SIMD level adds exactly what
// the scalar DecodeAdd adds, and a non-finite value anywhere (first, in a
// block's middle, at a block boundary, in the vector tail, last) is found
// at its index with the blocks before its block added and the rest of the
// sums untouched.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/codec.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

using codec_internal::Isa;
using codec_internal::SupportedIsas;

// a[from, to) and b[from, to) hold the same bits.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b, size_t from,
              size_t to) {
  return std::memcmp(a.data() + from, b.data() + from, (to - from) * sizeof(float)) == 0;
}

std::vector<float> Random(std::mt19937* rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(*rng);
  return v;
}

const size_t kB = kFusedBlockElements;
const size_t kSizes[] = {1, 7, 16, 33, kB - 1, kB, kB + 1, 3 * kB + 5};

// The positions a bad value is put at: first, middle, a block's first and
// last, the vector tail (last - 3) and last.
std::vector<size_t> Positions(size_t n) {
  std::vector<size_t> out = {0, n / 2, n - 1};
  if (n > 3) out.push_back(n - 3);
  if (n > kB) {
    out.push_back(kB - 1);
    out.push_back(kB);
  }
  return out;
}

// `first`: the sum's old values are not read; the result is the scalar add
// into zeros, bit for bit (-0 in gives +0), at every level, in every add.
TEST(CodecFusedTest, FirstAddIsTheAddIntoZeros) {
  std::mt19937 rng(11);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const size_t es = DTypeSize(dt);
    for (size_t n : kSizes) {
      std::vector<float> values = Random(&rng, n);
      values[n / 2] = -0.0f;
      std::vector<char> enc(n * es + 1);
      Encode(dt, values.data(), n, enc.data() + 1);  // misaligned
      std::vector<float> want(n, 0.0f);
      codec_internal::DecodeAddWith(Isa::kScalar, dt, enc.data() + 1, n, want.data());
      ASSERT_FALSE(std::signbit(want[n / 2]));
      for (Isa isa : SupportedIsas()) {
        std::vector<float> acc(n, std::numeric_limits<float>::quiet_NaN());  // stale
        codec_internal::DecodeAddWith(isa, dt, enc.data() + 1, n, acc.data(), /*first=*/true);
        EXPECT_TRUE(SameBits(acc, want, 0, n)) << DTypeName(dt) << " n=" << n;
        acc.assign(n, std::numeric_limits<float>::quiet_NaN());
        size_t bad = 0;
        ASSERT_TRUE(codec_internal::DecodeAddFiniteWith(isa, dt, enc.data() + 1, n, acc.data(),
                                                        &bad, /*first=*/true));
        EXPECT_TRUE(SameBits(acc, want, 0, n)) << "finite " << DTypeName(dt) << " n=" << n;
      }
    }
  }
  for (size_t n : kSizes) {
    std::vector<int8_t> q(n);
    for (size_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(static_cast<int>(i * 37 % 256) - 128);
    for (float scale : {0.01f, 3e38f}) {  // the second overflows: Int8Finite reads the values
      std::vector<float> want(n, 0.0f);
      codec_internal::DecodeAddInt8With(Isa::kScalar, q.data(), n, scale, want.data());
      for (Isa isa : SupportedIsas()) {
        std::vector<float> acc(n, std::numeric_limits<float>::quiet_NaN());
        codec_internal::DecodeAddInt8With(isa, q.data(), n, scale, acc.data(), /*first=*/true);
        EXPECT_TRUE(SameBits(acc, want, 0, n)) << "int8 n=" << n;
        if (std::isfinite(128.0f * scale)) {
          acc.assign(n, std::numeric_limits<float>::quiet_NaN());
          size_t bad = 0;
          ASSERT_TRUE(codec_internal::DecodeAddInt8FiniteWith(isa, q.data(), n, scale, acc.data(),
                                                              &bad, /*first=*/true));
          EXPECT_TRUE(SameBits(acc, want, 0, n)) << "int8 finite n=" << n;
        }
      }
    }
  }
}

TEST(CodecFusedTest, FiniteInputAddsAsDecodeAdd) {
  std::mt19937 rng(3);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const size_t es = DTypeSize(dt);
    for (size_t n : kSizes) {
      const std::vector<float> values = Random(&rng, n);
      std::vector<char> enc(n * es + 1);
      Encode(dt, values.data(), n, enc.data() + 1);  // misaligned
      const std::vector<float> acc0 = Random(&rng, n);
      std::vector<float> want = acc0;
      codec_internal::DecodeAddWith(Isa::kScalar, dt, enc.data() + 1, n, want.data());
      for (Isa isa : SupportedIsas()) {
        SCOPED_TRACE(std::string(DTypeName(dt)) + " n=" + std::to_string(n) +
                     " isa=" + std::to_string(static_cast<int>(isa)));
        std::vector<float> acc = acc0;
        size_t bad = 777;
        ASSERT_TRUE(codec_internal::DecodeAddFiniteWith(isa, dt, enc.data() + 1, n, acc.data(),
                                                        &bad));
        EXPECT_EQ(bad, 777u);
        EXPECT_TRUE(SameBits(acc, want, 0, n));
      }
    }
  }
}

TEST(CodecFusedTest, NonFiniteValueStopsBeforeItsBlock) {
  const float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(5);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const size_t es = DTypeSize(dt);
    for (size_t n : kSizes) {
      for (size_t pos : Positions(n)) {
        for (float special : {kNaN, kInf, -kInf}) {
          std::vector<float> values = Random(&rng, n);
          values[pos] = special;
          if (pos + 1 < n) values[n - 1] = kNaN;  // a later one too
          std::vector<char> enc(n * es + 3);
          Encode(dt, values.data(), n, enc.data() + 3);
          const std::vector<float> acc0 = Random(&rng, n);
          const size_t added = pos / kB * kB;  // the blocks before pos's
          std::vector<float> want = acc0;
          codec_internal::DecodeAddWith(Isa::kScalar, dt, enc.data() + 3, added, want.data());
          for (Isa isa : SupportedIsas()) {
            SCOPED_TRACE(std::string(DTypeName(dt)) + " n=" + std::to_string(n) +
                         " pos=" + std::to_string(pos) + " v=" + std::to_string(special) +
                         " isa=" + std::to_string(static_cast<int>(isa)));
            std::vector<float> acc = acc0;
            size_t bad = 777;
            EXPECT_FALSE(codec_internal::DecodeAddFiniteWith(isa, dt, enc.data() + 3, n,
                                                             acc.data(), &bad));
            EXPECT_EQ(bad, pos);
            EXPECT_TRUE(SameBits(acc, want, 0, n));
            for (size_t i = added; i < n; ++i) ASSERT_FALSE(std::isnan(acc[i])) << i;
          }
        }
      }
    }
  }
}

TEST(CodecFusedTest, Int8AddsAsDecodeAddInt8AndFindsOverflow) {
  std::mt19937 rng(11);
  for (size_t n : kSizes) {
    std::vector<int8_t> q(n);
    for (int8_t& v : q) v = static_cast<int8_t>(static_cast<int>(rng() % 3) - 1);  // -1, 0, 1
    const std::vector<float> acc0 = Random(&rng, n);
    for (float scale : {0.0f, 0.01f, 3e36f, 3e38f}) {
      // A finite scale whose 128 * scale overflows reads the values: with
      // |q| <= 1 they are still finite.
      std::vector<float> want = acc0;
      codec_internal::DecodeAddInt8With(Isa::kScalar, q.data(), n, scale, want.data());
      for (Isa isa : SupportedIsas()) {
        std::vector<float> acc = acc0;
        size_t bad = 777;
        ASSERT_TRUE(
            codec_internal::DecodeAddInt8FiniteWith(isa, q.data(), n, scale, acc.data(), &bad));
        EXPECT_TRUE(SameBits(acc, want, 0, n)) << n << " " << scale;
        EXPECT_TRUE(Int8AllFinite(q.data(), n, scale, nullptr));
      }
    }
    for (size_t pos : Positions(n)) {
      std::vector<int8_t> dirty = q;
      dirty[pos] = pos % 2 == 0 ? 2 : -128;  // x 3e38: beyond fp32
      if (pos + 1 < n) dirty[n - 1] = 127;
      const size_t added = pos / kB * kB;
      std::vector<float> want = acc0;
      codec_internal::DecodeAddInt8With(Isa::kScalar, dirty.data(), added, 3e38f, want.data());
      for (Isa isa : SupportedIsas()) {
        SCOPED_TRACE("n=" + std::to_string(n) + " pos=" + std::to_string(pos) +
                     " isa=" + std::to_string(static_cast<int>(isa)));
        std::vector<float> acc = acc0;
        size_t bad = 777;
        EXPECT_FALSE(codec_internal::DecodeAddInt8FiniteWith(isa, dirty.data(), n, 3e38f,
                                                             acc.data(), &bad));
        EXPECT_EQ(bad, pos);
        EXPECT_TRUE(SameBits(acc, want, 0, n));
        bad = 777;
        EXPECT_FALSE(Int8AllFinite(dirty.data(), n, 3e38f, &bad));
        EXPECT_EQ(bad, pos);
      }
    }
  }
}

}  // namespace
}  // namespace zenflow
