// UpdateDivergence: the sample it draws, what it captures, and its estimate
// against a direct computation with the tests' one AdamW reference.
#include "server/divergence.h"

#include <cmath>
#include <set>
#include <vector>

#include "common/adamw.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/testing/adamw_reference.h"

namespace zenflow {
namespace {

std::vector<int32_t> AllBut(int32_t cols, const std::set<int32_t>& important) {
  std::vector<int32_t> out;
  for (int32_t c = 0; c < cols; ++c) {
    if (important.count(c) == 0) out.push_back(c);
  }
  return out;
}

TEST(UpdateDivergence, SamplesAboutOnePercentOfTheDaemonColumnsAndMoves) {
  const std::vector<TensorStore::Shape> shapes = {{4, 1000}, {2, 30}, {3, 5}};
  UpdateDivergence a(shapes, 1, false, 4, 42), b(shapes, 1, false, 4, 42);
  const std::set<int32_t> important = {0, 1, 2, 3, 4, 500, 999};
  const std::vector<std::vector<int32_t>> remote = {AllBut(1000, important), AllBut(30, {}), {}};
  a.BeginRound(3, remote);
  b.BeginRound(3, remote);
  const auto sample = a.SampleOf(3);
  EXPECT_EQ(sample, b.SampleOf(3));  // deterministic
  int per_tensor[3] = {0, 0, 0};
  std::set<std::pair<int, int32_t>> distinct;
  for (const auto& [t, c] : sample) {
    ++per_tensor[t];
    distinct.insert({t, c});
    if (t == 0) {
      EXPECT_EQ(important.count(c), 0u) << c;
    }
    EXPECT_EQ(a.Slot(t, 3, c), static_cast<int>(distinct.size()) - 1);
  }
  EXPECT_EQ(distinct.size(), sample.size());
  EXPECT_EQ(per_tensor[0], 10);  // ceil(993 / 100)
  EXPECT_EQ(per_tensor[1], 1);   // at least one
  EXPECT_EQ(per_tensor[2], 0);   // no daemon columns
  EXPECT_EQ(a.Slot(0, 4, sample[0].second), -1);  // round 4 was not drawn
  // Another round (and another job) draws another sample.
  a.BeginRound(5, remote);
  EXPECT_NE(a.SampleOf(5), sample);
  UpdateDivergence other(shapes, 1, false, 4, 43);
  other.BeginRound(3, remote);
  EXPECT_NE(other.SampleOf(3), sample);
  // Round 5 shares round 3's buffers: round 3 is gone.
  EXPECT_FALSE(a.Began(3));
  EXPECT_TRUE(a.Began(5));
  a.Invalidate();
  EXPECT_FALSE(a.Began(5));
  EXPECT_EQ(a.Slot(sample[0].first, 5, sample[0].second), -1);
}

// Random state for a store and per-step, per-rank gradients for a sample.
struct Fixture {
  std::vector<TensorStore::Shape> shapes = {{5, 250}, {3, 40}};
  int world = 2;
  int steps = 3;
  TensorStore store{shapes};
  uint64_t rng = 7;
  float Next() { return static_cast<float>(UnitInterval(NextRandom(&rng)) * 2 - 1); }
  void Fill() {
    for (int t = 0; t < 2; ++t) {
      for (int64_t c = 0; c < shapes[t].cols; ++c) {
        for (int64_t i = 0; i < shapes[t].rows; ++i) {
          store.master(t, c)[i] = Next();
          store.m(t, c)[i] = 0.01f * Next();
          store.v(t, c)[i] = 1e-4f * (1.0f + Next());
        }
        store.set_count(t, c, 5);
      }
    }
  }
};

TEST(UpdateDivergence, EqualsADirectComputationWithTheReference) {
  for (bool rank_ordered : {true, false}) {
    Fixture f;
    f.Fill();
    UpdateDivergence div(f.shapes, f.world, rank_ordered, 4, 1);
    const std::vector<std::vector<int32_t>> remote = {AllBut(250, {9, 10}), AllBut(40, {0})};
    div.BeginRound(2, remote);
    const auto sample = div.SampleOf(2);
    ASSERT_EQ(sample.size(), 4u);  // 3 + 1
    // grads[slot][k][rank][row]
    std::vector<std::vector<std::vector<std::vector<float>>>> grads(sample.size());
    for (size_t s = 0; s < sample.size(); ++s) {
      const int64_t rows = f.shapes[sample[s].first].rows;
      grads[s].resize(f.steps);
      for (int k = 0; k < f.steps; ++k) {
        for (int r = 0; r < f.world; ++r) {
          std::vector<float> g(rows);
          for (float& x : g) x = f.Next();
          grads[s][k].push_back(g);
          div.Capture(static_cast<int>(s), r, 2, k, [&](float* dst) {
            for (int64_t i = 0; i < rows; ++i) dst[i] += g[i];
          });
        }
      }
    }
    ASSERT_TRUE(div.Start(2, f.steps, &f.store));
    // The update the daemon "applied": one AdamW step of lr 1e-3 with the
    // round's mean (rule 6 without rule 12), on the sampled columns.
    testing::AdamWRefHyper rh;
    const float lr = 1e-3f;
    std::vector<std::vector<float>> old(sample.size()), replay(sample.size());
    for (size_t s = 0; s < sample.size(); ++s) {
      const auto [t, c] = sample[s];
      const int64_t rows = f.shapes[t].rows;
      old[s].assign(f.store.master(t, c), f.store.master(t, c) + rows);
      std::vector<float> m(f.store.m(t, c), f.store.m(t, c) + rows);
      std::vector<float> v(f.store.v(t, c), f.store.v(t, c) + rows);
      replay[s] = old[s];
      for (int k = 0; k < f.steps; ++k) {
        const testing::AdamWStepFactors fk = testing::AdamWFactors(rh, lr, 5 + k + 1);
        for (int64_t i = 0; i < rows; ++i) {
          const float g = (grads[s][k][0][i] + grads[s][k][1][i]) * 0.5f;
          testing::AdamWElement(rh, fk, g, &replay[s][i], &m[i], &v[i]);
        }
      }
      const testing::AdamWStepFactors f1 = testing::AdamWFactors(rh, lr, 6);
      for (int64_t i = 0; i < rows; ++i) {
        float g = 0;
        for (int k = 0; k < f.steps; ++k) g += grads[s][k][0][i] + grads[s][k][1][i];
        g /= static_cast<float>(f.steps * f.world);
        testing::AdamWElement(rh, f1, g, f.store.master(t, c) + i, f.store.m(t, c) + i,
                              f.store.v(t, c) + i);
      }
    }
    double diff2 = 0, ref2 = 0;
    for (size_t s = 0; s < sample.size(); ++s) {
      const auto [t, c] = sample[s];
      for (size_t i = 0; i < old[s].size(); ++i) {
        const double applied = double{f.store.master(t, c)[i]} - old[s][i];
        const double per_step = double{replay[s][i]} - old[s][i];
        diff2 += (applied - per_step) * (applied - per_step);
        ref2 += per_step * per_step;
      }
    }
    const double expected = std::sqrt(diff2 / ref2);
    AdamWHyper h;
    h.lr = lr;
    const std::optional<float> d = div.Finish(f.store, h, 1.0f, SimdLevel::kScalar);
    ASSERT_TRUE(d.has_value());
    EXPECT_NEAR(*d, expected, 1e-4 * expected) << "rank_ordered " << rank_ordered;
    EXPECT_GT(*d, 0.3);  // one step for three is far from per-step AdamW
    // Finish consumed the measure.
    EXPECT_FALSE(div.Finish(f.store, h, 1.0f, SimdLevel::kScalar).has_value());
  }
}

TEST(UpdateDivergence, AOneStepRoundIsExactlyPerStep) {
  Fixture f;
  f.Fill();
  UpdateDivergence div(f.shapes, f.world, true, 1, 3);
  div.BeginRound(0, {AllBut(250, {}), AllBut(40, {})});
  const auto sample = div.SampleOf(0);
  std::vector<std::vector<float>> sums(sample.size());
  for (size_t s = 0; s < sample.size(); ++s) {
    const int64_t rows = f.shapes[sample[s].first].rows;
    sums[s].assign(rows, 0.0f);
    for (int r = 0; r < f.world; ++r) {
      std::vector<float> g(rows);
      for (float& x : g) x = f.Next();
      for (int64_t i = 0; i < rows; ++i) sums[s][i] += g[i];
      div.Capture(static_cast<int>(s), r, 0, 0, [&](float* dst) {
        for (int64_t i = 0; i < rows; ++i) dst[i] += g[i];
      });
    }
  }
  ASSERT_TRUE(div.Start(0, 1, &f.store));
  AdamWHyper h;
  h.lr = 3e-3f;
  for (size_t s = 0; s < sample.size(); ++s) {
    const auto [t, c] = sample[s];
    AdamWUpdate(SimdLevel::kScalar, h, 6, 0.5f, sums[s].data(), f.store.master(t, c),
                f.store.m(t, c), f.store.v(t, c), sums[s].size());
  }
  const std::optional<float> d = div.Finish(f.store, h, 1.0f, SimdLevel::kScalar);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, 0.0f);
}

TEST(UpdateDivergence, MeasuresOnlyRoundsWhoseEveryStepArrived) {
  Fixture f;
  f.Fill();
  UpdateDivergence div(f.shapes, f.world, true, 4, 3);
  div.BeginRound(1, {AllBut(250, {}), AllBut(40, {})});
  const size_t n = div.SampleOf(1).size();
  for (size_t s = 0; s < n; ++s) {
    for (int k = 0; k < 2; ++k) {
      for (int r = 0; r < f.world; ++r) {
        if (s == n - 1 && k == 1 && r == 1) continue;  // one rank's step missing
        div.Capture(static_cast<int>(s), r, 1, k, [](float* dst) { dst[0] += 1; });
      }
    }
  }
  EXPECT_FALSE(div.Start(1, 2, &f.store));
  EXPECT_FALSE(div.Start(2, 2, &f.store));  // not drawn
  EXPECT_TRUE(div.Start(1, 1, &f.store));   // the first step is complete
  EXPECT_FALSE(div.Start(1, UpdateDivergence::kMaxSteps + 1, &f.store));
  // A round whose replay moves nothing (lr 0) reports nothing.
  AdamWHyper h;
  h.lr = 0;
  EXPECT_FALSE(div.Finish(f.store, h, 1.0f, SimdLevel::kScalar).has_value());
}

TEST(UpdateDivergence, BufferBytesCountTheSideBuffers) {
  // 1% of 1000 columns x 8 rows x 4 steps x 2 ranks x 4 B, two rounds.
  const int64_t b = UpdateDivergence::BufferBytes(8, 1000, 4, 2, true);
  EXPECT_GE(b, 2 * 10 * 8 * 4 * 2 * 4);
  EXPECT_LT(b, 8 * 1000 * 4);  // well below one fp32 copy of the tensor
  // Steps beyond kMaxSteps are not kept.
  EXPECT_EQ(UpdateDivergence::BufferBytes(8, 1000, 1 << 20, 2, true),
            UpdateDivergence::BufferBytes(8, 1000, UpdateDivergence::kMaxSteps, 2, true));
}

}  // namespace
}  // namespace zenflow
