// The one reference AdamW of the tests, the simulator (zenflow_sim.h) and the
// soak (tools/zf_soak.cc): torch's AdamW with decoupled weight decay, written
// from the formula for one element at a time. It shares no code with the
// product's kernels (common/adamw.cc, gpu_worker/kernels/) on purpose: a test
// that compares the two must be able to fail.
//
//   const AdamWStepFactors f = AdamWFactors(h, lr, step);   // once per column
//   AdamWElement(h, f, g, &p, &m, &v);                      // per element
//
// Bias corrections are computed in double and rounded to float; every other
// operation is a float one in the written order, so results are exactly
// reproducible (callers compare bit for bit against them).
#ifndef ZENFLOW_TESTS_TESTING_ADAMW_REFERENCE_H_
#define ZENFLOW_TESTS_TESTING_ADAMW_REFERENCE_H_

#include <cmath>
#include <cstdint>

namespace zenflow::testing {

struct AdamWRefHyper {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// What one step of one column needs besides the element's own values.
struct AdamWStepFactors {
  float step_size = 0;     // lr / (1 - beta1^t)
  float bc2_sqrt = 0;      // sqrt(1 - beta2^t)
  float inv_bc2_sqrt = 0;  // 1 / sqrt(1 - beta2^t), for the fused form
  float decay = 0;         // 1 - lr * weight_decay
};

// The factors of update number `step` (1 for a column's first update).
inline AdamWStepFactors AdamWFactors(const AdamWRefHyper& h, float lr, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(step));
  AdamWStepFactors f;
  f.step_size = static_cast<float>(static_cast<double>(lr) / bc1);
  f.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  f.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  f.decay = static_cast<float>(1.0 - static_cast<double>(lr) * static_cast<double>(h.weight_decay));
  return f;
}

// Updates *m and *v with gradient g and returns the step's update
// (step_size * m) / (sqrt(v) / bc2_sqrt + eps), in plain float operations
// (the daemon's scalar kernel evaluates the same expression).
inline float AdamWMomentsAndUpdate(const AdamWRefHyper& h, const AdamWStepFactors& f, float g,
                                   float* m, float* v) {
  const float mi = h.beta1 * *m + (1.0f - h.beta1) * g;
  const float vi = h.beta2 * *v + ((1.0f - h.beta2) * g) * g;
  const float denom = std::sqrt(vi) / f.bc2_sqrt + h.eps;
  *m = mi;
  *v = vi;
  return (f.step_size * mi) / denom;
}

// The same with m, v and the denominator evaluated the way vector kernels
// do (fused multiply-adds; sqrt(v) times 1 / sqrt(bc2)).
inline float AdamWMomentsAndUpdateFused(const AdamWRefHyper& h, const AdamWStepFactors& f,
                                        float g, float* m, float* v) {
  const float mi = std::fma(h.beta1, *m, (1.0f - h.beta1) * g);
  const float vi = std::fma(h.beta2, *v, ((1.0f - h.beta2) * g) * g);
  const float denom = std::fma(std::sqrt(vi), f.inv_bc2_sqrt, h.eps);
  *m = mi;
  *v = vi;
  return (f.step_size * mi) / denom;
}

// One whole AdamW step of one element in plain float operations:
// p = p * decay - update, the two rounded separately.
inline void AdamWElement(const AdamWRefHyper& h, const AdamWStepFactors& f, float g, float* p,
                         float* m, float* v) {
  const float update = AdamWMomentsAndUpdate(h, f, g, m, v);
  const float decayed = *p * f.decay;
  *p = decayed - update;
}

}  // namespace zenflow::testing

#endif  // ZENFLOW_TESTS_TESTING_ADAMW_REFERENCE_H_
