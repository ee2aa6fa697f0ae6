// The CUDA transformer's device code: block reductions and the kernels of
// its forward and backward passes (see transformer_cuda.cu, the only file
// that includes this one: nvcc compiles it as part of that translation
// unit, so the kernels are launched from where they are defined).
#ifndef ZENFLOW_GPU_WORKER_MODEL_TRANSFORMER_KERNELS_CUH_
#define ZENFLOW_GPU_WORKER_MODEL_TRANSFORMER_KERNELS_CUH_

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace zenflow {
namespace model {
namespace cuda_kernels {

constexpr float kLnEps = 1e-5f;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

constexpr int kRowThreads = 256;  // Block size of the one-block-per-row kernels.
constexpr int kEwThreads = 256;   // Block size of elementwise kernels.

// ---------------------------------------------------------------------------
// Block reductions (blockDim.x a multiple of 32, <= 1024). `shm` holds 32
// values; the result is returned to every thread.

template <typename T>
__device__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T>
__device__ T BlockSum(T v, T* shm) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // Earlier readers of shm are done.
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T r = lane < warps ? shm[lane] : T(0);
    r = WarpSum(r);
    if (lane == 0) shm[0] = r;
  }
  __syncthreads();
  return shm[0];
}

__device__ float BlockMax(float v, float* shm) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float r = lane < warps ? shm[lane] : -INFINITY;
    r = WarpMax(r);
    if (lane == 0) shm[0] = r;
  }
  __syncthreads();
  return shm[0];
}

// ---------------------------------------------------------------------------
// Kernels.

// x[r][j] = tok_emb[token(r)][j] + pos_emb[t(r)][j], r = b * seq + t.
__global__ void EmbeddingForwardKernel(const float* __restrict__ te, const float* __restrict__ pe,
                                       const uint8_t* __restrict__ tokens, int seq, int d,
                                       size_t count, float* __restrict__ x) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t r = i / d;
    const int j = static_cast<int>(i % d);
    const int b = static_cast<int>(r / seq);
    const int t = static_cast<int>(r % seq);
    const int tok = tokens[static_cast<size_t>(b) * (seq + 1) + t];
    x[i] = te[static_cast<size_t>(tok) * d + j] + pe[static_cast<size_t>(t) * d + j];
  }
}

// Tokens: grads of tok_emb (zeroed) += d_res rows, one thread per column,
// rows in order (the CPU order).
__global__ void EmbeddingTokBackwardKernel(const float* __restrict__ dres,
                                           const uint8_t* __restrict__ tokens, int n, int seq,
                                           int d, float* __restrict__ gte) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  for (int r = 0; r < n; ++r) {
    const int b = r / seq;
    const int t = r % seq;
    const int tok = tokens[static_cast<size_t>(b) * (seq + 1) + t];
    gte[static_cast<size_t>(tok) * d + j] += dres[static_cast<size_t>(r) * d + j];
  }
}

// Positions: gpe[t][j] = sum over b (in order) of d_res[b * seq + t][j].
__global__ void EmbeddingPosBackwardKernel(const float* __restrict__ dres, int batch, int seq,
                                           int d, float* __restrict__ gpe) {
  const size_t count = static_cast<size_t>(seq) * d;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t t = i / d;
    const size_t j = i % d;
    float acc = 0.0f;
    for (int b = 0; b < batch; ++b) acc += dres[(static_cast<size_t>(b) * seq + t) * d + j];
    gpe[i] = acc;
  }
}

