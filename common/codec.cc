// Wire dtype conversion: scalar bulk kernels (over the conversions of
// common/float16.h) and AVX2 / AVX-512 bulk kernels selected at runtime. See
// codec.h.
//
// This file is compiled without -march flags; SIMD kernels carry
// __attribute__((target(...))) and are only called after a CPU check.

#include "common/codec.h"

#include "common/simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zenflow {
namespace {

#define ZF_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define ZF_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

using codec_internal::Isa;

// Unaligned element access helpers for the scalar paths.
inline uint16_t LoadU16(const void* base, size_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const char*>(base) + 2 * i, sizeof(v));
  return v;
}

inline void StoreU16(void* base, size_t i, uint16_t v) {
  std::memcpy(static_cast<char*>(base) + 2 * i, &v, sizeof(v));
}

inline uint32_t LoadU32(const void* base, size_t i) {
  uint32_t v;
  std::memcpy(&v, static_cast<const char*>(base) + 4 * i, sizeof(v));
  return v;
}

inline float LoadF32(const void* base, size_t i) {
  float v;
  std::memcpy(&v, static_cast<const char*>(base) + 4 * i, sizeof(v));
  return v;
}

inline void StoreF32(void* base, size_t i, float v) {
  std::memcpy(static_cast<char*>(base) + 4 * i, &v, sizeof(v));
}

// Exponent-field masks: a value is NaN or Inf iff all exponent bits are set.
constexpr uint32_t kF32ExpMask = 0x7F800000u;
constexpr uint16_t kBf16ExpMask = 0x7F80u;
constexpr uint16_t kF16ExpMask = 0x7C00u;

inline uint16_t ExpMask16(DType dtype) {
  return dtype == DType::kBF16 ? kBf16ExpMask : kF16ExpMask;
}

inline float DecodeOne16(DType dtype, uint16_t bits) {
  return dtype == DType::kBF16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
}

inline uint16_t EncodeOne16(DType dtype, float value) {
  return dtype == DType::kBF16 ? FloatToBf16(value) : FloatToF16(value);
}

// ---------------------------------------------------------------------------
// Scalar kernels. Also used for the tails of the AVX2 kernels.
// ---------------------------------------------------------------------------

void EncodeScalar(DType dtype, const float* src, size_t n, void* dst) {
  if (dtype == DType::kF32) {
    if (n > 0) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    StoreU16(dst, i, EncodeOne16(dtype, LoadF32(src, i)));
  }
}

void DecodeScalar(DType dtype, const void* src, size_t n, float* dst) {
  if (dtype == DType::kF32) {
    if (n > 0) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    StoreF32(dst, i, DecodeOne16(dtype, LoadU16(src, i)));
  }
}

// kFirst: the first add into a sum whose old values are stale (see
// DecodeAdd's `first`): 0.0f takes the place of acc[i], which is not read.
template <bool kFirst>
void DecodeAddScalar(DType dtype, const void* src, size_t n, float* acc) {
  auto old = [acc](size_t i) { return kFirst ? 0.0f : LoadF32(acc, i); };
  if (dtype == DType::kF32) {
    for (size_t i = 0; i < n; ++i) {
      StoreF32(acc, i, old(i) + LoadF32(src, i));
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    StoreF32(acc, i, old(i) + DecodeOne16(dtype, LoadU16(src, i)));
  }
}

bool AllFiniteScalar(DType dtype, const void* src, size_t n,
                     size_t* first_bad) {
  if (dtype == DType::kF32) {
    for (size_t i = 0; i < n; ++i) {
      if ((LoadU32(src, i) & kF32ExpMask) == kF32ExpMask) {
        if (first_bad != nullptr) *first_bad = i;
        return false;
      }
    }
    return true;
  }
  const uint16_t mask = ExpMask16(dtype);
  for (size_t i = 0; i < n; ++i) {
    if ((LoadU16(src, i) & mask) == mask) {
      if (first_bad != nullptr) *first_bad = i;
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// AVX2 (+F16C) kernels. Tails fall back to the scalar kernels.
// ---------------------------------------------------------------------------

// Rounds 8 fp32 bit patterns to bf16 (RNE, quiet NaN), one per 32-bit lane.
ZF_TARGET_AVX2 inline __m256i Bf16RoundAvx2(__m256i x) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7FFF);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(static_cast<int>(kF32ExpMask));
  const __m256i quiet = _mm256_set1_epi32(0x40);
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i lsb = _mm256_and_si256(hi, one);
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, bias), lsb), 16);
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
  const __m256i nan_val = _mm256_or_si256(hi, quiet);
  return _mm256_blendv_epi8(rounded, nan_val, is_nan);
}

