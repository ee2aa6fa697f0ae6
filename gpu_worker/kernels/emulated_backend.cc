// The EMULATED GPU backend; see emulated_backend.h for the model.
#include "gpu_worker/kernels/emulated_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "gpu_worker/kernels/backend_common.h"

namespace zenflow::worker {
namespace {

constexpr double kGB = 1e9;
constexpr double kTB = 1e12;
constexpr double kSector = 32.0;  // bytes: the unit of a GPU's DRAM accesses

// The profiles. Bandwidths are decimal (1 GB/s = 1e9 B/s).
//
// Sources and assumptions:
// - HBM bandwidth: NVIDIA's datasheets. H100 SXM5 80GB: 3.35 TB/s (HBM3);
//   H100 PCIe 80GB: 2.0 TB/s (HBM2e); A100 80GB SXM: 2,039 GB/s (HBM2e).
// - hbm_efficiency 0.85: our ASSUMPTION for what a streaming, memory-bound
//   kernel reaches of the datasheet peak (well-written copy / triad kernels
//   typically land between 80% and 90%).
// - PCIe: Gen5 x16 is 32 GT/s x 16 lanes with 128b/130b coding, ~63 GB/s
//   per direction in theory (PCI-SIG); we ASSUME 50 GB/s achieved by large
//   pinned copies. Gen4 x16 is half that (~31.5 GB/s theoretical); we ASSUME
//   25 GB/s achieved.
// - launch_seconds 5 us: our ASSUMPTION for a kernel launch or copy issue on
//   a stream (CUDA's launch overhead is a few microseconds).
const std::vector<DeviceProfile>& Table() {
  static const std::vector<DeviceProfile>* table = new std::vector<DeviceProfile>{
      {"h100-sxm", "NVIDIA H100 SXM5 80GB: HBM3 3.35 TB/s; PCIe Gen5 x16, 50 GB/s per direction",
       3.35 * kTB, 0.85, 50 * kGB, 50 * kGB, 5e-6},
      {"h100-pcie", "NVIDIA H100 PCIe 80GB: HBM2e 2.0 TB/s; PCIe Gen5 x16, 50 GB/s per direction",
       2.0 * kTB, 0.85, 50 * kGB, 50 * kGB, 5e-6},
      {"a100-sxm-80gb",
       "NVIDIA A100 SXM 80GB: HBM2e 2.039 TB/s; PCIe Gen4 x16, 25 GB/s per direction",
       2.039 * kTB, 0.85, 25 * kGB, 25 * kGB, 5e-6},
  };
  return *table;
}

class SteadyClock : public EmulatorClock {
 public:
  double Now() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void SleepUntil(double t) override {
    for (double now = Now(); now < t; now = Now()) {
      std::this_thread::sleep_for(std::chrono::duration<double>(t - now));
    }
  }
};

constexpr size_t kAlign = 64;
constexpr size_t kHugeAlign = size_t{2} << 20;

absl::StatusOr<void*> AllocZeroed(size_t bytes, const char* what) {
  const size_t align = bytes >= kHugeAlign ? kHugeAlign : kAlign;
  const size_t rounded = std::max<size_t>(align, (bytes + align - 1) / align * align);
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "emulated backend: ", what, " allocation of ", bytes, " bytes failed (out of host memory?)"));
  }
  std::memset(p, 0, rounded);
  return p;
}

// A fixed pseudo-random score for column j of a [rows, cols] tensor, in
// [0, 1): splitmix64 of (j, shape). Not a gradient statistic.
float PseudoScore(int64_t j, int64_t rows, int64_t cols) {
  const uint64_t z = HashRandom(static_cast<uint64_t>(j) * kSplitMix64Gamma ^
                                static_cast<uint64_t>(rows) * 0xC2B2AE3D27D4EB4Full ^
                                static_cast<uint64_t>(cols));
  return static_cast<float>(static_cast<double>(z >> 40) * (1.0 / (1ull << 24)));
}

}  // namespace

const std::vector<DeviceProfile>& DeviceProfiles() { return Table(); }

absl::StatusOr<DeviceProfile> FindDeviceProfile(const std::string& name) {
  std::vector<std::string> names;
  for (const DeviceProfile& p : Table()) {
    if (p.name == name) return p;
    names.push_back(p.name);
  }
  return absl::NotFoundError(absl::StrCat("unknown device profile '", name,
                                          "'; known profiles: ", absl::StrJoin(names, ", ")));
}

double KernelCostSeconds(const DeviceProfile& p, double device_bytes) {
  return p.launch_seconds + device_bytes / (p.hbm_bytes_per_s * p.hbm_efficiency);
}

