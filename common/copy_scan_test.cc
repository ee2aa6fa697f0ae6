// Tests for the receive copy's scan (CopyScanNonFinite, NonFiniteScan):
// at every SIMD level the copy is exact and the bits name exactly the
// dtypes with a non-finite whole word, wherever it lies (vector body, tail,
// last word, a word cut by the end), and a message's scan proves finiteness
// only when its pieces covered it in whole words.
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
    if ((w & 0x7C00) == 0x7C00) bits |= NonFiniteBit(DType::kF16);
  }
  for (size_t i = 0; i + 4 <= n; i += 4) {
    uint32_t w = 0;
    std::memcpy(&w, b.data() + i, 4);
    if ((w & 0x7F800000u) == 0x7F800000u) bits |= NonFiniteBit(DType::kF32);
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
  const Plant plants[] = {{0x7FC1, 2}, {0x7C00, 2}, {0x7F800000u, 4}, {0xFF80, 2}};
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
  EXPECT_EQ(NonFiniteBit(DType::kBF16) | NonFiniteBit(DType::kF16) | NonFiniteBit(DType::kF32),
            Reference(b, 8));
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

}  // namespace
}  // namespace zenflow
