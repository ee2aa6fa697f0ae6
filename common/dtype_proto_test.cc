#include "common/dtype_proto.h"

#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(DTypeProtoTest, EveryCodecDTypeRoundTrips) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    absl::StatusOr<DType> back = FromProto(ToProto(d), "x");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(ToProto(DType::kF32), v1::DTYPE_FP32);
  EXPECT_EQ(ToProto(DType::kBF16), v1::DTYPE_BF16);
  EXPECT_EQ(ToProto(DType::kF16), v1::DTYPE_FP16);
}

TEST(DTypeProtoTest, Int8AndUnknownHaveNoCodecDType) {
  absl::Status s = FromProto(v1::DTYPE_INT8, "shard dtype").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "shard dtype: unknown dtype 4 (use DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16)");
  EXPECT_FALSE(FromProto(v1::DTYPE_UNSPECIFIED, "x").ok());
  EXPECT_FALSE(FromProto(static_cast<v1::DType>(77), "x").ok());
}

TEST(DTypeProtoTest, WireNames) {
  EXPECT_EQ(*WireDTypeFromName("fp32"), v1::DTYPE_FP32);
  EXPECT_EQ(*WireDTypeFromName("bf16"), v1::DTYPE_BF16);
  EXPECT_EQ(*WireDTypeFromName("fp16"), v1::DTYPE_FP16);
  EXPECT_EQ(*WireDTypeFromName("int8"), v1::DTYPE_INT8);
  EXPECT_EQ(WireDTypeFromName("fp8").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zenflow
