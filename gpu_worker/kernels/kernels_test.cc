// Parity tests for the worker backends: every Backend kernel against the
// single-threaded references of kernels_ref.h, on the CPU backend (with and
// without its hand-written SIMD kernels, several thread counts) and on the
// CUDA backend (skipped when no device is visible). Exact where the math is
// identical (packing, applying, top-k), within a small tolerance where the
// summation order or multiply-add contraction may differ (importance, AdamW,
// norm). Also: the references against hand-computed numbers and against
// common/selection, and argument errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/selection.h"
#include "gmock/gmock.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/kernels/backend_common.h"
#include "gpu_worker/kernels/kernels_ref.h"
#include "gtest/gtest.h"

namespace zenflow::worker {
namespace {

using ::testing::HasSubstr;

constexpr PackDType kAllDTypes[] = {PackDType::kF32, PackDType::kBF16, PackDType::kF16,
                                    PackDType::kInt8};

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// |x - ref| <= atol + rtol * |ref|, with NaNs matching NaNs.
::testing::AssertionResult Near(const std::vector<float>& got, const std::vector<float>& want,
                                double atol, double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(static_cast<double>(want[i])))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", reference " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Random data generator; `specials` mixes in the values that stress the
// encoders: signed zeros, denormals, NaNs with payloads, infinities, bf16 /
// fp16 rounding ties and fp16 overflow / underflow boundaries.
class Data {
 public:
  explicit Data(uint32_t seed) : rng_(seed) {}

  float Uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::vector<float> Floats(size_t n, float lo, float hi, bool specials = false) {
    static const uint32_t kSpecial[] = {
        0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x00400000u,  // zeros, denormals
        0x7FC00000u, 0xFFC00001u, 0x7FA12345u, 0x7F800001u,               // NaNs
        0x7F800000u, 0xFF800000u, 0x7F7FFFFFu,                            // inf, max
        0x3F808000u, 0x3F818000u, 0xBF808000u, 0x3F800001u,               // bf16 ties
        0x3F801000u, 0x3F803000u, 0x477FF000u, 0x477FEFFFu,               // fp16 ties, 65520
        0x33000000u, 0x33000001u, 0x387FC000u, 0x38800000u,               // fp16 small
    };
    std::vector<float> v(n);
    for (float& x : v) {
      x = Uniform(lo, hi);
      if (specials && Int(0, 9) == 0) {
        x = FromBits(kSpecial[Int(0, static_cast<int>(std::size(kSpecial)) - 1)]);
      }
    }
    return v;
  }

 private:
  std::mt19937 rng_;
};

// Distinct columns in [0, cols), in the given style.
enum class ColStyle { kAll, kSkipTenth, kRandomSorted, kRandomUnsorted, kSparse };

std::vector<int32_t> MakeColumns(ColStyle style, int64_t cols, int64_t want, Data* d) {
  std::vector<int32_t> all(static_cast<size_t>(cols));
  std::iota(all.begin(), all.end(), 0);
  std::vector<int32_t> out;
  switch (style) {
    case ColStyle::kAll:
      out = all;
      break;
    case ColStyle::kSkipTenth:
      for (int32_t j : all) {
        if (j % 10 != 0) out.push_back(j);
      }
      break;
    case ColStyle::kSparse:
      for (int64_t j = 0; j < cols; j += 3) out.push_back(static_cast<int32_t>(j));
      break;
    case ColStyle::kRandomSorted:
    case ColStyle::kRandomUnsorted: {
      std::mt19937 rng(static_cast<uint32_t>(d->Int(0, 1 << 30)));
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(static_cast<size_t>(std::min(want, cols)));
      if (style == ColStyle::kRandomSorted) std::sort(all.begin(), all.end());
      out = all;
      break;
    }
  }
  return out;
}

struct BackendCase {
  std::string name;
  bool cuda = false;
  int threads = 1;
  bool simd = true;
};

std::string CaseName(const ::testing::TestParamInfo<BackendCase>& info) { return info.param.name; }

void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

// Holds one backend and frees what a test allocated on it.
class BackendTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    const BackendCase& c = GetParam();
    if (c.cuda) {
      if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
      absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(0);
      ASSERT_TRUE(b.ok()) << b.status();
      be_ = std::move(*b);
    } else {
      be_ = internal::MakeCpuBackendForTest(c.threads, c.simd);
    }
  }

  void TearDown() override {
    if (be_ == nullptr) return;
    EXPECT_TRUE(be_->Synchronize().ok());
    for (void* p : allocs_) be_->Free(p);
  }

  // Backend memory holding `bytes` (at least one byte).
  void* Raw(size_t bytes) {
    absl::StatusOr<void*> p = be_->Alloc(std::max<size_t>(bytes, 1));
    if (!p.ok()) {
      ADD_FAILURE() << p.status();
      return nullptr;
    }
    allocs_.push_back(*p);
    return *p;
  }

  template <typename T>
  T* Dev(size_t n) {
    return static_cast<T*>(Raw(n * sizeof(T)));
  }

