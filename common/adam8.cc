// AdamW with 8-bit state: the block codes (scalar, AVX2, AVX-512, the same
// bits at every level) and the block-by-block update. See adam8.h.
//
// Compiled without -march flags; the vector functions carry target
// attributes and run only at a level the caller checked.

#include "common/adam8.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/simd.h"

namespace zenflow {
namespace {

#define ZF_A8_AVX2 ZF_TARGET("avx2,fma")
#define ZF_A8_AVX512 ZF_TARGET("avx512f,avx2,fma")

// The largest code's value (1.875): a block's scale is its largest
// magnitude over it.
constexpr float kTop = 1.875f;
// Code k's float bits are (k + offset) << 20: the exponent field takes
// k >> 3 plus the bias, the top three mantissa bits k & 7.
constexpr uint32_t kOffsetM = 896;  // (127 - 15) << 3
constexpr uint32_t kOffsetV = 768;  // (127 - 31) << 3
constexpr uint32_t kHalf = 1u << 19;  // half a code step in those bits
// Half of m's smallest non-zero code (1.125 * 2^-15): below it m is 0.
constexpr float kMZeroBelow = 0.5625f / 32768.0f;

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The scale of a block whose largest magnitude is amax, and its inverse
// (0 and 0 for a block of zeros or of values below FLT_MIN).
inline void ScaleOf(float amax, float* scale, float* inv) {
  if (!(amax >= FLT_MIN)) {
    *scale = 0.0f;
    *inv = 0.0f;
    return;
  }
  *scale = amax / kTop;
  *inv = kTop / amax;
}

// v's stochastic rounding (the update's requantization): code k's bits plus
// a uniform 20-bit draw, truncated, round y up with probability equal to
// its distance past the code below over the code step (within a binade the
// value is linear in those bits), so a stored v is unbiased and follows
// beta2's small decay, where rounding to the nearest code would keep it
// (docs/design.md, rule 15). The draw is a hash of y's bits, the value's
// row in its column and the step: deterministic (reruns and thread counts
// give the same bytes) and independent of how columns are partitioned.
constexpr uint32_t kHashRow = 0x85EBCA77u;
constexpr uint32_t kHashMul1 = 0x9E3779B1u;
constexpr uint32_t kHashMul2 = 0x2C1B3C6Du;
constexpr uint32_t kHashStep = 0xC2B2AE3Du;

inline uint32_t StepSalt(int64_t step) {
  return static_cast<uint32_t>(static_cast<uint64_t>(step)) * kHashStep;
}

// The 20-bit draw for scaled value bits yb at row `row` (rowb = row *
// kHashRow, mod 2^32).
inline uint32_t Draw(uint32_t yb, uint32_t rowb, uint32_t salt) {
  uint32_t h = ((yb ^ salt) + rowb) * kHashMul1;
  h ^= h >> 15;
  h *= kHashMul2;
  h ^= h >> 13;
  return h >> 12;
}

// ---- Scalar -----------------------------------------------------------------

inline uint8_t QuantM(float x, float inv) {
  const float y = std::fabs(x) * inv;
  int32_t k = static_cast<int32_t>((Bits(y) + kHalf) >> 20) - static_cast<int32_t>(kOffsetM);
  if (k < 1) k = y >= kMZeroBelow ? 1 : 0;
  if (k > 127) k = 127;
  return static_cast<uint8_t>(static_cast<uint32_t>(k) | ((Bits(x) >> 31) << 7));
}

inline uint8_t QuantV(float x, float inv) {
  const float y = x * inv;
  int32_t k = static_cast<int32_t>((Bits(y) + kHalf) >> 20) - static_cast<int32_t>(kOffsetV);
  return static_cast<uint8_t>(std::min<int32_t>(255, std::max<int32_t>(0, k)));
}

inline uint8_t QuantVDraw(float x, float inv, uint32_t rowb, uint32_t salt) {
  const uint32_t yb = Bits(x * inv);
  int32_t k = static_cast<int32_t>((yb + Draw(yb, rowb, salt)) >> 20) -
              static_cast<int32_t>(kOffsetV);
  return static_cast<uint8_t>(std::min<int32_t>(255, std::max<int32_t>(0, k)));
}

inline float DequantM(uint8_t q, float scale) {
  const uint32_t k = q & 127u;
  const float f = (k == 0 ? 0.0f : FromBits((k + kOffsetM) << 20)) * scale;
  return (q & 128u) != 0 ? -f : f;
}

inline float DequantV(uint8_t q, float scale) {
  return FromBits((static_cast<uint32_t>(q) + kOffsetV) << 20) * scale;
}

void DqMScalar(const uint8_t* q, float s, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = DequantM(q[i], s);
}
void DqVScalar(const uint8_t* q, float s, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = DequantV(q[i], s);
}
void QMScalar(const float* x, float inv, uint8_t* q, size_t n) {
  for (size_t i = 0; i < n; ++i) q[i] = QuantM(x[i], inv);
}
void QVScalar(const float* x, float inv, uint8_t* q, size_t n) {
  for (size_t i = 0; i < n; ++i) q[i] = QuantV(x[i], inv);
}
// v's codes with stochastic rounding; x[0] is row row0 of its column.
void QVDrawScalar(const float* x, float inv, uint8_t* q, size_t n, uint32_t row0, uint32_t salt) {
  for (size_t i = 0; i < n; ++i) {
    q[i] = QuantVDraw(x[i], inv, (row0 + static_cast<uint32_t>(i)) * kHashRow, salt);
  }
}
float MaxAbsScalar(const float* x, size_t n) {
  float r = 0.0f;
  for (size_t i = 0; i < n; ++i) r = std::max(r, std::fabs(x[i]));
  return r;
}

// ---- AVX2 (n a multiple of 8) -------------------------------------------------

ZF_A8_AVX2 void DqMAvx2(const uint8_t* q, float s, float* out, size_t n) {
  const __m256 scale = _mm256_set1_ps(s);
  const __m256i mag = _mm256_set1_epi32(127), sign = _mm256_set1_epi32(128);
  const __m256i off = _mm256_set1_epi32(static_cast<int>(kOffsetM));
  for (size_t i = 0; i < n; i += 8) {
    uint64_t bytes;
    std::memcpy(&bytes, q + i, 8);
    const __m256i c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bytes)));
    const __m256i k = _mm256_and_si256(c, mag);
    const __m256i nz = _mm256_xor_si256(_mm256_cmpeq_epi32(k, _mm256_setzero_si256()),
                                        _mm256_set1_epi32(-1));
    const __m256i b = _mm256_and_si256(_mm256_slli_epi32(_mm256_add_epi32(k, off), 20), nz);
    __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(b), scale);
    f = _mm256_xor_ps(f, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(c, sign), 24)));
    _mm256_storeu_ps(out + i, f);
  }
}