// One block per row: y = (x - mean) * rstd * g + b.
__global__ void LayerNormForwardKernel(const float* __restrict__ x, const float* __restrict__ g,
                                       const float* __restrict__ bias, int d,
                                       float* __restrict__ y, float* __restrict__ mean,
                                       float* __restrict__ rstd) {
  __shared__ float shm[32];
  const size_t r = blockIdx.x;
  const float* xr = x + r * d;
  float s = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) s += xr[j];
  const float mu = BlockSum(s, shm) / d;
  float v = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float c = xr[j] - mu;
    v += c * c;
  }
  const float var = BlockSum(v, shm) / d;
  const float rs = 1.0f / sqrtf(var + kLnEps);
  float* yr = y + r * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) yr[j] = (xr[j] - mu) * rs * g[j] + bias[j];
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// One block per row: dx (+)= rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)).
__global__ void LayerNormBackwardDxKernel(const float* __restrict__ x,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd,
                                          const float* __restrict__ g,
                                          const float* __restrict__ dy, int d, int accumulate,
                                          float* __restrict__ dx) {
  __shared__ float shm[32];
  const size_t r = blockIdx.x;
  const float* xr = x + r * d;
  const float* dyr = dy + r * d;
  const float mu = mean[r];
  const float rs = rstd[r];
  float s1 = 0.0f, s2 = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float dxh = dyr[j] * g[j];
    s1 += dxh;
    s2 += dxh * ((xr[j] - mu) * rs);
  }
  const float m1 = BlockSum(s1, shm) / d;
  const float m2 = BlockSum(s2, shm) / d;
  float* dxr = dx + r * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float xh = (xr[j] - mu) * rs;
    const float v = rs * (dyr[j] * g[j] - m1 - xh * m2);
    dxr[j] = accumulate ? dxr[j] + v : v;
  }
}

// One thread per column: dg = sum dy * xhat, db = sum dy (overwritten).
__global__ void LayerNormBackwardParamsKernel(const float* __restrict__ x,
                                              const float* __restrict__ mean,
                                              const float* __restrict__ rstd,
                                              const float* __restrict__ dy, int n, int d,
                                              float* __restrict__ dg, float* __restrict__ db) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float ag = 0.0f, ab = 0.0f;
  for (int r = 0; r < n; ++r) {
    const size_t i = static_cast<size_t>(r) * d + j;
    ag += dy[i] * ((x[i] - mean[r]) * rstd[r]);
    ab += dy[i];
  }
  dg[j] = ag;
  db[j] = ab;
}

// out[i] = out[i] + bias[col] (+ residual[i]); bias may be null.
__global__ void AddBiasResidualKernel(float* __restrict__ out, const float* __restrict__ bias,
                                      const float* __restrict__ residual, int cols,
                                      size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    float v = out[i];
    if (bias != nullptr) v += bias[i % cols];
    if (residual != nullptr) v += residual[i];
    out[i] = v;
  }
}

// sums[j] = sum over rows (in order) of m[r][j]; one thread per column.
__global__ void ColumnSumsKernel(const float* __restrict__ m, int rows, int cols,
                                 float* __restrict__ sums) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) acc += m[static_cast<size_t>(r) * cols + j];
  sums[j] = acc;
}

__global__ void GeluForwardKernel(const float* __restrict__ pre, size_t count,
                                  float* __restrict__ th, float* __restrict__ act) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = pre[i];
    const float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
    th[i] = t;
    act[i] = 0.5f * x * (1.0f + t);
  }
}

__global__ void GeluBackwardKernel(const float* __restrict__ pre, const float* __restrict__ th,
                                   size_t count, float* __restrict__ dh) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = pre[i];
    const float t = th[i];
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
    dh[i] *= 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
  }
}

// dst[(b*heads + h)][t][c] = src[(b*seq + t) * ld + off + h*hd + c].
__global__ void SplitHeadsKernel(const float* __restrict__ src, int ld, int off, int seq,
                                 int heads, int hd, size_t count, float* __restrict__ dst) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t per_bh = static_cast<size_t>(seq) * hd;
    const size_t bh = i / per_bh;
    const size_t rem = i % per_bh;
    const size_t t = rem / hd;
    const size_t c = rem % hd;
    const size_t b = bh / heads;
    const size_t h = bh % heads;
    dst[i] = src[(b * seq + t) * ld + off + h * hd + c];
  }
}

// The inverse of SplitHeadsKernel.
__global__ void MergeHeadsKernel(const float* __restrict__ src, int ld, int off, int seq,
                                 int heads, int hd, size_t count, float* __restrict__ dst) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t per_bh = static_cast<size_t>(seq) * hd;
    const size_t bh = i / per_bh;
    const size_t rem = i % per_bh;
    const size_t t = rem / hd;
    const size_t c = rem % hd;
    const size_t b = bh / heads;
    const size_t h = bh % heads;
    dst[(b * seq + t) * ld + off + h * hd + c] = src[i];
  }
}

