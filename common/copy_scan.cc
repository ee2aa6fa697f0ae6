#include "common/copy_scan.h"

#include <cstring>

#include "common/simd.h"

namespace zenflow {
namespace {

using codec_internal::Isa;

constexpr uint32_t kF32Exp = 0x7F800000u;
constexpr uint16_t kBf16Exp = 0x7F80u;
constexpr uint16_t kF16Exp = 0x7C00u;

// The words of [from, n) (from a multiple of 4) of an already copied block.
uint32_t ScanTail(const unsigned char* p, size_t from, size_t n) {
  uint32_t bits = 0;
  for (size_t i = from; i + 2 <= n; i += 2) {
    uint16_t w;
    std::memcpy(&w, p + i, 2);
    if ((w & kBf16Exp) == kBf16Exp) bits |= NonFiniteBit(DType::kBF16);
    if ((w & kBf16Exp) >= kBf16BoundBits) bits |= LargeBit(DType::kBF16);
    if ((w & kF16Exp) == kF16Exp) bits |= NonFiniteBit(DType::kF16);
  }
  for (size_t i = from; i + 4 <= n; i += 4) {
    uint32_t w;
    std::memcpy(&w, p + i, 4);
    if ((w & kF32Exp) == kF32Exp) bits |= NonFiniteBit(DType::kF32);
    if ((w & kF32Exp) >= kF32BoundBits) bits |= LargeBit(DType::kF32);
  }
  return bits;
}

uint32_t CopyScanScalar(void* dst, const void* src, size_t n) {
  std::memcpy(dst, src, n);
  return ScanTail(static_cast<const unsigned char*>(src), 0, n);
}

// 64 bytes a step: the three patterns compared in every vector and their
// hits OR-ed into three masks, tested once at the end (no branch per step).
ZF_TARGET("avx512f,avx512bw")
uint32_t CopyScanAvx512(void* dst, const void* src, size_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  const __m512i bf = _mm512_set1_epi16(static_cast<short>(kBf16Exp));
  const __m512i hf = _mm512_set1_epi16(static_cast<short>(kF16Exp));
  const __m512i f = _mm512_set1_epi32(static_cast<int>(kF32Exp));
  const __m512i bf_bound = _mm512_set1_epi16(static_cast<short>(kBf16BoundBits));
  const __m512i f_bound = _mm512_set1_epi32(static_cast<int>(kF32BoundBits));
  __mmask32 bf_hit = 0, hf_hit = 0, bf_large = 0;
  __mmask16 f_hit = 0, f_large = 0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i v = _mm512_loadu_si512(in + i);
    _mm512_storeu_si512(out + i, v);
    const __m512i bf_exp = _mm512_and_si512(v, bf);
    const __m512i f_exp = _mm512_and_si512(v, f);
    bf_hit |= _mm512_cmpeq_epi16_mask(bf_exp, bf);
    bf_large |= _mm512_cmpge_epu16_mask(bf_exp, bf_bound);
    hf_hit |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, hf), hf);
    f_hit |= _mm512_cmpeq_epi32_mask(f_exp, f);
    f_large |= _mm512_cmpge_epu32_mask(f_exp, f_bound);
  }
  std::memcpy(out + i, in + i, n - i);
  uint32_t bits = ScanTail(in, i, n);
  if (bf_hit != 0) bits |= NonFiniteBit(DType::kBF16);
  if (bf_large != 0) bits |= LargeBit(DType::kBF16);
  if (hf_hit != 0) bits |= NonFiniteBit(DType::kF16);
  if (f_hit != 0) bits |= NonFiniteBit(DType::kF32);
  if (f_large != 0) bits |= LargeBit(DType::kF32);
  return bits;
}

ZF_TARGET("avx2")
uint32_t CopyScanAvx2(void* dst, const void* src, size_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  const __m256i bf = _mm256_set1_epi16(static_cast<short>(kBf16Exp));
  const __m256i hf = _mm256_set1_epi16(static_cast<short>(kF16Exp));
  const __m256i f = _mm256_set1_epi32(static_cast<int>(kF32Exp));
  // (A masked exponent has its top bit clear: signed > bound - 1 is >= bound.)
  const __m256i bf_below = _mm256_set1_epi16(static_cast<short>(kBf16BoundBits - 1));
  const __m256i f_below = _mm256_set1_epi32(static_cast<int>(kF32BoundBits - 1));
  __m256i bf_hit = _mm256_setzero_si256(), hf_hit = bf_hit, f_hit = bf_hit;
  __m256i bf_large = bf_hit, f_large = bf_hit;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), v);
    const __m256i bf_exp = _mm256_and_si256(v, bf);
    const __m256i f_exp = _mm256_and_si256(v, f);
    bf_hit = _mm256_or_si256(bf_hit, _mm256_cmpeq_epi16(bf_exp, bf));
    bf_large = _mm256_or_si256(bf_large, _mm256_cmpgt_epi16(bf_exp, bf_below));
    hf_hit = _mm256_or_si256(hf_hit, _mm256_cmpeq_epi16(_mm256_and_si256(v, hf), hf));
    f_hit = _mm256_or_si256(f_hit, _mm256_cmpeq_epi32(f_exp, f));
    f_large = _mm256_or_si256(f_large, _mm256_cmpgt_epi32(f_exp, f_below));
  }
  std::memcpy(out + i, in + i, n - i);
  uint32_t bits = ScanTail(in, i, n);
  if (!_mm256_testz_si256(bf_hit, bf_hit)) bits |= NonFiniteBit(DType::kBF16);
  if (!_mm256_testz_si256(bf_large, bf_large)) bits |= LargeBit(DType::kBF16);
  if (!_mm256_testz_si256(hf_hit, hf_hit)) bits |= NonFiniteBit(DType::kF16);
  if (!_mm256_testz_si256(f_hit, f_hit)) bits |= NonFiniteBit(DType::kF32);
  if (!_mm256_testz_si256(f_large, f_large)) bits |= LargeBit(DType::kF32);
  return bits;
}