  template <typename T>
  T* Upload(const std::vector<T>& host) {
    T* p = Dev<T>(host.size());
    if (p != nullptr && !host.empty()) {
      EXPECT_TRUE(be_->CopyToDevice(p, host.data(), host.size() * sizeof(T)).ok());
    }
    return p;
  }

  template <typename T>
  std::vector<T> Download(const T* p, size_t n) {
    std::vector<T> host(n);
    if (n > 0) {
      EXPECT_TRUE(be_->CopyToHost(host.data(), p, n * sizeof(T)).ok());
    }
    const absl::Status s = be_->Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    return host;
  }

  // A call's error, whether reported by the call itself or at Synchronize().
  absl::Status Outcome(absl::Status call) {
    if (!call.ok()) return call;
    return be_->Synchronize();
  }

  std::unique_ptr<Backend> be_;
  std::vector<void*> allocs_;
};

// ---------------------------------------------------------------------------
// Memory.
// ---------------------------------------------------------------------------

TEST_P(BackendTest, AllocIsZeroedAndCopiesRoundTrip) {
  const size_t n = 1000;
  const std::vector<float> zeros = Download(Dev<float>(n), n);
  EXPECT_TRUE(std::all_of(zeros.begin(), zeros.end(), [](float x) { return Bits(x) == 0; }));

  Data d(1);
  const std::vector<float> host = d.Floats(n, -1, 1);
  float* a = Upload(host);
  float* b = Dev<float>(n);
  ASSERT_TRUE(be_->CopyDeviceToDevice(b, a, n * sizeof(float)).ok());
  EXPECT_EQ(Download(b, n), host);

  absl::StatusOr<void*> pinned = be_->AllocHost(64);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  std::memset(*pinned, 7, 64);
  be_->FreeHost(*pinned);
  EXPECT_TRUE(be_->CopyToDevice(a, host.data(), 0).ok());
}

// ---------------------------------------------------------------------------
// ColumnImportance.
// ---------------------------------------------------------------------------

TEST_P(BackendTest, ColumnImportanceMatchesReference) {
  struct Shape {
    int64_t rows, cols;
  };
  const Shape shapes[] = {{0, 0},    {0, 5},    {5, 0},   {1, 1},      {3, 7},
                          {256, 10}, {257, 33}, {600, 1}, {1000, 2100}};
  Data d(2);
  for (const Shape& s : shapes) {
    const std::vector<float> g = d.Floats(static_cast<size_t>(s.rows * s.cols), -3, 3);
    const float* dg = Upload(g);
    for (Importance kind : {Importance::kL1, Importance::kL2Squared}) {
      SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols, kind == Importance::kL1 ? " L1" : " L2"));
      std::vector<float> want(static_cast<size_t>(s.cols));
      RefColumnImportance(g.data(), s.rows, s.cols, kind, want.data());
      float* out = Dev<float>(static_cast<size_t>(s.cols));
      ASSERT_TRUE(be_->ColumnImportance(dg, s.rows, s.cols, kind, out).ok());
      // Backends sum in blocks of rows; the reference in one sequence.
      const std::vector<float> got = Download(out, static_cast<size_t>(s.cols));
      EXPECT_TRUE(Near(got, want, 1e-6, 2e-5));
      // ...but every backend uses the same blocks and order: bit-identical.
      std::vector<float> cpu(static_cast<size_t>(s.cols));
      ASSERT_TRUE(
          MakeCpuBackend(1)->ColumnImportance(g.data(), s.rows, s.cols, kind, cpu.data()).ok());
      EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size() * sizeof(float)), 0);
    }
  }
}

// ---------------------------------------------------------------------------
// TopK.
// ---------------------------------------------------------------------------

TEST_P(BackendTest, TopKMatchesReferenceWithTies) {
  Data d(3);
  for (int64_t cols : {1, 2, 17, 1000, 5000, 70000}) {
    // Few distinct values: lots of ties, which go to the lower index.
    std::vector<float> scores(static_cast<size_t>(cols));
    for (float& x : scores) x = static_cast<float>(d.Int(0, 7));
    const float* ds = Upload(scores);
    for (int64_t k : {int64_t{0}, int64_t{1}, cols / 3, cols - 1, cols}) {
      SCOPED_TRACE(absl::StrCat("cols=", cols, " k=", k));
      std::vector<int32_t> want(static_cast<size_t>(k));
      RefTopK(scores.data(), cols, k, want.data());
      int32_t* out = Dev<int32_t>(static_cast<size_t>(k));
      ASSERT_TRUE(be_->TopK(ds, cols, k, out).ok());
      EXPECT_EQ(Download(out, static_cast<size_t>(k)), want);
    }
  }
}

