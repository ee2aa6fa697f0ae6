// The worker's device backend: memory and the ZenFlow kernels (docs/design.md rules
// 2-6), with a multithreaded CPU implementation and a CUDA implementation.
// Every kernel also has a plain single-threaded reference in kernels_ref.h;
// the parity tests compare each backend against it.
//
//   std::unique_ptr<Backend> be = MakeCpuBackend(/*threads=*/2);
//   DeviceBuffer g, scores;  // gpu_worker/device_buffer.h
//   ZF_RETURN_IF_ERROR(g.Reserve(be.get(), bytes));
//   ZF_RETURN_IF_ERROR(scores.Reserve(be.get(), cols * sizeof(float)));
//   ZF_RETURN_IF_ERROR(be->ColumnImportance(g.f32(), rows, cols, Importance::kL1, scores.f32()));
//
// Layout: a tensor W is row-major [rows][cols] (rows = out, cols = in); a
// "column" j is W[:, j]. Packed column data is column-major: rows values of
// columns[0], then of columns[1], ... All pointers a kernel takes are backend
// memory (host memory for the CPU backend, device memory for CUDA) unless
// the name says host_. Kernels are asynchronous on CUDA (one stream per
// backend); Synchronize() waits. Errors are reported on the call when they
// can be detected (bad arguments) and at the latest by Synchronize().
#ifndef ZENFLOW_GPU_WORKER_BACKEND_H_
#define ZENFLOW_GPU_WORKER_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/adamw.h"

namespace zenflow::worker {

enum class Importance { kL1, kL2Squared };

// Encodings of packed columns. kInt8 stores one fp32 scale per column
// (max |x| / 127, 0 for an all-zero column) and q = round-half-even(x / scale)
// clamped to [-127, 127].
enum class PackDType { kF32, kBF16, kF16, kInt8 };
size_t PackDTypeSize(PackDType d);  // bytes per value: 4, 2, 2, 1


// Thread-compatible: one thread drives a backend at a time.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu" or "cuda"

