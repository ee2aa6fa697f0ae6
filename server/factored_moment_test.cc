// Unit tests of the factored second moment (docs/design.md rule 13): its
// value against a plain computation from v and the counts, its independence
// of the thread count, and its share of a delta message.
#include "server/factored_moment.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/thread_pool.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

constexpr float kBeta2 = 0.999f;

// A column-major v of `rows` x `cols` and per-column counts.
struct State {
  int64_t rows, cols;
  std::vector<float> v;
  std::vector<int64_t> count;
  State(int64_t r, int64_t c) : rows(r), cols(c), v(r * c), count(c) {
    for (int64_t j = 0; j < cols; ++j) {
      count[j] = 1 + (j % 3 == 0 ? 4 : 0);  // runs of equal and different counts
      for (int64_t i = 0; i < rows; ++i) {
        v[j * rows + i] = 1e-6f * static_cast<float>(1 + (i * 7 + j * 13) % 97) *
                          static_cast<float>(1 + i % 5);
      }
    }
  }
  FactoredMomentTensor Tensor(const std::vector<int32_t>* columns) const {
    FactoredMomentTensor t;
    t.rows = rows;
    t.columns = columns;
    t.v = [this](int32_t c) { return v.data() + c * rows; };
    t.count = [this](int32_t c) { return count[c]; };
    return t;
  }
};

// The definition written out, element by element, in double.
FactoredMoment Plain(const State& s, const std::vector<int32_t>& columns) {
  FactoredMoment f;
  std::vector<double> row(s.rows, 0.0), col(columns.size(), 0.0);
  double total = 0;
  for (size_t j = 0; j < columns.size(); ++j) {
    const int32_t c = columns[j];
    const double bc2 = 1.0 - std::pow(static_cast<double>(kBeta2), static_cast<double>(s.count[c]));
    for (int64_t i = 0; i < s.rows; ++i) {
      const double vh = static_cast<double>(s.v[c * s.rows + i]) / bc2;
      row[i] += vh;
      col[j] += vh;
      total += vh;
    }
  }
  for (double x : row) f.row_v.push_back(static_cast<float>(x / columns.size()));
  for (double x : col) f.col_v.push_back(static_cast<float>(x / s.rows));
  f.v_mean = static_cast<float>(total / (s.rows * static_cast<double>(columns.size())));
  return f;
}

ParallelRange Serial() {
  return [](size_t n, const std::function<void(size_t, size_t)>& fn) {
    if (n > 0) fn(0, n);
  };
}

ParallelRange On(ThreadPool* pool) {
  return [pool](size_t n, const std::function<void(size_t, size_t)>& fn) {
    pool->ParallelFor(n, 1, fn);
  };
}

void ExpectNear(const FactoredMoment& got, const FactoredMoment& want) {
  ASSERT_EQ(got.row_v.size(), want.row_v.size());
  ASSERT_EQ(got.col_v.size(), want.col_v.size());
  for (size_t i = 0; i < want.row_v.size(); ++i) {
    EXPECT_NEAR(got.row_v[i], want.row_v[i], 2e-7 * std::fabs(want.row_v[i])) << "row " << i;
  }
  for (size_t j = 0; j < want.col_v.size(); ++j) {
    EXPECT_NEAR(got.col_v[j], want.col_v[j], 2e-7 * std::fabs(want.col_v[j])) << "column " << j;
  }
  EXPECT_NEAR(got.v_mean, want.v_mean, 2e-7 * std::fabs(want.v_mean));
}

bool BitEqual(const FactoredMoment& a, const FactoredMoment& b) {
  return a.row_v.size() == b.row_v.size() && a.col_v.size() == b.col_v.size() &&
         std::memcmp(a.row_v.data(), b.row_v.data(), a.row_v.size() * 4) == 0 &&
         std::memcmp(a.col_v.data(), b.col_v.data(), a.col_v.size() * 4) == 0 &&
         std::memcmp(&a.v_mean, &b.v_mean, 4) == 0;
}

// Means of the bias-corrected v over the daemon's columns only (column 2 is
// on the worker), each column corrected by its own count.
TEST(FactoredMomentTest, EqualsTheMeansOfTheBiasCorrectedV) {
  State s(5, 6);
  const std::vector<int32_t> columns = {0, 1, 3, 4, 5};
  const std::vector<FactoredMoment> f =
      ComputeFactoredMoments({s.Tensor(&columns)}, kBeta2, Serial());
  ASSERT_EQ(f.size(), 1u);
  ExpectNear(f[0], Plain(s, columns));
  // Not the raw v: the correction of a first update is 1/(1 - 0.999), 1000x.
  EXPECT_GT(f[0].col_v[1], 500.0f * s.v[1 * s.rows + 0]);
}

// Tall tensors span several row blocks; the result is bit-identical however
// many threads share the work, and equals the definition to fp32 rounding.
TEST(FactoredMomentTest, SameBitsForAnyThreadCount) {
  State tall(3 * kFactoredRowBlock + 17, 9), small(3, 4);
  const std::vector<int32_t> tall_cols = {0, 1, 2, 4, 5, 6, 8}, small_cols = {1, 2};
  const std::vector<int32_t> none;
  const std::vector<FactoredMomentTensor> in = {tall.Tensor(&tall_cols), small.Tensor(&none),
                                                small.Tensor(&small_cols)};
  const std::vector<FactoredMoment> one = ComputeFactoredMoments(in, kBeta2, Serial());
  ASSERT_EQ(one.size(), 3u);
  EXPECT_TRUE(one[1].row_v.empty() && one[1].col_v.empty()) << "no columns, nothing";
  ExpectNear(one[0], Plain(tall, tall_cols));
  ExpectNear(one[2], Plain(small, small_cols));
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    const std::vector<FactoredMoment> many = ComputeFactoredMoments(in, kBeta2, On(&pool));
    for (size_t t = 0; t < in.size(); ++t) {
      EXPECT_TRUE(BitEqual(many[t], one[t])) << threads << " threads, tensor " << t;
    }
  }
}

// A message's columns, row_v, col_v and v_mean stay within the size limit
// when a column does; a column larger than the limit travels alone.
TEST(FactoredMomentTest, MessagesFitTheLimitWithTheFactoredMoment) {
  for (int64_t rows : {1, 100, 1000}) {
    for (int64_t bytes : {2, 4, 8}) {
      const int64_t max = 64 << 10;
      const int64_t per = DeltaColumnsPerMessage(max, rows, bytes, true);
      EXPECT_LE(per * rows * bytes + FactoredMomentBytes(rows, per), max) << rows << " " << bytes;
      EXPECT_GT((per + 1) * rows * bytes + FactoredMomentBytes(rows, per + 1), max);
      EXPECT_EQ(DeltaColumnsPerMessage(max, rows, bytes, false), ColumnsPerMessage(max, rows, bytes));
    }
  }
  EXPECT_EQ(DeltaColumnsPerMessage(1000, 4096, 2, true), 1);
}

}  // namespace
}  // namespace zenflow