TEST_P(BackendTest, TopKOrdersSpecialScores) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // NaN ranks above +inf; -0 ties with +0 (lower index first).
  const std::vector<float> scores = {1.0f, -0.0f, nan, 0.0f,  -inf,  inf,
                                     2.0f, -1.0f, nan, -0.0f, 1e-45f};
  const int64_t cols = static_cast<int64_t>(scores.size());
  const float* ds = Upload(scores);
  for (int64_t k = 0; k <= cols; ++k) {
    std::vector<int32_t> want(static_cast<size_t>(k));
    RefTopK(scores.data(), cols, k, want.data());
    int32_t* out = Dev<int32_t>(static_cast<size_t>(k));
    ASSERT_TRUE(be_->TopK(ds, cols, k, out).ok());
    EXPECT_EQ(Download(out, static_cast<size_t>(k)), want) << "k=" << k;
  }
  std::vector<int32_t> top4(4);
  RefTopK(scores.data(), cols, 4, top4.data());
  EXPECT_EQ(top4, (std::vector<int32_t>{2, 5, 6, 8}));  // NaN, NaN, +inf, 2.
}

// ---------------------------------------------------------------------------
// PackColumns / ApplyColumns.
// ---------------------------------------------------------------------------

struct ColumnShape {
  int64_t rows;
  int64_t cols;
  ColStyle style;
  int64_t want;  // Column count for the random styles.
};

// Odd sizes, tiles' edges, the SIMD path's 32/128-row steps and 256-column
// staging spans, unsorted and sparse selections.
const ColumnShape kColumnShapes[] = {
    {0, 5, ColStyle::kRandomUnsorted, 2}, {1, 1, ColStyle::kAll, 1},
    {7, 3, ColStyle::kRandomUnsorted, 3}, {33, 50, ColStyle::kRandomUnsorted, 20},
    {64, 40, ColStyle::kAll, 40},         {65, 100, ColStyle::kSkipTenth, 0},
    {96, 300, ColStyle::kSkipTenth, 0},   {130, 300, ColStyle::kRandomSorted, 77},
    {160, 97, ColStyle::kSparse, 0},      {257, 200, ColStyle::kRandomUnsorted, 150},
    {128, 700, ColStyle::kSkipTenth, 0},  {40, 17, ColStyle::kAll, 17},
    {5, 1, ColStyle::kRandomSorted, 0},
};

TEST_P(BackendTest, PackColumnsMatchesReferenceBitForBit) {
  Data d(4);
  for (const ColumnShape& s : kColumnShapes) {
    const std::vector<float> w = d.Floats(static_cast<size_t>(s.rows * s.cols), -4, 4, true);
    std::vector<int32_t> columns = MakeColumns(s.style, s.cols, s.want, &d);
    if (s.style == ColStyle::kRandomUnsorted && columns.size() > 2) {
      columns.push_back(columns[0]);  // Packing may repeat a column.
    }
    const int64_t ncols = static_cast<int64_t>(columns.size());
    const float* dw = Upload(w);
    const int32_t* dc = Upload(columns);
    for (PackDType dtype : kAllDTypes) {
      for (int offset : {0, 1}) {  // offset 1: packed data not line-aligned.
        SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols, " ncols=", ncols, " ",
                                  internal::PackDTypeName(dtype), " offset=", offset));
        const size_t esize = PackDTypeSize(dtype);
        const size_t bytes = static_cast<size_t>(s.rows * ncols) * esize;
        std::vector<char> want(bytes);
        std::vector<float> want_scales(static_cast<size_t>(ncols));
        RefPackColumns(w.data(), s.rows, s.cols, columns.data(), ncols, dtype, want.data(),
                       want_scales.data());
        char* dst = static_cast<char*>(Raw(bytes + esize));
        float* scales = Dev<float>(static_cast<size_t>(ncols));
        ASSERT_TRUE(
            be_->PackColumns(dw, s.rows, s.cols, dc, ncols, dtype, dst + offset * esize, scales)
                .ok());
        const std::vector<char> got = Download(dst + offset * esize, bytes);
        EXPECT_TRUE(got == want) << "packed bytes differ";
        if (got != want) {
          for (size_t i = 0; i < bytes; ++i) {
            if (got[i] != want[i]) {
              ADD_FAILURE() << "first difference at byte " << i << " (value " << i / esize % s.rows
                            << " of packed column " << i / esize / s.rows << ")";
              break;
            }
          }
        }
        if (dtype == PackDType::kInt8) {
          const std::vector<float> got_scales = Download(scales, static_cast<size_t>(ncols));
          EXPECT_EQ(std::memcmp(got_scales.data(), want_scales.data(),
                                want_scales.size() * sizeof(float)),
                    0);
        }
      }
    }
  }
}

