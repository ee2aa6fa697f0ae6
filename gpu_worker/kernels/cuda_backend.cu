// The CUDA Backend: device memory, one stream per backend, and a kernel for
// each ZenFlow operation (see backend.h). Compiled by nvcc (sm_90 + PTX) when
// the toolkit is present; cuda_stub.cc stands in otherwise.
//
// Everything is enqueued on the backend's stream and returns without waiting;
// Synchronize() waits and reports asynchronous failures: CUDA errors and the
// argument errors only the kernels can see (column indices out of range or
// repeated, step counts < 1), which the kernels record in a device flag word.
//
// Numerics match the CPU backend bit for bit where the math allows: the
// bf16 / fp16 encodings are the codec's own scalar conversions
// (common/float16.h), int8 uses the shared quantizer, ColumnImportance uses
// the same fixed row blocks and fp32 summation order, and the file is
// compiled with -fmad=false so no multiply-add is contracted behind the
// formulas' backs.
// TopK is an exact radix select on 64-bit (score, index) keys followed by an
// order-preserving compaction (no CUB: everything here is self-contained).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/float16.h"
#include "common/status_macros.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/cuda_util.h"
#include "gpu_worker/kernels/backend_common.h"
#include "gpu_worker/kernels/cuda_kernels.cuh"

namespace zenflow::worker {
namespace {

using internal::kImportanceRowBlock;
using cuda_kernels::AdamConsts;
using cuda_kernels::AdamW16Kernel;
using cuda_kernels::AdamWKernel;
using cuda_kernels::Apply16Kernel;
using cuda_kernels::ApplyKernel;
using cuda_kernels::ColumnCheckKernel;
using cuda_kernels::CompactCountKernel;
using cuda_kernels::CompactScatterKernel;
using cuda_kernels::ConvertKernel;
using cuda_kernels::ExclusiveScanKernel;
using cuda_kernels::FillZeroKernel;
using cuda_kernels::GridFor;
using cuda_kernels::ImportancePartialKernel;
using cuda_kernels::ImportanceReduceKernel;
using cuda_kernels::Int8ScaleKernel;
using cuda_kernels::NormFinalKernel;
using cuda_kernels::NormPartialKernel;
using cuda_kernels::FactoredStepKernel;
using cuda_kernels::PackKernel;
using cuda_kernels::SelectDigitKernel;
using cuda_kernels::SelectHistogramKernel;
using cuda_kernels::SelectInitKernel;
using cuda_kernels::SelectState;
using cuda_kernels::TopKKeysKernel;
using cuda_kernels::kCompactTile;
using cuda_kernels::kErrAdam16Duplicate;
using cuda_kernels::kErrAdam16Index;
using cuda_kernels::kErrAdam16Step;
using cuda_kernels::kErrAdamDuplicate;
using cuda_kernels::kErrAdamIndex;
using cuda_kernels::kErrAdamStep;
using cuda_kernels::kErrApply16Duplicate;
using cuda_kernels::kErrApply16Index;
using cuda_kernels::kErrApplyDuplicate;
using cuda_kernels::kErrApplyIndex;
using cuda_kernels::kErrFactoredDuplicate;
using cuda_kernels::kErrFactoredIndex;
using cuda_kernels::kErrPackIndex;
using cuda_kernels::kMaxGridY;
using cuda_kernels::kNormMaxBlocks;
using cuda_kernels::kThreads;
using cuda_kernels::kTile;
using cuda_kernels::kTileY;

// ---------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------

// Names this component in CUDA error messages (see cuda_util.h).
constexpr char kWho[] = "CUDA backend";

std::string DescribeErrors(unsigned int bits) {
  std::string out;
  auto add = [&](unsigned int bit, const char* text) {
    if (bits & bit) absl::StrAppend(&out, out.empty() ? "" : "; ", text);
  };
  add(kErrPackIndex, "PackColumns: a column index was outside [0, cols)");
  add(kErrApplyIndex, "ApplyColumns: a column index was outside [0, cols)");
  add(kErrApplyDuplicate, "ApplyColumns: a column index appeared more than once");
  add(kErrAdamIndex, "SelectiveAdamW: a column index was outside [0, cols)");
  add(kErrAdamDuplicate, "SelectiveAdamW: a column index appeared more than once");
  add(kErrAdamStep, "SelectiveAdamW: a step count was < 1 (steps include this update)");
  add(kErrApply16Index, "ApplyColumns16: a column index was outside [0, cols)");
  add(kErrApply16Duplicate, "ApplyColumns16: a column index appeared more than once");
  add(kErrAdam16Index, "SelectiveAdamW16: a column index was outside [0, cols)");
  add(kErrAdam16Duplicate, "SelectiveAdamW16: a column index appeared more than once");
  add(kErrAdam16Step, "SelectiveAdamW16: a step count was < 1 (steps include this update)");
  add(kErrFactoredIndex, "FactoredStep: a column index was outside [0, cols)");
  add(kErrFactoredDuplicate, "FactoredStep: a column index appeared more than once");
  return out;
}

// ---------------------------------------------------------------------------
// The backend.
// ---------------------------------------------------------------------------

int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Thread-compatible (see Backend). Owns its stream, a grow-only device
// scratch buffer, a device error word and pinned staging for the host-side
// results (SquaredNorm, the error word).
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  ~CudaBackend() override;

