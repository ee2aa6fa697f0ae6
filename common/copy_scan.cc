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
    if ((w & kF16Exp) == kF16Exp) bits |= NonFiniteBit(DType::kF16);
  }
  for (size_t i = from; i + 4 <= n; i += 4) {
    uint32_t w;
    std::memcpy(&w, p + i, 4);
    if ((w & kF32Exp) == kF32Exp) bits |= NonFiniteBit(DType::kF32);
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
  __mmask32 bf_hit = 0, hf_hit = 0;
  __mmask16 f_hit = 0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i v = _mm512_loadu_si512(in + i);
    _mm512_storeu_si512(out + i, v);
    bf_hit |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, bf), bf);
    hf_hit |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, hf), hf);
    f_hit |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(v, f), f);
  }
  std::memcpy(out + i, in + i, n - i);
  uint32_t bits = ScanTail(in, i, n);
  if (bf_hit != 0) bits |= NonFiniteBit(DType::kBF16);
  if (hf_hit != 0) bits |= NonFiniteBit(DType::kF16);
  if (f_hit != 0) bits |= NonFiniteBit(DType::kF32);
  return bits;
}

ZF_TARGET("avx2")
uint32_t CopyScanAvx2(void* dst, const void* src, size_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  const __m256i bf = _mm256_set1_epi16(static_cast<short>(kBf16Exp));
  const __m256i hf = _mm256_set1_epi16(static_cast<short>(kF16Exp));
  const __m256i f = _mm256_set1_epi32(static_cast<int>(kF32Exp));
  __m256i bf_hit = _mm256_setzero_si256(), hf_hit = bf_hit, f_hit = bf_hit;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), v);
    bf_hit = _mm256_or_si256(bf_hit, _mm256_cmpeq_epi16(_mm256_and_si256(v, bf), bf));
    hf_hit = _mm256_or_si256(hf_hit, _mm256_cmpeq_epi16(_mm256_and_si256(v, hf), hf));
    f_hit = _mm256_or_si256(f_hit, _mm256_cmpeq_epi32(_mm256_and_si256(v, f), f));
  }
  std::memcpy(out + i, in + i, n - i);
  uint32_t bits = ScanTail(in, i, n);
  if (!_mm256_testz_si256(bf_hit, bf_hit)) bits |= NonFiniteBit(DType::kBF16);
  if (!_mm256_testz_si256(hf_hit, hf_hit)) bits |= NonFiniteBit(DType::kF16);
  if (!_mm256_testz_si256(f_hit, f_hit)) bits |= NonFiniteBit(DType::kF32);
  return bits;
}

}  // namespace

namespace copy_scan_internal {

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

uint32_t CopyScanNonFinite(void* dst, const void* src, size_t n) {
  return copy_scan_internal::CopyScanNonFiniteWith(codec_internal::ActiveIsa(), dst, src, n);
}

}  // namespace zenflow
