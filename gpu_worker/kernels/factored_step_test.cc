// Backend::FactoredStep (the local step, docs/design.md rule 13) on every
// backend against the single-threaded reference (kernels_ref.h), bit for
// bit, for fp32, bf16 and fp16 parameters; its hand-computed value; and its
// argument checks. Beside kernels_test (which holds the other kernels' parity
// tests); the CUDA cases skip without a device.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "gmock/gmock.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/kernels/backend_common.h"
#include "gpu_worker/kernels/kernels_ref.h"
#include "gtest/gtest.h"

namespace zenflow::worker {
namespace {

using ::testing::HasSubstr;

struct Case {
  std::string name;
  bool cuda = false;
  int threads = 1;
  bool simd = true;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

class FactoredStepTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (GetParam().cuda) {
      if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
      absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(0);
      ASSERT_TRUE(b.ok()) << b.status();
      be_ = std::move(*b);
    } else {
      be_ = internal::MakeCpuBackendForTest(GetParam().threads, GetParam().simd);
    }
  }
  void TearDown() override {
    if (be_ == nullptr) return;
    EXPECT_TRUE(be_->Synchronize().ok());
    for (void* p : allocs_) be_->Free(p);
  }

  void* Upload(const void* host, size_t bytes) {
    absl::StatusOr<void*> p = be_->Alloc(std::max<size_t>(bytes, 1));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    allocs_.push_back(*p);
    if (bytes > 0) {
      EXPECT_TRUE(be_->CopyToDevice(*p, host, bytes).ok());
    }
    return *p;
  }
  template <typename T>
  T* Upload(const std::vector<T>& v) {
    return static_cast<T*>(Upload(v.data(), v.size() * sizeof(T)));
  }
  std::vector<char> Download(const void* p, size_t bytes) {
    std::vector<char> out(bytes);
    if (bytes > 0) {
      EXPECT_TRUE(be_->CopyToHost(out.data(), p, bytes).ok());
    }
    EXPECT_TRUE(be_->Synchronize().ok());
    return out;
  }
  absl::Status Outcome(absl::Status call) { return call.ok() ? be_->Synchronize() : call; }

  std::unique_ptr<Backend> be_;
  std::vector<void*> allocs_;
};

// Parameters of `dtype` as raw bytes, from values in [-2, 2].
std::vector<char> Params(PackDType dtype, size_t n, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> f(n);
  for (float& x : f) x = u(*rng);
  std::vector<char> raw(n * PackDTypeSize(dtype));
  const DType codec = dtype == PackDType::kF32    ? DType::kF32
                      : dtype == PackDType::kBF16 ? DType::kBF16
                                                  : DType::kF16;
  Encode(codec, f.data(), n, raw.data());
  return raw;
}

TEST_P(FactoredStepTest, MatchesReferenceBitForBit) {
  struct Shape {
    int64_t rows, cols, ncols;  // ncols distinct columns, shuffled
  };
  // Row counts off the vector width and the tiles (8, 64, 32), a single
  // element, and an empty selection.
  const Shape shapes[] = {{1, 1, 1}, {37, 50, 20}, {130, 64, 40}, {600, 20, 20}, {9, 5, 0}};
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (PackDType dtype : {PackDType::kF32, PackDType::kBF16, PackDType::kF16}) {
    for (const Shape& s : shapes) {
      for (float v_mean : {3e-4f, 0.0f}) {  // 0: no element has a scale
        SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols, " ncols=", s.ncols, " ",
                                  internal::PackDTypeName(dtype), " v_mean=", v_mean));
        std::vector<int32_t> columns(static_cast<size_t>(s.cols));
        std::iota(columns.begin(), columns.end(), 0);
        std::shuffle(columns.begin(), columns.end(), rng);
        columns.resize(static_cast<size_t>(s.ncols));
        const size_t n = static_cast<size_t>(s.rows * s.ncols);
        std::vector<float> grad(n), row_v(static_cast<size_t>(s.rows)),
            col_v(static_cast<size_t>(s.ncols));
        for (float& g : grad) g = u(rng);
        // Moments over several decades, with zeros (a row or column the
        // daemon never saw a gradient in).
        for (float& x : row_v) x = rng() % 7 == 0 ? 0.0f : std::pow(10.0f, -6.0f + 3.0f * std::fabs(u(rng)));
        for (float& x : col_v) x = rng() % 5 == 0 ? 0.0f : std::pow(10.0f, -6.0f + 3.0f * std::fabs(u(rng)));
        const std::vector<char> w0 = Params(dtype, static_cast<size_t>(s.rows * s.cols), &rng);
        std::vector<char> want = w0;
        RefFactoredStep(1e-2f, 1e-8f, want.data(), dtype, s.rows, s.cols, columns.data(), s.ncols,
                        grad.data(), row_v.data(), col_v.data(), v_mean);
        void* dw = Upload(w0.data(), w0.size());
        ASSERT_TRUE(be_->FactoredStep(1e-2f, 1e-8f, dw, dtype, s.rows, s.cols, Upload(columns),
                                      s.ncols, Upload(grad), Upload(row_v), Upload(col_v), v_mean)
                        .ok());
        EXPECT_TRUE(Download(dw, w0.size()) == want) << "parameters differ from the reference";
        if (v_mean == 0.0f || s.ncols == 0) {
          EXPECT_TRUE(want == w0) << "a step without a scale moved a parameter";
        } else if (n >= 100) {  // (a lone element may have no scale, or round back)
          EXPECT_FALSE(want == w0) << "the step moved nothing";
        }
      }
    }
  }
}

