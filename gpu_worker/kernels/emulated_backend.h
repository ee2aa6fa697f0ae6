// An EMULATED GPU: a Backend that stands for a device without one, for
// benchmarks that must see the host as it is beside a real GPU (stall_bench
// --device=emulated). It is not a numerical backend: its kernels compute
// nothing, and the engine's correctness tests use the CPU and CUDA backends.
//
//   absl::StatusOr<std::unique_ptr<EmulatedBackend>> be = MakeEmulatedBackend("h100-sxm");
//   ZF_RETURN_IF_ERROR((*be)->CopyToHost(host, dev, bytes));  // returns at once
//   ZF_RETURN_IF_ERROR((*be)->Synchronize());  // sleeps until the modelled copy ends
//
// The model. Device memory is host memory. Every kernel and every copy is
// enqueued on one in-order stream and costs a modelled time, from a named
// DeviceProfile:
//   kernel: launch latency + (bytes it reads and writes in device memory) /
//           (HBM bandwidth x achieved fraction);
//   H2D / D2H copy: launch latency + bytes / PCIe bandwidth (per direction);
//   D2D copy: a kernel reading and writing `bytes`.
// The stream keeps a virtual "device busy until" time: an operation starts at
// max(now, busy until) and moves it forward by its cost. Enqueueing never
// blocks the host; Synchronize() (and nothing else) sleeps until the device
// clock. Column kernels count 32-byte sectors for the strided side of a
// row-major tensor (a column read touches one sector per row unless
// neighbouring columns share it), as a GPU's memory system does.
//
// What the host still does (what a GPU's copy engine would leave it):
// - Copies of at most kControlCopyBytes move their bytes (column lists,
//   update counts, importance scores, int8 scales: the engine's protocol
//   reads them). Larger copies, and PackColumns, write real bytes the first
//   time they write a given destination address (so staging buffers hold
//   shard bytes made once from the synthetic gradients) and afterwards only
//   advance the clock.
// - ApplyColumns, SelectiveAdamW, their 16-bit forms, Convert and
//   SquaredNorm do no host arithmetic (SquaredNorm reports 0). Deltas are
//   left in the receive buffers. The 16-bit forms cost what they move: 2-byte
//   parameter elements (16 columns per sector) beside fp32 master, m, v.
// - ColumnImportance writes a fixed pseudo-random score per column (a hash
//   of the column index and the tensor shape), NOT the gradient's norm, so
//   selection and hand-off run deterministically; TopK ranks those scores
//   exactly (cols values, on the host). Their values are not numerics.
//
// Thread-compatible, like every Backend: one thread drives it at a time.
#ifndef ZENFLOW_GPU_WORKER_KERNELS_EMULATED_BACKEND_H_
#define ZENFLOW_GPU_WORKER_KERNELS_EMULATED_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_worker/backend.h"

namespace zenflow::worker {

// The figures the model uses for one device. Sources are in the table in
// emulated_backend.cc.
struct DeviceProfile {
  std::string name;                  // e.g. "h100-sxm"
  std::string description;           // the device and its host link, in words
  double hbm_bytes_per_s = 0;        // device memory bandwidth, datasheet peak
  double hbm_efficiency = 0;         // fraction of the peak a memory-bound kernel reaches
  double h2d_bytes_per_s = 0;        // host -> device copies (pinned), achieved
  double d2h_bytes_per_s = 0;        // device -> host copies (pinned), achieved
  double launch_seconds = 0;         // per kernel or copy
};

// Every known profile, in table order.
const std::vector<DeviceProfile>& DeviceProfiles();

// The named profile; NOT_FOUND listing the known names otherwise.
absl::StatusOr<DeviceProfile> FindDeviceProfile(const std::string& name);

// The model's costs, in seconds (launch latency included).
double KernelCostSeconds(const DeviceProfile& p, double device_bytes);
double HostToDeviceCostSeconds(const DeviceProfile& p, double bytes);
double DeviceToHostCostSeconds(const DeviceProfile& p, double bytes);

// Time source of the stream clock: the real steady clock, or a fake one in
// tests. Seconds on an arbitrary origin.
class EmulatorClock {
 public:
  virtual ~EmulatorClock() = default;
  virtual double Now() = 0;
  // Returns once Now() >= t.
  virtual void SleepUntil(double t) = 0;
};

// std::chrono::steady_clock and a real sleep.
std::unique_ptr<EmulatorClock> MakeSteadyEmulatorClock();

class EmulatedBackend : public Backend {
 public:
  // Copies of at most this many bytes always move their bytes.
  static constexpr size_t kControlCopyBytes = size_t{1} << 20;

  // `clock` may be null: the steady clock.
  EmulatedBackend(DeviceProfile profile, std::unique_ptr<EmulatorClock> clock);
  ~EmulatedBackend() override;
  EmulatedBackend(const EmulatedBackend&) = delete;
  EmulatedBackend& operator=(const EmulatedBackend&) = delete;

  // "emulated:<profile>", e.g. "emulated:h100-sxm".
  std::string name() const override;
  const DeviceProfile& profile() const { return profile_; }

  // ---- The stream clock (for tests and reports). ----
  // The virtual time (on the clock's origin) the device is busy until.
  double device_busy_until() const { return busy_until_; }
  // Sum of every enqueued operation's modelled cost since construction.
  double modelled_busy_seconds() const { return busy_total_; }
  // Operations enqueued since construction.
  int64_t operations() const { return ops_; }
  // Bytes moved over the modelled PCIe link, each direction.
  double h2d_bytes() const { return h2d_bytes_; }
  double d2h_bytes() const { return d2h_bytes_; }

  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* p) override;
  absl::StatusOr<void*> AllocHost(size_t bytes) override;
  void FreeHost(void* p) override;
  absl::Status CopyToDevice(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override;

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
                              const int64_t* steps, const float* grad, float* m,
                              float* v) override;
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
  // Puts an operation of `seconds` on the stream.
  void Enqueue(double seconds);
  // A copy's bytes move when it is small or its destination is new.
  bool MovesBytes(const void* dst, size_t bytes);

  DeviceProfile profile_;
  std::unique_ptr<EmulatorClock> clock_;
  std::unique_ptr<Backend> first_pack_;  // CPU backend for first-time packs
  std::unordered_set<const void*> written_;
  double busy_until_ = 0;
  double busy_total_ = 0;
  int64_t ops_ = 0;
  double h2d_bytes_ = 0;
  double d2h_bytes_ = 0;
};

// A backend for the named profile on the steady clock; NOT_FOUND listing the
// known profiles otherwise.
absl::StatusOr<std::unique_ptr<EmulatedBackend>> MakeEmulatedBackend(const std::string& profile);

namespace internal {
// Distinct 32-byte sectors a row of a row-major tensor of `elem_bytes`
// (4: fp32, 2: bf16 / fp16) touches when `columns` of it are read or
// written (the strided side of a column kernel).
int64_t ColumnSectorsPerRow(const int32_t* columns, int64_t ncols, int64_t elem_bytes = 4);
}  // namespace internal

}  // namespace zenflow::worker

#endif  // ZENFLOW_GPU_WORKER_KERNELS_EMULATED_BACKEND_H_