  absl::Status Init();

  std::string name() const override { return "cuda"; }

  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* p) override;
  absl::StatusOr<void*> AllocHost(size_t bytes) override;
  void FreeHost(void* p) override;
  absl::Status CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    return Copy(dst, host_src, bytes, cudaMemcpyHostToDevice, "CopyToDevice");
  }
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    return Copy(host_dst, src, bytes, cudaMemcpyDeviceToHost, "CopyToHost");
  }
  absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToDevice, "CopyDeviceToDevice");
  }
  absl::Status Synchronize() override;
  absl::Status WaitForStream(uintptr_t stream) override;
  absl::Status SignalStream(uintptr_t stream) override;

  absl::Status ColumnImportance(const float* grad, int64_t rows, int64_t cols, Importance kind,
                                float* out) override;
  absl::Status TopK(const float* scores, int64_t cols, int64_t k, int32_t* out) override;
  absl::Status PackColumns(const float* w, int64_t rows, int64_t cols, const int32_t* columns,
                           int64_t ncols, PackDType dtype, void* dst, float* scales) override;
  absl::Status ApplyColumns(float* w, int64_t rows, int64_t cols, const int32_t* columns,
                            int64_t ncols, PackDType dtype, const void* src, const float* scales,
                            bool add) override;
  absl::Status SelectiveAdamW(const AdamWHyper& h, float grad_scale, float* w, int64_t rows,
                              int64_t cols, const int32_t* columns, int64_t ncols,
                              const int64_t* steps, const float* grad, float* m, float* v) override;
  absl::Status SquaredNorm(const float* x, int64_t n, double* host_out) override;
  absl::Status ApplyColumns16(void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                              const int32_t* columns, int64_t ncols, PackDType src_dtype,
                              const void* src) override;
  absl::Status SelectiveAdamW16(const AdamWHyper& h, float grad_scale, void* w, PackDType w_dtype,
                                int64_t rows, int64_t cols, const int32_t* columns, int64_t ncols,
                                const int64_t* steps, const float* grad, float* master, float* m,
                                float* v) override;
  absl::Status Convert(const void* src, PackDType src_dtype, void* dst, PackDType dst_dtype,
                       int64_t n) override;
  absl::Status FactoredStep(float lr, float eps, void* w, PackDType w_dtype, int64_t rows,
                            int64_t cols, const int32_t* columns, int64_t ncols, const float* grad,
                            const float* row_v, const float* col_v, float v_mean) override;

 private:
  // Makes device_ current on the calling thread.
  absl::Status Activate() { return CudaStatus(kWho, cudaSetDevice(device_), "cudaSetDevice"); }
  absl::Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* op);
  // Device scratch of at least `bytes` (contents undefined), valid until the
  // next call; only work on stream_ may use it.
  absl::StatusOr<char*> Scratch(size_t bytes);
  // Clears and checks `columns` of a writing kernel.
  absl::Status LaunchColumnCheck(const int32_t* columns, int64_t ncols, int64_t cols,
                                 unsigned int range_bit, unsigned int duplicate_bit);

  const int device_;
  CudaStream stream_;
  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  unsigned int* errors_ = nullptr;       // Device error word.
  unsigned int* host_errors_ = nullptr;  // Pinned copy, read at Synchronize().
  // SquaredNorm results: pinned slots and where they go at Synchronize().
  static constexpr int kNormSlots = 256;
  double* norm_slots_ = nullptr;
  std::vector<double*> pending_norms_;
  // WaitForStream / SignalStream: one event each, reused (a wait takes the
  // event's state when it is enqueued, so recording it again is safe).
  cudaEvent_t from_caller_ = nullptr;
  cudaEvent_t to_caller_ = nullptr;
};

CudaBackend::~CudaBackend() {
  if (Activate().ok()) {
    if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
    cudaFree(scratch_);
    cudaFree(errors_);
    cudaFreeHost(host_errors_);
    cudaFreeHost(norm_slots_);
    if (from_caller_ != nullptr) cudaEventDestroy(from_caller_);
    if (to_caller_ != nullptr) cudaEventDestroy(to_caller_);
    stream_.Reset();
  }
}

