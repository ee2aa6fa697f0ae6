// Scalar fp32 <-> bf16 / fp16 conversions, written once for the host and the
// device: the codec's scalar path (common/codec.h, which re-exports these)
// and the CUDA backend's pack / apply kernels compile this same code, so both
// sides of the wire round identically.
//
// Plain C++17 without CUDA headers, so g++ builds it as ordinary inline
// functions; under nvcc they are also __device__ (ZF_HOST_DEVICE). Only
// integer arithmetic touches the values, so results do not depend on FTZ /
// DAZ or the rounding mode, on either side.
//
// All functions are stateless and thread-safe.
#ifndef ZENFLOW_COMMON_FLOAT16_H_
#define ZENFLOW_COMMON_FLOAT16_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ZF_HOST_DEVICE __host__ __device__
#else
#define ZF_HOST_DEVICE
#endif

namespace zenflow {
namespace float16_internal {

// The bits of `from` as a To of the same size. memcpy is the portable bit
// cast; nvcc accepts it in device code as well, and both compilers turn it
// into a register move.
template <typename To, typename From>
ZF_HOST_DEVICE inline To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "BitCast needs equal sizes");
  To to;
  std::memcpy(&to, &from, sizeof(to));
  return to;
}

// Index of the highest set bit of x != 0.
ZF_HOST_DEVICE inline uint32_t HighestBit(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return 31u - static_cast<uint32_t>(__clz(x));
#else
  return 31u - static_cast<uint32_t>(__builtin_clz(x));
#endif
}

// fp32 exponent field: a value is NaN or Inf iff all these bits are set.
inline constexpr uint32_t kF32ExpMask = 0x7F800000u;

}  // namespace float16_internal

// fp32 -> bf16 with round-to-nearest-even. NaN stays NaN (returned quiet, sign
// and top payload bits kept); +-Inf stays +-Inf; large finite values may round
// to Inf.
ZF_HOST_DEVICE inline uint16_t FloatToBf16(float value) {
  const uint32_t x = float16_internal::BitCast<uint32_t>(value);
  if ((x & 0x7FFFFFFFu) > float16_internal::kF32ExpMask) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // Quiet NaN.
  }
  // Adding 0x7FFF (+1 when the kept lsb is odd) carries into the kept bits
  // exactly when the dropped half is above (or at, for odd) the midpoint.
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// bf16 -> fp32 (exact).
ZF_HOST_DEVICE inline float Bf16ToFloat(uint16_t bits) {
  return float16_internal::BitCast<float>(static_cast<uint32_t>(bits) << 16);
}

// fp32 -> IEEE binary16 with round-to-nearest-even, including subnormal
// results. Values whose magnitude rounds above 65504 become +-Inf. NaN stays
// NaN (quiet, sign and top payload bits kept).
ZF_HOST_DEVICE inline uint16_t FloatToF16(float value) {
  using float16_internal::kF32ExpMask;
  const uint32_t x = float16_internal::BitCast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > kF32ExpMask) {  // NaN: keep top payload bits, force quiet.
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  }
  if (a >= 0x477FF000u) {  // >= 65520 rounds to Inf (also Inf itself).
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (a >= 0x38800000u) {  // Normal result (>= 2^-14): rebias 127 -> 15.
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign |
                                 ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) {  // <= 2^-25: rounds to (signed) zero.
    return static_cast<uint16_t>(sign);
  }
  // Subnormal result: value = mant * 2^(e - 150); in units of 2^-24 that is
  // mant >> (126 - e), with e in [102, 112] so the shift is in [14, 24].
  const uint32_t e = a >> 23;
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

// IEEE binary16 -> fp32 (exact for all non-NaN inputs; NaNs come back quiet,
// matching the hardware F16C conversion).
ZF_HOST_DEVICE inline float F16ToFloat(uint16_t bits) {
  using float16_internal::BitCast;
  using float16_internal::kF32ExpMask;
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1Fu;
  const uint32_t mant = bits & 0x3FFu;
  if (exp == 0x1F) {
    if (mant == 0) return BitCast<float>(sign | kF32ExpMask);
    return BitCast<float>(sign | kF32ExpMask | 0x400000u | (mant << 13));
  }
  if (exp == 0) {
    if (mant == 0) return BitCast<float>(sign);
    // Subnormal: mant * 2^-24 = 2^(k-24) * (mant / 2^k), k = leading one.
    // Built with integer ops so it is exact regardless of FTZ/DAZ modes.
    const uint32_t k = float16_internal::HighestBit(mant);
    return BitCast<float>(sign | ((k + 103u) << 23) |
                          ((mant << (23u - k)) & 0x7FFFFFu));
  }
  return BitCast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_FLOAT16_H_
