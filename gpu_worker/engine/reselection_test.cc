// The reselection's own rules: which columns leave, how the hand-off is cut
// into calls, and the new compact state (kept columns keep theirs, joining
// ones take the daemon's).
#include "gpu_worker/engine/reselection.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/engine/engine_tensor.h"
#include "gtest/gtest.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace {

TEST(ReselectionTest, ColumnDifference) {
  EXPECT_EQ(ColumnDifference({1, 3, 5, 7}, {3, 4, 7}), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(ColumnDifference({}, {1}), (std::vector<int32_t>{}));
  EXPECT_EQ(ColumnDifference({2, 4}, {}), (std::vector<int32_t>{2, 4}));
}

TEST(ReselectionTest, HandOffCallsStayUnderTheLimit) {
  EXPECT_TRUE(HandOffCalls({}, 10).empty());
  // 4 + 5 fit in 10, 3 more would not; 12 alone is over the limit but goes
  // in a call of its own (even a tensor with nothing to move does not join
  // it).
  const auto calls = HandOffCalls({4, 5, 3, 12, 0, 6}, 10);
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[0], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(calls[1], (std::vector<size_t>{2}));
  EXPECT_EQ(calls[2], (std::vector<size_t>{3}));
  EXPECT_EQ(calls[3], (std::vector<size_t>{4, 5}));
  // ... and the limit holds per call, not for the first only.
  const auto more = HandOffCalls({12, 0, 6, 4, 1}, 10);
  ASSERT_EQ(more.size(), 3u);
  EXPECT_EQ(more[0], (std::vector<size_t>{0}));
  EXPECT_EQ(more[1], (std::vector<size_t>{1, 2, 3}));
  EXPECT_EQ(more[2], (std::vector<size_t>{4}));
  // One call when all fit.
  EXPECT_EQ(HandOffCalls({1, 2, 3}, 10).size(), 1u);
}

// A tensor of 2 rows whose important columns are 1 and 4, with state
// m = 10*c + r, v = 100*c + r, master = 1000*c + r and c updates.
void Fill(bool fp32, EngineTensor* out) {
  EngineTensor& t = *out;
  t.name = "w";
  t.rows = 2;
  t.cols = 6;
  t.dtype = fp32 ? DType::kF32 : DType::kBF16;
  t.important = {1, 4};
  for (int32_t c : t.important) {
    for (int r = 0; r < 2; ++r) {
      t.host_m.push_back(10.0f * c + r);
      t.host_v.push_back(100.0f * c + r);
      if (!fp32) t.host_master.push_back(1000.0f * c + r);
    }
    t.steps.push_back(c);
  }
}

TEST(ReselectionTest, KeptColumnsKeepTheirStateJoiningOnesTakeTheDaemons) {
  EngineTensor t;
  Fill(/*fp32=*/false, &t);
  v1::ColumnState join;
  join.set_tensor("w");
  join.add_columns(2);
  join.add_columns(5);
  for (int32_t c : {2, 5}) {
    for (int r = 0; r < 2; ++r) {
      join.add_m(-10.0f * c - r);
      join.add_v(-100.0f * c - r);
      join.add_values(-1000.0f * c - r);
    }
    join.add_update_counts(50 + c);
  }
  // Column 1 leaves; 4 stays; 2 and 5 join.
  auto s = NextCompactState(t, {2, 4, 5}, &join);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->m, (std::vector<float>{-20, -21, 40, 41, -50, -51}));
  EXPECT_EQ(s->v, (std::vector<float>{-200, -201, 400, 401, -500, -501}));
  EXPECT_EQ(s->master, (std::vector<float>{-2000, -2001, 4000, 4001, -5000, -5001}));
  EXPECT_EQ(s->steps, (std::vector<int64_t>{52, 4, 55}));
}

TEST(ReselectionTest, Fp32TensorsHaveNoMaster) {
  EngineTensor t;
  Fill(/*fp32=*/true, &t);
  auto s = NextCompactState(t, {4}, nullptr);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->m, (std::vector<float>{40, 41}));
  EXPECT_TRUE(s->master.empty());
  EXPECT_EQ(s->steps, (std::vector<int64_t>{4}));
}

TEST(ReselectionTest, AJoiningColumnWithoutStateIsAnError) {
  EngineTensor t;
  Fill(/*fp32=*/true, &t);
  EXPECT_EQ(NextCompactState(t, {3}, nullptr).status().code(), absl::StatusCode::kInternal);
  v1::ColumnState join;
  join.set_tensor("w");
  join.add_columns(2);
  join.add_m(0);
  join.add_m(0);
  join.add_v(0);
  join.add_v(0);
  join.add_update_counts(1);
  EXPECT_EQ(NextCompactState(t, {3}, &join).status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(NextCompactState(t, {2}, &join).ok());
}

}  // namespace
}  // namespace zenflow
