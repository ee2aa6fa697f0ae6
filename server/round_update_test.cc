#include "server/round_update.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/thread_pool.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

constexpr int64_t kRows = 3, kCols = 4;

struct Fixture {
  explicit Fixture(bool rank_ordered = false);
  TensorStore store{{{kRows, kCols}}};
  RoundAccumulator acc;
  std::vector<RoundUpdateTensor> tensors{{"w", kRows, DType::kF32}};
  std::vector<std::vector<int32_t>> remote{{0, 1, 3}};  // column 2 is important

  void Init() {
    for (int64_t c = 0; c < kCols; ++c) {
      for (int64_t r = 0; r < kRows; ++r) {
        store.master(0, c)[r] = 1.0f + 0.5f * static_cast<float>(c) - 0.25f * static_cast<float>(r);
        store.m(0, c)[r] = 0.01f * static_cast<float>(r + 1);
        store.v(0, c)[r] = 0.001f * static_cast<float>(c + 1);
        acc.sum(0, /*round=*/1, c)[r] = 0.3f * static_cast<float>(c + 1) - 0.1f * static_cast<float>(r);
      }
    }
    store.set_count(0, 1, 2);  // column 1 was updated twice before: its own bias correction
  }

  RoundUpdateInput Input() {
    RoundUpdateInput in;
    in.round = 1;
    in.steps_sum = 4;  // 2 ranks x 2 steps
    in.lr = 0.01f;
    in.tensors = &tensors;
    in.remote = &remote;
    in.hyper = AdamWHyper{0.0f, 0.9f, 0.999f, 1e-8f, 0.01f};
    in.max_shard_bytes = 2 * kRows * 4;  // two fp32 columns a message
    in.simd = SimdLevel::kScalar;
    return in;
  }
};

Fixture::Fixture(bool rank_ordered) : acc({{kRows, kCols}}, 2, rank_ordered) { Init(); }