ZF_A8_AVX2 void DqVAvx2(const uint8_t* q, float s, float* out, size_t n) {
  const __m256 scale = _mm256_set1_ps(s);
  const __m256i off = _mm256_set1_epi32(static_cast<int>(kOffsetV));
  for (size_t i = 0; i < n; i += 8) {
    uint64_t bytes;
    std::memcpy(&bytes, q + i, 8);
    const __m256i c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bytes)));
    const __m256i b = _mm256_slli_epi32(_mm256_add_epi32(c, off), 20);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_castsi256_ps(b), scale));
  }
}

// The low byte of each of 8 int32 lanes, stored as 8 bytes.
ZF_A8_AVX2 inline void StoreBytesAvx2(__m256i k, uint8_t* q) {
  const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1);
  const __m256i b = _mm256_shuffle_epi8(k, shuf);
  const __m256i p = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm256_castsi256_si128(p));
}

ZF_A8_AVX2 void QMAvx2(const float* x, float inv_s, uint8_t* q, size_t n) {
  const __m256 inv = _mm256_set1_ps(inv_s), thr = _mm256_set1_ps(kMZeroBelow);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i half = _mm256_set1_epi32(static_cast<int>(kHalf));
  const __m256i off = _mm256_set1_epi32(static_cast<int>(kOffsetM));
  const __m256i one = _mm256_set1_epi32(1), top = _mm256_set1_epi32(127);
  for (size_t i = 0; i < n; i += 8) {
    const __m256 xi = _mm256_loadu_ps(x + i);
    const __m256 y = _mm256_mul_ps(_mm256_and_ps(xi, abs_mask), inv);
    __m256i k = _mm256_sub_epi32(
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(y), half), 20), off);
    // As QMAvx512: 0 below half the smallest code, else at least 1.
    const __m256i keep = _mm256_castps_si256(_mm256_cmp_ps(y, thr, _CMP_GE_OQ));
    k = _mm256_min_epi32(_mm256_and_si256(_mm256_max_epi32(k, one), keep), top);
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(xi), 31), 7);
    StoreBytesAvx2(_mm256_or_si256(k, sign), q + i);
  }
}

