// Tests for the receive copy's scan (CopyScanNonFinite, NonFiniteScan) and
// AllBounded: at every SIMD level the copy is exact and the bits name
// exactly the dtypes with a non-finite whole word, and those with a word of
// magnitude 2^63 or more, wherever it lies (vector body, tail, last word, a
// word cut by the end); a message's scan proves finiteness (and the bound)
// only when its pieces covered it in whole words; AllBounded agrees with
// the same definition.
#include "common/copy_scan.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

using codec_internal::Isa;
using codec_internal::SupportedIsas;

// Bytes whose every 2- and 4-byte word has a clear top exponent bit: no
// dtype's pattern anywhere until one is planted.
std::vector<unsigned char> Clean(std::mt19937* rng, size_t n) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>((*rng)() & 0x3F);
  return v;
}

// The definition, word by word.
uint32_t Reference(const std::vector<unsigned char>& b, size_t n) {
  uint32_t bits = 0;
  for (size_t i = 0; i + 2 <= n; i += 2) {
    const uint16_t w = static_cast<uint16_t>(b[i] | (b[i + 1] << 8));
    if ((w & 0x7F80) == 0x7F80) bits |= NonFiniteBit(DType::kBF16);
    if ((w & 0x7F80) >= 0x5F00) bits |= LargeBit(DType::kBF16);  // |x| >= 2^63
    if ((w & 0x7C00) == 0x7C00) bits |= NonFiniteBit(DType::kF16);
  }
  for (size_t i = 0; i + 4 <= n; i += 4) {
    uint32_t w = 0;
    std::memcpy(&w, b.data() + i, 4);
    if ((w & 0x7F800000u) == 0x7F800000u) bits |= NonFiniteBit(DType::kF32);
    if ((w & 0x7F800000u) >= 0x5F000000u) bits |= LargeBit(DType::kF32);
  }
  return bits;
}

uint32_t CopyAndScan(Isa isa, const std::vector<unsigned char>& src, size_t n, size_t src_offset) {
  // Copied to an odd place first: the kernel must not need alignment.
  std::vector<unsigned char> shifted(n + src_offset);
  std::memcpy(shifted.data() + src_offset, src.data(), n);
  std::vector<unsigned char> dst(n + 3, 0xEE);
  const uint32_t bits = copy_scan_internal::CopyScanNonFiniteWith(
      isa, dst.data() + 1, shifted.data() + src_offset, n);
  EXPECT_EQ(0, std::memcmp(dst.data() + 1, src.data(), n));
  EXPECT_EQ(0xEE, dst[0]);
  EXPECT_EQ(0xEE, dst[n + 1]);
  return bits;
}

TEST(CopyScan, CleanBytesHaveNoPattern) {
  std::mt19937 rng(1);
  for (Isa isa : SupportedIsas()) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{130}, size_t{4099},
                     size_t{1} << 20}) {
      const auto b = Clean(&rng, n);
      EXPECT_EQ(0u, CopyAndScan(isa, b, n, n % 3)) << static_cast<int>(isa) << " n=" << n;
    }
  }
}

TEST(CopyScan, EachPlantedPatternIsNamedWhereverItLies) {
  std::mt19937 rng(2);
  struct Plant {
    uint32_t word;   // little-endian, 2 or 4 bytes
    size_t bytes;
  };
  // bf16 NaN; fp16 Inf (also a bf16 pattern? 0x7C00 & 0x7F80 = 0x7C00: no);
  // fp32 Inf whose halves are no 16-bit pattern; a bf16 Inf at an odd
  // offset is no whole word of any dtype.
  // Then the bound: bf16 2^63 and -2^63 (large, finite), the largest bf16
  // below 2^63, fp32 2^63 (its top half the bf16 2^63) and the largest fp32
  // below it (its top half is below as well).
  const Plant plants[] = {{0x7FC1, 2},      {0x7C00, 2},      {0x7F800000u, 4},
                          {0xFF80, 2},      {0x5F00, 2},      {0xDF00, 2},
                          {0x5EFF, 2},      {0x5F000000u, 4}, {0x5EFFFFFFu, 4}};
  for (Isa isa : SupportedIsas()) {
    for (size_t n : {size_t{4}, size_t{66}, size_t{200}, size_t{4096}, size_t{65539}}) {
      for (const Plant& p : plants) {
        for (size_t at : {size_t{0}, size_t{2}, size_t{3}, size_t{62}, size_t{64}, n / 2,
                          n - p.bytes, n - p.bytes + 1, n - 2}) {
          if (at + p.bytes > n + 1) continue;
          auto b = Clean(&rng, n);
          for (size_t k = 0; k < p.bytes && at + k < n; ++k) {
            b[at + k] = static_cast<unsigned char>(p.word >> (8 * k));
          }
          EXPECT_EQ(Reference(b, n), CopyAndScan(isa, b, n, at % 5))
              << "isa " << static_cast<int>(isa) << " n " << n << " at " << at << " word "
              << std::hex << p.word;
        }
      }
    }
  }
}