double HostToDeviceCostSeconds(const DeviceProfile& p, double bytes) {
  return p.launch_seconds + bytes / p.h2d_bytes_per_s;
}

double DeviceToHostCostSeconds(const DeviceProfile& p, double bytes) {
  return p.launch_seconds + bytes / p.d2h_bytes_per_s;
}

std::unique_ptr<EmulatorClock> MakeSteadyEmulatorClock() { return std::make_unique<SteadyClock>(); }

namespace internal {

int64_t ColumnSectorsPerRow(const int32_t* columns, int64_t ncols, int64_t elem_bytes) {
  const int32_t kPerSector = static_cast<int32_t>(kSector) / static_cast<int32_t>(elem_bytes);
  if (ncols <= 0) return 0;
  bool ascending = true;
  for (int64_t i = 1; i < ncols && ascending; ++i) ascending = columns[i] > columns[i - 1];
  if (ascending) {
    int64_t n = 1;
    for (int64_t i = 1; i < ncols; ++i) {
      n += columns[i] / kPerSector != columns[i - 1] / kPerSector;
    }
    return n;
  }
  std::vector<int32_t> s(columns, columns + ncols);
  for (int32_t& c : s) c /= kPerSector;
  std::sort(s.begin(), s.end());
  return static_cast<int64_t>(std::unique(s.begin(), s.end()) - s.begin());
}

}  // namespace internal

EmulatedBackend::EmulatedBackend(DeviceProfile profile, std::unique_ptr<EmulatorClock> clock)
    : profile_(std::move(profile)),
      clock_(clock != nullptr ? std::move(clock) : MakeSteadyEmulatorClock()),
      first_pack_(MakeCpuBackend(1)) {
  busy_until_ = clock_->Now();
}

EmulatedBackend::~EmulatedBackend() = default;

std::string EmulatedBackend::name() const { return "emulated:" + profile_.name; }

void EmulatedBackend::Enqueue(double seconds) {
  const double start = std::max(clock_->Now(), busy_until_);
  busy_until_ = start + seconds;
  busy_total_ += seconds;
  ++ops_;
}

bool EmulatedBackend::MovesBytes(const void* dst, size_t bytes) {
  if (bytes <= kControlCopyBytes) return true;
  return written_.insert(dst).second;
}

absl::StatusOr<void*> EmulatedBackend::Alloc(size_t bytes) { return AllocZeroed(bytes, "device"); }

void EmulatedBackend::Free(void* p) {
  written_.erase(p);
  std::free(p);
}

absl::StatusOr<void*> EmulatedBackend::AllocHost(size_t bytes) {
  return AllocZeroed(bytes, "pinned host");
}

void EmulatedBackend::FreeHost(void* p) {
  written_.erase(p);
  std::free(p);
}

absl::Status EmulatedBackend::CopyToDevice(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || host_src == nullptr) {
    return absl::InvalidArgumentError("CopyToDevice: null pointer with bytes > 0");
  }
  if (MovesBytes(dst, bytes)) std::memcpy(dst, host_src, bytes);
  h2d_bytes_ += static_cast<double>(bytes);
  Enqueue(HostToDeviceCostSeconds(profile_, static_cast<double>(bytes)));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (host_dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError("CopyToHost: null pointer with bytes > 0");
  }
  if (MovesBytes(host_dst, bytes)) std::memcpy(host_dst, src, bytes);
  d2h_bytes_ += static_cast<double>(bytes);
  Enqueue(DeviceToHostCostSeconds(profile_, static_cast<double>(bytes)));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::CopyDeviceToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError("CopyDeviceToDevice: null pointer with bytes > 0");
  }
  if (MovesBytes(dst, bytes)) std::memmove(dst, src, bytes);
  Enqueue(KernelCostSeconds(profile_, 2.0 * static_cast<double>(bytes)));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::Synchronize() {
  clock_->SleepUntil(busy_until_);
  return absl::OkStatus();
}