ZF_A8_AVX2 void QVAvx2(const float* x, float inv_s, uint8_t* q, size_t n) {
  const __m256 inv = _mm256_set1_ps(inv_s);
  const __m256i half = _mm256_set1_epi32(static_cast<int>(kHalf));
  const __m256i off = _mm256_set1_epi32(static_cast<int>(kOffsetV));
  const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi32(255);
  for (size_t i = 0; i < n; i += 8) {
    const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + i), inv);
    __m256i k = _mm256_sub_epi32(
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(y), half), 20), off);
    k = _mm256_min_epi32(_mm256_max_epi32(k, zero), top);
    StoreBytesAvx2(k, q + i);
  }
}

ZF_A8_AVX2 void QVDrawAvx2(const float* x, float inv_s, uint8_t* q, size_t n, uint32_t row0,
                           uint32_t salt) {
  const __m256 inv = _mm256_set1_ps(inv_s);
  const __m256i off = _mm256_set1_epi32(static_cast<int>(kOffsetV));
  const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi32(255);
  const __m256i vsalt = _mm256_set1_epi32(static_cast<int>(salt));
  const __m256i mul1 = _mm256_set1_epi32(static_cast<int>(kHashMul1));
  const __m256i mul2 = _mm256_set1_epi32(static_cast<int>(kHashMul2));
  const __m256i rstep = _mm256_set1_epi32(static_cast<int>(8u * kHashRow));
  __m256i rowb = _mm256_mullo_epi32(
      _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(row0)),
                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
      _mm256_set1_epi32(static_cast<int>(kHashRow)));
  for (size_t i = 0; i < n; i += 8) {
    const __m256i yb = _mm256_castps_si256(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    __m256i h = _mm256_mullo_epi32(_mm256_add_epi32(_mm256_xor_si256(yb, vsalt), rowb), mul1);
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
    h = _mm256_mullo_epi32(h, mul2);
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
    __m256i k = _mm256_sub_epi32(
        _mm256_srli_epi32(_mm256_add_epi32(yb, _mm256_srli_epi32(h, 12)), 20), off);
    k = _mm256_min_epi32(_mm256_max_epi32(k, zero), top);
    StoreBytesAvx2(k, q + i);
    rowb = _mm256_add_epi32(rowb, rstep);
  }
}

ZF_A8_AVX2 float MaxAbsAvx2(const float* x, size_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 r = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 8) r = _mm256_max_ps(r, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, r);
  return *std::max_element(lanes, lanes + 8);
}

// ---- AVX-512 (n a multiple of 16) ---------------------------------------------

ZF_A8_AVX512 void DqMAvx512(const uint8_t* q, float s, float* out, size_t n) {
  const __m512 scale = _mm512_set1_ps(s);
  const __m512i mag = _mm512_set1_epi32(127), sign = _mm512_set1_epi32(128);
  const __m512i off = _mm512_set1_epi32(static_cast<int>(kOffsetM));
  for (size_t i = 0; i < n; i += 16) {
    const __m512i c =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
    const __m512i k = _mm512_and_si512(c, mag);
    const __mmask16 nz = _mm512_test_epi32_mask(k, k);
    const __m512i b = _mm512_maskz_slli_epi32(nz, _mm512_add_epi32(k, off), 20);
    const __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(b), scale);
    const __m512i sb = _mm512_slli_epi32(_mm512_and_si512(c, sign), 24);
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(f), sb)));
  }
}

ZF_A8_AVX512 void DqVAvx512(const uint8_t* q, float s, float* out, size_t n) {
  const __m512 scale = _mm512_set1_ps(s);
  const __m512i off = _mm512_set1_epi32(static_cast<int>(kOffsetV));
  for (size_t i = 0; i < n; i += 16) {
    const __m512i c =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
    const __m512i b = _mm512_slli_epi32(_mm512_add_epi32(c, off), 20);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_castsi512_ps(b), scale));
  }
}