TEST_P(FactoredStepTest, HandComputedValue) {
  // vh = 4 * 9 / 36 = 1: w = 1 - (0.1 * 0.5) / (1 + 0) = 0.95; column 0
  // untouched; row 1 (row_v 0) untouched.
  const std::vector<float> w = {7.0f, 1.0f, 7.0f, 2.0f};  // [2, 2]
  const std::vector<int32_t> columns = {1};
  const std::vector<float> grad = {0.5f, 0.25f};
  const std::vector<float> row_v = {4.0f, 0.0f};
  const std::vector<float> col_v = {9.0f};
  float* dw = Upload(w);
  ASSERT_TRUE(be_->FactoredStep(0.1f, 0.0f, dw, PackDType::kF32, 2, 2, Upload(columns), 1,
                                Upload(grad), Upload(row_v), Upload(col_v), 36.0f)
                  .ok());
  const std::vector<char> raw = Download(dw, 16);
  float got[4];
  std::memcpy(got, raw.data(), 16);
  EXPECT_EQ(got[0], 7.0f);
  EXPECT_EQ(got[1], 1.0f - 0.1f * 0.5f);
  EXPECT_EQ(got[2], 7.0f);
  EXPECT_EQ(got[3], 2.0f);
}

TEST_P(FactoredStepTest, RejectsBadArguments) {
  const std::vector<float> f(64, 1.0f);
  float* df = Upload(f);
  const std::vector<int32_t> two = {0, 1};
  const int32_t* cols2 = Upload(two);
  absl::Status s =
      be_->FactoredStep(0.1f, 1e-8f, df, PackDType::kInt8, 4, 4, cols2, 2, df, df, df, 1.0f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("parameter dtype must be f32, bf16 or f16"));
  s = be_->FactoredStep(-0.1f, 1e-8f, df, PackDType::kF32, 4, 4, cols2, 2, df, df, df, 1.0f);
  EXPECT_THAT(std::string(s.message()), HasSubstr("lr must be finite and >= 0"));
  s = be_->FactoredStep(0.1f, NAN, df, PackDType::kF32, 4, 4, cols2, 2, df, df, df, 1.0f);
  EXPECT_THAT(std::string(s.message()), HasSubstr("eps must be finite and >= 0"));
  s = be_->FactoredStep(0.1f, 1e-8f, df, PackDType::kF32, 4, 4, cols2, 2, df, nullptr, df, 1.0f);
  EXPECT_THAT(std::string(s.message()), HasSubstr("row_v is null"));
  const std::vector<int32_t> repeated = {1, 3, 1};
  s = Outcome(be_->FactoredStep(0.1f, 1e-8f, df, PackDType::kF32, 4, 4, Upload(repeated), 3, df,
                                df, df, 1.0f));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("FactoredStep"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("more than once"));
  EXPECT_TRUE(be_->Synchronize().ok()) << "the error is reported once";
}

INSTANTIATE_TEST_SUITE_P(Backends, FactoredStepTest,
                         ::testing::Values(Case{"cpu_1thread", false, 1, true},
                                           Case{"cpu_3threads", false, 3, true},
                                           Case{"cpu_2threads_portable", false, 2, false},
                                           Case{"cuda", true, 1, true}),
                         CaseName);

}  // namespace
}  // namespace zenflow::worker