TEST_P(BackendTest, ApplyColumnsMatchesReferenceBitForBit) {
  Data d(5);
  for (const ColumnShape& s : kColumnShapes) {
    const std::vector<int32_t> columns = MakeColumns(s.style, s.cols, s.want, &d);  // Distinct.
    const int64_t ncols = static_cast<int64_t>(columns.size());
    const std::vector<float> w0 = d.Floats(static_cast<size_t>(s.rows * s.cols), -2, 2);
    const std::vector<float> values = d.Floats(static_cast<size_t>(s.rows * s.cols), -3, 3);
    const int32_t* dc = Upload(columns);
    for (PackDType dtype : kAllDTypes) {
      // Encoded source: the reference packing of finite values.
      std::vector<char> src(static_cast<size_t>(s.rows * ncols) * PackDTypeSize(dtype));
      std::vector<float> scales(static_cast<size_t>(ncols));
      RefPackColumns(values.data(), s.rows, s.cols, columns.data(), ncols, dtype, src.data(),
                     scales.data());
      const char* dsrc = Upload(src);
      const float* dscales = Upload(scales);
      for (bool add : {false, true}) {
        SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols, " ncols=", ncols, " ",
                                  internal::PackDTypeName(dtype), add ? " add" : " set"));
        std::vector<float> want = w0;
        RefApplyColumns(want.data(), s.rows, s.cols, columns.data(), ncols, dtype, src.data(),
                        scales.data(), add);
        float* dw = Upload(w0);
        ASSERT_TRUE(
            be_->ApplyColumns(dw, s.rows, s.cols, dc, ncols, dtype, dsrc, dscales, add).ok());
        const std::vector<float> got = Download(dw, w0.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
            << "parameters differ";
      }
    }
  }
}

TEST_P(BackendTest, Int8RoundTripWithinHalfAStep) {
  Data d(6);
  const int64_t rows = 200;
  const int64_t cols = 64;
  std::vector<float> w = d.Floats(static_cast<size_t>(rows * cols), -5, 5);
  for (int64_t r = 0; r < rows; ++r) w[static_cast<size_t>(r * cols + 3)] = 0.0f;  // Zero column.
  const std::vector<int32_t> columns = MakeColumns(ColStyle::kSkipTenth, cols, 0, &d);
  const int64_t ncols = static_cast<int64_t>(columns.size());
  const float* dw = Upload(w);
  const int32_t* dc = Upload(columns);
  int8_t* packed = Dev<int8_t>(static_cast<size_t>(rows * ncols));
  float* scales = Dev<float>(static_cast<size_t>(ncols));
  ASSERT_TRUE(be_->PackColumns(dw, rows, cols, dc, ncols, PackDType::kInt8, packed, scales).ok());
  float* back = Dev<float>(static_cast<size_t>(rows * cols));
  ASSERT_TRUE(be_->ApplyColumns(back, rows, cols, dc, ncols, PackDType::kInt8, packed, scales,
                                /*add=*/false)
                  .ok());
  const std::vector<float> got = Download(back, static_cast<size_t>(rows * cols));
  const std::vector<float> s = Download(scales, static_cast<size_t>(ncols));
  for (int64_t c = 0; c < ncols; ++c) {
    const int64_t col = columns[static_cast<size_t>(c)];
    float max_abs = 0;
    for (int64_t r = 0; r < rows; ++r) {
      max_abs = std::max(max_abs, std::fabs(w[static_cast<size_t>(r * cols + col)]));
    }
    EXPECT_EQ(s[static_cast<size_t>(c)], max_abs / 127.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = static_cast<size_t>(r * cols + col);
      EXPECT_LE(std::fabs(w[i] - got[i]), 0.5f * s[static_cast<size_t>(c)] * (1 + 1e-5f) + 1e-30f)
          << "row " << r << " column " << col;
    }
  }
}

// ---------------------------------------------------------------------------
// SelectiveAdamW.
// ---------------------------------------------------------------------------

TEST_P(BackendTest, SelectiveAdamWMatchesReference) {
  struct Shape {
    int64_t rows, cols;
    ColStyle style;
    int64_t want;
  };
  const Shape shapes[] = {{0, 4, ColStyle::kAll, 0},
                          {1, 1, ColStyle::kAll, 0},
                          {37, 50, ColStyle::kRandomUnsorted, 20},
                          {130, 64, ColStyle::kRandomSorted, 40},
                          {600, 20, ColStyle::kAll, 0}};
  const int64_t kSteps[] = {1, 2, 3, 10, 1000, 1000000};
  Data d(7);
  AdamWHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols));
    const std::vector<int32_t> columns = MakeColumns(s.style, s.cols, s.want, &d);
    const int64_t ncols = static_cast<int64_t>(columns.size());
    const size_t n = static_cast<size_t>(s.rows * ncols);
    std::vector<float> w = d.Floats(static_cast<size_t>(s.rows * s.cols), -1, 1);
    std::vector<float> grad = d.Floats(n, -1, 1);
    std::vector<float> m = d.Floats(n, -0.1f, 0.1f);
    std::vector<float> v = d.Floats(n, 0.01f, 0.02f);
    std::vector<int64_t> steps(static_cast<size_t>(ncols));
    for (size_t i = 0; i < steps.size(); ++i) steps[i] = kSteps[i % std::size(kSteps)];
    float* dw = Upload(w);
    float* dm = Upload(m);
    float* dv = Upload(v);
    ASSERT_TRUE(be_->SelectiveAdamW(h, 0.5f, dw, s.rows, s.cols, Upload(columns), ncols,
                                    Upload(steps), Upload(grad), dm, dv)
                    .ok());
    RefSelectiveAdamW(h, 0.5f, w.data(), s.rows, s.cols, columns.data(), ncols, steps.data(),
                      grad.data(), m.data(), v.data());
    EXPECT_TRUE(Near(Download(dw, w.size()), w, 1e-6, 1e-6)) << "w";
    EXPECT_TRUE(Near(Download(dm, n), m, 1e-6, 1e-6)) << "m";
    EXPECT_TRUE(Near(Download(dv, n), v, 1e-6, 1e-6)) << "v";
  }
}