ZF_A8_AVX512 void QMAvx512(const float* x, float inv_s, uint8_t* q, size_t n) {
  const __m512 inv = _mm512_set1_ps(inv_s), thr = _mm512_set1_ps(kMZeroBelow);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i half = _mm512_set1_epi32(static_cast<int>(kHalf));
  const __m512i off = _mm512_set1_epi32(static_cast<int>(kOffsetM));
  const __m512i one = _mm512_set1_epi32(1), top = _mm512_set1_epi32(127);
  for (size_t i = 0; i < n; i += 16) {
    const __m512i xi = _mm512_castps_si512(_mm512_loadu_ps(x + i));
    const __m512 y = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(xi, abs_mask)), inv);
    __m512i k = _mm512_sub_epi32(
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(y), half), 20), off);
    // Below half the smallest code: 0; else at least code 1 (a k >= 1
    // means y >= 1.0625 * 2^-15, so its lane keeps k).
    const __mmask16 keep = _mm512_cmp_ps_mask(y, thr, _CMP_GE_OQ);
    k = _mm512_min_epi32(_mm512_maskz_max_epi32(keep, k, one), top);
    const __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(xi, 31), 7);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(_mm512_or_si512(k, sign)));
  }
}

ZF_A8_AVX512 void QVAvx512(const float* x, float inv_s, uint8_t* q, size_t n) {
  const __m512 inv = _mm512_set1_ps(inv_s);
  const __m512i half = _mm512_set1_epi32(static_cast<int>(kHalf));
  const __m512i off = _mm512_set1_epi32(static_cast<int>(kOffsetV));
  const __m512i zero = _mm512_setzero_si512(), top = _mm512_set1_epi32(255);
  for (size_t i = 0; i < n; i += 16) {
    const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x + i), inv);
    __m512i k = _mm512_sub_epi32(
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(y), half), 20), off);
    k = _mm512_min_epi32(_mm512_max_epi32(k, zero), top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(k));
  }
}

ZF_A8_AVX512 void QVDrawAvx512(const float* x, float inv_s, uint8_t* q, size_t n, uint32_t row0,
                               uint32_t salt) {
  const __m512 inv = _mm512_set1_ps(inv_s);
  const __m512i off = _mm512_set1_epi32(static_cast<int>(kOffsetV));
  const __m512i zero = _mm512_setzero_si512(), top = _mm512_set1_epi32(255);
  const __m512i vsalt = _mm512_set1_epi32(static_cast<int>(salt));
  const __m512i mul1 = _mm512_set1_epi32(static_cast<int>(kHashMul1));
  const __m512i mul2 = _mm512_set1_epi32(static_cast<int>(kHashMul2));
  const __m512i rstep = _mm512_set1_epi32(static_cast<int>(16u * kHashRow));
  __m512i rowb = _mm512_mullo_epi32(
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(row0)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
      _mm512_set1_epi32(static_cast<int>(kHashRow)));
  for (size_t i = 0; i < n; i += 16) {
    const __m512i yb = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
    __m512i h = _mm512_mullo_epi32(_mm512_add_epi32(_mm512_xor_si512(yb, vsalt), rowb), mul1);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
    h = _mm512_mullo_epi32(h, mul2);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
    __m512i k = _mm512_sub_epi32(
        _mm512_srli_epi32(_mm512_add_epi32(yb, _mm512_srli_epi32(h, 12)), 20), off);
    k = _mm512_min_epi32(_mm512_max_epi32(k, zero), top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(k));
    rowb = _mm512_add_epi32(rowb, rstep);
  }
}

ZF_A8_AVX512 float MaxAbsAvx512(const float* x, size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512 r = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const __m512i xi = _mm512_castps_si512(_mm512_loadu_ps(x + i));
    r = _mm512_max_ps(r, _mm512_castsi512_ps(_mm512_and_si512(xi, abs_mask)));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, r);
  return *std::max_element(lanes, lanes + 16);
}

// ---- Per level ----------------------------------------------------------------

// A level's block functions; n is the block's length rounded up to 16
// (the buffers are padded).
struct Kernels {
  void (*dq_m)(const uint8_t*, float, float*, size_t);
  void (*dq_v)(const uint8_t*, float, float*, size_t);
  void (*q_m)(const float*, float, uint8_t*, size_t);
  void (*q_v)(const float*, float, uint8_t*, size_t);
  void (*q_v_draw)(const float*, float, uint8_t*, size_t, uint32_t, uint32_t);
  float (*max_abs)(const float*, size_t);
};

Kernels KernelsFor(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return {DqMAvx512, DqVAvx512, QMAvx512, QVAvx512, QVDrawAvx512, MaxAbsAvx512};
    case SimdLevel::kAvx2:
      return {DqMAvx2, DqVAvx2, QMAvx2, QVAvx2, QVDrawAvx2, MaxAbsAvx2};
    case SimdLevel::kScalar:
      break;
  }
  return {DqMScalar, DqVScalar, QMScalar, QVScalar, QVDrawScalar, MaxAbsScalar};
}