absl::Status EmulatedBackend::ColumnImportance(const float* grad, int64_t rows, int64_t cols,
                                               Importance kind, float* out) {
  ZF_RETURN_IF_ERROR(internal::CheckImportanceArgs(grad, rows, cols, kind, out));
  for (int64_t j = 0; j < cols; ++j) out[j] = PseudoScore(j, rows, cols);
  const double bytes = static_cast<double>(rows) * static_cast<double>(cols) * 4.0 +
                       static_cast<double>(cols) * 4.0;
  Enqueue(KernelCostSeconds(profile_, bytes));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::TopK(const float* scores, int64_t cols, int64_t k, int32_t* out) {
  ZF_RETURN_IF_ERROR(internal::CheckTopKArgs(scores, cols, k, out));
  if (k > 0) {
    // Exact, on the host: the selection must be valid. cols values only.
    std::vector<uint64_t> keys(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) {
      uint32_t bits;
      std::memcpy(&bits, &scores[j], sizeof(bits));
      keys[static_cast<size_t>(j)] = internal::TopKKey(bits, static_cast<uint32_t>(j));
    }
    std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint64_t>());
    std::vector<int32_t> chosen(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      chosen[static_cast<size_t>(i)] =
          static_cast<int32_t>(internal::TopKKeyIndex(keys[static_cast<size_t>(i)]));
    }
    std::sort(chosen.begin(), chosen.end());
    std::copy(chosen.begin(), chosen.end(), out);
  }
  // Modelled as a two-pass select over the scores plus the output.
  Enqueue(KernelCostSeconds(profile_, 2.0 * static_cast<double>(cols) * 4.0 +
                                          static_cast<double>(k) * 4.0));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::PackColumns(const float* w, int64_t rows, int64_t cols,
                                          const int32_t* columns, int64_t ncols, PackDType dtype,
                                          void* dst, float* scales) {
  ZF_RETURN_IF_ERROR(
      internal::CheckColumnsArgs("PackColumns", w, rows, cols, columns, ncols, dtype, dst, scales));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("PackColumns", columns, ncols, cols,
                                                  /*distinct=*/false));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  if (written_.insert(dst).second) {
    // First write of this destination: real bytes, once.
    ZF_RETURN_IF_ERROR(first_pack_->PackColumns(w, rows, cols, columns, ncols, dtype, dst, scales));
  }
  const double r = static_cast<double>(rows);
  const double n = static_cast<double>(ncols);
  const double read = r * static_cast<double>(internal::ColumnSectorsPerRow(columns, ncols)) *
                      kSector;
  // int8 reads its columns twice (the maximum, then the quantization).
  double bytes = (dtype == PackDType::kInt8 ? 2.0 : 1.0) * read + n * 4.0 +
                 r * n * static_cast<double>(PackDTypeSize(dtype));
  if (dtype == PackDType::kInt8) bytes += n * 4.0;
  Enqueue(KernelCostSeconds(profile_, bytes));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::ApplyColumns(float* w, int64_t rows, int64_t cols,
                                           const int32_t* columns, int64_t ncols, PackDType dtype,
                                           const void* src, const float* scales, bool add) {
  ZF_RETURN_IF_ERROR(
      internal::CheckColumnsArgs("ApplyColumns", w, rows, cols, columns, ncols, dtype, src, scales));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("ApplyColumns", columns, ncols, cols,
                                                  /*distinct=*/true));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const double r = static_cast<double>(rows);
  const double n = static_cast<double>(ncols);
  // The packed source, the indices, and each touched sector of W read and
  // written back (a partial-sector write is a read-modify-write).
  const double bytes = r * n * static_cast<double>(PackDTypeSize(dtype)) + n * 4.0 +
                       2.0 * r *
                           static_cast<double>(internal::ColumnSectorsPerRow(columns, ncols)) *
                           kSector +
                       (dtype == PackDType::kInt8 ? n * 4.0 : 0.0);
  Enqueue(KernelCostSeconds(profile_, bytes));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::SelectiveAdamW(const AdamWHyper& h, float grad_scale, float* w,
                                             int64_t rows, int64_t cols, const int32_t* columns,
                                             int64_t ncols, const int64_t* steps,
                                             const float* grad, float* m, float* v) {
  ZF_RETURN_IF_ERROR(
      internal::CheckAdamWArgs(h, grad_scale, w, rows, cols, columns, ncols, steps, grad, m, v));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("SelectiveAdamW", columns, ncols, cols,
                                                  /*distinct=*/true));
  ZF_RETURN_IF_ERROR(internal::CheckSteps(steps, ncols));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const double r = static_cast<double>(rows);
  const double n = static_cast<double>(ncols);
  // grad read; m and v read and written; W's sectors read and written;
  // the indices and update counts.
  const double bytes = r * n * (4.0 + 16.0) +
                       2.0 * r *
                           static_cast<double>(internal::ColumnSectorsPerRow(columns, ncols)) *
                           kSector +
                       n * 12.0;
  Enqueue(KernelCostSeconds(profile_, bytes));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::SquaredNorm(const float* x, int64_t n, double* host_out) {
  ZF_RETURN_IF_ERROR(internal::CheckSquaredNormArgs(x, n, host_out));
  *host_out = 0.0;  // Not computed: the emulated device's results are not numerics.
  Enqueue(KernelCostSeconds(profile_, static_cast<double>(n) * 4.0));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::ApplyColumns16(void* w, PackDType w_dtype, int64_t rows,
                                             int64_t cols, const int32_t* columns, int64_t ncols,
                                             PackDType src_dtype, const void* src) {
  ZF_RETURN_IF_ERROR(internal::CheckApplyColumns16Args(w, w_dtype, rows, cols, columns, ncols,
                                                       src_dtype, src));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("ApplyColumns16", columns, ncols, cols,
                                                  /*distinct=*/true));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const double r = static_cast<double>(rows);
  const double n = static_cast<double>(ncols);
  // As ApplyColumns, with W's sectors holding 16 two-byte columns each.
  const double bytes =
      r * n * static_cast<double>(PackDTypeSize(src_dtype)) + n * 4.0 +
      2.0 * r * static_cast<double>(internal::ColumnSectorsPerRow(columns, ncols, 2)) * kSector;
  Enqueue(KernelCostSeconds(profile_, bytes));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::SelectiveAdamW16(const AdamWHyper& h, float grad_scale, void* w,
                                               PackDType w_dtype, int64_t rows, int64_t cols,
                                               const int32_t* columns, int64_t ncols,
                                               const int64_t* steps, const float* grad,
                                               float* master, float* m, float* v) {
  ZF_RETURN_IF_ERROR(internal::CheckAdamW16Args(h, grad_scale, w, w_dtype, rows, cols, columns,
                                                ncols, steps, grad, master, m, v));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("SelectiveAdamW16", columns, ncols, cols,
                                                  /*distinct=*/true));
  ZF_RETURN_IF_ERROR(internal::CheckSteps(steps, ncols, "SelectiveAdamW16"));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const double r = static_cast<double>(rows);
  const double n = static_cast<double>(ncols);
  // grad read; master, m and v read and written (compact, coalesced); W's
  // sectors written (a partial-sector write is a read-modify-write); the
  // indices and update counts.
  const double bytes =
      r * n * (4.0 + 24.0) +
      2.0 * r * static_cast<double>(internal::ColumnSectorsPerRow(columns, ncols, 2)) * kSector +
      n * 12.0;
  Enqueue(KernelCostSeconds(profile_, bytes));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::Convert(const void* src, PackDType src_dtype, void* dst,
                                      PackDType dst_dtype, int64_t n) {
  ZF_RETURN_IF_ERROR(internal::CheckConvertArgs(src, src_dtype, dst, dst_dtype, n));
  if (n == 0) return absl::OkStatus();
  Enqueue(KernelCostSeconds(profile_, static_cast<double>(n) *
                                          static_cast<double>(PackDTypeSize(src_dtype) +
                                                              PackDTypeSize(dst_dtype))));
  return absl::OkStatus();
}

absl::Status EmulatedBackend::FactoredStep(float lr, float eps, void* w, PackDType w_dtype,
                                           int64_t rows, int64_t cols, const int32_t* columns,
                                           int64_t ncols, const float* grad, const float* row_v,
                                           const float* col_v, float v_mean) {
  ZF_RETURN_IF_ERROR(internal::CheckFactoredStepArgs(lr, eps, w, w_dtype, rows, cols, columns,
                                                     ncols, grad, row_v, col_v));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("FactoredStep", columns, ncols, cols,
                                                  /*distinct=*/true));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const double r = static_cast<double>(rows);
  const double n = static_cast<double>(ncols);
  const int64_t esize = static_cast<int64_t>(PackDTypeSize(w_dtype));
  // grad read (compact, coalesced); W's sectors read and written; row_v,
  // col_v and the indices: about 4 + 2 * 4 bytes per fp32 element.
  const double bytes =
      r * n * 4.0 +
      2.0 * r * static_cast<double>(internal::ColumnSectorsPerRow(columns, ncols, esize)) *
          kSector +
      r * 4.0 + n * 8.0;
  Enqueue(KernelCostSeconds(profile_, bytes));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EmulatedBackend>> MakeEmulatedBackend(const std::string& profile) {
  ZF_ASSIGN_OR_RETURN(DeviceProfile p, FindDeviceProfile(profile));
  return std::make_unique<EmulatedBackend>(std::move(p), nullptr);
}

}  // namespace zenflow::worker
