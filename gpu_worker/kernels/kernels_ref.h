// Plain single-threaded references for the Backend kernels (backend.h): the
// simplest loops that implement each kernel's documented semantics, on host
// pointers. The parity tests compare every backend against them, so they are
// written independently of the backends (no shared blocking, ordering or
// AdamW code); only the scalar bf16/fp16 conversions of common/codec.h are
// reused. No argument checking: callers pass valid arguments.
//
// All functions are stateless and thread-safe (for disjoint outputs).
#ifndef ZENFLOW_GPU_WORKER_KERNELS_KERNELS_REF_H_
#define ZENFLOW_GPU_WORKER_KERNELS_KERNELS_REF_H_

#include <cstdint>

#include "gpu_worker/backend.h"

namespace zenflow::worker {

// out[j] = sum over i in row order of |g[i][j]| (kL1) or g[i][j]*g[i][j]
// (kL2Squared), accumulated in fp32.
void RefColumnImportance(const float* grad, int64_t rows, int64_t cols, Importance kind,
                         float* out);

// The k best columns in ascending index order: stable sort of all indices by
// score, descending, then the first k, sorted. Score order: usual float order
// (-0 == +0) with every NaN above +Inf and all NaNs equal; ties keep the
// lower index first.
void RefTopK(const float* scores, int64_t cols, int64_t k, int32_t* out);

// dst (column-major [ncols][rows]) = encode(W[:, columns[i]]). For kInt8,
// scales[i] = max|x| / 127 over the column (NaNs ignored), and
// q = clamp(round-half-even(x / scale), -127, 127), or 0 when the scale is 0
// or x / scale is NaN.
void RefPackColumns(const float* w, int64_t rows, int64_t cols, const int32_t* columns,
                    int64_t ncols, PackDType dtype, void* dst, float* scales);

// W[:, columns[i]] = decode(src column i), or += with `add`.
void RefApplyColumns(float* w, int64_t rows, int64_t cols, const int32_t* columns, int64_t ncols,
                     PackDType dtype, const void* src, const float* scales, bool add);

// The AdamW step of Backend::SelectiveAdamW, element by element.
void RefSelectiveAdamW(const AdamWHyper& h, float grad_scale, float* w, int64_t rows, int64_t cols,
                       const int32_t* columns, int64_t ncols, const int64_t* steps,
                       const float* grad, float* m, float* v);

// W (row-major, bf16 or fp16)[:, columns[i]] = round(decode(src column i)).
void RefApplyColumns16(void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                       const int32_t* columns, int64_t ncols, PackDType src_dtype,
                       const void* src);

// RefSelectiveAdamW's step on the compact master, then W[:, columns[i]] =
// round(master column i).
void RefSelectiveAdamW16(const AdamWHyper& h, float grad_scale, void* w, PackDType w_dtype,
                         int64_t rows, int64_t cols, const int32_t* columns, int64_t ncols,
                         const int64_t* steps, const float* grad, float* master, float* m,
                         float* v);

// The local step of Backend::FactoredStep, element by element (W of
// w_dtype kF32, kBF16 or kF16).
void RefFactoredStep(float lr, float eps, void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                     const int32_t* columns, int64_t ncols, const float* grad, const float* row_v,
                     const float* col_v, float v_mean);

// dst[i] = convert(src[i]).
void RefConvert(const void* src, PackDType src_dtype, void* dst, PackDType dst_dtype, int64_t n);

// sum of (double)x[i]^2 in index order.
double RefSquaredNorm(const float* x, int64_t n);

}  // namespace zenflow::worker

#endif  // ZENFLOW_GPU_WORKER_KERNELS_KERNELS_REF_H_
