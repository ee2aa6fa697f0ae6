// AdamW update kernel (decoupled weight decay, same formula as
// torch.optim.AdamW) applied to one contiguous run of parameters, with a scalar
// reference and AVX2 / AVX-512 versions selected by SimdLevel.

#ifndef ZENFLOW_COMMON_ADAMW_H_
#define ZENFLOW_COMMON_ADAMW_H_

#include <cstddef>
#include <cstdint>

namespace zenflow {

// AdamW's hyper-parameters, shared by the daemon and the worker (torch's
// defaults, and the daemon's JobSpec defaults).
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// Vector instruction set used by AdamWUpdate.
enum class SimdLevel { kScalar, kAvx2, kAvx512 };

// Best level this CPU supports (kAvx512 needs avx512f; kAvx2 needs avx2+fma).
SimdLevel BestSimdLevel();

// "scalar", "avx2" or "avx512".
const char* SimdLevelName(SimdLevel level);

// True if this CPU can run `level`.
bool SimdLevelSupported(SimdLevel level);

// Scalar reference. For each i in [0, n), with t = step >= 1 (this column's
// update count including this update) and g = grad[i] * grad_scale:
//   m = beta1*m + (1-beta1)*g
//   v = beta2*v + (1-beta2)*g*g
//   p = p * (1 - lr*weight_decay)
//   p = p - step_size * m / (sqrt(v)/bc2_sqrt + eps)
// where bc1 = 1 - beta1^t and bc2 = 1 - beta2^t are computed in double, and
// step_size = lr/bc1, bc2_sqrt = sqrt(bc2) and the decay factor
// 1 - lr*weight_decay are computed in double and then rounded to float.
// Everything per element is float arithmetic in the order written.
//
// Stateless and thread-safe; callers must not share p/m/v ranges between
// concurrent calls. No alignment requirements.
void AdamWReference(const AdamWHyper& h, int64_t step, float grad_scale,
                    const float* grad, float* p, float* m, float* v, size_t n);

// Same update vectorized at `level` (kScalar runs the reference). `level` must
// be supported by the CPU. Results equal the reference up to fp32 rounding
// (FMA contraction; sqrt(v)/bc2_sqrt computed as sqrt(v) * (1/bc2_sqrt)).
// At every level an element's result depends only on its inputs, not on
// its position in the call: splitting a range into several calls gives the
// same bits (the vector levels run their tails through the vector step).
// Stateless and thread-safe, no alignment requirements.
void AdamWUpdate(SimdLevel level, const AdamWHyper& h, int64_t step,
                 float grad_scale, const float* grad, float* p, float* m,
                 float* v, size_t n);

// AdamWUpdate's per-call constants (the bias corrections: two pow() in
// double), made once for callers that update many small runs with one
// step and scale (common/adam8.h, block by block).
struct AdamWConsts {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float decay;         // 1 - lr * weight_decay.
  float step_size;     // lr / (1 - beta1^t).
  float bc2_sqrt;      // sqrt(1 - beta2^t).
  float inv_bc2_sqrt;  // 1 / bc2_sqrt (vector kernels only).
  float eps;
  float grad_scale;
};
AdamWConsts MakeAdamWConsts(const AdamWHyper& h, int64_t step, float grad_scale);
// AdamWUpdate(level, h, step, grad_scale, ...) with c = MakeAdamWConsts(h,
// step, grad_scale): the same bits.
void AdamWUpdateWith(SimdLevel level, const AdamWConsts& c, const float* grad, float* p,
                     float* m, float* v, size_t n);

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_ADAMW_H_