ZF_TARGET_AVX2 void EncodeAvx2(DType dtype, const float* src, size_t n,
                               void* dst) {
  if (dtype == DType::kF32) {
    EncodeScalar(dtype, src, n, dst);
    return;
  }
  auto* out = static_cast<char*>(dst);
  size_t i = 0;
  if (dtype == DType::kBF16) {
    for (; i + 16 <= n; i += 16) {
      const __m256i a =
          Bf16RoundAvx2(_mm256_castps_si256(_mm256_loadu_ps(src + i)));
      const __m256i b =
          Bf16RoundAvx2(_mm256_castps_si256(_mm256_loadu_ps(src + i + 8)));
      // packus interleaves 128-bit lanes; restore element order.
      const __m256i packed =
          _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), packed);
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      const __m128i h =
          _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
    }
  }
  EncodeScalar(dtype, src + i, n - i, out + 2 * i);
}

// Decodes 8 16-bit values at p to fp32.
ZF_TARGET_AVX2 inline __m256 Load8Avx2(DType dtype, const char* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (dtype == DType::kBF16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_cvtph_ps(h);
}

ZF_TARGET_AVX2 void DecodeAvx2(DType dtype, const void* src, size_t n,
                               float* dst) {
  if (dtype == DType::kF32) {
    DecodeScalar(dtype, src, n, dst);
    return;
  }
  const auto* in = static_cast<const char*>(src);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, Load8Avx2(dtype, in + 2 * i));
  DecodeScalar(dtype, in + 2 * i, n - i, dst + i);
}

// The sum's old values: zeros when kFirst (see DecodeAddScalar).
template <bool kFirst>
ZF_TARGET_AVX2 inline __m256 OldAvx2(const float* acc) {
  return kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(acc);
}

template <bool kFirst>
ZF_TARGET_AVX2 void DecodeAddAvx2(DType dtype, const void* src, size_t n,
                                  float* acc) {
  const auto* in = static_cast<const char*>(src);
  size_t i = 0;
  if (dtype == DType::kF32) {
    for (; i + 16 <= n; i += 16) {
      const __m256 a =
          _mm256_loadu_ps(reinterpret_cast<const float*>(in + 4 * i));
      const __m256 b =
          _mm256_loadu_ps(reinterpret_cast<const float*>(in + 4 * i + 32));
      _mm256_storeu_ps(acc + i, _mm256_add_ps(OldAvx2<kFirst>(acc + i), a));
      _mm256_storeu_ps(acc + i + 8,
                       _mm256_add_ps(OldAvx2<kFirst>(acc + i + 8), b));
    }
    DecodeAddScalar<kFirst>(dtype, in + 4 * i, n - i, acc + i);
    return;
  }
  for (; i + 16 <= n; i += 16) {
    const __m256 a = Load8Avx2(dtype, in + 2 * i);
    const __m256 b = Load8Avx2(dtype, in + 2 * i + 16);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(OldAvx2<kFirst>(acc + i), a));
    _mm256_storeu_ps(acc + i + 8,
                     _mm256_add_ps(OldAvx2<kFirst>(acc + i + 8), b));
  }
  DecodeAddScalar<kFirst>(dtype, in + 2 * i, n - i, acc + i);
}

// The finiteness checks' fast loops test 128 bytes per branch: four
// vectors' compares ORed, one test. A group with a bad value is left to the
// loops after them, which find its first bad value.
ZF_TARGET_AVX2 inline __m256i NonFinite32Avx2(const char* p, __m256i mask) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_cmpeq_epi32(_mm256_and_si256(x, mask), mask);
}

ZF_TARGET_AVX2 inline __m256i NonFinite16Avx2(const char* p, __m256i mask) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_cmpeq_epi16(_mm256_and_si256(x, mask), mask);
}