absl::Status CudaBackend::Init() {
  ZF_RETURN_IF_ERROR(Activate());
  ZF_RETURN_IF_ERROR(stream_.Create(kWho, cudaStreamNonBlocking));
  ZF_RETURN_IF_ERROR(
      CudaStatus(kWho, cudaMalloc(&errors_, sizeof(unsigned int)), "cudaMalloc (error word)"));
  ZF_RETURN_IF_ERROR(CudaStatus(kWho,
                                cudaMemsetAsync(errors_, 0, sizeof(unsigned int), stream_.get()),
                                "cudaMemsetAsync (error word)"));
  ZF_RETURN_IF_ERROR(CudaStatus(
      kWho, cudaMallocHost(reinterpret_cast<void**>(&host_errors_), sizeof(unsigned int)),
      "cudaMallocHost (error word)"));
  ZF_RETURN_IF_ERROR(CudaStatus(
      kWho, cudaMallocHost(reinterpret_cast<void**>(&norm_slots_), kNormSlots * sizeof(double)),
      "cudaMallocHost (norm slots)"));
  return CudaStatus(kWho, cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
}

absl::StatusOr<void*> CudaBackend::Alloc(size_t bytes) {
  ZF_RETURN_IF_ERROR(Activate());
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // Allocation failures are not sticky.
    return CudaStatus(kWho, err, absl::StrCat("cudaMalloc of ", bytes, " bytes"));
  }
  const absl::Status s =
      CudaStatus(kWho, cudaMemsetAsync(p, 0, bytes, stream_.get()), "cudaMemsetAsync");
  if (!s.ok()) {
    cudaFree(p);
    return s;
  }
  return p;
}

void CudaBackend::Free(void* p) {
  if (p == nullptr || !Activate().ok()) return;
  cudaFree(p);  // Waits for work that may still use p.
}

absl::StatusOr<void*> CudaBackend::AllocHost(size_t bytes) {
  ZF_RETURN_IF_ERROR(Activate());
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(kWho, err, absl::StrCat("cudaMallocHost of ", bytes, " bytes"));
  }
  std::memset(p, 0, bytes);
  return p;
}

void CudaBackend::FreeHost(void* p) {
  if (p == nullptr || !Activate().ok()) return;
  cudaFreeHost(p);
}

absl::Status CudaBackend::Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                               const char* op) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": null ", dst == nullptr ? "destination" : "source", " for ", bytes, " bytes"));
  }
  ZF_RETURN_IF_ERROR(Activate());
  return CudaStatus(kWho, cudaMemcpyAsync(dst, src, bytes, kind, stream_.get()), op);
}

