// AdamW update kernels: scalar reference plus AVX2 (+FMA) and AVX-512
// versions. See adamw.h.
//
// This file is compiled without -march flags; SIMD kernels carry
// __attribute__((target(...))) and callers pick a level the CPU supports.

#include "common/adamw.h"

#include "common/simd.h"

#include <cmath>
#include <cstring>

namespace zenflow {
namespace {

#define ZF_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define ZF_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))

using Consts = AdamWConsts;

Consts MakeConsts(const AdamWHyper& h, int64_t step, float grad_scale) {
  const double t = static_cast<double>(step < 1 ? 1 : step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  const double bc2_sqrt = std::sqrt(bc2);
  Consts c;
  c.beta1 = h.beta1;
  c.one_minus_beta1 = 1.0f - h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta2 = 1.0f - h.beta2;
  c.decay = static_cast<float>(1.0 - static_cast<double>(h.lr) *
                                         static_cast<double>(h.weight_decay));
  c.step_size = static_cast<float>(static_cast<double>(h.lr) / bc1);
  c.bc2_sqrt = static_cast<float>(bc2_sqrt);
  c.inv_bc2_sqrt = static_cast<float>(1.0 / bc2_sqrt);
  c.eps = h.eps;
  c.grad_scale = grad_scale;
  return c;
}

// The reference formula, element by element, in the documented order.
inline void ScalarLoop(const Consts& c, const float* grad, float* p, float* m,
                       float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * c.grad_scale;
    const float mi = c.beta1 * m[i] + c.one_minus_beta1 * g;
    const float vi = c.beta2 * v[i] + c.one_minus_beta2 * g * g;
    float pi = p[i] * c.decay;
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    pi = pi - c.step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  }
}

// Broadcast constants for the AVX2 kernel.
struct Avx2Consts {
  __m256 beta1, omb1, beta2, omb2, decay, step_size, inv_bc2_sqrt, eps, scale;
};

// Updates the 8 elements starting at i.
ZF_TARGET_AVX2 inline void Step8Avx2(const Avx2Consts& k, size_t i,
                                     const float* grad, float* p, float* m,
                                     float* v) {
  const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), k.scale);
  const __m256 mi = _mm256_fmadd_ps(k.beta1, _mm256_loadu_ps(m + i),
                                    _mm256_mul_ps(k.omb1, g));
  const __m256 vi = _mm256_fmadd_ps(k.beta2, _mm256_loadu_ps(v + i),
                                    _mm256_mul_ps(_mm256_mul_ps(k.omb2, g), g));
  const __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), k.decay);
  const __m256 denom =
      _mm256_fmadd_ps(_mm256_sqrt_ps(vi), k.inv_bc2_sqrt, k.eps);
  const __m256 upd = _mm256_div_ps(_mm256_mul_ps(k.step_size, mi), denom);
  _mm256_storeu_ps(m + i, mi);
  _mm256_storeu_ps(v + i, vi);
  _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, upd));
}

ZF_TARGET_AVX2 void UpdateAvx2(const Consts& c, const float* grad, float* p,
                               float* m, float* v, size_t n) {
  Avx2Consts k;
  k.beta1 = _mm256_set1_ps(c.beta1);
  k.omb1 = _mm256_set1_ps(c.one_minus_beta1);
  k.beta2 = _mm256_set1_ps(c.beta2);
  k.omb2 = _mm256_set1_ps(c.one_minus_beta2);
  k.decay = _mm256_set1_ps(c.decay);
  k.step_size = _mm256_set1_ps(c.step_size);
  k.inv_bc2_sqrt = _mm256_set1_ps(c.inv_bc2_sqrt);
  k.eps = _mm256_set1_ps(c.eps);
  k.scale = _mm256_set1_ps(c.grad_scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Step8Avx2(k, i, grad, p, m, v);
    Step8Avx2(k, i + 8, grad, p, m, v);
  }
  if (i + 8 <= n) {
    Step8Avx2(k, i, grad, p, m, v);
    i += 8;
  }
  if (i < n) {
    // The last < 8 elements through the same vector step, padded with
    // zeros: an element's bits do not depend on where a call starts or
    // ends (an update split into blocks gives the same result).
    float tg[8] = {}, tp[8] = {}, tm[8] = {}, tv[8] = {};
    const size_t rest = n - i;
    std::memcpy(tg, grad + i, rest * sizeof(float));
    std::memcpy(tp, p + i, rest * sizeof(float));
    std::memcpy(tm, m + i, rest * sizeof(float));
    std::memcpy(tv, v + i, rest * sizeof(float));
    Step8Avx2(k, 0, tg, tp, tm, tv);
    std::memcpy(p + i, tp, rest * sizeof(float));
    std::memcpy(m + i, tm, rest * sizeof(float));
    std::memcpy(v + i, tv, rest * sizeof(float));
  }
}