TEST(CopyScan, ReferenceAgreesOnKnownCases) {
  // The test's own definition, pinned: a bf16 NaN at offset 2 is a bf16
  // value and the high half of an fp32 NaN; at offset 1 it is neither.
  std::vector<unsigned char> b(8, 0);
  b[2] = 0xC0;
  b[3] = 0x7F;
  EXPECT_EQ(NonFiniteBit(DType::kBF16) | NonFiniteBit(DType::kF16) | NonFiniteBit(DType::kF32) |
                LargeBit(DType::kBF16) | LargeBit(DType::kF32),
            Reference(b, 8));
  std::vector<unsigned char> big(4, 0);  // fp32 2^64: large, finite
  big[3] = 0x5F;
  big[2] = 0x80;
  EXPECT_EQ(LargeBit(DType::kBF16) | LargeBit(DType::kF32), Reference(big, 4));
  big[3] = 0x5E;  // 2^62
  EXPECT_EQ(0u, Reference(big, 4));
  std::vector<unsigned char> c(8, 0);
  c[1] = 0xC0;
  c[2] = 0x7F;
  EXPECT_EQ(0u, Reference(c, 8));
  EXPECT_EQ(0u, Reference(b, 3));  // the word is cut by the end
}

TEST(NonFiniteScan, ProvesOnlyWhatWholeWordPiecesCovered) {
  NonFiniteScan none;
  EXPECT_FALSE(none.Proves(DType::kBF16, 0));  // never begun

  NonFiniteScan s;
  s.Begin(1000);
  s.Add(512, 0, 488);  // out of order is fine
  EXPECT_FALSE(s.Proves(DType::kBF16, 100));  // [0, 512) not scanned yet
  s.Add(0, NonFiniteBit(DType::kF16), 512);
  EXPECT_TRUE(s.Proves(DType::kBF16, 1000));
  EXPECT_TRUE(s.Proves(DType::kF32, 1000));
  EXPECT_FALSE(s.Proves(DType::kF16, 1000));
  EXPECT_FALSE(s.Proves(DType::kBF16, 1001));  // beyond what was scanned

  NonFiniteScan odd;
  odd.Begin(10);
  odd.Add(0, 0, 6);  // cuts an fp32 word in two
  odd.Add(6, 0, 4);
  EXPECT_FALSE(odd.Proves(DType::kBF16, 10));

  NonFiniteScan last;
  last.Begin(10);
  last.Add(0, 0, 8);
  last.Add(8, 0, 2);  // the message's end may cut a word
  EXPECT_TRUE(last.Proves(DType::kBF16, 10));

  last.Reset();
  EXPECT_FALSE(last.Proves(DType::kBF16, 0));
}

TEST(NonFiniteScan, ProvesTheBoundOnlyWithoutALargeValue) {
  NonFiniteScan s;
  s.Begin(64);
  s.Add(0, LargeBit(DType::kBF16), 64);
  EXPECT_TRUE(s.Proves(DType::kBF16, 64));  // finite...
  EXPECT_FALSE(s.ProvesBounded(DType::kBF16, 64));  // ...but not below 2^63
  EXPECT_TRUE(s.ProvesBounded(DType::kF32, 64));
  EXPECT_TRUE(s.ProvesBounded(DType::kF16, 64));

  NonFiniteScan f16;
  f16.Begin(64);
  f16.Add(0, NonFiniteBit(DType::kF16), 64);
  EXPECT_FALSE(f16.ProvesBounded(DType::kF16, 64));

  NonFiniteScan cut;
  cut.Begin(10);
  cut.Add(0, 0, 6);  // a word cut in two: nothing proven
  cut.Add(6, 0, 4);
  EXPECT_FALSE(cut.ProvesBounded(DType::kF32, 10));
  EXPECT_FALSE(NonFiniteScan().ProvesBounded(DType::kBF16, 0));
}

TEST(AllBounded, AgreesWithTheDefinitionAtEveryLevel) {
  std::mt19937 rng(3);
  const uint32_t plants[] = {0x7FC1, 0x7C00, 0x5F00, 0xDF00, 0x5EFF, 0x7F800000u,
                             0x5F000000u, 0xDF000000u, 0x5EFFFFFFu, 0x3F800000u};
  for (Isa isa : SupportedIsas()) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      const size_t esize = DTypeSize(dt);
      const uint32_t flag = dt == DType::kF16 ? NonFiniteBit(dt) : LargeBit(dt);
      for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{512}, size_t{700}, size_t{9000}}) {
        const auto clean = Clean(&rng, n * esize);
        EXPECT_TRUE(copy_scan_internal::AllBoundedWith(isa, dt, clean.data(), n));
        for (const uint32_t word : plants) {
          if ((word > 0xFFFF) != (esize == 4)) continue;
          for (size_t at : {size_t{0}, n / 3, n - 1}) {
            if (at >= n) continue;
            auto b = clean;
            std::memcpy(b.data() + at * esize, &word, esize);
            const bool want = (Reference(b, n * esize) & flag) == 0;
            EXPECT_EQ(want, copy_scan_internal::AllBoundedWith(isa, dt, b.data(), n))
                << "isa " << static_cast<int>(isa) << " dtype " << DTypeName(dt) << " n " << n
                << " at " << at << " word " << std::hex << word;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace zenflow