// True when none of the 128 bytes at p is part of a non-finite value.
ZF_TARGET_AVX2 inline bool Finite128Avx2(const char* p, __m256i mask, bool f32) {
  const __m256i any =
      f32 ? _mm256_or_si256(_mm256_or_si256(NonFinite32Avx2(p, mask), NonFinite32Avx2(p + 32, mask)),
                            _mm256_or_si256(NonFinite32Avx2(p + 64, mask),
                                            NonFinite32Avx2(p + 96, mask)))
          : _mm256_or_si256(_mm256_or_si256(NonFinite16Avx2(p, mask), NonFinite16Avx2(p + 32, mask)),
                            _mm256_or_si256(NonFinite16Avx2(p + 64, mask),
                                            NonFinite16Avx2(p + 96, mask)));
  return _mm256_testz_si256(any, any) != 0;
}

ZF_TARGET_AVX2 bool AllFiniteAvx2(DType dtype, const void* src, size_t n,
                                  size_t* first_bad) {
  const auto* in = static_cast<const char*>(src);
  size_t i = 0;
  size_t tail_index = 0;
  bool tail_ok = true;
  if (dtype == DType::kF32) {
    const __m256i mask = _mm256_set1_epi32(static_cast<int>(kF32ExpMask));
    while (i + 32 <= n && Finite128Avx2(in + 4 * i, mask, /*f32=*/true)) i += 32;
    for (; i + 16 <= n; i += 16) {
      const __m256i a =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 4 * i));
      const __m256i b =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 4 * i + 32));
      const unsigned bad_a =
          static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(
              _mm256_cmpeq_epi32(_mm256_and_si256(a, mask), mask))));
      const unsigned bad_b =
          static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(
              _mm256_cmpeq_epi32(_mm256_and_si256(b, mask), mask))));
      const unsigned bad = bad_a | (bad_b << 8);
      if (bad != 0) {
        if (first_bad != nullptr) *first_bad = i + __builtin_ctz(bad);
        return false;
      }
    }
    tail_ok = AllFiniteScalar(dtype, in + 4 * i, n - i, &tail_index);
  } else {
    const __m256i mask =
        _mm256_set1_epi16(static_cast<short>(ExpMask16(dtype)));
    while (i + 64 <= n && Finite128Avx2(in + 2 * i, mask, /*f32=*/false)) i += 64;
    for (; i + 16 <= n; i += 16) {
      const __m256i x =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i));
      // Two mask bits per 16-bit element.
      const unsigned bad = static_cast<unsigned>(_mm256_movemask_epi8(
          _mm256_cmpeq_epi16(_mm256_and_si256(x, mask), mask)));
      if (bad != 0) {
        if (first_bad != nullptr) *first_bad = i + __builtin_ctz(bad) / 2;
        return false;
      }
    }
    tail_ok = AllFiniteScalar(dtype, in + 2 * i, n - i, &tail_index);
  }
  if (!tail_ok && first_bad != nullptr) *first_bad = i + tail_index;
  return tail_ok;
}

// ---------------------------------------------------------------------------
// AVX-512 kernels. Tails use masked loads/stores.
// ---------------------------------------------------------------------------

ZF_TARGET_AVX512 inline __mmask16 TailMask16(size_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

ZF_TARGET_AVX512 inline __mmask32 TailMask32(size_t count) {
  return count >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu)
                     : static_cast<__mmask32>((1u << count) - 1u);
}

// Rounds 16 fp32 bit patterns to bf16 (RNE, quiet NaN), one per 32-bit lane.
ZF_TARGET_AVX512 inline __m512i Bf16RoundAvx512(__m512i x) {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i bias = _mm512_set1_epi32(0x7FFF);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i inf = _mm512_set1_epi32(static_cast<int>(kF32ExpMask));
  const __m512i quiet = _mm512_set1_epi32(0x40);
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i lsb = _mm512_and_si512(hi, one);
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, bias), lsb), 16);
  const __mmask16 is_nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs_mask), inf);
  return _mm512_mask_blend_epi32(is_nan, rounded, _mm512_or_si512(hi, quiet));
}