inline size_t Padded(size_t n) { return (n + 15) & ~size_t{15}; }

// One block's scratch: its m and v in fp32 and its codes, padded to 16.
struct alignas(64) BlockScratch {
  float m[kAdam8Block];
  float v[kAdam8Block];
  uint8_t code[kAdam8Block];
};

// Codes of n values into s->code (padded with zeros) and fp32 into out.
inline void LoadBlock(const Kernels& k, bool is_m, const uint8_t* q, float scale, size_t n,
                      BlockScratch* s, float* out) {
  std::memcpy(s->code, q, n);
  std::memset(s->code + n, 0, Padded(n) - n);
  (is_m ? k.dq_m : k.dq_v)(s->code, scale, out, Padded(n));
  std::fill(out + n, out + Padded(n), 0.0f);
}

// x[0, n) (zero padded to 16) quantized into q, scale into *scale.
inline void StoreBlock(const Kernels& k, bool is_m, const float* x, size_t n, BlockScratch* s,
                       uint8_t* q, float* scale) {
  float inv;
  ScaleOf(k.max_abs(x, Padded(n)), scale, &inv);
  (is_m ? k.q_m : k.q_v)(x, inv, s->code, Padded(n));
  std::memcpy(q, s->code, n);
}

// v's block x[0, n) (row row0 of its column first) quantized with
// stochastic rounding.
inline void StoreVDraw(const Kernels& k, const float* x, size_t n, uint32_t row0, uint32_t salt,
                       BlockScratch* s, uint8_t* q, float* scale) {
  float inv;
  ScaleOf(k.max_abs(x, Padded(n)), scale, &inv);
  k.q_v_draw(x, inv, s->code, Padded(n), row0, salt);
  std::memcpy(q, s->code, n);
}

// Calls fn(offset, length, scale index) for every block of ncols columns.
template <typename Fn>
void ForEachBlock(int64_t rows, int64_t ncols, Fn fn) {
  const int64_t per = Adam8BlocksPerColumn(rows);
  for (int64_t c = 0; c < ncols; ++c) {
    for (int64_t b = 0; b < per; ++b) {
      const int64_t r0 = b * kAdam8Block;
      fn(static_cast<size_t>(c * rows + r0),
         static_cast<size_t>(std::min<int64_t>(kAdam8Block, rows - r0)),
         static_cast<size_t>(c * per + b));
    }
  }
}


// ---- Fused blocks -----------------------------------------------------------
//
// One block (n <= 256 values) in one pass over its memory: dequantize,
// AdamW with the same operations as adamw.cc's vector step (so the same
// bits as AdamWUpdateWith at that level), the new m and v kept in the
// scratch with their largest magnitudes, then the codes. Masked-off lanes
// load as zeros (m, v, g and p 0): they leave the maxima alone.

