// Tests for server/adamw: the scalar reference against a hand-expanded
// double-precision computation, SIMD kernels against the reference, and
// decoupled weight decay.

#include "common/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

void ExpectRelNear(double want, float got, double rel,
                   const std::string& what) {
  EXPECT_LE(std::fabs(static_cast<double>(got) - want), rel * std::fabs(want))
      << what << ": want " << want << " got " << got;
}

TEST(AdamWTest, LevelNames) {
  EXPECT_STREQ(SimdLevelName(SimdLevel::kScalar), "scalar");
  EXPECT_STREQ(SimdLevelName(SimdLevel::kAvx2), "avx2");
  EXPECT_STREQ(SimdLevelName(SimdLevel::kAvx512), "avx512");
  EXPECT_TRUE(SimdLevelSupported(SimdLevel::kScalar));
  EXPECT_TRUE(SimdLevelSupported(BestSimdLevel()));
}

// Three elements over three steps, with the formula written out in double.
TEST(AdamWTest, ReferenceMatchesHandComputation) {
  const AdamWHyper h{/*lr=*/1e-2f, /*beta1=*/0.9f, /*beta2=*/0.999f,
                     /*eps=*/1e-8f, /*weight_decay=*/0.1f};
  const float grad_scale = 0.5f;
  // Per-step gradients for each of the three elements.
  const float grads[3][3] = {
      {1.0f, -2.0f, 0.25f}, {0.5f, -1.0f, 3.0f}, {-0.75f, 0.1f, 0.0f}};
  float p[3] = {1.0f, -0.5f, 2.0f};
  float m[3] = {0.0f, 0.0f, 0.0f};
  float v[3] = {0.0f, 0.0f, 0.0f};

  // Double-precision shadow state, using the exact float hyperparameters.
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps,
               wd = h.weight_decay;
  double dp[3] = {1.0, -0.5, 2.0};
  double dm[3] = {0.0, 0.0, 0.0};
  double dv[3] = {0.0, 0.0, 0.0};

  for (int t = 1; t <= 3; ++t) {
    AdamWReference(h, t, grad_scale, grads[t - 1], p, m, v, 3);
    const double bc1 = 1.0 - std::pow(b1, t);
    const double bc2 = 1.0 - std::pow(b2, t);
    const double step_size = lr / bc1;
    const double bc2_sqrt = std::sqrt(bc2);
    for (int i = 0; i < 3; ++i) {
      const double g = static_cast<double>(grads[t - 1][i]) * 0.5;
      dm[i] = b1 * dm[i] + (1.0 - b1) * g;
      dv[i] = b2 * dv[i] + (1.0 - b2) * g * g;
      dp[i] = dp[i] * (1.0 - lr * wd);
      dp[i] = dp[i] - step_size * dm[i] / (std::sqrt(dv[i]) / bc2_sqrt + eps);
      const std::string where =
          "t=" + std::to_string(t) + " i=" + std::to_string(i);
      ExpectRelNear(dm[i], m[i], 1e-6, "m " + where);
      ExpectRelNear(dv[i], v[i], 1e-6, "v " + where);
      ExpectRelNear(dp[i], p[i], 1e-6, "p " + where);
    }
  }
  // Spot-check the first step of element 0 against literal numbers:
  // g = 0.5, m = 0.05, v = 0.00025, p = 1 * (1 - 1e-3) - 0.01 * 0.5 / 0.5
  // (bias-corrected m/sqrt(v) is g/|g| = 1 at t = 1, up to eps). The loose
  // tolerances cover 0.9f / 0.999f not being exactly 0.9 / 0.999.
  float p1 = 1.0f, m1 = 0.0f, v1 = 0.0f;
  const float g1 = 1.0f;
  AdamWReference(h, 1, grad_scale, &g1, &p1, &m1, &v1, 1);
  EXPECT_NEAR(m1, 0.05, 1e-7);
  EXPECT_NEAR(v1, 0.00025, 1e-8);
  EXPECT_NEAR(p1, 0.999 - 0.01, 1e-6);
}

