// CheckPlacement and ElemTypeOf (array_ref.h): what the framework-neutral
// layer accepts, and each refusal's message naming the parameter and the fix.
#include "gpu_worker/engine/array_ref.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/backend.h"

namespace zenflow {
namespace {

using ::testing::HasSubstr;

ArrayRef Host(float* p, std::vector<int64_t> shape, ElemType t = ElemType::kF32) {
  ArrayRef a;
  a.data = reinterpret_cast<uintptr_t>(p);
  a.shape = std::move(shape);
  a.elem = t;
  a.typestr = "<f4";
  return a;
}

TEST(ElemType, FromTypestr) {
  EXPECT_EQ(ElemTypeOf("<f4", ""), ElemType::kF32);
  EXPECT_EQ(ElemTypeOf("<f2", ""), ElemType::kF16);
  EXPECT_EQ(ElemTypeOf("<f8", ""), ElemType::kF64);
  EXPECT_EQ(ElemTypeOf("<V2", "bfloat16"), ElemType::kBF16);
  EXPECT_EQ(ElemTypeOf("<V2", ""), ElemType::kOther);
  EXPECT_EQ(ElemTypeOf(">f4", ""), ElemType::kOther);  // big-endian
  EXPECT_EQ(ElemTypeOf("<i4", ""), ElemType::kOther);
}

TEST(CheckPlacement, HostArraysBecomeParamSpecs) {
  std::vector<float> w(6 * 4), g(6 * 4), b(6), gb(6);
  std::vector<ArrayParam> a = {{"w", Host(w.data(), {6, 2, 2}), Host(g.data(), {6, 2, 2})},
                               {"b", Host(b.data(), {6}), Host(gb.data(), {6})}};
  auto p = CheckPlacement(a);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->device);
  ASSERT_EQ(p->params.size(), 2u);
  EXPECT_EQ(p->params[0].shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(p->params[0].param, w.data());
  EXPECT_EQ(p->params[0].grad, g.data());
  EXPECT_EQ(p->params[1].shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(p->params[1].dtype, DType::kF32);
}

TEST(CheckPlacement, MixedPlacementIsRefused) {
  std::vector<float> w(4), g(4), b(4), gb(4);
  ArrayRef dev = Host(b.data(), {4});
  dev.device = true;
  std::vector<ArrayParam> a = {{"w", Host(w.data(), {4}), Host(g.data(), {4})},
                               {"b", dev, Host(gb.data(), {4})}};
  auto p = CheckPlacement(a);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("parameter 'b' is on a CUDA device"));
  EXPECT_THAT(p.status().message(), HasSubstr("model.to(device)"));
  // A device parameter with a host gradient.
  a = {{"w", dev, Host(g.data(), {4})}};
  p = CheckPlacement(a);
  EXPECT_THAT(p.status().message(), HasSubstr("the gradient of parameter 'w' is in host memory"));
}

TEST(CheckPlacement, NonContiguousFp64And16BitGradientsAreRefused) {
  std::vector<float> w(8), g(8);
  ArrayRef t = Host(w.data(), {2, 4});
  t.strides = {4, 8};  // a transpose
  auto p = CheckPlacement({{"w", t, Host(g.data(), {2, 4})}});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("parameter 'w' is not contiguous"));
  EXPECT_THAT(p.status().message(), HasSubstr("contiguous()"));
  // Row-major strides given explicitly are fine, as are any size-1 strides.
  t.strides = {16, 4};
  EXPECT_TRUE(CheckPlacement({{"w", t, Host(g.data(), {2, 4})}}).ok());
  ArrayRef one = Host(w.data(), {1, 8});
  one.strides = {999, 4};
  EXPECT_TRUE(CheckPlacement({{"w", one, Host(g.data(), {1, 8})}}).ok());

  ArrayRef f64 = Host(w.data(), {4}, ElemType::kF64);
  p = CheckPlacement({{"w", f64, Host(g.data(), {4})}});
  EXPECT_THAT(p.status().message(), HasSubstr("parameter 'w' is float64"));
  EXPECT_THAT(p.status().message(), HasSubstr("model.float()"));

  ArrayRef g16 = Host(g.data(), {8}, ElemType::kBF16);
  p = CheckPlacement({{"w", Host(w.data(), {8}, ElemType::kBF16), g16}});
  EXPECT_THAT(p.status().message(), HasSubstr("the gradient of parameter 'w' is bfloat16"));

  p = CheckPlacement({{"w", Host(w.data(), {8}), Host(g.data(), {4})}});
  EXPECT_THAT(p.status().message(), HasSubstr("has 4 elements and the parameter 8"));

  ArrayRef ro = Host(w.data(), {8});
  ro.readonly = true;
  p = CheckPlacement({{"w", ro, Host(g.data(), {8})}});
  EXPECT_THAT(p.status().message(), HasSubstr("read-only"));

  ArrayRef other = Host(w.data(), {8}, ElemType::kOther);
  other.typestr = "<i8";
  p = CheckPlacement({{"w", other, Host(g.data(), {8})}});
  EXPECT_THAT(p.status().message(), HasSubstr("element type '<i8'"));

  EXPECT_EQ(CheckPlacement({}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Without a device (or a CUDA build), device memory cannot be located: the
// CUDA side answers UNAVAILABLE, which is what a caller with device arrays
// sees here.
TEST(CudaPointerDevice, UnavailableWithoutADevice) {
  if (worker::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible";
  float x = 0;
  EXPECT_EQ(worker::CudaPointerDevice(&x).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace zenflow
