// The emulated GPU's model, on a fake clock: no test reads a wall clock.
#include "gpu_worker/kernels/emulated_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zenflow::worker {
namespace {

using ::testing::HasSubstr;

// Time moves only when the test says so, or when the backend sleeps.
class FakeClock : public EmulatorClock {
 public:
  explicit FakeClock(double* now) : now_(now) {}
  double Now() override { return *now_; }
  void SleepUntil(double t) override { *now_ = std::max(*now_, t); }

 private:
  double* now_;
};

// The h100-sxm figures, written out from the datasheet (not read back from
// the table): HBM3 3.35 TB/s at 85%, PCIe 50 GB/s, 5 us per operation.
constexpr double kHbm = 3.35e12 * 0.85;
constexpr double kPcie = 50e9;
constexpr double kLaunch = 5e-6;

class EmulatedBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<DeviceProfile> p = FindDeviceProfile("h100-sxm");
    ASSERT_TRUE(p.ok()) << p.status();
    be_ = std::make_unique<EmulatedBackend>(*p, std::make_unique<FakeClock>(&now_));
  }
  double now_ = 100.0;
  std::unique_ptr<EmulatedBackend> be_;
};

TEST(DeviceProfileTest, H100SxmHasItsDatasheetFigures) {
  absl::StatusOr<DeviceProfile> p = FindDeviceProfile("h100-sxm");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->hbm_bytes_per_s, 3.35e12);
  EXPECT_DOUBLE_EQ(p->h2d_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(p->d2h_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(p->launch_seconds, 5e-6);
}

TEST(DeviceProfileTest, UnknownProfileIsNotFoundAndListsTheKnownOnes) {
  absl::StatusOr<DeviceProfile> p = FindDeviceProfile("tpu-v9");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("tpu-v9"));
  for (const DeviceProfile& known : DeviceProfiles()) {
    EXPECT_THAT(p.status().message(), HasSubstr(known.name));
  }
  EXPECT_FALSE(MakeEmulatedBackend("tpu-v9").ok());
}

TEST_F(EmulatedBackendTest, NameSaysEmulatedAndTheProfile) {
  EXPECT_EQ(be_->name(), "emulated:h100-sxm");
}

TEST_F(EmulatedBackendTest, CopyToHostAdvancesTheDeviceClockByItsModelledCostWithoutBlocking) {
  const size_t n = size_t{8} << 20;
  std::vector<char> host(n);
  absl::StatusOr<void*> dev = be_->Alloc(n);
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(be_->CopyToHost(host.data(), *dev, n).ok());
  const double cost = kLaunch + static_cast<double>(n) / kPcie;
  EXPECT_DOUBLE_EQ(be_->device_busy_until(), 100.0 + cost);
  EXPECT_DOUBLE_EQ(now_, 100.0) << "the host must not wait for an enqueued copy";
  EXPECT_DOUBLE_EQ(be_->d2h_bytes(), static_cast<double>(n));
  ASSERT_TRUE(be_->Synchronize().ok());
  EXPECT_DOUBLE_EQ(now_, 100.0 + cost) << "Synchronize waits exactly until the device is idle";
  be_->Free(*dev);
}

TEST_F(EmulatedBackendTest, OperationsQueueOnOneStreamAndAnIdleDeviceStartsAtNow) {
  const size_t a = size_t{4} << 20, b = size_t{2} << 20;
  std::vector<char> host(a);
  absl::StatusOr<void*> dev = be_->Alloc(a);
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(be_->CopyToDevice(*dev, host.data(), a).ok());
  now_ += 1e-5;  // the host moves on while the first copy runs
  ASSERT_TRUE(be_->CopyToHost(host.data(), *dev, b).ok());
  const double queued = 100.0 + 2 * kLaunch + static_cast<double>(a + b) / kPcie;
  EXPECT_DOUBLE_EQ(be_->device_busy_until(), queued);
  EXPECT_EQ(be_->operations(), 2);
  // Later than the queue's end: the next operation starts at the host's now.
  now_ = 200.0;
  ASSERT_TRUE(be_->CopyToDevice(*dev, host.data(), b).ok());
  EXPECT_DOUBLE_EQ(be_->device_busy_until(), 200.0 + kLaunch + static_cast<double>(b) / kPcie);
  EXPECT_DOUBLE_EQ(be_->modelled_busy_seconds(),
                   3 * kLaunch + static_cast<double>(a + 2 * b) / kPcie);
  be_->Free(*dev);
}

TEST_F(EmulatedBackendTest, SynchronizeOnAnIdleDeviceDoesNotWait) {
  now_ = 150.0;
  ASSERT_TRUE(be_->Synchronize().ok());
  EXPECT_DOUBLE_EQ(now_, 150.0);
}