absl::Status CudaBackend::Synchronize() {
  ZF_RETURN_IF_ERROR(Activate());
  ZF_RETURN_IF_ERROR(CudaStatus(kWho,
                                cudaMemcpyAsync(host_errors_, errors_, sizeof(unsigned int),
                                                cudaMemcpyDeviceToHost, stream_.get()),
                                "cudaMemcpyAsync (error word)"));
  ZF_RETURN_IF_ERROR(
      CudaStatus(kWho, cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize"));
  for (size_t i = 0; i < pending_norms_.size(); ++i) *pending_norms_[i] = norm_slots_[i];
  pending_norms_.clear();
  const unsigned int bits = *host_errors_;
  if (bits != 0) {
    *host_errors_ = 0;
    ZF_RETURN_IF_ERROR(CudaStatus(kWho,
                                  cudaMemsetAsync(errors_, 0, sizeof(unsigned int), stream_.get()),
                                  "cudaMemsetAsync (error word)"));
    return absl::InvalidArgumentError(absl::StrCat(
        DescribeErrors(bits), " (detected on the device; the affected elements were skipped)"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::WaitForStream(uintptr_t stream) {
  ZF_RETURN_IF_ERROR(Activate());
  if (from_caller_ == nullptr) {
    ZF_RETURN_IF_ERROR(CudaStatus(kWho, cudaEventCreateWithFlags(&from_caller_,
                                                                 cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags"));
  }
  const cudaStream_t caller = reinterpret_cast<cudaStream_t>(stream);
  ZF_RETURN_IF_ERROR(CudaStatus(kWho, cudaEventRecord(from_caller_, caller),
                                absl::StrCat("cudaEventRecord on the caller's stream ", stream)));
  return CudaStatus(kWho, cudaStreamWaitEvent(stream_.get(), from_caller_, 0),
                    "cudaStreamWaitEvent (the backend's stream after the caller's)");
}

absl::Status CudaBackend::SignalStream(uintptr_t stream) {
  ZF_RETURN_IF_ERROR(Activate());
  if (to_caller_ == nullptr) {
    ZF_RETURN_IF_ERROR(CudaStatus(kWho, cudaEventCreateWithFlags(&to_caller_,
                                                                 cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags"));
  }
  const cudaStream_t caller = reinterpret_cast<cudaStream_t>(stream);
  ZF_RETURN_IF_ERROR(CudaStatus(kWho, cudaEventRecord(to_caller_, stream_.get()),
                                "cudaEventRecord on the backend's stream"));
  return CudaStatus(kWho, cudaStreamWaitEvent(caller, to_caller_, 0),
                    absl::StrCat("cudaStreamWaitEvent (the caller's stream ", stream,
                                 " after the backend's)"));
}

absl::StatusOr<char*> CudaBackend::Scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Work already queued may still read the old buffer.
  ZF_RETURN_IF_ERROR(
      CudaStatus(kWho, cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize"));
  cudaFree(scratch_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  const size_t want = std::max<size_t>(bytes, size_t{1} << 20);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, want);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(kWho, err, absl::StrCat("cudaMalloc of ", want, " bytes of scratch"));
  }
  scratch_ = static_cast<char*>(p);
  scratch_bytes_ = want;
  return scratch_;
}

absl::Status CudaBackend::LaunchColumnCheck(const int32_t* columns, int64_t ncols, int64_t cols,
                                            unsigned int range_bit, unsigned int duplicate_bit) {
  const size_t words = static_cast<size_t>((cols + 31) / 32);
  ZF_ASSIGN_OR_RETURN(char* scratch, Scratch(words * sizeof(unsigned int)));
  unsigned int* seen = reinterpret_cast<unsigned int*>(scratch);
  ZF_RETURN_IF_ERROR(
      CudaStatus(kWho, cudaMemsetAsync(seen, 0, words * sizeof(unsigned int), stream_.get()),
                 "cudaMemsetAsync (column bitmap)"));
  ColumnCheckKernel<<<GridFor(ncols, kThreads, 4096), kThreads, 0, stream_.get()>>>(
      columns, ncols, cols, seen, errors_, range_bit, duplicate_bit);
  return CheckLaunch(kWho, "ColumnCheckKernel");
}

absl::Status CudaBackend::ColumnImportance(const float* grad, int64_t rows, int64_t cols,
                                           Importance kind, float* out) {
  ZF_RETURN_IF_ERROR(internal::CheckImportanceArgs(grad, rows, cols, kind, out));
  if (cols == 0) return absl::OkStatus();
  ZF_RETURN_IF_ERROR(Activate());
  const int col_blocks = GridFor(cols, kThreads, int64_t{1} << 30);
  if (rows == 0) {
    FillZeroKernel<<<GridFor(cols, kThreads, 4096), kThreads, 0, stream_.get()>>>(out, cols);
    return CheckLaunch(kWho, "FillZeroKernel");
  }
  const int64_t blocks = (rows + kImportanceRowBlock - 1) / kImportanceRowBlock;
  float* partials = out;
  if (blocks > 1) {
    ZF_ASSIGN_OR_RETURN(char* scratch, Scratch(static_cast<size_t>(blocks * cols) * sizeof(float)));
    partials = reinterpret_cast<float*>(scratch);
  }
  const dim3 grid(col_blocks, static_cast<unsigned int>(std::min<int64_t>(blocks, kMaxGridY)));
  if (kind == Importance::kL1) {
    ImportancePartialKernel<Importance::kL1>
        <<<grid, kThreads, 0, stream_.get()>>>(grad, rows, cols, blocks, partials);
  } else {
    ImportancePartialKernel<Importance::kL2Squared>
        <<<grid, kThreads, 0, stream_.get()>>>(grad, rows, cols, blocks, partials);
  }
  ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "ImportancePartialKernel"));
  if (blocks == 1) return absl::OkStatus();
  ImportanceReduceKernel<<<col_blocks, kThreads, 0, stream_.get()>>>(partials, cols, blocks, out);
  return CheckLaunch(kWho, "ImportanceReduceKernel");
}

absl::Status CudaBackend::TopK(const float* scores, int64_t cols, int64_t k, int32_t* out) {
  ZF_RETURN_IF_ERROR(internal::CheckTopKArgs(scores, cols, k, out));
  if (k == 0) return absl::OkStatus();
  ZF_RETURN_IF_ERROR(Activate());
  const int64_t tiles = (cols + kCompactTile - 1) / kCompactTile;
  const int64_t keys_bytes = AlignUp(cols * 8, 256);
  const int64_t state_bytes = AlignUp(sizeof(SelectState), 256);
  ZF_ASSIGN_OR_RETURN(char* scratch,
                      Scratch(static_cast<size_t>(keys_bytes + state_bytes + tiles * 8)));
  auto* keys = reinterpret_cast<unsigned long long*>(scratch);
  auto* state = reinterpret_cast<SelectState*>(scratch + keys_bytes);
  auto* block_counts = reinterpret_cast<unsigned long long*>(scratch + keys_bytes + state_bytes);
  const int grid = GridFor(cols, kThreads, 4096);

  TopKKeysKernel<<<grid, kThreads, 0, stream_.get()>>>(scores, cols, keys);
  ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "TopKKeysKernel"));
  SelectInitKernel<<<1, kThreads, 0, stream_.get()>>>(state, k);
  ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "SelectInitKernel"));
  // Radix select, 8 bits per pass from the top: afterwards state->prefix is
  // the k-th largest key (keys are distinct), the threshold.
  for (int shift = 56; shift >= 0; shift -= 8) {
    SelectHistogramKernel<<<grid, kThreads, 0, stream_.get()>>>(keys, cols, state, shift);
    ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "SelectHistogramKernel"));
    SelectDigitKernel<<<1, 1, 0, stream_.get()>>>(state, shift);
    ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "SelectDigitKernel"));
  }
  // Exactly k keys are >= the threshold; write their indices in order.
  CompactCountKernel<<<static_cast<unsigned int>(tiles), kThreads, 0, stream_.get()>>>(
      keys, cols, state, block_counts);
  ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "CompactCountKernel"));
  ExclusiveScanKernel<<<1, 1024, 0, stream_.get()>>>(block_counts, tiles);
  ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "ExclusiveScanKernel"));
  CompactScatterKernel<<<static_cast<unsigned int>(tiles), kThreads, 0, stream_.get()>>>(
      keys, cols, state, block_counts, out);
  return CheckLaunch(kWho, "CompactScatterKernel");
}