ZF_A8_AVX512 void BlockAvx512(const AdamWConsts& c, const float* grad, float* p, uint8_t* mq,
                              float* ms, uint8_t* vq, float* vs, size_t n, BlockScratch* x, uint32_t row0,
    uint32_t salt) {
  const __m512 beta1 = _mm512_set1_ps(c.beta1), omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 decay = _mm512_set1_ps(c.decay), step_size = _mm512_set1_ps(c.step_size);
  const __m512 inv_bc2 = _mm512_set1_ps(c.inv_bc2_sqrt), eps = _mm512_set1_ps(c.eps);
  const __m512 gs = _mm512_set1_ps(c.grad_scale);
  const __m512 sm = _mm512_set1_ps(*ms), sv = _mm512_set1_ps(*vs);
  const __m512i mag = _mm512_set1_epi32(127), sign = _mm512_set1_epi32(128);
  const __m512i offm = _mm512_set1_epi32(static_cast<int>(kOffsetM));
  const __m512i offv = _mm512_set1_epi32(static_cast<int>(kOffsetV));
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512 mmax = _mm512_setzero_ps(), vmax = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const size_t cnt = n - i < 16 ? n - i : 16;
    const __mmask16 mask = static_cast<__mmask16>((1u << cnt) - 1u);
    __m128i cm8, cv8;
    if (cnt == 16) {
      cm8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mq + i));
      cv8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(vq + i));
    } else {
      alignas(16) uint8_t tm[16] = {}, tv[16] = {};
      std::memcpy(tm, mq + i, cnt);
      std::memcpy(tv, vq + i, cnt);
      cm8 = _mm_load_si128(reinterpret_cast<const __m128i*>(tm));
      cv8 = _mm_load_si128(reinterpret_cast<const __m128i*>(tv));
    }
    const __m512i cm = _mm512_cvtepu8_epi32(cm8), cv = _mm512_cvtepu8_epi32(cv8);
    const __m512i km = _mm512_and_si512(cm, mag);
    const __m512i bm = _mm512_maskz_slli_epi32(_mm512_test_epi32_mask(km, km),
                                               _mm512_add_epi32(km, offm), 20);
    const __m512 m0 = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(bm), sm)),
                         _mm512_slli_epi32(_mm512_and_si512(cm, sign), 24)));
    const __m512 v0 = _mm512_maskz_mul_ps(
        mask, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(cv, offv), 20)), sv);
    const __m512 g =
        _mm512_mul_ps(cnt == 16 ? _mm512_loadu_ps(grad + i) : _mm512_maskz_loadu_ps(mask, grad + i), gs);
    const __m512 mi = _mm512_fmadd_ps(beta1, m0, _mm512_mul_ps(omb1, g));
    const __m512 vi = _mm512_fmadd_ps(beta2, v0, _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 pi = _mm512_mul_ps(cnt == 16 ? _mm512_loadu_ps(p + i) : _mm512_maskz_loadu_ps(mask, p + i), decay);
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), inv_bc2, eps);
    const __m512 upd = _mm512_div_ps(_mm512_mul_ps(step_size, mi), denom);
    if (cnt == 16) {
      _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, upd));
    } else {
      _mm512_mask_storeu_ps(p + i, mask, _mm512_sub_ps(pi, upd));
    }
    _mm512_store_ps(x->m + i, mi);
    _mm512_store_ps(x->v + i, vi);
    mmax = _mm512_max_ps(mmax, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(mi), abs_mask)));
    vmax = _mm512_max_ps(vmax, vi);
  }
  alignas(64) float lm[16], lv[16];
  _mm512_store_ps(lm, mmax);
  _mm512_store_ps(lv, vmax);
  float inv_m, inv_v;
  ScaleOf(*std::max_element(lm, lm + 16), ms, &inv_m);
  ScaleOf(*std::max_element(lv, lv + 16), vs, &inv_v);
  const size_t full = n & ~size_t{15};
  QMAvx512(x->m, inv_m, mq, full);
  QVDrawAvx512(x->v, inv_v, vq, full, row0, salt);
  if (full < n) {
    QMAvx512(x->m + full, inv_m, x->code, 16);
    std::memcpy(mq + full, x->code, n - full);
    QVDrawAvx512(x->v + full, inv_v, x->code, 16, row0 + static_cast<uint32_t>(full), salt);
    std::memcpy(vq + full, x->code, n - full);
  }
}