  // ---- Memory ----
  virtual absl::StatusOr<void*> Alloc(size_t bytes) = 0;  // zero-filled
  virtual void Free(void* p) = 0;
  // Host memory for staging (pinned on CUDA).
  virtual absl::StatusOr<void*> AllocHost(size_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;
  virtual absl::Status CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Synchronize() = 0;

  // ---- Ordering with a caller's stream (a framework's, e.g. torch's) ----
  // `stream` is a cudaStream_t of this backend's device as an integer (0:
  // the legacy default stream, 1: cudaStreamLegacy, 2: cudaStreamPerThread,
  // as __cuda_array_interface__ numbers them). WaitForStream: the backend's
  // next work starts after the work queued on `stream` so far. SignalStream:
  // work queued on `stream` from now on starts after the backend's work so
  // far. Both are asynchronous (an event recorded on one stream, waited for
  // on the other); neither waits on the host nor synchronizes the device.
  // The CPU backend has no streams: stream 0 is OK (nothing to order),
  // anything else INVALID_ARGUMENT.
  virtual absl::Status WaitForStream(uintptr_t stream);
  virtual absl::Status SignalStream(uintptr_t stream);

  // ---- Kernels ----
  // out[j] = sum_i |g[i][j]| (kL1) or sum_i g[i][j]^2 (kL2Squared), j < cols.
  virtual absl::Status ColumnImportance(const float* grad, int64_t rows, int64_t cols,
                                        Importance kind, float* out) = 0;

  // The k columns with the largest scores, ties to the lower index, written
  // to out[0..k) in ascending index order. Exact. k in [0, cols].
  virtual absl::Status TopK(const float* scores, int64_t cols, int64_t k, int32_t* out) = 0;

  // Gathers columns (ascending or not; indices in [0, cols)) of a row-major
  // W[rows][cols] into dst, column-major, encoded as `dtype`. For kInt8,
  // scales[i] receives column i's scale (scales may be null otherwise).
  virtual absl::Status PackColumns(const float* w, int64_t rows, int64_t cols,
                                   const int32_t* columns, int64_t ncols, PackDType dtype,
                                   void* dst, float* scales) = 0;

  // The inverse: for each i, W[:, columns[i]] = decode(src column i), or
  // += when `add` (arithmetic deltas). src is column-major as PackColumns
  // writes it; scales as above for kInt8.
  virtual absl::Status ApplyColumns(float* w, int64_t rows, int64_t cols, const int32_t* columns,
                                    int64_t ncols, PackDType dtype, const void* src,
                                    const float* scales, bool add) = 0;

  // AdamW on selected columns of a row-major parameter W[rows][cols]:
  // grad, m and v are compact column-major [ncols][rows] fp32 (m, v held for
  // the selected columns only); steps[i] is column i's update count
  // including this update (>= 1). Per element, with g = grad * grad_scale:
  //   m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; p = p*(1 - lr*wd);
  //   p = p - (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps),
  // bc1 = 1-b1^t, bc2 = 1-b2^t, and lr/bc1, sqrt(bc2), 1-lr*wd computed in
  // double then rounded to float (the same formula as the daemon's AdamW).
  virtual absl::Status SelectiveAdamW(const AdamWHyper& h, float grad_scale, float* w,
                                      int64_t rows, int64_t cols, const int32_t* columns,
                                      int64_t ncols, const int64_t* steps, const float* grad,
                                      float* m, float* v) = 0;

  // sum x[i]^2 over n values, accumulated in double; the result lands in
  // *host_out after Synchronize() (CPU: immediately).
  virtual absl::Status SquaredNorm(const float* x, int64_t n, double* host_out) = 0;

  // ---- 16-bit parameters (bf16 / fp16 models with an fp32 master) ----
  // Below, W is a row-major [rows][cols] tensor of `w_dtype`, which is
  // kBF16 or kF16; "round" is fp32 -> w_dtype, to nearest even (the codec's
  // FloatToBf16 / FloatToF16).

  // For each i, W[:, columns[i]] = round(decode(src column i)), src
  // column-major as PackColumns writes it, of `src_dtype` kF32 or w_dtype
  // (then the values are copied exactly). Columns distinct.
  virtual absl::Status ApplyColumns16(void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                                      const int32_t* columns, int64_t ncols, PackDType src_dtype,
                                      const void* src) = 0;

  // SelectiveAdamW on an fp32 master of the selected columns: `master` is
  // compact column-major [ncols][rows] like grad, m and v, and takes the
  // place of W in the update (the same per-element formula, bit for bit);
  // then W[:, columns[i]] = round(master column i). W is only written.
  virtual absl::Status SelectiveAdamW16(const AdamWHyper& h, float grad_scale, void* w,
                                        PackDType w_dtype, int64_t rows, int64_t cols,
                                        const int32_t* columns, int64_t ncols,
                                        const int64_t* steps, const float* grad, float* master,
                                        float* m, float* v) = 0;

  // The local step (docs/design.md rule 13) on selected columns of a
  // row-major W[rows][cols] of `w_dtype` (kF32, kBF16 or kF16) from a
  // factored second moment: grad is compact column-major [ncols][rows] fp32,
  // row_v has `rows` values and col_v one per selected column. Per element,
  // with vh = (row_v[r] * col_v[c]) / v_mean:
  //   W[r, columns[c]] = W - (lr * g) / (sqrt(vh) + eps)   if vh > 0,
  // in fp32 operations in that order (no contraction, correctly rounded
  // sqrt and division: every backend gives the same bits). An element whose
  // vh is not > 0 (zero, or NaN when v_mean is 0) keeps its value: a row or
  // column the daemon never saw a gradient in has no scale to step by. A
  // 16-bit W is read as fp32 and the result rounded to nearest even.
  // Columns distinct. No weight decay, no moments.
  virtual absl::Status FactoredStep(float lr, float eps, void* w, PackDType w_dtype, int64_t rows,
                                    int64_t cols, const int32_t* columns, int64_t ncols,
                                    const float* grad, const float* row_v, const float* col_v,
                                    float v_mean) = 0;

  // dst[i] = convert(src[i]) for i < n, between kF32, kBF16 and kF16:
  // to 16 bits rounds to nearest even, to fp32 is exact, equal dtypes copy.
  // src and dst must not overlap. (A model that computes in fp32 reads its
  // 16-bit parameters through this.)
  virtual absl::Status Convert(const void* src, PackDType src_dtype, void* dst,
                               PackDType dst_dtype, int64_t n) = 0;
};

// threads >= 1 participants (the caller included).
std::unique_ptr<Backend> MakeCpuBackend(int threads);

// UNAVAILABLE when the build has no CUDA or the machine has no device.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device = 0);

// True when this binary was built with nvcc (whether or not a device exists).
bool CudaCompiled();
// Number of CUDA devices visible (0 without CUDA or without a device).
int CudaDeviceCount();
// The ordinal of the CUDA device that holds `p` (device or managed memory):
// UNAVAILABLE without CUDA or without a device, INVALID_ARGUMENT when `p`
// is not device memory (host memory handed over as device memory).
absl::StatusOr<int> CudaPointerDevice(const void* p);

}  // namespace zenflow::worker

#endif  // ZENFLOW_GPU_WORKER_BACKEND_H_