// One block per score row (bh, t) of [bh][seq][seq]: causal softmax in place
// over u <= t; entries u > t become 0.
__global__ void CausalSoftmaxKernel(float* __restrict__ p, int seq) {
  __shared__ float shm[32];
  const size_t row = blockIdx.x;
  const int t = static_cast<int>(row % seq);
  const int cnt = t + 1;
  float* pr = p + row * seq;
  float mx = -INFINITY;
  for (int u = threadIdx.x; u < cnt; u += blockDim.x) mx = fmaxf(mx, pr[u]);
  mx = BlockMax(mx, shm);
  float s = 0.0f;
  for (int u = threadIdx.x; u < cnt; u += blockDim.x) {
    const float e = expf(pr[u] - mx);
    pr[u] = e;
    s += e;
  }
  const float inv = 1.0f / BlockSum(s, shm);
  for (int u = threadIdx.x; u < seq; u += blockDim.x) pr[u] = u < cnt ? pr[u] * inv : 0.0f;
}

// One block per row: dp <- p * (dp - sum_u p*dp) * scale over u <= t, else 0.
__global__ void CausalSoftmaxBackwardKernel(const float* __restrict__ p, float* __restrict__ dp,
                                            int seq, float scale) {
  __shared__ float shm[32];
  const size_t row = blockIdx.x;
  const int cnt = static_cast<int>(row % seq) + 1;
  const float* pr = p + row * seq;
  float* dr = dp + row * seq;
  float s = 0.0f;
  for (int u = threadIdx.x; u < cnt; u += blockDim.x) s += pr[u] * dr[u];
  const float pdp = BlockSum(s, shm);
  for (int u = threadIdx.x; u < seq; u += blockDim.x) {
    dr[u] = u < cnt ? pr[u] * (dr[u] - pdp) * scale : 0.0f;
  }
}

// One block per row: logits -> softmax probabilities in place, and
// row_loss = max + log(sum exp) - logit[target] (double, as the CPU model).
__global__ void CrossEntropyKernel(float* __restrict__ logits, const uint8_t* __restrict__ tokens,
                                   int seq, int vocab, double* __restrict__ row_loss) {
  __shared__ float fshm[32];
  __shared__ double dshm[32];
  const size_t r = blockIdx.x;
  const int b = static_cast<int>(r / seq);
  const int t = static_cast<int>(r % seq);
  const int target = tokens[static_cast<size_t>(b) * (seq + 1) + t + 1];
  float* p = logits + r * vocab;
  const double target_logit = p[target];
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, p[j]);
  mx = BlockMax(mx, fshm);  // Its barriers order the reads above before the writes below.
  double s = 0.0;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    s += e;
  }
  const double sum = BlockSum(s, dshm);
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) p[j] *= inv;
  if (threadIdx.x == 0) row_loss[r] = static_cast<double>(mx) + log(sum) - target_logit;
}

// One block: *out = mean of row_loss[0, n).
__global__ void MeanLossKernel(const double* __restrict__ row_loss, int n,
                               double* __restrict__ out) {
  __shared__ double shm[32];
  double s = 0.0;
  for (int r = threadIdx.x; r < n; r += blockDim.x) s += row_loss[r];
  s = BlockSum(s, shm);
  if (threadIdx.x == 0) *out = s / n;
}

// d loss / d logits = (probs - onehot(target)) / n.
__global__ void DLogitsKernel(const float* __restrict__ probs, const uint8_t* __restrict__ tokens,
                              int seq, int vocab, float inv_n, size_t count,
                              float* __restrict__ dl) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t r = i / vocab;
    const int j = static_cast<int>(i % vocab);
    const size_t b = r / seq;
    const size_t t = r % seq;
    const int target = tokens[b * (seq + 1) + t + 1];
    float g = probs[i] * inv_n;
    if (j == target) g -= inv_n;
    dl[i] = g;
  }
}

}  // namespace cuda_kernels
}  // namespace model
}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_MODEL_TRANSFORMER_KERNELS_CUH_