ZF_A8_AVX2 void BlockAvx2(const AdamWConsts& c, const float* grad, float* p, uint8_t* mq,
                          float* ms, uint8_t* vq, float* vs, size_t n, BlockScratch* x, uint32_t row0,
    uint32_t salt) {
  const __m256 beta1 = _mm256_set1_ps(c.beta1), omb1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2), omb2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 decay = _mm256_set1_ps(c.decay), step_size = _mm256_set1_ps(c.step_size);
  const __m256 inv_bc2 = _mm256_set1_ps(c.inv_bc2_sqrt), eps = _mm256_set1_ps(c.eps);
  const __m256 gs = _mm256_set1_ps(c.grad_scale);
  const __m256 sm = _mm256_set1_ps(*ms), sv = _mm256_set1_ps(*vs);
  const __m256i mag = _mm256_set1_epi32(127), sign = _mm256_set1_epi32(128);
  const __m256i offm = _mm256_set1_epi32(static_cast<int>(kOffsetM));
  const __m256i offv = _mm256_set1_epi32(static_cast<int>(kOffsetV));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i ones = _mm256_set1_epi32(-1), zero = _mm256_setzero_si256();
  __m256 mmax = _mm256_setzero_ps(), vmax = _mm256_setzero_ps();
  // A short tail through padded copies (zeros beyond n).
  alignas(32) float tg[8] = {}, tp[8] = {};
  for (size_t i = 0; i < n; i += 8) {
    const size_t cnt = n - i < 8 ? n - i : 8;
    const float* gi = grad + i;
    float* pi_ptr = p + i;
    uint64_t bm8 = 0, bv8 = 0;
    if (cnt == 8) {
      std::memcpy(&bm8, mq + i, 8);
      std::memcpy(&bv8, vq + i, 8);
    } else {
      std::memcpy(&bm8, mq + i, cnt);
      std::memcpy(&bv8, vq + i, cnt);
      std::memcpy(tg, gi, cnt * sizeof(float));
      std::memcpy(tp, pi_ptr, cnt * sizeof(float));
      gi = tg;
      pi_ptr = tp;
    }
    const __m256i cm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bm8)));
    const __m256i cv = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bv8)));
    const __m256i km = _mm256_and_si256(cm, mag);
    const __m256i nz = _mm256_xor_si256(_mm256_cmpeq_epi32(km, zero), ones);
    const __m256i bm = _mm256_and_si256(_mm256_slli_epi32(_mm256_add_epi32(km, offm), 20), nz);
    const __m256 m0 = _mm256_xor_ps(_mm256_mul_ps(_mm256_castsi256_ps(bm), sm),
                                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(cm, sign), 24)));
    __m256 v0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(cv, offv), 20)), sv);
    if (cnt < 8) {
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cnt)), lane);
      v0 = _mm256_and_ps(v0, _mm256_castsi256_ps(live));
    }
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(gi), gs);
    const __m256 mi = _mm256_fmadd_ps(beta1, m0, _mm256_mul_ps(omb1, g));
    const __m256 vi = _mm256_fmadd_ps(beta2, v0, _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 pv = _mm256_mul_ps(_mm256_loadu_ps(pi_ptr), decay);
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), inv_bc2, eps);
    const __m256 upd = _mm256_div_ps(_mm256_mul_ps(step_size, mi), denom);
    _mm256_storeu_ps(pi_ptr, _mm256_sub_ps(pv, upd));
    if (cnt < 8) std::memcpy(p + i, tp, cnt * sizeof(float));
    _mm256_store_ps(x->m + i, mi);
    _mm256_store_ps(x->v + i, vi);
    mmax = _mm256_max_ps(mmax, _mm256_and_ps(mi, abs_mask));
    vmax = _mm256_max_ps(vmax, vi);
  }
  alignas(32) float lm[8], lv[8];
  _mm256_store_ps(lm, mmax);
  _mm256_store_ps(lv, vmax);
  float inv_m, inv_v;
  ScaleOf(*std::max_element(lm, lm + 8), ms, &inv_m);
  ScaleOf(*std::max_element(lv, lv + 8), vs, &inv_v);
  const size_t full = n & ~size_t{7};
  QMAvx2(x->m, inv_m, mq, full);
  QVDrawAvx2(x->v, inv_v, vq, full, row0, salt);
  if (full < n) {
    QMAvx2(x->m + full, inv_m, x->code, 8);
    std::memcpy(mq + full, x->code, n - full);
    QVDrawAvx2(x->v + full, inv_v, x->code, 8, row0 + static_cast<uint32_t>(full), salt);
    std::memcpy(vq + full, x->code, n - full);
  }
}

SimdLevel Usable(SimdLevel level) {
  return SimdLevelSupported(level) ? level : BestSimdLevel();
}

}  // namespace

void Adam8QuantizeM(const float* x, size_t n, uint8_t* q, float* scale) {
  float inv;
  ScaleOf(MaxAbsScalar(x, n), scale, &inv);
  QMScalar(x, inv, q, n);
}

void Adam8QuantizeV(const float* x, size_t n, uint8_t* q, float* scale) {
  float inv;
  ScaleOf(MaxAbsScalar(x, n), scale, &inv);
  QVScalar(x, inv, q, n);
}

float Adam8DecodeM(uint8_t q, float scale) { return DequantM(q, scale); }
float Adam8DecodeV(uint8_t q, float scale) { return DequantV(q, scale); }

void Adam8Quantize(SimdLevel level, int64_t rows, int64_t ncols, const float* m, const float* v,
                   const Adam8Columns& out) {
  const Kernels k = KernelsFor(Usable(level));
  BlockScratch s;
  ForEachBlock(rows, ncols, [&](size_t at, size_t n, size_t b) {
    std::memcpy(s.m, m + at, n * sizeof(float));
    std::fill(s.m + n, s.m + Padded(n), 0.0f);
    StoreBlock(k, true, s.m, n, &s, out.m + at, out.m_scale + b);
    std::memcpy(s.v, v + at, n * sizeof(float));
    std::fill(s.v + n, s.v + Padded(n), 0.0f);
    StoreBlock(k, false, s.v, n, &s, out.v + at, out.v_scale + b);
  });
}