ZF_TARGET_AVX512 inline __m256i Encode16Avx512(DType dtype, __m512 x) {
  if (dtype == DType::kBF16) {
    return _mm512_cvtepi32_epi16(Bf16RoundAvx512(_mm512_castps_si512(x)));
  }
  return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
}

ZF_TARGET_AVX512 void EncodeAvx512(DType dtype, const float* src, size_t n,
                                   void* dst) {
  if (dtype == DType::kF32) {
    EncodeScalar(dtype, src, n, dst);
    return;
  }
  auto* out = static_cast<char*>(dst);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = Encode16Avx512(dtype, _mm512_loadu_ps(src + i));
    const __m256i b = Encode16Avx512(dtype, _mm512_loadu_ps(src + i + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i + 32), b);
  }
  for (; i < n; i += 16) {
    const size_t count = n - i < 16 ? n - i : 16;
    const __mmask16 k = TailMask16(count);
    const __m256i h = Encode16Avx512(dtype, _mm512_maskz_loadu_ps(k, src + i));
    _mm256_mask_storeu_epi16(out + 2 * i, k, h);
  }
}

// Decodes 16 16-bit values (those selected by k; others read as zero).
ZF_TARGET_AVX512 inline __m512 Load16Avx512(DType dtype, const char* p,
                                            __mmask16 k) {
  const __m256i h = _mm256_maskz_loadu_epi16(k, p);
  if (dtype == DType::kBF16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_cvtph_ps(h);
}

ZF_TARGET_AVX512 inline __m512 Load16Avx512(DType dtype, const char* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (dtype == DType::kBF16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_cvtph_ps(h);
}

ZF_TARGET_AVX512 void DecodeAvx512(DType dtype, const void* src, size_t n,
                                   float* dst) {
  if (dtype == DType::kF32) {
    DecodeScalar(dtype, src, n, dst);
    return;
  }
  const auto* in = static_cast<const char*>(src);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm512_storeu_ps(dst + i, Load16Avx512(dtype, in + 2 * i));
    _mm512_storeu_ps(dst + i + 16, Load16Avx512(dtype, in + 2 * i + 32));
  }
  for (; i < n; i += 16) {
    const size_t count = n - i < 16 ? n - i : 16;
    const __mmask16 k = TailMask16(count);
    _mm512_mask_storeu_ps(dst + i, k, Load16Avx512(dtype, in + 2 * i, k));
  }
}

// The sum's old values: zeros when kFirst (see DecodeAddScalar).
template <bool kFirst>
ZF_TARGET_AVX512 inline __m512 OldAvx512(const float* acc) {
  return kFirst ? _mm512_setzero_ps() : _mm512_loadu_ps(acc);
}
template <bool kFirst>
ZF_TARGET_AVX512 inline __m512 OldAvx512(__mmask16 k, const float* acc) {
  return kFirst ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(k, acc);
}

template <bool kFirst>
ZF_TARGET_AVX512 void DecodeAddAvx512(DType dtype, const void* src, size_t n,
                                      float* acc) {
  const auto* in = static_cast<const char*>(src);
  size_t i = 0;
  if (dtype == DType::kF32) {
    const auto* f = reinterpret_cast<const float*>(in);
    for (; i + 32 <= n; i += 32) {
      const __m512 a = _mm512_loadu_ps(f + i);
      const __m512 b = _mm512_loadu_ps(f + i + 16);
      _mm512_storeu_ps(acc + i, _mm512_add_ps(OldAvx512<kFirst>(acc + i), a));
      _mm512_storeu_ps(acc + i + 16,
                       _mm512_add_ps(OldAvx512<kFirst>(acc + i + 16), b));
    }
    for (; i < n; i += 16) {
      const size_t count = n - i < 16 ? n - i : 16;
      const __mmask16 k = TailMask16(count);
      const __m512 a = _mm512_maskz_loadu_ps(k, f + i);
      _mm512_mask_storeu_ps(
          acc + i, k, _mm512_add_ps(OldAvx512<kFirst>(k, acc + i), a));
    }
    return;
  }
  for (; i + 32 <= n; i += 32) {
    const __m512 a = Load16Avx512(dtype, in + 2 * i);
    const __m512 b = Load16Avx512(dtype, in + 2 * i + 32);
    _mm512_storeu_ps(acc + i, _mm512_add_ps(OldAvx512<kFirst>(acc + i), a));
    _mm512_storeu_ps(acc + i + 16,
                     _mm512_add_ps(OldAvx512<kFirst>(acc + i + 16), b));
  }
  for (; i < n; i += 16) {
    const size_t count = n - i < 16 ? n - i : 16;
    const __mmask16 k = TailMask16(count);
    const __m512 a = Load16Avx512(dtype, in + 2 * i, k);
    _mm512_mask_storeu_ps(acc + i, k,
                          _mm512_add_ps(OldAvx512<kFirst>(k, acc + i), a));
  }
}

ZF_TARGET_AVX512 inline uint64_t NonFiniteMask512(const char* p, __m512i mask, bool f32) {
  const __m512i x = _mm512_and_si512(_mm512_loadu_si512(p), mask);
  return f32 ? static_cast<uint64_t>(_mm512_cmpeq_epi32_mask(x, mask))
             : static_cast<uint64_t>(_mm512_cmpeq_epi16_mask(x, mask));
}

// As Finite128Avx2: 256 bytes per branch.
ZF_TARGET_AVX512 inline bool Finite256Avx512(const char* p, __m512i mask, bool f32) {
  return (NonFiniteMask512(p, mask, f32) | NonFiniteMask512(p + 64, mask, f32) |
          NonFiniteMask512(p + 128, mask, f32) | NonFiniteMask512(p + 192, mask, f32)) == 0;
}

ZF_TARGET_AVX512 bool AllFiniteAvx512(DType dtype, const void* src, size_t n,
                                      size_t* first_bad) {
  const auto* in = static_cast<const char*>(src);
  size_t i = 0;
  if (dtype == DType::kF32) {
    const __m512i mask = _mm512_set1_epi32(static_cast<int>(kF32ExpMask));
    while (i + 64 <= n && Finite256Avx512(in + 4 * i, mask, /*f32=*/true)) i += 64;
    for (; i + 32 <= n; i += 32) {
      const __m512i a = _mm512_loadu_si512(in + 4 * i);
      const __m512i b = _mm512_loadu_si512(in + 4 * i + 64);
      const uint32_t bad = static_cast<uint32_t>(_mm512_cmpeq_epi32_mask(
                               _mm512_and_si512(a, mask), mask)) |
                           (static_cast<uint32_t>(_mm512_cmpeq_epi32_mask(
                                _mm512_and_si512(b, mask), mask))
                            << 16);
      if (bad != 0) {
        if (first_bad != nullptr) *first_bad = i + __builtin_ctz(bad);
        return false;
      }
    }
    for (; i < n; i += 16) {
      const size_t count = n - i < 16 ? n - i : 16;
      const __mmask16 k = TailMask16(count);
      const __m512i x = _mm512_maskz_loadu_epi32(k, in + 4 * i);
      const uint32_t bad =
          _mm512_mask_cmpeq_epi32_mask(k, _mm512_and_si512(x, mask), mask);
      if (bad != 0) {
        if (first_bad != nullptr) *first_bad = i + __builtin_ctz(bad);
        return false;
      }
    }
    return true;
  }
  const __m512i mask = _mm512_set1_epi16(static_cast<short>(ExpMask16(dtype)));
  while (i + 128 <= n && Finite256Avx512(in + 2 * i, mask, /*f32=*/false)) i += 128;
  for (; i + 64 <= n; i += 64) {
    const __m512i a = _mm512_loadu_si512(in + 2 * i);
    const __m512i b = _mm512_loadu_si512(in + 2 * i + 64);
    const uint64_t bad = static_cast<uint64_t>(_mm512_cmpeq_epi16_mask(
                             _mm512_and_si512(a, mask), mask)) |
                         (static_cast<uint64_t>(_mm512_cmpeq_epi16_mask(
                              _mm512_and_si512(b, mask), mask))
                          << 32);
    if (bad != 0) {
      if (first_bad != nullptr) *first_bad = i + __builtin_ctzll(bad);
      return false;
    }
  }
  for (; i < n; i += 32) {
    const size_t count = n - i < 32 ? n - i : 32;
    const __mmask32 k = TailMask32(count);
    const __m512i x = _mm512_maskz_loadu_epi16(k, in + 2 * i);
    const uint32_t bad =
        _mm512_mask_cmpeq_epi16_mask(k, _mm512_and_si512(x, mask), mask);
    if (bad != 0) {
      if (first_bad != nullptr) *first_bad = i + __builtin_ctz(bad);
      return false;
    }
  }
  return true;
}

// ---- int8 (one scale per column) -------------------------------------------

template <bool kFirst>
void DecodeAddInt8Scalar(const int8_t* q, size_t n, float scale, float* acc) {
  for (size_t i = 0; i < n; ++i) {
    acc[i] = (kFirst ? 0.0f : acc[i]) + static_cast<float>(q[i]) * scale;
  }
}

template <bool kFirst>
ZF_TARGET_AVX2 void DecodeAddInt8Avx2(const int8_t* q, size_t n, float scale, float* acc) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(OldAvx2<kFirst>(acc + i), v));
  }
  DecodeAddInt8Scalar<kFirst>(q + i, n - i, scale, acc + i);
}

