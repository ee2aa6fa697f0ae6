// Pieces shared by the CPU and CUDA backends (not by the references in
// kernels_ref.h, which are written independently): argument validation with
// actionable messages, the blocking constants that fix the summation order of
// ColumnImportance, and small host/device helpers (the TopK ordering key and
// the int8 quantizer) that both backends must compute identically.
//
// Everything here is stateless and thread-safe. This header is also compiled
// by nvcc, so it keeps to C++17 that nvcc accepts and marks the arithmetic
// helpers __host__ __device__ there.
#ifndef ZENFLOW_GPU_WORKER_KERNELS_BACKEND_COMMON_H_
#define ZENFLOW_GPU_WORKER_KERNELS_BACKEND_COMMON_H_

#include <math.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/float16.h"  // ZF_HOST_DEVICE, and the bf16 / fp16 conversions.
#include "gpu_worker/backend.h"

namespace zenflow::worker::internal {

// ColumnImportance sums each column over blocks of this many rows (in row
// order, fp32), then adds the block partials in block order (fp32). Both
// backends use exactly this order, so their results are bit-identical to
// each other and independent of the thread count / launch shape.
inline constexpr int64_t kImportanceRowBlock = 256;

// SquaredNorm (CPU) accumulates chunks of this many values, each in its own
// double, then adds the chunk sums in order: deterministic for any thread
// count.
inline constexpr int64_t kNormChunk = int64_t{1} << 16;

// Largest column count: column indices are int32_t.
inline constexpr int64_t kMaxCols = int64_t{1} << 31;

// "f32", "bf16", "f16", "int8" (or "invalid").
const char* PackDTypeName(PackDType d);

// ---- Argument checks. Each returns INVALID_ARGUMENT naming the kernel, the
// offending argument, its value and the allowed range. Null pointers are
// accepted only where nothing would be read or written. ----

absl::Status CheckImportanceArgs(const float* grad, int64_t rows, int64_t cols, Importance kind,
                                 const float* out);
absl::Status CheckTopKArgs(const float* scores, int64_t cols, int64_t k, const int32_t* out);
// op is "PackColumns" or "ApplyColumns"; data is dst or src.
absl::Status CheckColumnsArgs(const char* op, const float* w, int64_t rows, int64_t cols,
                              const int32_t* columns, int64_t ncols, PackDType dtype,
                              const void* data, const float* scales);
// op names the kernel in messages (SelectiveAdamW16 checks its own
// arguments with this too, its master in the place of w).
absl::Status CheckAdamWArgs(const AdamWHyper& h, float grad_scale, const float* w, int64_t rows,
                            int64_t cols, const int32_t* columns, int64_t ncols,
                            const int64_t* steps, const float* grad, const float* m,
                            const float* v, const char* op = "SelectiveAdamW");
absl::Status CheckSquaredNormArgs(const float* x, int64_t n, const double* host_out);
// The 16-bit parameter kernels: w_dtype must be kBF16 or kF16.
absl::Status CheckParam16DType(const char* op, PackDType w_dtype);
absl::Status CheckApplyColumns16Args(const void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                                     const int32_t* columns, int64_t ncols, PackDType src_dtype,
                                     const void* src);
absl::Status CheckAdamW16Args(const AdamWHyper& h, float grad_scale, const void* w,
                              PackDType w_dtype, int64_t rows, int64_t cols,
                              const int32_t* columns, int64_t ncols, const int64_t* steps,
                              const float* grad, const float* master, const float* m,
                              const float* v);
// FactoredStep: w_dtype kF32, kBF16 or kF16; lr and eps finite and >= 0.
absl::Status CheckFactoredStepArgs(float lr, float eps, const void* w, PackDType w_dtype,
                                   int64_t rows, int64_t cols, const int32_t* columns,
                                   int64_t ncols, const float* grad, const float* row_v,
                                   const float* col_v);
absl::Status CheckConvertArgs(const void* src, PackDType src_dtype, const void* dst,
                              PackDType dst_dtype, int64_t n);

// Host-memory content checks (the CPU backend runs them before touching any
// data; the CUDA backend checks the same conditions in its kernels and
// reports them at Synchronize()). Every columns[i] must lie in [0, cols);
// with `distinct`, no index may repeat (ApplyColumns and SelectiveAdamW write
// through the indices).
absl::Status CheckColumnIndices(const char* op, const int32_t* columns, int64_t ncols, int64_t cols,
                                bool distinct);
// Every steps[i] >= 1.
absl::Status CheckSteps(const int64_t* steps, int64_t ncols, const char* op = "SelectiveAdamW");

// The CPU backend with its hand-written SIMD kernels (AVX-512 PackColumns,
// SIMD AdamW) enabled or, with simd = false, only the portable code paths
// (which still use the runtime-dispatched codec), so tests can cover both.
std::unique_ptr<Backend> MakeCpuBackendForTest(int threads, bool simd);

// ---- Arithmetic shared bit-for-bit by the backends. ----

// Ordering key for TopK from a score's bit pattern and its index: a larger
// key means "more important". Scores order as floats with -0 == +0, and every
// NaN ranks above +Inf (all NaNs equal); equal scores rank the lower index
// higher. Keys of distinct indices are distinct.
ZF_HOST_DEVICE inline uint64_t TopKKey(uint32_t score_bits, uint32_t index) {
  uint32_t b = score_bits;
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) b = 0x7FC00000u;  // Any NaN.
  if (b == 0x80000000u) b = 0;                           // -0 -> +0.
  // Monotone map of IEEE order onto unsigned order.
  const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(ordered) << 32) | (0xFFFFFFFFu - index);
}

// Column index encoded in a TopKKey.
ZF_HOST_DEVICE inline uint32_t TopKKeyIndex(uint64_t key) {
  return 0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFu);
}

// One step of the int8 column maximum: max |x| with NaNs ignored.
ZF_HOST_DEVICE inline float MaxAbsStep(float running, float x) {
  const float a = fabsf(x);
  return a > running ? a : running;
}

// Column scale from its max |x|.
ZF_HOST_DEVICE inline float Int8Scale(float max_abs) { return max_abs / 127.0f; }

// q = round-half-even(x / scale) clamped to [-127, 127]; 0 when scale is not
// positive (all-zero column) or x / scale is NaN.
ZF_HOST_DEVICE inline int8_t QuantizeInt8(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  float y = x / scale;
  if (!(y == y)) return 0;
  y = y > 127.0f ? 127.0f : (y < -127.0f ? -127.0f : y);
  return static_cast<int8_t>(rintf(y));
}

ZF_HOST_DEVICE inline float DequantizeInt8(int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

// FactoredStep's element (backend.h), the same expression on every backend:
// the updated value of w, or w itself when vh is not > 0.
ZF_HOST_DEVICE inline float FactoredStepElement(float w, float g, float rv, float cv, float v_mean,
                                                float lr, float eps) {
  const float vh = (rv * cv) / v_mean;
  if (!(vh > 0.0f)) return w;
  const float step = (lr * g) / (sqrtf(vh) + eps);
  return w - step;
}

}  // namespace zenflow::worker::internal

#endif  // ZENFLOW_GPU_WORKER_KERNELS_BACKEND_COMMON_H_