absl::Status CudaBackend::PackColumns(const float* w, int64_t rows, int64_t cols,
                                      const int32_t* columns, int64_t ncols, PackDType dtype,
                                      void* dst, float* scales) {
  ZF_RETURN_IF_ERROR(
      internal::CheckColumnsArgs("PackColumns", w, rows, cols, columns, ncols, dtype, dst, scales));
  if (ncols == 0) return absl::OkStatus();
  ZF_RETURN_IF_ERROR(Activate());
  const unsigned int col_tiles = static_cast<unsigned int>((ncols + kTile - 1) / kTile);
  if (dtype == PackDType::kInt8) {
    Int8ScaleKernel<<<col_tiles, dim3(kTile, kTileY), 0, stream_.get()>>>(w, rows, cols, columns,
                                                                          ncols, scales);
    ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "Int8ScaleKernel"));
  }
  const int64_t row_tiles = std::max<int64_t>(1, (rows + kTile - 1) / kTile);
  const dim3 grid(col_tiles, static_cast<unsigned int>(std::min<int64_t>(row_tiles, kMaxGridY)));
  const dim3 block(kTile, kTileY);
  switch (dtype) {
    case PackDType::kF32:
      PackKernel<PackDType::kF32>
          <<<grid, block, 0, stream_.get()>>>(w, rows, cols, columns, ncols, dst, scales, errors_);
      break;
    case PackDType::kBF16:
      PackKernel<PackDType::kBF16>
          <<<grid, block, 0, stream_.get()>>>(w, rows, cols, columns, ncols, dst, scales, errors_);
      break;
    case PackDType::kF16:
      PackKernel<PackDType::kF16>
          <<<grid, block, 0, stream_.get()>>>(w, rows, cols, columns, ncols, dst, scales, errors_);
      break;
    case PackDType::kInt8:
      PackKernel<PackDType::kInt8>
          <<<grid, block, 0, stream_.get()>>>(w, rows, cols, columns, ncols, dst, scales, errors_);
      break;
  }
  return CheckLaunch(kWho, "PackKernel");
}