// ---------------------------------------------------------------------------
// 16-bit parameters: ApplyColumns16, SelectiveAdamW16, Convert.
// ---------------------------------------------------------------------------

constexpr PackDType k16BitDTypes[] = {PackDType::kBF16, PackDType::kF16};

// Random 16-bit parameter bits of finite values in [-2, 2].
std::vector<uint16_t> Param16(PackDType dtype, size_t n, Data* d) {
  std::vector<uint16_t> out(n);
  for (uint16_t& x : out) {
    const float f = d->Uniform(-2, 2);
    x = dtype == PackDType::kBF16 ? FloatToBf16(f) : FloatToF16(f);
  }
  return out;
}

TEST_P(BackendTest, ApplyColumns16MatchesReferenceBitForBit) {
  Data d(11);
  for (const ColumnShape& s : kColumnShapes) {
    const std::vector<int32_t> columns = MakeColumns(s.style, s.cols, s.want, &d);  // Distinct.
    const int64_t ncols = static_cast<int64_t>(columns.size());
    const size_t n = static_cast<size_t>(s.rows * ncols);
    const int32_t* dc = Upload(columns);
    for (PackDType w_dtype : k16BitDTypes) {
      const std::vector<uint16_t> w0 = Param16(w_dtype, static_cast<size_t>(s.rows * s.cols), &d);
      // fp32 sources with the encoders' special values (rounding ties,
      // fp16 overflow, NaNs), and sources already in the parameter's dtype.
      const std::vector<float> f32 = d.Floats(n, -3, 3, /*specials=*/true);
      const std::vector<uint16_t> own = Param16(w_dtype, n, &d);
      for (PackDType src_dtype : {PackDType::kF32, w_dtype}) {
        SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols, " ncols=", ncols, " w=",
                                  internal::PackDTypeName(w_dtype),
                                  " src=", internal::PackDTypeName(src_dtype)));
        const void* src = src_dtype == PackDType::kF32 ? static_cast<const void*>(f32.data())
                                                       : static_cast<const void*>(own.data());
        std::vector<uint16_t> want = w0;
        RefApplyColumns16(want.data(), w_dtype, s.rows, s.cols, columns.data(), ncols, src_dtype,
                          src);
        uint16_t* dw = Upload(w0);
        const void* dsrc =
            src_dtype == PackDType::kF32 ? static_cast<void*>(Upload(f32)) : Upload(own);
        ASSERT_TRUE(
            be_->ApplyColumns16(dw, w_dtype, s.rows, s.cols, dc, ncols, src_dtype, dsrc).ok());
        EXPECT_TRUE(Download(dw, w0.size()) == want) << "parameters differ";
      }
    }
  }
}

TEST_P(BackendTest, SelectiveAdamW16MatchesReference) {
  struct Shape {
    int64_t rows, cols;
    ColStyle style;
    int64_t want;
  };
  const Shape shapes[] = {{0, 4, ColStyle::kAll, 0},
                          {1, 1, ColStyle::kAll, 0},
                          {37, 50, ColStyle::kRandomUnsorted, 20},
                          {130, 64, ColStyle::kRandomSorted, 40},
                          {600, 20, ColStyle::kAll, 0}};
  const int64_t kSteps[] = {1, 2, 3, 10, 1000, 1000000};
  Data d(12);
  AdamWHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  for (PackDType w_dtype : k16BitDTypes) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols, " ", internal::PackDTypeName(w_dtype)));
      const std::vector<int32_t> columns = MakeColumns(s.style, s.cols, s.want, &d);
      const int64_t ncols = static_cast<int64_t>(columns.size());
      const size_t n = static_cast<size_t>(s.rows * ncols);
      const std::vector<uint16_t> w0 = Param16(w_dtype, static_cast<size_t>(s.rows * s.cols), &d);
      std::vector<float> master = d.Floats(n, -1, 1);
      std::vector<float> grad = d.Floats(n, -1, 1);
      std::vector<float> m = d.Floats(n, -0.1f, 0.1f);
      std::vector<float> v = d.Floats(n, 0.01f, 0.02f);
      std::vector<int64_t> steps(static_cast<size_t>(ncols));
      for (size_t i = 0; i < steps.size(); ++i) steps[i] = kSteps[i % std::size(kSteps)];
      uint16_t* dw = Upload(w0);
      float* dmaster = Upload(master);
      float* dm = Upload(m);
      float* dv = Upload(v);
      ASSERT_TRUE(be_->SelectiveAdamW16(h, 0.5f, dw, w_dtype, s.rows, s.cols, Upload(columns),
                                        ncols, Upload(steps), Upload(grad), dmaster, dm, dv)
                      .ok());
      std::vector<uint16_t> want_w = w0;
      RefSelectiveAdamW16(h, 0.5f, want_w.data(), w_dtype, s.rows, s.cols, columns.data(), ncols,
                          steps.data(), grad.data(), master.data(), m.data(), v.data());
      const std::vector<float> got_master = Download(dmaster, n);
      EXPECT_TRUE(Near(got_master, master, 1e-6, 1e-6)) << "master";
      EXPECT_TRUE(Near(Download(dm, n), m, 1e-6, 1e-6)) << "m";
      EXPECT_TRUE(Near(Download(dv, n), v, 1e-6, 1e-6)) << "v";
      // W holds exactly the backend's own master, rounded (the master may
      // differ from the reference's in its last fp32 bit, which can move a
      // rounding: compare against what this backend computed), and the
      // other columns are untouched.
      std::vector<uint16_t> expect_w = w0;
      for (int64_t c = 0; c < ncols; ++c) {
        for (int64_t r = 0; r < s.rows; ++r) {
          const float x = got_master[static_cast<size_t>(c * s.rows + r)];
          expect_w[static_cast<size_t>(r * s.cols + columns[static_cast<size_t>(c)])] =
              w_dtype == PackDType::kBF16 ? FloatToBf16(x) : FloatToF16(x);
        }
      }
      const std::vector<uint16_t> got_w = Download(dw, w0.size());
      EXPECT_TRUE(got_w == expect_w) << "W is not the rounded master";
      // And against the reference: at most one unit in the last place apart.
      for (size_t i = 0; i < got_w.size(); ++i) {
        const int diff = std::abs(static_cast<int>(got_w[i]) - static_cast<int>(want_w[i]));
        ASSERT_LE(diff, 1) << "W element " << i;
      }
    }
  }
}