TEST_F(EmulatedBackendTest, PackColumnsCostsTheSectorsItReadsAndTheBytesItWrites) {
  const int64_t rows = 64, cols = 64;
  absl::StatusOr<void*> w = be_->Alloc(rows * cols * 4);
  absl::StatusOr<void*> dst = be_->Alloc(rows * 16 * 2);
  absl::StatusOr<void*> idx = be_->Alloc(16 * 4);
  ASSERT_TRUE(w.ok() && dst.ok() && idx.ok());
  std::vector<int32_t> columns(16);
  std::iota(columns.begin(), columns.end(), 0);  // two 32-byte sectors of each row
  std::memcpy(*idx, columns.data(), 16 * 4);
  ASSERT_TRUE(be_->PackColumns(static_cast<float*>(*w), rows, cols, static_cast<int32_t*>(*idx), 16,
                               PackDType::kBF16, *dst, nullptr)
                  .ok());
  // Reads: 64 rows x 2 sectors x 32 B, 16 indices x 4 B; writes 64 x 16 x 2 B.
  const double bytes = 64 * 2 * 32 + 16 * 4 + 64 * 16 * 2;
  EXPECT_DOUBLE_EQ(be_->device_busy_until(), 100.0 + kLaunch + bytes / kHbm);
  be_->Free(*w);
  be_->Free(*dst);
  be_->Free(*idx);
}

TEST_F(EmulatedBackendTest, SixteenBitAdamWCostsTwoByteSectorsAndAnFp32Master) {
  const int64_t rows = 64, cols = 64, ncols = 16;
  std::vector<void*> bufs;
  for (size_t bytes : {size_t{rows * cols * 2}, size_t{ncols * 4}, size_t{ncols * 8},
                       size_t{rows * ncols * 4}, size_t{rows * ncols * 4},
                       size_t{rows * ncols * 4}, size_t{rows * ncols * 4}}) {
    absl::StatusOr<void*> p = be_->Alloc(bytes);
    ASSERT_TRUE(p.ok());
    bufs.push_back(*p);
  }
  std::vector<int32_t> columns(ncols);
  std::iota(columns.begin(), columns.end(), 0);  // one 32-byte sector of each bf16 row
  std::memcpy(bufs[1], columns.data(), ncols * 4);
  const std::vector<int64_t> steps(ncols, 1);
  std::memcpy(bufs[2], steps.data(), ncols * 8);
  auto f = [&](int i) { return static_cast<float*>(bufs[i]); };
  ASSERT_TRUE(be_->SelectiveAdamW16(AdamWHyper(), 1.0f, bufs[0], PackDType::kBF16, rows, cols,
                                    static_cast<int32_t*>(bufs[1]), ncols,
                                    static_cast<int64_t*>(bufs[2]), f(3), f(4), f(5), f(6))
                  .ok());
  // grad read, master / m / v read and written: 28 B per element; W's
  // sector written as a read-modify-write; indices and counts.
  const double bytes = 64 * 16 * 28 + 2 * 64 * 1 * 32 + 16 * 12;
  EXPECT_DOUBLE_EQ(be_->device_busy_until(), 100.0 + kLaunch + bytes / kHbm);
  EXPECT_EQ(be_->SelectiveAdamW16(AdamWHyper(), 1.0f, bufs[0], PackDType::kF32, rows, cols,
                                  static_cast<int32_t*>(bufs[1]), ncols,
                                  static_cast<int64_t*>(bufs[2]), f(3), f(4), f(5), f(6))
                .code(),
            absl::StatusCode::kInvalidArgument);
  for (void* p : bufs) be_->Free(p);
}

TEST_F(EmulatedBackendTest, FactoredStepCostsTheGradientAndWsSectors) {
  const int64_t rows = 64, cols = 64, ncols = 16;
  std::vector<void*> bufs;
  for (size_t bytes : {size_t{rows * cols * 4}, size_t{ncols * 4}, size_t{rows * ncols * 4},
                       size_t{rows * 4}, size_t{ncols * 4}}) {
    absl::StatusOr<void*> p = be_->Alloc(bytes);
    ASSERT_TRUE(p.ok());
    bufs.push_back(*p);
  }
  std::vector<int32_t> columns(ncols);
  std::iota(columns.begin(), columns.end(), 0);  // two 32-byte sectors of each fp32 row
  std::memcpy(bufs[1], columns.data(), ncols * 4);
  auto f = [&](int i) { return static_cast<float*>(bufs[i]); };
  ASSERT_TRUE(be_->FactoredStep(1e-3f, 1e-8f, bufs[0], PackDType::kF32, rows, cols,
                                static_cast<int32_t*>(bufs[1]), ncols, f(2), f(3), f(4), 1.0f)
                  .ok());
  // The gradient read (4 B per element); W's sectors read and written; the
  // row moments, the column moments and indices.
  const double bytes = 64 * 16 * 4 + 2 * 64 * 2 * 32 + 64 * 4 + 16 * 8;
  EXPECT_DOUBLE_EQ(be_->device_busy_until(), 100.0 + kLaunch + bytes / kHbm);
  EXPECT_EQ(be_->FactoredStep(1e-3f, 1e-8f, bufs[0], PackDType::kInt8, rows, cols,
                              static_cast<int32_t*>(bufs[1]), ncols, f(2), f(3), f(4), 1.0f)
                .code(),
            absl::StatusCode::kInvalidArgument);
  for (void* p : bufs) be_->Free(p);
}