absl::Status CudaBackend::ApplyColumns(float* w, int64_t rows, int64_t cols, const int32_t* columns,
                                       int64_t ncols, PackDType dtype, const void* src,
                                       const float* scales, bool add) {
  ZF_RETURN_IF_ERROR(internal::CheckColumnsArgs("ApplyColumns", w, rows, cols, columns, ncols,
                                                dtype, src, scales));
  if (ncols == 0) return absl::OkStatus();
  ZF_RETURN_IF_ERROR(Activate());
  ZF_RETURN_IF_ERROR(LaunchColumnCheck(columns, ncols, cols, kErrApplyIndex, kErrApplyDuplicate));
  if (rows == 0) return absl::OkStatus();
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const dim3 grid(static_cast<unsigned int>((ncols + kTile - 1) / kTile),
                  static_cast<unsigned int>(std::min<int64_t>(row_tiles, kMaxGridY)));
  const dim3 block(kTile, kTileY);
  switch (dtype) {
    case PackDType::kF32:
      ApplyKernel<PackDType::kF32>
          <<<grid, block, 0, stream_.get()>>>(w, rows, cols, columns, ncols, src, scales, add);
      break;
    case PackDType::kBF16:
      ApplyKernel<PackDType::kBF16>
          <<<grid, block, 0, stream_.get()>>>(w, rows, cols, columns, ncols, src, scales, add);
      break;
    case PackDType::kF16:
      ApplyKernel<PackDType::kF16>
          <<<grid, block, 0, stream_.get()>>>(w, rows, cols, columns, ncols, src, scales, add);
      break;
    case PackDType::kInt8:
      ApplyKernel<PackDType::kInt8>
          <<<grid, block, 0, stream_.get()>>>(w, rows, cols, columns, ncols, src, scales, add);
      break;
  }
  return CheckLaunch(kWho, "ApplyKernel");
}

absl::Status CudaBackend::SelectiveAdamW(const AdamWHyper& h, float grad_scale, float* w,
                                         int64_t rows, int64_t cols, const int32_t* columns,
                                         int64_t ncols, const int64_t* steps, const float* grad,
                                         float* m, float* v) {
  ZF_RETURN_IF_ERROR(
      internal::CheckAdamWArgs(h, grad_scale, w, rows, cols, columns, ncols, steps, grad, m, v));
  if (ncols == 0) return absl::OkStatus();
  ZF_RETURN_IF_ERROR(Activate());
  ZF_RETURN_IF_ERROR(LaunchColumnCheck(columns, ncols, cols, kErrAdamIndex, kErrAdamDuplicate));
  AdamConsts k;
  k.beta1 = h.beta1;
  k.one_minus_beta1 = 1.0f - h.beta1;
  k.beta2 = h.beta2;
  k.one_minus_beta2 = 1.0f - h.beta2;
  k.decay =
      static_cast<float>(1.0 - static_cast<double>(h.lr) * static_cast<double>(h.weight_decay));
  k.eps = h.eps;
  k.grad_scale = grad_scale;
  k.beta1_d = h.beta1;
  k.beta2_d = h.beta2;
  k.lr_d = h.lr;
  const int64_t row_tiles = std::max<int64_t>(1, (rows + kTile - 1) / kTile);
  const dim3 grid(static_cast<unsigned int>((ncols + kTile - 1) / kTile),
                  static_cast<unsigned int>(std::min<int64_t>(row_tiles, kMaxGridY)));
  AdamWKernel<<<grid, dim3(kTile, kTileY), 0, stream_.get()>>>(k, w, rows, cols, columns, ncols,
                                                               steps, grad, m, v, errors_);
  return CheckLaunch(kWho, "AdamWKernel");
}

absl::Status CudaBackend::ApplyColumns16(void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                                         const int32_t* columns, int64_t ncols,
                                         PackDType src_dtype, const void* src) {
  ZF_RETURN_IF_ERROR(internal::CheckApplyColumns16Args(w, w_dtype, rows, cols, columns, ncols,
                                                       src_dtype, src));
  if (ncols == 0) return absl::OkStatus();
  ZF_RETURN_IF_ERROR(Activate());
  ZF_RETURN_IF_ERROR(
      LaunchColumnCheck(columns, ncols, cols, kErrApply16Index, kErrApply16Duplicate));
  if (rows == 0) return absl::OkStatus();
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const dim3 grid(static_cast<unsigned int>((ncols + kTile - 1) / kTile),
                  static_cast<unsigned int>(std::min<int64_t>(row_tiles, kMaxGridY)));
  const dim3 block(kTile, kTileY);
  uint16_t* w16 = static_cast<uint16_t*>(w);
  const bool same = src_dtype == w_dtype;
  if (w_dtype == PackDType::kBF16) {
    if (same) {
      Apply16Kernel<PackDType::kBF16, PackDType::kBF16>
          <<<grid, block, 0, stream_.get()>>>(w16, rows, cols, columns, ncols, src);
    } else {
      Apply16Kernel<PackDType::kBF16, PackDType::kF32>
          <<<grid, block, 0, stream_.get()>>>(w16, rows, cols, columns, ncols, src);
    }
  } else if (same) {
    Apply16Kernel<PackDType::kF16, PackDType::kF16>
        <<<grid, block, 0, stream_.get()>>>(w16, rows, cols, columns, ncols, src);
  } else {
    Apply16Kernel<PackDType::kF16, PackDType::kF32>
        <<<grid, block, 0, stream_.get()>>>(w16, rows, cols, columns, ncols, src);
  }
  return CheckLaunch(kWho, "Apply16Kernel");
}