template <bool kFirst>
ZF_TARGET_AVX512 void DecodeAddInt8Avx512(const int8_t* q, size_t n, float scale, float* acc) {
  const __m512 s = _mm512_set1_ps(scale);
  for (size_t i = 0; i < n; i += 16) {
    const size_t count = n - i < 16 ? n - i : 16;
    const __mmask16 k = TailMask16(count);
    const __m128i b = _mm_maskz_loadu_epi8(k, q + i);
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
    _mm512_mask_storeu_ps(acc + i, k, _mm512_add_ps(OldAvx512<kFirst>(k, acc + i), v));
  }
}

Isa DetectIsa() {
  if (simd::HasAvx512Codec()) return Isa::kAvx512;
  if (simd::HasAvx2F16c()) return Isa::kAvx2;
  return Isa::kScalar;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "fp32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "fp16";
  }
  return "unknown";
}

namespace codec_internal {

Isa ActiveIsa() {
  static const Isa isa = DetectIsa();
  return isa;
}

bool IsaSupported(Isa isa) {
  return static_cast<int>(isa) <= static_cast<int>(ActiveIsa());
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

void EncodeWith(Isa isa, DType dtype, const float* src, size_t n, void* dst) {
  switch (isa) {
    case Isa::kAvx512:
      EncodeAvx512(dtype, src, n, dst);
      return;
    case Isa::kAvx2:
      EncodeAvx2(dtype, src, n, dst);
      return;
    case Isa::kScalar:
      break;
  }
  EncodeScalar(dtype, src, n, dst);
}

void DecodeWith(Isa isa, DType dtype, const void* src, size_t n, float* dst) {
  switch (isa) {
    case Isa::kAvx512:
      DecodeAvx512(dtype, src, n, dst);
      return;
    case Isa::kAvx2:
      DecodeAvx2(dtype, src, n, dst);
      return;
    case Isa::kScalar:
      break;
  }
  DecodeScalar(dtype, src, n, dst);
}

void DecodeAddWith(Isa isa, DType dtype, const void* src, size_t n,
                   float* acc, bool first) {
  switch (isa) {
    case Isa::kAvx512:
      first ? DecodeAddAvx512<true>(dtype, src, n, acc)
            : DecodeAddAvx512<false>(dtype, src, n, acc);
      return;
    case Isa::kAvx2:
      first ? DecodeAddAvx2<true>(dtype, src, n, acc) : DecodeAddAvx2<false>(dtype, src, n, acc);
      return;
    case Isa::kScalar:
      break;
  }
  first ? DecodeAddScalar<true>(dtype, src, n, acc) : DecodeAddScalar<false>(dtype, src, n, acc);
}

bool AllFiniteWith(Isa isa, DType dtype, const void* src, size_t n,
                   size_t* first_bad) {
  switch (isa) {
    case Isa::kAvx512:
      return AllFiniteAvx512(dtype, src, n, first_bad);
    case Isa::kAvx2:
      return AllFiniteAvx2(dtype, src, n, first_bad);
    case Isa::kScalar:
      break;
  }
  return AllFiniteScalar(dtype, src, n, first_bad);
}

void DecodeAddInt8With(Isa isa, const int8_t* q, size_t n, float scale, float* acc,
                       bool first) {
  switch (isa) {
    case Isa::kAvx512:
      first ? DecodeAddInt8Avx512<true>(q, n, scale, acc)
            : DecodeAddInt8Avx512<false>(q, n, scale, acc);
      return;
    case Isa::kAvx2:
      first ? DecodeAddInt8Avx2<true>(q, n, scale, acc)
            : DecodeAddInt8Avx2<false>(q, n, scale, acc);
      return;
    case Isa::kScalar:
      break;
  }
  first ? DecodeAddInt8Scalar<true>(q, n, scale, acc)
        : DecodeAddInt8Scalar<false>(q, n, scale, acc);
}

bool DecodeAddFiniteWith(Isa isa, DType dtype, const void* src, size_t n, float* acc,
                         size_t* first_bad, bool first) {
  const size_t esize = DTypeSize(dtype);
  const char* bytes = static_cast<const char*>(src);
  for (size_t i = 0; i < n; i += kFusedBlockElements) {
    const size_t m = std::min(kFusedBlockElements, n - i);
    size_t at = 0;
    if (!AllFiniteWith(isa, dtype, bytes + i * esize, m, &at)) {
      if (first_bad != nullptr) *first_bad = i + at;
      return false;
    }
    DecodeAddWith(isa, dtype, bytes + i * esize, m, acc + i, first);  // the block, from L1
  }
  return true;
}

bool DecodeAddInt8FiniteWith(Isa isa, const int8_t* q, size_t n, float scale, float* acc,
                             size_t* first_bad, bool first) {
  if (std::isfinite(128.0f * scale)) {  // every value is finite
    DecodeAddInt8With(isa, q, n, scale, acc, first);
    return true;
  }
  for (size_t i = 0; i < n; i += kFusedBlockElements) {
    const size_t m = std::min(kFusedBlockElements, n - i);
    size_t at = 0;
    if (!Int8AllFinite(q + i, m, scale, &at)) {
      if (first_bad != nullptr) *first_bad = i + at;
      return false;
    }
    DecodeAddInt8With(isa, q + i, m, scale, acc + i, first);
  }
  return true;
}

}  // namespace codec_internal

bool Int8AllFinite(const int8_t* q, size_t n, float scale, size_t* first_bad) {
  // |q| <= 128 and a finite scale: 128 * scale is exact (a power of two
  // times), so when it is finite every product is.
  if (std::isfinite(128.0f * scale)) return true;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(static_cast<float>(q[i]) * scale)) {
      if (first_bad != nullptr) *first_bad = i;
      return false;
    }
  }
  return true;
}