TEST_P(BackendTest, ConvertMatchesReferenceBitForBit) {
  Data d(13);
  const PackDType kFloatTypes[] = {PackDType::kF32, PackDType::kBF16, PackDType::kF16};
  for (int64_t n : {0, 1, 7, 1000, 70000}) {
    const std::vector<float> f32 = d.Floats(static_cast<size_t>(n), -70000, 70000, true);
    for (PackDType from : kFloatTypes) {
      // The source: fp32 values with specials, or their reference encoding.
      std::vector<char> src(static_cast<size_t>(n) * PackDTypeSize(from));
      RefConvert(f32.data(), PackDType::kF32, src.data(), from, n);
      const char* dsrc = Upload(src);
      for (PackDType to : kFloatTypes) {
        SCOPED_TRACE(absl::StrCat("n=", n, " ", internal::PackDTypeName(from), " -> ",
                                  internal::PackDTypeName(to)));
        const size_t bytes = static_cast<size_t>(n) * PackDTypeSize(to);
        std::vector<char> want(bytes);
        RefConvert(src.data(), from, want.data(), to, n);
        char* dst = static_cast<char*>(Raw(bytes));
        ASSERT_TRUE(be_->Convert(dsrc, from, dst, to, n).ok());
        EXPECT_TRUE(Download(dst, bytes) == want) << "converted bytes differ";
      }
    }
  }
}

// ---------------------------------------------------------------------------
// SquaredNorm.
// ---------------------------------------------------------------------------

TEST_P(BackendTest, SquaredNormMatchesReference) {
  Data d(8);
  for (int64_t n : {0, 1, 5, 1000, 65536 + 7, 300000}) {
    const std::vector<float> x = d.Floats(static_cast<size_t>(n), -10, 10);
    double got = -1;
    ASSERT_TRUE(be_->SquaredNorm(Upload(x), n, &got).ok());
    ASSERT_TRUE(be_->Synchronize().ok());
    const double want = RefSquaredNorm(x.data(), n);
    EXPECT_NEAR(got, want, 1e-12 * want) << "n=" << n;
  }
}

// ---------------------------------------------------------------------------
// Argument errors.
// ---------------------------------------------------------------------------