absl::Status CudaBackend::FactoredStep(float lr, float eps, void* w, PackDType w_dtype,
                                       int64_t rows, int64_t cols, const int32_t* columns,
                                       int64_t ncols, const float* grad, const float* row_v,
                                       const float* col_v, float v_mean) {
  ZF_RETURN_IF_ERROR(internal::CheckFactoredStepArgs(lr, eps, w, w_dtype, rows, cols, columns,
                                                     ncols, grad, row_v, col_v));
  if (ncols == 0) return absl::OkStatus();
  ZF_RETURN_IF_ERROR(Activate());
  ZF_RETURN_IF_ERROR(
      LaunchColumnCheck(columns, ncols, cols, kErrFactoredIndex, kErrFactoredDuplicate));
  if (rows == 0) return absl::OkStatus();
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const dim3 grid(static_cast<unsigned int>((ncols + kTile - 1) / kTile),
                  static_cast<unsigned int>(std::min<int64_t>(row_tiles, kMaxGridY)));
  const dim3 block(kTile, kTileY);
  if (w_dtype == PackDType::kF32) {
    FactoredStepKernel<PackDType::kF32><<<grid, block, 0, stream_.get()>>>(
        lr, eps, w, rows, cols, columns, ncols, grad, row_v, col_v, v_mean);
  } else if (w_dtype == PackDType::kBF16) {
    FactoredStepKernel<PackDType::kBF16><<<grid, block, 0, stream_.get()>>>(
        lr, eps, w, rows, cols, columns, ncols, grad, row_v, col_v, v_mean);
  } else {
    FactoredStepKernel<PackDType::kF16><<<grid, block, 0, stream_.get()>>>(
        lr, eps, w, rows, cols, columns, ncols, grad, row_v, col_v, v_mean);
  }
  return CheckLaunch(kWho, "FactoredStepKernel");
}

absl::Status CudaBackend::SelectiveAdamW16(const AdamWHyper& h, float grad_scale, void* w,
                                           PackDType w_dtype, int64_t rows, int64_t cols,
                                           const int32_t* columns, int64_t ncols,
                                           const int64_t* steps, const float* grad,
                                           float* master, float* m, float* v) {
  ZF_RETURN_IF_ERROR(internal::CheckAdamW16Args(h, grad_scale, w, w_dtype, rows, cols, columns,
                                                ncols, steps, grad, master, m, v));
  if (ncols == 0) return absl::OkStatus();
  ZF_RETURN_IF_ERROR(Activate());
  ZF_RETURN_IF_ERROR(
      LaunchColumnCheck(columns, ncols, cols, kErrAdam16Index, kErrAdam16Duplicate));
  AdamConsts k;
  k.beta1 = h.beta1;
  k.one_minus_beta1 = 1.0f - h.beta1;
  k.beta2 = h.beta2;
  k.one_minus_beta2 = 1.0f - h.beta2;
  k.decay =
      static_cast<float>(1.0 - static_cast<double>(h.lr) * static_cast<double>(h.weight_decay));
  k.eps = h.eps;
  k.grad_scale = grad_scale;
  k.beta1_d = h.beta1;
  k.beta2_d = h.beta2;
  k.lr_d = h.lr;
  const int64_t row_tiles = std::max<int64_t>(1, (rows + kTile - 1) / kTile);
  const dim3 grid(static_cast<unsigned int>((ncols + kTile - 1) / kTile),
                  static_cast<unsigned int>(std::min<int64_t>(row_tiles, kMaxGridY)));
  uint16_t* w16 = static_cast<uint16_t*>(w);
  if (w_dtype == PackDType::kBF16) {
    AdamW16Kernel<PackDType::kBF16><<<grid, dim3(kTile, kTileY), 0, stream_.get()>>>(
        k, w16, rows, cols, columns, ncols, steps, grad, master, m, v, errors_);
  } else {
    AdamW16Kernel<PackDType::kF16><<<grid, dim3(kTile, kTileY), 0, stream_.get()>>>(
        k, w16, rows, cols, columns, ncols, steps, grad, master, m, v, errors_);
  }
  return CheckLaunch(kWho, "AdamW16Kernel");
}

