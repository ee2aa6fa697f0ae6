// CRC-32C; see crc32c.h.
#include "common/crc32c.h"

#include <array>
#include <cstring>

#include "common/simd.h"

namespace zenflow {
namespace crc32c_internal {
namespace {

constexpr uint32_t kPoly = 0x82F63B78;  // reflected Castagnoli polynomial

// Slicing-by-8: kTables[k][b] is the CRC register after byte b followed by
// k zero bytes, so eight bytes are folded with eight lookups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

const Tables& ScalarTables() {
  static const Tables tables = [] {
    Tables t{};
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kPoly & (0u - (c & 1)));
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
    return t;
  }();
  return tables;
}

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;  // little-endian host (x86)
}

// The hardware path runs three independent streams of kStride bytes each:
// the crc32 instruction has a latency of three cycles but can start one per
// cycle, so a single dependent chain would use a third of it. The three
// partial CRCs are then joined: crc(A ++ B) = Shift(crc(A), |B|) ^ crc0(B),
// where Shift feeds |B| zero bytes through the register (a linear map,
// tabulated below for |B| = kStride) and crc0 starts from a zero register.
constexpr size_t kStride = 1024;

// Shift by kStride zero bytes, as four byte-indexed tables.
using ShiftTables = std::array<std::array<uint32_t, 256>, 4>;

ZF_TARGET("sse4.2") uint32_t ZerosHw(uint32_t c, size_t n) {
  uint64_t r = c;
  for (size_t i = 0; i < n; i += 8) r = _mm_crc32_u64(r, 0);
  return static_cast<uint32_t>(r);
}

const ShiftTables& StrideShift() {
  static const ShiftTables tables = [] {
    // The map is linear in the register, so 32 basis images determine it.
    uint32_t basis[32];
    for (int bit = 0; bit < 32; ++bit) basis[bit] = ZerosHw(1u << bit, kStride);
    ShiftTables t{};
    for (int k = 0; k < 4; ++k) {
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t x = 0;
        for (int j = 0; j < 8; ++j) {
          if (v & (1u << j)) x ^= basis[8 * k + j];
        }
        t[k][v] = x;
      }
    }
    return t;
  }();
  return tables;
}

inline uint32_t Shift(const ShiftTables& t, uint32_t c) {
  return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

// Both implementations work on the raw register (no pre/post inversion).
uint32_t RawScalar(uint32_t c, const uint8_t* p, size_t n) {
  const Tables& t = ScalarTables();
  for (; n >= 8; p += 8, n -= 8) {
    const uint64_t v = Load64(p) ^ c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^
        t[4][(v >> 24) & 0xff] ^ t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^
        t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
  }
  for (; n > 0; ++p, --n) c = (c >> 8) ^ t[0][(c ^ *p) & 0xff];
  return c;
}

ZF_TARGET("sse4.2") uint32_t RawHardware(uint32_t c, const uint8_t* p, size_t n) {
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; ++p, --n) c = _mm_crc32_u8(c, *p);
  if (n >= 3 * kStride) {
    const ShiftTables& t = StrideShift();
    for (; n >= 3 * kStride; p += 3 * kStride, n -= 3 * kStride) {
      uint64_t c0 = c, c1 = 0, c2 = 0;
      for (size_t i = 0; i < kStride; i += 8) {
        c0 = _mm_crc32_u64(c0, Load64(p + i));
        c1 = _mm_crc32_u64(c1, Load64(p + kStride + i));
        c2 = _mm_crc32_u64(c2, Load64(p + 2 * kStride + i));
      }
      c = Shift(t, Shift(t, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
          static_cast<uint32_t>(c2);
    }
  }
  uint64_t r = c;
  for (; n >= 8; p += 8, n -= 8) r = _mm_crc32_u64(r, Load64(p));
  c = static_cast<uint32_t>(r);
  for (; n > 0; ++p, --n) c = _mm_crc32_u8(c, *p);
  return c;
}

}  // namespace

bool HasHardware() {
  static const bool ok = (__builtin_cpu_init(), __builtin_cpu_supports("sse4.2"));
  return ok;
}

uint32_t ExtendScalar(uint32_t crc, const void* data, size_t n) {
  return ~RawScalar(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n) {
  return ~RawHardware(~crc, static_cast<const uint8_t*>(data), n);
}

}  // namespace crc32c_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  return crc32c_internal::HasHardware() ? crc32c_internal::ExtendHardware(crc, data, n)
                                        : crc32c_internal::ExtendScalar(crc, data, n);
}

}  // namespace zenflow