// Broadcast constants for the AVX-512 kernel.
struct Avx512Consts {
  __m512 beta1, omb1, beta2, omb2, decay, step_size, inv_bc2_sqrt, eps, scale;
};

// Updates the elements i + j, j < 16, selected by `mask` (masked-off lanes
// are neither read nor written).
ZF_TARGET_AVX512 inline void Step16Avx512(const Avx512Consts& k, size_t i,
                                          __mmask16 mask, const float* grad,
                                          float* p, float* m, float* v) {
  const __m512 g =
      _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, grad + i), k.scale);
  const __m512 mi = _mm512_fmadd_ps(k.beta1, _mm512_maskz_loadu_ps(mask, m + i),
                                    _mm512_mul_ps(k.omb1, g));
  const __m512 vi = _mm512_fmadd_ps(k.beta2, _mm512_maskz_loadu_ps(mask, v + i),
                                    _mm512_mul_ps(_mm512_mul_ps(k.omb2, g), g));
  const __m512 pi = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, p + i), k.decay);
  const __m512 denom =
      _mm512_fmadd_ps(_mm512_sqrt_ps(vi), k.inv_bc2_sqrt, k.eps);
  const __m512 upd = _mm512_div_ps(_mm512_mul_ps(k.step_size, mi), denom);
  _mm512_mask_storeu_ps(m + i, mask, mi);
  _mm512_mask_storeu_ps(v + i, mask, vi);
  _mm512_mask_storeu_ps(p + i, mask, _mm512_sub_ps(pi, upd));
}

ZF_TARGET_AVX512 void UpdateAvx512(const Consts& c, const float* grad, float* p,
                                   float* m, float* v, size_t n) {
  Avx512Consts k;
  k.beta1 = _mm512_set1_ps(c.beta1);
  k.omb1 = _mm512_set1_ps(c.one_minus_beta1);
  k.beta2 = _mm512_set1_ps(c.beta2);
  k.omb2 = _mm512_set1_ps(c.one_minus_beta2);
  k.decay = _mm512_set1_ps(c.decay);
  k.step_size = _mm512_set1_ps(c.step_size);
  k.inv_bc2_sqrt = _mm512_set1_ps(c.inv_bc2_sqrt);
  k.eps = _mm512_set1_ps(c.eps);
  k.scale = _mm512_set1_ps(c.grad_scale);
  const __mmask16 all = static_cast<__mmask16>(0xFFFF);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    Step16Avx512(k, i, all, grad, p, m, v);
    Step16Avx512(k, i + 16, all, grad, p, m, v);
  }
  for (; i < n; i += 16) {
    const size_t count = n - i < 16 ? n - i : 16;
    Step16Avx512(k, i, static_cast<__mmask16>((1u << count) - 1u), grad, p, m,
                 v);
  }
}

SimdLevel DetectLevel() {
  if (simd::HasAvx512Fma()) return SimdLevel::kAvx512;
  if (simd::HasAvx2Fma()) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

}  // namespace

SimdLevel BestSimdLevel() {
  static const SimdLevel level = DetectLevel();
  return level;
}

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kScalar:
      break;
  }
  return "scalar";
}

bool SimdLevelSupported(SimdLevel level) {
  return static_cast<int>(level) <= static_cast<int>(BestSimdLevel());
}

void AdamWReference(const AdamWHyper& h, int64_t step, float grad_scale,
                    const float* grad, float* p, float* m, float* v, size_t n) {
  ScalarLoop(MakeConsts(h, step, grad_scale), grad, p, m, v, n);
}

AdamWConsts MakeAdamWConsts(const AdamWHyper& h, int64_t step, float grad_scale) {
  return MakeConsts(h, step, grad_scale);
}

void AdamWUpdate(SimdLevel level, const AdamWHyper& h, int64_t step,
                 float grad_scale, const float* grad, float* p, float* m,
                 float* v, size_t n) {
  AdamWUpdateWith(level, MakeConsts(h, step, grad_scale), grad, p, m, v, n);
}

void AdamWUpdateWith(SimdLevel level, const AdamWConsts& c, const float* grad, float* p,
                     float* m, float* v, size_t n) {
  switch (level) {
    case SimdLevel::kAvx512:
      UpdateAvx512(c, grad, p, m, v, n);
      return;
    case SimdLevel::kAvx2:
      UpdateAvx2(c, grad, p, m, v, n);
      return;
    case SimdLevel::kScalar:
      break;
  }
  ScalarLoop(c, grad, p, m, v, n);
}

}  // namespace zenflow