bool DecodeAddFinite(DType dtype, const void* src, size_t n, float* acc, size_t* first_bad,
                     bool first) {
  return codec_internal::DecodeAddFiniteWith(codec_internal::ActiveIsa(), dtype, src, n, acc,
                                             first_bad, first);
}

bool DecodeAddInt8Finite(const int8_t* q, size_t n, float scale, float* acc,
                         size_t* first_bad, bool first) {
  return codec_internal::DecodeAddInt8FiniteWith(codec_internal::ActiveIsa(), q, n, scale, acc,
                                                 first_bad, first);
}

void DecodeAddInt8(const int8_t* q, size_t n, float scale, float* acc, bool first) {
  codec_internal::DecodeAddInt8With(codec_internal::ActiveIsa(), q, n, scale, acc, first);
}

void Encode(DType dtype, const float* src, size_t n, void* dst) {
  codec_internal::EncodeWith(codec_internal::ActiveIsa(), dtype, src, n, dst);
}

void Decode(DType dtype, const void* src, size_t n, float* dst) {
  codec_internal::DecodeWith(codec_internal::ActiveIsa(), dtype, src, n, dst);
}

void DecodeAdd(DType dtype, const void* src, size_t n, float* acc, bool first) {
  codec_internal::DecodeAddWith(codec_internal::ActiveIsa(), dtype, src, n, acc, first);
}

bool AllFinite(DType dtype, const void* src, size_t n, size_t* first_bad) {
  return codec_internal::AllFiniteWith(codec_internal::ActiveIsa(), dtype, src,
                                       n, first_bad);
}

const char* CodecSimdLevel() {
  switch (codec_internal::ActiveIsa()) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

}  // namespace zenflow
