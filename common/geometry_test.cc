#include "common/geometry.h"

#include "gtest/gtest.h"

namespace zenflow {
namespace {

v1::TensorSpec Spec(std::initializer_list<int64_t> shape, bool local = false) {
  v1::TensorSpec t;
  for (int64_t d : shape) t.add_shape(d);
  t.set_local(local);
  return t;
}

TEST(GeometryTest, TwoDIsRowsByColsOneDIsOneRow) {
  const ColumnGeometry w = GeometryOf(Spec({96, 300}));
  EXPECT_EQ(w.rows, 96);
  EXPECT_EQ(w.cols, 300);
  const ColumnGeometry b = GeometryOf(Spec({300}));
  EXPECT_EQ(b.rows, 1);
  EXPECT_EQ(b.cols, 300);
}

TEST(GeometryTest, OneDAndLocalTensorsStayOnTheWorkerInZenflowOnly) {
  EXPECT_TRUE(AlwaysImportant(Spec({16}), v1::MODE_ZENFLOW));
  EXPECT_TRUE(AlwaysImportant(Spec({8, 16}, /*local=*/true), v1::MODE_ZENFLOW));
  EXPECT_FALSE(AlwaysImportant(Spec({8, 16}), v1::MODE_ZENFLOW));
  EXPECT_FALSE(AlwaysImportant(Spec({16}), v1::MODE_ZERO_OFFLOAD));
  EXPECT_FALSE(AlwaysImportant(Spec({8, 16}, true), v1::MODE_ZERO_OFFLOAD));
}

TEST(GeometryTest, ColumnsPerMessageIsWholeColumnsAndAtLeastOne) {
  EXPECT_EQ(ColumnsPerMessage(4 << 20, 4096, 2), 512);  // 8 KiB bf16 columns in 4 MiB
  EXPECT_EQ(ColumnsPerMessage(4 << 20, 4096, 4), 256);
  EXPECT_EQ(ColumnsPerMessage(1000, 4096, 4), 1) << "a column over the limit travels alone";
  EXPECT_EQ(ColumnsPerMessage(1000, 0, 4), 1000);
}

}  // namespace
}  // namespace zenflow