TEST(ColumnSectorsTest, CountsDistinctSectorsSortedOrNot) {
  const std::vector<int32_t> one = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(internal::ColumnSectorsPerRow(one.data(), 8), 1);
  const std::vector<int32_t> spread = {0, 8, 16};
  EXPECT_EQ(internal::ColumnSectorsPerRow(spread.data(), 3), 3);
  const std::vector<int32_t> unsorted = {9, 1, 15};
  EXPECT_EQ(internal::ColumnSectorsPerRow(unsorted.data(), 3), 2);
  EXPECT_EQ(internal::ColumnSectorsPerRow(nullptr, 0), 0);
  // Two-byte elements: 16 columns to a sector.
  EXPECT_EQ(internal::ColumnSectorsPerRow(spread.data(), 3, 2), 2);
}

TEST_F(EmulatedBackendTest, SmallCopiesMoveBytesLargeOnesOnlyTheFirstTime) {
  std::vector<int32_t> a(16, 7), b(16, 9);
  absl::StatusOr<void*> small = be_->Alloc(64);
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE(be_->CopyToDevice(*small, a.data(), 64).ok());
  ASSERT_TRUE(be_->CopyToDevice(*small, b.data(), 64).ok());
  EXPECT_EQ(static_cast<int32_t*>(*small)[3], 9) << "control data always moves";

  const size_t big = EmulatedBackend::kControlCopyBytes * 2;
  std::vector<char> x(big, 'x'), y(big, 'y');
  absl::StatusOr<void*> dev = be_->Alloc(big);
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(be_->CopyToDevice(*dev, x.data(), big).ok());
  ASSERT_TRUE(be_->CopyToDevice(*dev, y.data(), big).ok());
  EXPECT_EQ(static_cast<char*>(*dev)[big - 1], 'x')
      << "bulk bytes are made once; later copies only cost time";
  EXPECT_DOUBLE_EQ(be_->h2d_bytes(), 128.0 + 2.0 * static_cast<double>(big));
  be_->Free(*small);
  be_->Free(*dev);
}

TEST_F(EmulatedBackendTest, FirstPackWritesTheCpuBackendsBytes) {
  const int64_t rows = 64, cols = 48;
  std::vector<float> w(rows * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(i % 97) - 3.0f;
  const std::vector<int32_t> columns = {1, 5, 17, 40};
  const size_t out_bytes = rows * columns.size() * 2;
  std::vector<char> got(out_bytes), want(out_bytes);
  ASSERT_TRUE(be_->PackColumns(w.data(), rows, cols, columns.data(), 4, PackDType::kBF16,
                               got.data(), nullptr)
                  .ok());
  std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  ASSERT_TRUE(
      cpu->PackColumns(w.data(), rows, cols, columns.data(), 4, PackDType::kBF16, want.data(), nullptr)
          .ok());
  EXPECT_EQ(got, want);
}

TEST_F(EmulatedBackendTest, ImportanceIsAFixedScoreAndTopKSelectsItExactly) {
  const int64_t rows = 8, cols = 100;
  std::vector<float> g1(rows * cols, 1.0f), g2(rows * cols, -5.0f), s1(cols), s2(cols);
  ASSERT_TRUE(be_->ColumnImportance(g1.data(), rows, cols, Importance::kL1, s1.data()).ok());
  ASSERT_TRUE(be_->ColumnImportance(g2.data(), rows, cols, Importance::kL1, s2.data()).ok());
  EXPECT_EQ(s1, s2) << "the score does not depend on the gradient (not numerics)";
  for (float s : s1) {
    EXPECT_GE(s, 0.0f);
    EXPECT_LT(s, 1.0f);
  }
  std::vector<int32_t> order(cols);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s1[a] > s1[b]; });
  std::vector<int32_t> want(order.begin(), order.begin() + 10);
  std::sort(want.begin(), want.end());
  std::vector<int32_t> got(10);
  ASSERT_TRUE(be_->TopK(s1.data(), cols, 10, got.data()).ok());
  EXPECT_EQ(got, want);
  EXPECT_GT(std::set<float>(s1.begin(), s1.end()).size(), 90u) << "scores are spread out";
}

TEST_F(EmulatedBackendTest, BadArgumentsAreRefusedWithoutTouchingTheClock) {
  std::vector<float> w(16);
  const std::vector<int32_t> columns = {0, 4};
  EXPECT_EQ(be_->PackColumns(w.data(), 4, 4, columns.data(), 2, PackDType::kF32, nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(be_->operations(), 0);
}

}  // namespace
}  // namespace zenflow::worker