absl::Status CudaBackend::Convert(const void* src, PackDType src_dtype, void* dst,
                                  PackDType dst_dtype, int64_t n) {
  ZF_RETURN_IF_ERROR(internal::CheckConvertArgs(src, src_dtype, dst, dst_dtype, n));
  if (n == 0) return absl::OkStatus();
  if (src_dtype == dst_dtype) {
    return CopyDeviceToDevice(dst, src, static_cast<size_t>(n) * PackDTypeSize(src_dtype));
  }
  ZF_RETURN_IF_ERROR(Activate());
  const int grid = GridFor(n, kThreads, 4096);
  cudaStream_t st = stream_.get();
  using D = PackDType;
  if (src_dtype == D::kF32 && dst_dtype == D::kBF16) {
    ConvertKernel<D::kF32, D::kBF16><<<grid, kThreads, 0, st>>>(src, dst, n);
  } else if (src_dtype == D::kF32) {
    ConvertKernel<D::kF32, D::kF16><<<grid, kThreads, 0, st>>>(src, dst, n);
  } else if (src_dtype == D::kBF16 && dst_dtype == D::kF32) {
    ConvertKernel<D::kBF16, D::kF32><<<grid, kThreads, 0, st>>>(src, dst, n);
  } else if (src_dtype == D::kBF16) {
    ConvertKernel<D::kBF16, D::kF16><<<grid, kThreads, 0, st>>>(src, dst, n);
  } else if (dst_dtype == D::kF32) {
    ConvertKernel<D::kF16, D::kF32><<<grid, kThreads, 0, st>>>(src, dst, n);
  } else {
    ConvertKernel<D::kF16, D::kBF16><<<grid, kThreads, 0, st>>>(src, dst, n);
  }
  return CheckLaunch(kWho, "ConvertKernel");
}

absl::Status CudaBackend::SquaredNorm(const float* x, int64_t n, double* host_out) {
  ZF_RETURN_IF_ERROR(internal::CheckSquaredNormArgs(x, n, host_out));
  if (n == 0) {
    *host_out = 0.0;
    return absl::OkStatus();
  }
  ZF_RETURN_IF_ERROR(Activate());
  if (pending_norms_.size() == static_cast<size_t>(kNormSlots)) {
    ZF_RETURN_IF_ERROR(Synchronize());  // Deliver the queued results first.
  }
  const int blocks = GridFor(n, int64_t{kThreads} * 8, kNormMaxBlocks);
  ZF_ASSIGN_OR_RETURN(char* scratch, Scratch((blocks + 1) * sizeof(double)));
  double* partials = reinterpret_cast<double*>(scratch);
  double* result = partials + blocks;
  NormPartialKernel<<<blocks, kThreads, 0, stream_.get()>>>(x, n, partials);
  ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "NormPartialKernel"));
  NormFinalKernel<<<1, kNormMaxBlocks, 0, stream_.get()>>>(partials, blocks, result);
  ZF_RETURN_IF_ERROR(CheckLaunch(kWho, "NormFinalKernel"));
  double* slot = norm_slots_ + pending_norms_.size();
  ZF_RETURN_IF_ERROR(CudaStatus(
      kWho, cudaMemcpyAsync(slot, result, sizeof(double), cudaMemcpyDeviceToHost, stream_.get()),
      "cudaMemcpyAsync (SquaredNorm result)"));
  pending_norms_.push_back(host_out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("no CUDA device is visible (cudaGetDeviceCount: ",
                     err == cudaSuccess ? "0 devices" : cudaGetErrorString(err),
                     "); check the driver and CUDA_VISIBLE_DEVICES, or use the CPU backend"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " visible)"));
  }
  auto backend = std::make_unique<CudaBackend>(device);
  ZF_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

bool CudaCompiled() { return true; }

int CudaDeviceCount() { return VisibleCudaDevices(); }

absl::StatusOr<int> CudaPointerDevice(const void* p) {
  if (VisibleCudaDevices() == 0) {
    return absl::UnavailableError(
        "no CUDA device is visible, so device memory cannot be used; check the driver and "
        "CUDA_VISIBLE_DEVICES, or keep the tensors in host memory (the CPU backend)");
  }
  cudaPointerAttributes a{};
  const cudaError_t err = cudaPointerGetAttributes(&a, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "cudaPointerGetAttributes: ", cudaGetErrorString(err), " for a pointer given as device "
        "memory"));
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(
        "a pointer given as device memory (__cuda_array_interface__) is host memory to the CUDA "
        "runtime; hand host arrays over with __array_interface__ instead");
  }
  return a.device;
}

}  // namespace zenflow::worker