TEST(AdamWTest, ScalarLevelIsReference) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t n = 37;
  std::vector<float> g(n), p(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = u(rng);
    p[i] = u(rng);
    m[i] = 0.1f * u(rng);
    v[i] = 0.01f * std::fabs(u(rng));
  }
  std::vector<float> p2 = p, m2 = m, v2 = v;
  const AdamWHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  AdamWReference(h, 7, 1.0f, g.data(), p.data(), m.data(), v.data(), n);
  AdamWUpdate(SimdLevel::kScalar, h, 7, 1.0f, g.data(), p2.data(), m2.data(),
              v2.data(), n);
  EXPECT_EQ(std::memcmp(p.data(), p2.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(m.data(), m2.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(v.data(), v2.data(), n * 4), 0);
}

class AdamWSimdTest : public ::testing::TestWithParam<SimdLevel> {};

TEST_P(AdamWSimdTest, MatchesReference) {
  const SimdLevel level = GetParam();
  if (!SimdLevelSupported(level)) {
    GTEST_SKIP() << "CPU lacks " << SimdLevelName(level);
  }
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  constexpr size_t kGuard = 4;
  constexpr float kGuardValue = 123.0f;
  for (size_t n : {0, 1, 15, 16, 17, 33, 1000, 4099}) {
    for (float wd : {0.0f, 0.01f}) {
      for (int64_t step : {1, 1000}) {
        for (size_t off : {0, 1, 3}) {
          SCOPED_TRACE("n=" + std::to_string(n) + " wd=" + std::to_string(wd) +
                       " step=" + std::to_string(step) +
                       " off=" + std::to_string(off));
          const AdamWHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, wd};
          // Buffers offset by `off` floats so they are not vector-aligned.
          const size_t len = off + n + kGuard;
          std::vector<float> g(len), p(len, kGuardValue), m(len, kGuardValue),
              v(len, kGuardValue);
          for (size_t i = off; i < off + n; ++i) {
            g[i] = u(rng);
            p[i] = u(rng);
            m[i] = 0.1f * u(rng);
            v[i] = 0.01f * std::fabs(u(rng));
          }
          std::vector<float> rp = p, rm = m, rv = v;
          AdamWReference(h, step, 0.5f, g.data() + off, rp.data() + off,
                         rm.data() + off, rv.data() + off, n);
          AdamWUpdate(level, h, step, 0.5f, g.data() + off, p.data() + off,
                      m.data() + off, v.data() + off, n);
          for (size_t i = 0; i < len; ++i) {
            ASSERT_LE(std::fabs(p[i] - rp[i]), 1e-6f + 1e-5f * std::fabs(rp[i]))
                << "p[" << i << "] " << p[i] << " vs " << rp[i];
            ASSERT_LE(std::fabs(m[i] - rm[i]), 1e-6f + 1e-5f * std::fabs(rm[i]))
                << "m[" << i << "] " << m[i] << " vs " << rm[i];
            ASSERT_LE(std::fabs(v[i] - rv[i]), 1e-6f + 1e-5f * std::fabs(rv[i]))
                << "v[" << i << "] " << v[i] << " vs " << rv[i];
          }
          // Elements outside the range are untouched.
          for (size_t i = 0; i < off; ++i) {
            ASSERT_EQ(p[i], kGuardValue);
            ASSERT_EQ(m[i], kGuardValue);
            ASSERT_EQ(v[i], kGuardValue);
          }
          for (size_t i = off + n; i < len; ++i) {
            ASSERT_EQ(p[i], kGuardValue);
            ASSERT_EQ(m[i], kGuardValue);
            ASSERT_EQ(v[i], kGuardValue);
          }
        }
      }
    }
  }
}

// With zero gradient and zero moments, the only change is the decoupled
// decay p *= (1 - lr * wd), exactly.
TEST_P(AdamWSimdTest, WeightDecayIsDecoupled) {
  const SimdLevel level = GetParam();
  if (!SimdLevelSupported(level)) {
    GTEST_SKIP() << "CPU lacks " << SimdLevelName(level);
  }
  const AdamWHyper h{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f};
  const float decay = static_cast<float>(1.0 - 0.01 * 0.1);
  const float decay_f = static_cast<float>(
      1.0 - static_cast<double>(h.lr) * static_cast<double>(h.weight_decay));
  EXPECT_NEAR(decay_f, decay, 1e-9);
  const size_t n = 37;
  std::vector<float> g(n, 0.0f), p(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) p[i] = 0.25f * static_cast<float>(i) - 3.0f;
  const std::vector<float> p0 = p;
  for (int64_t step : {1, 2, 50}) {
    std::vector<float> want = p;
    for (float& x : want) x *= decay_f;
    AdamWUpdate(level, h, step, 1.0f, g.data(), p.data(), m.data(), v.data(),
                n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(p[i], want[i]) << i;
      ASSERT_EQ(m[i], 0.0f);
      ASSERT_EQ(v[i], 0.0f);
    }
  }
  // Without weight decay nothing moves.
  const AdamWHyper no_wd{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f};
  std::vector<float> q = p0;
  AdamWUpdate(level, no_wd, 3, 1.0f, g.data(), q.data(), m.data(), v.data(), n);
  EXPECT_EQ(q, p0);
}

// One call over a range and several calls over pieces of it give the same
// bits: the round update runs AdamW in blocks of its own choosing.
TEST_P(AdamWSimdTest, SplitCallsGiveTheSameBits) {
  const SimdLevel level = GetParam();
  if (!SimdLevelSupported(level)) {
    GTEST_SKIP() << "CPU lacks " << SimdLevelName(level);
  }
  constexpr size_t n = 1000;
  std::vector<float> g(n), p(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.37f * static_cast<float>(i));
    p[i] = std::cos(0.11f * static_cast<float>(i));
    m[i] = 0.01f * std::sin(0.05f * static_cast<float>(i));
    v[i] = 1e-4f * (1.0f + std::cos(0.07f * static_cast<float>(i)));
  }
  const AdamWHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  std::vector<float> wp = p, wm = m, wv = v;
  AdamWUpdate(level, h, 7, 0.5f, g.data(), wp.data(), wm.data(), wv.data(), n);
  for (size_t piece : {size_t{1}, size_t{7}, size_t{13}, size_t{257}}) {
    std::vector<float> sp = p, sm = m, sv = v;
    for (size_t at = 0; at < n; at += piece) {
      const size_t len = std::min(piece, n - at);
      AdamWUpdate(level, h, 7, 0.5f, g.data() + at, sp.data() + at, sm.data() + at,
                  sv.data() + at, len);
    }
    ASSERT_EQ(std::memcmp(sp.data(), wp.data(), n * 4), 0) << "pieces of " << piece;
    ASSERT_EQ(std::memcmp(sm.data(), wm.data(), n * 4), 0);
    ASSERT_EQ(std::memcmp(sv.data(), wv.data(), n * 4), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, AdamWSimdTest,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2,
                                           SimdLevel::kAvx512),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(SimdLevelName(info.param));
                         });

}  // namespace
}  // namespace zenflow