// The update equals the reference AdamW on the mean gradient, column by
// column with each column's own count; the important column and the rest
// of the state are untouched; deltas carry the new values in chunks.
TEST(RoundUpdateTest, MatchesReferenceAdamWOnTheMean) {
  Fixture f;
  std::vector<float> p(kRows * kCols), m(kRows * kCols), v(kRows * kCols), g(kRows * kCols);
  for (int64_t c = 0; c < kCols; ++c) {
    std::memcpy(&p[c * kRows], f.store.master(0, c), kRows * 4);
    std::memcpy(&m[c * kRows], f.store.m(0, c), kRows * 4);
    std::memcpy(&v[c * kRows], f.store.v(0, c), kRows * 4);
    std::memcpy(&g[c * kRows], f.acc.sum(0, 1, c), kRows * 4);
  }
  const AdamWHyper h{0.01f, 0.9f, 0.999f, 1e-8f, 0.01f};
  for (int32_t c : f.remote[0]) {
    AdamWReference(h, f.store.count(0, c) + 1, 0.25f, &g[c * kRows], &p[c * kRows],
                   &m[c * kRows], &v[c * kRows], kRows);
  }
  RoundUpdateResult r =
      UpdateRound(f.Input(), UpdateLease::Grant(f.Input().round, &f.store, &f.acc));
  ASSERT_FALSE(r.skipped);
  for (int64_t c = 0; c < kCols; ++c) {
    const bool remote = c != 2;
    for (int64_t r2 = 0; r2 < kRows; ++r2) {
      EXPECT_EQ(f.store.master(0, c)[r2], p[c * kRows + r2]) << "column " << c;
      EXPECT_EQ(f.store.m(0, c)[r2], m[c * kRows + r2]);
      EXPECT_EQ(f.store.v(0, c)[r2], v[c * kRows + r2]);
      EXPECT_EQ(f.acc.sum(0, 1, c)[r2], remote ? 0.0f : g[c * kRows + r2])
          << "the daemon's sums are cleared, an important column's are not touched";
    }
  }
  EXPECT_EQ(f.store.count(0, 0), 1);
  EXPECT_EQ(f.store.count(0, 1), 3);
  EXPECT_EQ(f.store.count(0, 2), 0);
  ASSERT_EQ(r.deltas.size(), 2u);
  EXPECT_EQ(std::vector<int32_t>(r.deltas[0].delta().columns().begin(),
                                 r.deltas[0].delta().columns().end()),
            (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(r.deltas[1].delta().columns(0), 3);
  EXPECT_EQ(r.deltas[0].delta().round(), 1);
  EXPECT_EQ(r.deltas[0].delta().dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(std::memcmp(r.deltas[1].delta().payload().data(), &p[3 * kRows], kRows * 4), 0);
}

TEST(RoundUpdateTest, ArithmeticDeltasAreNewMinusOld) {
  Fixture f;
  std::vector<float> old(kRows);
  std::memcpy(old.data(), f.store.master(0, 3), kRows * 4);
  RoundUpdateInput in = f.Input();
  in.arithmetic = true;
  RoundUpdateResult r = UpdateRound(in, UpdateLease::Grant(in.round, &f.store, &f.acc));
  ASSERT_EQ(r.deltas.size(), 2u);
  const float* d = reinterpret_cast<const float*>(r.deltas[1].delta().payload().data());
  for (int64_t i = 0; i < kRows; ++i) EXPECT_EQ(d[i], f.store.master(0, 3)[i] - old[i]);
  EXPECT_EQ(r.deltas[1].delta().kind(), v1::DELTA_ARITHMETIC);
}

// Sums that overflowed: skipped, the store untouched, the sums cleared.
TEST(RoundUpdateTest, ANonFiniteSumIsSkippedAndCleared) {
  Fixture f;
  f.acc.sum(0, 1, 1)[0] = std::numeric_limits<float>::infinity();
  const float before = f.store.master(0, 1)[0];
  RoundUpdateResult r =
      UpdateRound(f.Input(), UpdateLease::Grant(f.Input().round, &f.store, &f.acc));
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(r.overflowed);
  EXPECT_TRUE(r.deltas.empty());
  EXPECT_EQ(f.store.master(0, 1)[0], before);
  EXPECT_EQ(f.store.count(0, 1), 2);
  EXPECT_EQ(f.acc.sum(0, 1, 1)[0], 0.0f);
  EXPECT_EQ(f.acc.sum(0, 1, 3)[2], 0.0f);
}

// Rank-ordered sums: the update folds rank 1's part into rank 0's before
// anything reads the sum, so it equals the update of the folded sum; rank
// 1's part is cleared with the rest (a skipped round's too).
TEST(RoundUpdateTest, RankOrderedSumsAreFoldedBeforeTheUpdate) {
  Fixture plain, ordered(true);
  for (int64_t c = 0; c < kCols; ++c) {
    for (int64_t r = 0; r < kRows; ++r) {
      const float part = 0.5f * static_cast<float>(c) - 0.2f * static_cast<float>(r) + 0.07f;
      ordered.acc.sum_of(0, /*rank=*/1, /*round=*/1, c)[r] = part;
      plain.acc.sum(0, 1, c)[r] += part;
    }
  }
  UpdateRound(plain.Input(), UpdateLease::Grant(1, &plain.store, &plain.acc));
  RoundUpdateResult r = UpdateRound(ordered.Input(), UpdateLease::Grant(1, &ordered.store, &ordered.acc));
  ASSERT_FALSE(r.skipped);
  for (int64_t c = 0; c < kCols; ++c) {
    EXPECT_EQ(std::memcmp(ordered.store.master(0, c), plain.store.master(0, c), kRows * 4), 0);
    EXPECT_EQ(std::memcmp(ordered.store.m(0, c), plain.store.m(0, c), kRows * 4), 0);
    EXPECT_EQ(std::memcmp(ordered.store.v(0, c), plain.store.v(0, c), kRows * 4), 0);
    EXPECT_EQ(ordered.acc.sum_of(0, 1, 1, c)[0] == 0.0f, c != 2)
        << "column " << c << ": remote columns' parts are folded and cleared, the important "
        << "column's is not touched";
  }

  Fixture skipped(true);
  skipped.acc.sum_of(0, 1, 1, 3)[1] = 5.0f;
  RoundUpdateInput in = skipped.Input();
  in.nonfinite = true;
  EXPECT_TRUE(UpdateRound(in, UpdateLease::Grant(1, &skipped.store, &skipped.acc)).skipped);
  EXPECT_EQ(skipped.acc.sum_of(0, 1, 1, 3)[1], 0.0f);
  EXPECT_EQ(skipped.acc.sum(0, 1, 3)[1], 0.0f);
}

// With the local step (docs/design.md rule 13) every delta carries the
// factored second moment of the tensor's daemon columns after the update:
// row_v the same in every message, col_v one per column, v_mean; each
// column's v bias-corrected by its own new count. Arithmetic deltas never do.
TEST(RoundUpdateTest, DeltasCarryTheFactoredSecondMoment) {
  Fixture f;
  RoundUpdateInput in = f.Input();
  in.factored_moment = true;
  in.max_shard_bytes = 2 * kRows * 4 + 4 * (kRows + 3);  // two columns with the moment
  RoundUpdateResult r = UpdateRound(in, UpdateLease::Grant(in.round, &f.store, &f.acc));
  ASSERT_EQ(r.deltas.size(), 2u);
  std::vector<double> row(kRows, 0.0);
  double total = 0;
  std::vector<float> col_v;
  for (int32_t c : f.remote[0]) {
    const double bc2 = 1.0 - std::pow(static_cast<double>(0.999f), static_cast<double>(f.store.count(0, c)));
    double s = 0;
    for (int64_t i = 0; i < kRows; ++i) {
      const double vh = static_cast<double>(f.store.v(0, c)[i]) / bc2;
      row[i] += vh;
      s += vh;
    }
    total += s;
    col_v.push_back(static_cast<float>(s / kRows));
  }
  size_t at = 0;
  for (const v1::DownMessage& m : r.deltas) {
    const v1::ParameterDelta& d = m.delta();
    ASSERT_EQ(d.row_v_size(), kRows);
    ASSERT_EQ(d.col_v_size(), d.columns_size());
    for (int64_t i = 0; i < kRows; ++i) {
      EXPECT_NEAR(d.row_v(i), row[i] / 3, 1e-6 * row[i]) << "row " << i;
      EXPECT_EQ(d.row_v(i), r.deltas[0].delta().row_v(i)) << "the same in every message";
    }
    for (int i = 0; i < d.col_v_size(); ++i, ++at) {
      EXPECT_NEAR(d.col_v(i), col_v[at], 1e-6 * col_v[at]) << "column " << d.columns(i);
    }
    EXPECT_NEAR(d.v_mean(), total / (3 * kRows), 1e-6 * total / (3 * kRows));
  }
  EXPECT_EQ(at, 3u);
  EXPECT_EQ(ValueDeltas(1, f.tensors, f.remote, &f.store, in.max_shard_bytes, false, true, 0.999f)[1]
                .SerializeAsString(),
            r.deltas[1].SerializeAsString())
      << "made again from the store (a restarted daemon's resend): the same bytes";

  Fixture g;
  in = g.Input();
  in.factored_moment = true;
  in.arithmetic = true;
  r = UpdateRound(in, UpdateLease::Grant(in.round, &g.store, &g.acc));
  ASSERT_FALSE(r.deltas.empty());
  EXPECT_EQ(r.deltas[0].delta().row_v_size(), 0);
}

// A large update spreads over the pool; its store and deltas (the factored
// moment included) are the same bits for any number of update threads.
TEST(RoundUpdateTest, LargeUpdateIsTheSameForAnyThreadCount) {
  constexpr int64_t kBigRows = 300, kBigCols = 301;
  auto run = [&](int threads) {
    TensorStore store({{kBigRows, kBigCols}});
    RoundAccumulator acc({{kBigRows, kBigCols}}, 1, false);
    std::vector<RoundUpdateTensor> tensors{{"w", kBigRows, DType::kBF16}};
    std::vector<std::vector<int32_t>> remote(1);
    for (int32_t c = 0; c < kBigCols; ++c) {
      if (c % 10 != 3) remote[0].push_back(c);
      store.set_count(0, c, c % 7 == 0 ? 3 : 1);
      for (int64_t i = 0; i < kBigRows; ++i) {
        store.master(0, c)[i] = std::sin(0.01f * static_cast<float>(i * kBigCols + c));
        store.v(0, c)[i] = 1e-4f * static_cast<float>((i + c) % 11);
        acc.sum(0, 0, c)[i] = std::cos(0.003f * static_cast<float>(i * 7 + c));
      }
    }
    ThreadPool pool(threads);
    RoundUpdateInput in;
    in.round = 0;
    in.steps_sum = 2;
    in.lr = 1e-3f;
    in.tensors = &tensors;
    in.remote = &remote;
    in.factored_moment = true;
    in.max_shard_bytes = 16 << 10;
    in.pool = &pool;
    RoundUpdateResult r = UpdateRound(in, UpdateLease::Grant(0, &store, &acc));
    std::string all;
    for (const v1::DownMessage& d : r.deltas) all += d.SerializeAsString();
    return all;
  };
  const std::string one = run(1);
  EXPECT_GT(one.size(), size_t{kBigRows * 270 * 2});
  EXPECT_EQ(run(2), one);
  EXPECT_EQ(run(4), one);
}

}  // namespace
}  // namespace zenflow