// AllBounded: the masked exponent bits of every value against the bound
// (kF16: against the all-ones exponent), OR-ed over 1 KiB at a time; a
// payload with a large value stops at its kilobyte.
bool AllBoundedScalar(DType dtype, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      uint32_t w;
      std::memcpy(&w, p + 4 * i, 4);
      if ((w & kF32Exp) >= kF32BoundBits) return false;
    } else {
      uint16_t w;
      std::memcpy(&w, p + 2 * i, 2);
      if (dtype == DType::kBF16 ? (w & kBf16Exp) >= kBf16BoundBits : (w & kF16Exp) == kF16Exp) {
        return false;
      }
    }
  }
  return true;
}

ZF_TARGET("avx512f,avx512bw")
bool AllBoundedAvx512(DType dtype, const unsigned char* p, size_t n) {
  const size_t bytes = n * DTypeSize(dtype);
  size_t i = 0;
  const bool f32 = dtype == DType::kF32, bf16 = dtype == DType::kBF16;
  const __m512i mask = f32    ? _mm512_set1_epi32(static_cast<int>(kF32Exp))
                       : bf16 ? _mm512_set1_epi16(static_cast<short>(kBf16Exp))
                              : _mm512_set1_epi16(static_cast<short>(kF16Exp));
  const __m512i bound = f32    ? _mm512_set1_epi32(static_cast<int>(kF32BoundBits))
                        : bf16 ? _mm512_set1_epi16(static_cast<short>(kBf16BoundBits))
                               : mask;
  while (i + 1024 <= bytes) {
    uint32_t hit = 0;
    for (size_t end = i + 1024; i < end; i += 64) {
      const __m512i e = _mm512_and_si512(_mm512_loadu_si512(p + i), mask);
      hit |= f32 ? _mm512_cmpge_epu32_mask(e, bound) : _mm512_cmpge_epu16_mask(e, bound);
    }
    if (hit != 0) return false;
  }
  return AllBoundedScalar(dtype, p + i, (bytes - i) / DTypeSize(dtype));
}

ZF_TARGET("avx2")
bool AllBoundedAvx2(DType dtype, const unsigned char* p, size_t n) {
  const size_t bytes = n * DTypeSize(dtype);
  size_t i = 0;
  const bool f32 = dtype == DType::kF32, bf16 = dtype == DType::kBF16;
  // (A masked exponent has its top bit clear: signed > bound - 1 is >= bound.)
  const __m256i mask = f32    ? _mm256_set1_epi32(static_cast<int>(kF32Exp))
                       : bf16 ? _mm256_set1_epi16(static_cast<short>(kBf16Exp))
                              : _mm256_set1_epi16(static_cast<short>(kF16Exp));
  const __m256i below = f32    ? _mm256_set1_epi32(static_cast<int>(kF32BoundBits - 1))
                        : bf16 ? _mm256_set1_epi16(static_cast<short>(kBf16BoundBits - 1))
                               : _mm256_set1_epi16(static_cast<short>(kF16Exp - 1));
  while (i + 1024 <= bytes) {
    __m256i hit = _mm256_setzero_si256();
    for (size_t end = i + 1024; i < end; i += 32) {
      const __m256i e =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), mask);
      hit = _mm256_or_si256(hit, f32 ? _mm256_cmpgt_epi32(e, below) : _mm256_cmpgt_epi16(e, below));
    }
    if (!_mm256_testz_si256(hit, hit)) return false;
  }
  return AllBoundedScalar(dtype, p + i, (bytes - i) / DTypeSize(dtype));
}

}  // namespace

namespace copy_scan_internal {

bool AllBoundedWith(Isa isa, DType dtype, const void* src, size_t n) {
  const auto* p = static_cast<const unsigned char*>(src);
  switch (isa) {
    case Isa::kAvx512:
      return AllBoundedAvx512(dtype, p, n);
    case Isa::kAvx2:
      return AllBoundedAvx2(dtype, p, n);
    case Isa::kScalar:
      break;
  }
  return AllBoundedScalar(dtype, p, n);
}

uint32_t CopyScanNonFiniteWith(Isa isa, void* dst, const void* src, size_t n) {
  switch (isa) {
    case Isa::kAvx512:
      return CopyScanAvx512(dst, src, n);
    case Isa::kAvx2:
      return CopyScanAvx2(dst, src, n);
    case Isa::kScalar:
      break;
  }
  return CopyScanScalar(dst, src, n);
}

}  // namespace copy_scan_internal

bool AllBounded(DType dtype, const void* src, size_t n) {
  return copy_scan_internal::AllBoundedWith(codec_internal::ActiveIsa(), dtype, src, n);
}

uint32_t CopyScanNonFinite(void* dst, const void* src, size_t n) {
  return copy_scan_internal::CopyScanNonFiniteWith(codec_internal::ActiveIsa(), dst, src, n);
}

}  // namespace zenflow