void Adam8Dequantize(SimdLevel level, int64_t rows, int64_t ncols, const Adam8ConstColumns& in,
                     float* m, float* v) {
  const Kernels k = KernelsFor(Usable(level));
  BlockScratch s;
  ForEachBlock(rows, ncols, [&](size_t at, size_t n, size_t b) {
    if (m != nullptr) {
      LoadBlock(k, true, in.m + at, in.m_scale[b], n, &s, s.m);
      std::memcpy(m + at, s.m, n * sizeof(float));
    }
    if (v != nullptr) {
      LoadBlock(k, false, in.v + at, in.v_scale[b], n, &s, s.v);
      std::memcpy(v + at, s.v, n * sizeof(float));
    }
  });
}

void Adam8Reference(const AdamWHyper& h, int64_t step, float grad_scale, const float* grad,
                    float* p, const Adam8Columns& s, int64_t rows, int64_t ncols) {
  const size_t n = static_cast<size_t>(rows * ncols);
  std::vector<float> m(n), v(n);
  const int64_t per = Adam8BlocksPerColumn(rows);
  for (size_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(i) / rows, r = static_cast<int64_t>(i) % rows;
    const size_t b = static_cast<size_t>(c * per + r / kAdam8Block);
    m[i] = DequantM(s.m[i], s.m_scale[b]);
    v[i] = DequantV(s.v[i], s.v_scale[b]);
  }
  AdamWReference(h, step, grad_scale, grad, p, m.data(), v.data(), n);
  const uint32_t salt = StepSalt(step);
  ForEachBlock(rows, ncols, [&](size_t at, size_t len, size_t b) {
    Adam8QuantizeM(m.data() + at, len, s.m + at, s.m_scale + b);
    float inv;
    ScaleOf(MaxAbsScalar(v.data() + at, len), s.v_scale + b, &inv);
    QVDrawScalar(v.data() + at, inv, s.v + at, len,
                 static_cast<uint32_t>(static_cast<int64_t>(at) % rows), salt);
  });
}

void Adam8Update(SimdLevel level, const AdamWHyper& h, int64_t step, float grad_scale,
                 const float* grad, float* p, const Adam8Columns& s, int64_t rows, int64_t ncols,
                 float* m_out, float* v_out, uint32_t draw_seed) {
  level = Usable(level);
  const Kernels k = KernelsFor(level);
  const AdamWConsts c = MakeAdamWConsts(h, step, grad_scale);
  const uint32_t salt = StepSalt(step) ^ (draw_seed * kHashMul1);
  BlockScratch x;
  ForEachBlock(rows, ncols, [&](size_t at, size_t n, size_t b) {
    const uint32_t row0 = static_cast<uint32_t>(static_cast<int64_t>(at) % rows);
    if (level == SimdLevel::kAvx512) {
      BlockAvx512(c, grad + at, p + at, s.m + at, s.m_scale + b, s.v + at, s.v_scale + b, n, &x,
                  row0, salt);
    } else if (level == SimdLevel::kAvx2) {
      BlockAvx2(c, grad + at, p + at, s.m + at, s.m_scale + b, s.v + at, s.v_scale + b, n, &x,
                row0, salt);
    } else {
      LoadBlock(k, true, s.m + at, s.m_scale[b], n, &x, x.m);
      LoadBlock(k, false, s.v + at, s.v_scale[b], n, &x, x.v);
      AdamWUpdateWith(level, c, grad + at, p + at, x.m, x.v, n);
      StoreBlock(k, true, x.m, n, &x, s.m + at, s.m_scale + b);
      StoreVDraw(k, x.v, n, row0, salt, &x, s.v + at, s.v_scale + b);
    }
    if (m_out != nullptr) {
      LoadBlock(k, true, s.m + at, s.m_scale[b], n, &x, x.m);
      std::memcpy(m_out + at, x.m, n * sizeof(float));
    }
    if (v_out != nullptr) {
      LoadBlock(k, false, s.v + at, s.v_scale[b], n, &x, x.v);
      std::memcpy(v_out + at, x.v, n * sizeof(float));
    }
  });
}

}  // namespace zenflow