TEST_P(BackendTest, RejectsBadArguments) {
  float* f = Dev<float>(64);
  int32_t* idx = Dev<int32_t>(8);
  const std::vector<int32_t> in_range = {0, 1};
  const int32_t* cols2 = Upload(in_range);

  absl::Status s = be_->ColumnImportance(f, -1, 4, Importance::kL1, f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rows must be >= 0, got -1"));

  s = be_->TopK(f, 4, 5, idx);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("k must be in [0, cols] = [0, 4], got 5"));
  EXPECT_EQ(be_->TopK(f, 4, -1, idx).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(be_->TopK(f, -4, 0, idx).code(), absl::StatusCode::kInvalidArgument);

  s = be_->PackColumns(f, 4, 4, cols2, -2, PackDType::kBF16, f, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ncols must be >= 0"));
  s = be_->PackColumns(f, 4, 4, cols2, 2, PackDType::kInt8, f, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("scales"));
  EXPECT_EQ(be_->ApplyColumns(f, 4, -4, cols2, 2, PackDType::kF32, f, nullptr, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(be_->SquaredNorm(f, -1, nullptr).code(), absl::StatusCode::kInvalidArgument);
  double out;
  EXPECT_EQ(be_->SquaredNorm(f, 4, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(be_->SquaredNorm(f, 0, &out).ok());

  // Index contents live in backend memory: the CUDA backend reports them at
  // Synchronize(), the CPU backend on the call.
  const std::vector<int32_t> out_of_range = {0, 4};
  s = Outcome(be_->PackColumns(f, 4, 4, Upload(out_of_range), 2, PackDType::kF32, f, nullptr));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("PackColumns"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("outside [0, cols)"));
  EXPECT_TRUE(be_->Synchronize().ok()) << "the error is reported once";

  const std::vector<int32_t> repeated = {1, 3, 1};
  s = Outcome(be_->ApplyColumns(f, 4, 4, Upload(repeated), 3, PackDType::kF32, f, nullptr, true));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("more than once"));

  const std::vector<int64_t> zero_step = {1, 0};
  AdamWHyper h;
  s = Outcome(
      be_->SelectiveAdamW(h, 1.0f, f, 4, 4, cols2, 2, Upload(zero_step), f + 16, f + 32, f + 48));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("step"));

  // The 16-bit kernels: the parameter dtype, the source dtype, overlap.
  s = be_->ApplyColumns16(f, PackDType::kF32, 4, 4, cols2, 2, PackDType::kF32, f + 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("parameter dtype must be kBF16 or kF16"));
  s = be_->ApplyColumns16(f, PackDType::kBF16, 4, 4, cols2, 2, PackDType::kF16, f + 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("source dtype must be f32 or"));
  s = Outcome(be_->ApplyColumns16(f, PackDType::kBF16, 4, 4, Upload(repeated), 3,
                                  PackDType::kF32, f + 16));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ApplyColumns16"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("more than once"));
  s = Outcome(be_->SelectiveAdamW16(h, 1.0f, f, PackDType::kBF16, 4, 4, cols2, 2,
                                    Upload(zero_step), f + 16, f + 24, f + 32, f + 40));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("SelectiveAdamW16"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("step"));
  s = be_->Convert(f, PackDType::kF32, f + 2, PackDType::kBF16, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("overlap"));
  s = be_->Convert(f, PackDType::kInt8, f + 32, PackDType::kF32, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(be_->Synchronize().ok());

  h.beta1 = 1.0f;
  const std::vector<int64_t> ones = {1, 1};
  s = be_->SelectiveAdamW(h, 1.0f, f, 4, 4, cols2, 2, Upload(ones), f + 16, f + 32, f + 48);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("beta1 must be in [0, 1)"));
  EXPECT_TRUE(be_->Synchronize().ok());
}

std::vector<BackendCase> AllCases() {
  return {
      {"cpu_1thread", false, 1, true},
      {"cpu_3threads", false, 3, true},
      {"cpu_2threads_portable", false, 2, false},
      {"cuda", true, 1, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendTest, ::testing::ValuesIn(AllCases()), CaseName);

// ---------------------------------------------------------------------------
// Backend-independent checks.
// ---------------------------------------------------------------------------

TEST(CpuBackendTest, SumsAreIdenticalForEveryThreadCount) {
  Data d(9);
  const int64_t rows = 1100;
  const int64_t cols = 2500;
  const std::vector<float> g = d.Floats(static_cast<size_t>(rows * cols), -1, 1);
  std::vector<std::vector<float>> importance;
  std::vector<double> norms;
  for (int threads : {1, 2, 3, 5}) {
    std::unique_ptr<Backend> be = MakeCpuBackend(threads);
    std::vector<float> out(static_cast<size_t>(cols));
    ASSERT_TRUE(
        be->ColumnImportance(g.data(), rows, cols, Importance::kL2Squared, out.data()).ok());
    importance.push_back(out);
    double norm = 0;
    ASSERT_TRUE(be->SquaredNorm(g.data(), rows * cols, &norm).ok());
    norms.push_back(norm);
  }
  for (size_t i = 1; i < norms.size(); ++i) {
    EXPECT_EQ(std::memcmp(importance[i].data(), importance[0].data(), cols * sizeof(float)), 0);
    EXPECT_EQ(norms[i], norms[0]);
  }
}

TEST(KernelsRefTest, AdamWMatchesHandComputedValues) {
  // Column 2 of a 1x3 W: p=1, m=v=0, g=0.5, step 1, lr=0.1, wd=0.01:
  //   m = 0.1*0.5 = 0.05, v = 0.001*0.25 = 0.00025, p = 1*(1-0.001) = 0.999,
  //   bc1 = 0.1, bc2 = 0.001, sqrt(v)/sqrt(bc2) = 0.5,
  //   p = 0.999 - (0.1/0.1) * 0.05 / (0.5 + 1e-8) = 0.899000002.
  AdamWHyper h;
  h.lr = 0.1f;
  h.weight_decay = 0.01f;
  std::vector<float> w = {7.0f, 7.0f, 1.0f};
  std::vector<float> m = {0.0f};
  std::vector<float> v = {0.0f};
  const int32_t col2 = 2;
  const int64_t step1 = 1;
  const float g1 = 0.5f;
  RefSelectiveAdamW(h, 1.0f, w.data(), 1, 3, &col2, 1, &step1, &g1, m.data(), v.data());
  // The hand values use exact decimals; the kernel uses fp32 hyperparameters
  // (1 - 0.999f is 0.00099998713, 1.3e-5 below 0.001), hence the slack on v.
  EXPECT_NEAR(w[2], 0.899000002, 1e-6);
  EXPECT_NEAR(m[0], 0.05, 5e-8);
  EXPECT_NEAR(v[0], 0.00025, 5e-9);
  EXPECT_EQ(w[0], 7.0f);  // Unselected columns are untouched.
  EXPECT_EQ(w[1], 7.0f);

  // Column 0: p=2, m=0.1, v=0.01, grad=-2 with grad_scale 0.5 (g=-1), step 2,
  // lr=0.01, wd=0:
  //   m = 0.09 - 0.1 = -0.01, v = 0.00999 + 0.001 = 0.01099,
  //   bc1 = 1 - 0.81 = 0.19, bc2 = 1 - 0.998001 = 0.001999,
  //   p = 2 - (0.01/0.19) * -0.01 / (sqrt(0.01099/0.001999) + 1e-8)
  //     = 2 + 0.0526315789 * 0.01 / 2.344727932 = 2.000224467747.
  h.lr = 0.01f;
  h.weight_decay = 0.0f;
  w = {2.0f, 7.0f, 7.0f};
  m = {0.1f};
  v = {0.01f};
  const int32_t col0 = 0;
  const int64_t step2 = 2;
  const float g2 = -2.0f;
  RefSelectiveAdamW(h, 0.5f, w.data(), 1, 3, &col0, 1, &step2, &g2, m.data(), v.data());
  EXPECT_NEAR(w[0], 2.000224467747, 2e-6);
  EXPECT_NEAR(m[0], -0.01, 5e-8);  // 0.09 - 0.1 cancels: fp32 error of the terms.
  EXPECT_NEAR(v[0], 0.01099, 2e-8);
}

TEST(KernelsRefTest, TopKAgreesWithCommonSelection) {
  Data d(10);
  for (int64_t cols : {1, 9, 100, 3000}) {
    std::vector<float> scores(static_cast<size_t>(cols));
    for (float& x : scores) x = static_cast<float>(d.Int(0, 20)) * 0.25f;
    for (int64_t k : {int64_t{0}, int64_t{1}, cols / 2, cols}) {
      std::vector<int32_t> ref(static_cast<size_t>(k));
      RefTopK(scores.data(), cols, k, ref.data());
      EXPECT_EQ(ref, SelectTopK(scores, k)) << "cols=" << cols << " k=" << k;
    }
  }
}

TEST(KernelsRefTest, PackUsesCodecRounding) {
  const std::vector<float> w = {1.0f, FromBits(0x3F808000u), FromBits(0x3F818000u), 65520.0f};
  const int32_t col = 0;
  std::vector<uint16_t> bf16(4);
  std::vector<uint16_t> f16(4);
  // Column 0 of a 4x1 tensor.
  RefPackColumns(w.data(), 4, 1, &col, 1, PackDType::kBF16, bf16.data(), nullptr);
  RefPackColumns(w.data(), 4, 1, &col, 1, PackDType::kF16, f16.data(), nullptr);
  EXPECT_EQ(bf16, (std::vector<uint16_t>{0x3F80, 0x3F80, 0x3F82, FloatToBf16(65520.0f)}));
  EXPECT_EQ(f16[0], 0x3C00);
  EXPECT_EQ(f16[3], 0x7C00);  // 65520 rounds to infinity in fp16.
}

TEST(BackendApiTest, PackDTypeSizes) {
  EXPECT_EQ(PackDTypeSize(PackDType::kF32), 4u);
  EXPECT_EQ(PackDTypeSize(PackDType::kBF16), 2u);
  EXPECT_EQ(PackDTypeSize(PackDType::kF16), 2u);
  EXPECT_EQ(PackDTypeSize(PackDType::kInt8), 1u);
}

TEST(BackendApiTest, CudaAvailabilityIsReportedConsistently) {
  EXPECT_EQ(CudaCompiled(), ZF_EXPECT_CUDA_COMPILED != 0)
      << "the build's CUDA detection and the linked backend disagree";
  EXPECT_EQ(MakeCpuBackend(2)->name(), "cpu");
  if (CudaDeviceCount() == 0) {
    absl::StatusOr<std::unique_ptr<Backend>> be = MakeCudaBackend(0);
    EXPECT_EQ(be.status().code(), absl::StatusCode::kUnavailable) << be.status();
  } else {
    absl::StatusOr<std::unique_ptr<Backend>> be = MakeCudaBackend(0);
    ASSERT_TRUE(be.ok()) << be.status();
    EXPECT_EQ((*be)->name(), "cuda");
    EXPECT_EQ(MakeCudaBackend(CudaDeviceCount()).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace zenflow::worker
