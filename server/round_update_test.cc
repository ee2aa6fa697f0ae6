#include "server/round_update.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
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
// anything reads the sum, so it equals the update of the folded sum. Nothing
// is zeroed (each rank's next first add of a round stores:
// RoundAccumulator::first_add_stores): rank 1's part is only read, and a
// skipped round's sums are left as they were.
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
    EXPECT_EQ(ordered.acc.sum_of(0, 1, 1, c)[0], 0.5f * static_cast<float>(c) + 0.07f)
        << "column " << c << ": rank 1's part only read";
  }

  Fixture skipped(true);
  skipped.acc.sum_of(0, 1, 1, 3)[1] = 5.0f;
  RoundUpdateInput in = skipped.Input();
  in.nonfinite = true;
  const float total = skipped.acc.sum(0, 1, 3)[1];
  EXPECT_TRUE(UpdateRound(in, UpdateLease::Grant(1, &skipped.store, &skipped.acc)).skipped);
  EXPECT_EQ(skipped.acc.sum_of(0, 1, 1, 3)[1], 5.0f);
  EXPECT_EQ(skipped.acc.sum(0, 1, 3)[1], total);
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

// The large updates' inputs: every tenth column (from 3) on the worker,
// counts 1 (3 every seventh column), master, v and round 0's sum set.
std::vector<int32_t> FillLarge(int64_t rows, int64_t cols, TensorStore* store,
                               RoundAccumulator* acc) {
  std::vector<int32_t> remote;
  for (int32_t c = 0; c < cols; ++c) {
    if (c % 10 != 3) remote.push_back(c);
    store->set_count(0, c, c % 7 == 0 ? 3 : 1);
    for (int64_t i = 0; i < rows; ++i) {
      store->master(0, c)[i] = std::sin(0.01f * static_cast<float>(i * cols + c));
      store->v(0, c)[i] = 1e-4f * static_cast<float>((i + c) % 11);
      acc->sum(0, 0, c)[i] = std::cos(0.003f * static_cast<float>(i * 7 + c));
    }
  }
  return remote;
}

// A large update spreads over the pool; its store and deltas (the factored
// moment included) are the same bits for any number of update threads.
TEST(RoundUpdateTest, LargeUpdateIsTheSameForAnyThreadCount) {
  constexpr int64_t kBigRows = 300, kBigCols = 301;
  auto run = [&](int threads) {
    TensorStore store({{kBigRows, kBigCols}});
    RoundAccumulator acc({{kBigRows, kBigCols}}, 1, false);
    std::vector<RoundUpdateTensor> tensors{{"w", kBigRows, DType::kBF16}};
    std::vector<std::vector<int32_t>> remote{FillLarge(kBigRows, kBigCols, &store, &acc)};
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

// With a sink the messages go out batch by batch, in order, the same bytes
// as without one: the first is handed over before the last batch's columns
// are updated (the round is never all held); with the factored moment they
// all go at the end, the same bytes again.
TEST(RoundUpdateTest, ASinkGetsTheSameMessagesBatchByBatch) {
  constexpr int64_t kR = 200, kC = 400;  // > 64K elements: the pool is used
  auto run = [&](bool sink, bool factored, std::string* all, int64_t* count_at_first) {
    TensorStore store({{kR, kC}});
    RoundAccumulator acc({{kR, kC}}, 1, false);
    std::vector<RoundUpdateTensor> tensors{{"w", kR, DType::kBF16}};
    std::vector<std::vector<int32_t>> remote{FillLarge(kR, kC, &store, &acc)};
    ThreadPool pool(3);
    RoundUpdateInput in;
    in.round = 0;
    in.steps_sum = 2;
    in.lr = 1e-3f;
    in.tensors = &tensors;
    in.remote = &remote;
    in.moments = !factored;
    in.factored_moment = factored;
    in.max_shard_bytes = 16 << 10;
    in.window_bytes = 40 << 10;  // a few messages a batch
    in.pool = &pool;
    int64_t got = 0;
    *count_at_first = -1;
    if (sink) {
      in.sink = [&](v1::DownMessage d) {
        if (got++ == 0) *count_at_first = store.count(0, remote[0].back());
        *all += d.SerializeAsString();
      };
    }
    RoundUpdateResult r = UpdateRound(in, UpdateLease::Grant(0, &store, &acc));
    if (!sink) {
      for (const v1::DownMessage& d : r.deltas) *all += d.SerializeAsString();
      got = static_cast<int64_t>(r.deltas.size());
    } else {
      EXPECT_TRUE(r.deltas.empty());
    }
    EXPECT_EQ(r.messages, got);
    return got;
  };
  for (bool factored : {false, true}) {
    std::string buffered, streamed;
    int64_t at_first = 0;
    const int64_t n = run(false, factored, &buffered, &at_first);
    EXPECT_GT(n, 8);
    EXPECT_EQ(run(true, factored, &streamed, &at_first), n);
    EXPECT_EQ(streamed, buffered);
    // The last column (count 1, or 3 every seventh) is updated to 2 (or 4).
    const int64_t before = (kC - 1) % 7 == 0 ? 3 : 1;
    EXPECT_EQ(at_first, factored ? before + 1 : before) << "factored " << factored;
  }
}

// The fused passes against the unfused sequence built from the kernels
// (Fold, AdamWUpdate per column, Encode): rank-ordered sums of three
// ranks, moments and bf16 values, at every level, on a pool, in two passes
// and in one (a bounded round): the same store and the same delta bytes;
// and ValueDeltas makes them again.
TEST(RoundUpdateTest, FusedPassesEqualTheUnfusedKernels) {
  constexpr int64_t kR = 257, kC = 300;  // > 64K elements: the pool is used
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!SimdLevelSupported(level)) continue;
    for (bool bounded : {false, true}) {
    SCOPED_TRACE(bounded ? "one pass" : "two passes");
    TensorStore store({{kR, kC}}), ref({{kR, kC}});
    RoundAccumulator acc({{kR, kC}}, 3, true), racc({{kR, kC}}, 3, true);
    std::vector<RoundUpdateTensor> tensors{{"w", kR, DType::kBF16}};
    std::vector<std::vector<int32_t>> remote(1);
    for (int32_t c = 0; c < kC; ++c) {
      if (c % 9 != 4) remote[0].push_back(c);
      for (TensorStore* s : {&store, &ref}) {
        s->set_count(0, c, c % 5 == 0 ? 2 : 0);
        for (int64_t i = 0; i < kR; ++i) {
          s->master(0, c)[i] = std::sin(0.01f * static_cast<float>(i * kC + c));
          s->m(0, c)[i] = 1e-3f * static_cast<float>((i + 2 * c) % 13);
          s->v(0, c)[i] = 1e-5f * static_cast<float>((i + c) % 11);
        }
      }
      for (int r = 0; r < 3; ++r) {
        for (int64_t i = 0; i < kR; ++i) {
          const float g = std::cos(0.003f * static_cast<float>(i * 7 + c + 100 * r));
          acc.sum_of(0, r, 1, c)[i] = g;
          racc.sum_of(0, r, 1, c)[i] = g;
        }
      }
    }
    ThreadPool pool(3);
    RoundUpdateInput in;
    in.round = 1;
    in.steps_sum = 6;
    in.lr = 1e-3f;
    in.tensors = &tensors;
    in.remote = &remote;
    in.moments = true;
    in.max_shard_bytes = 64 << 10;
    in.simd = level;
    in.pool = &pool;
    in.bounded = bounded;
    RoundUpdateResult r = UpdateRound(in, UpdateLease::Grant(1, &store, &acc));
    ASSERT_FALSE(r.skipped);
    EXPECT_EQ(r.two_pass, !bounded);
    // The unfused reference.
    AdamWHyper h = in.hyper;
    h.lr = in.lr;
    std::string values, m, v;
    double norm2 = 0;
    for (int32_t c : remote[0]) {
      racc.Fold(SimdLevel::kScalar, 0, 1, c, 1);
      for (int64_t i = 0; i < kR; ++i) norm2 += static_cast<double>(racc.sum(0, 1, c)[i]) * racc.sum(0, 1, c)[i];
    }
    for (int32_t c : remote[0]) {
      const int64_t step = ref.count(0, c) + 1;
      AdamWUpdate(level, h, step, 1.0f / 6, racc.sum(0, 1, c), ref.master(0, c), ref.m(0, c),
                  ref.v(0, c), kR);
      ref.set_count(0, c, step);
      std::string b(kR * 2, '\0');
      Encode(DType::kBF16, ref.master(0, c), kR, b.data());
      values += b;
      Encode(DType::kBF16, ref.m(0, c), kR, b.data());
      m += b;
      Encode(DType::kBF16, ref.v(0, c), kR, b.data());
      v += b;
    }
    EXPECT_NEAR(r.grad_norm, std::sqrt(norm2) / 6, 1e-5 * std::sqrt(norm2) / 6);
    for (int32_t c = 0; c < kC; ++c) {
      ASSERT_EQ(store.count(0, c), ref.count(0, c)) << c;
      ASSERT_EQ(0, std::memcmp(store.master(0, c), ref.master(0, c), kR * 4)) << SimdLevelName(level) << " column " << c;
      ASSERT_EQ(0, std::memcmp(store.m(0, c), ref.m(0, c), kR * 4)) << c;
      ASSERT_EQ(0, std::memcmp(store.v(0, c), ref.v(0, c), kR * 4)) << c;
      for (int rank = 0; rank < 3; ++rank) {
        for (int64_t i = 0; i < kR; ++i) {
          // The daemon's columns folded as the reference's, nothing zeroed
          // (rank-ordered: the next round's first adds store), the others
          // untouched.
          ASSERT_EQ(acc.sum_of(0, rank, 1, c)[i], racc.sum_of(0, rank, 1, c)[i])
              << "rank " << rank << " column " << c;
        }
      }
    }
    std::string got_values, got_m, got_v;
    std::vector<int32_t> cols;
    for (const v1::DownMessage& d : r.deltas) {
      got_values += d.delta().payload();
      got_m += d.delta().m();
      got_v += d.delta().v();
      cols.insert(cols.end(), d.delta().columns().begin(), d.delta().columns().end());
      ASSERT_EQ(d.delta().update_counts_size(), d.delta().columns_size());
      for (int i = 0; i < d.delta().columns_size(); ++i) {
        EXPECT_EQ(d.delta().update_counts(i), store.count(0, d.delta().columns(i)));
      }
    }
    EXPECT_GT(r.deltas.size(), 3u);
    EXPECT_EQ(cols, remote[0]);
    EXPECT_TRUE(got_values == values) << SimdLevelName(level);
    EXPECT_TRUE(got_m == m);
    EXPECT_TRUE(got_v == v);
    const std::vector<v1::DownMessage> again =
        ValueDeltas(1, tensors, remote, &store, in.max_shard_bytes, true, false, 0.999f);
    ASSERT_EQ(again.size(), r.deltas.size());
    for (size_t k = 0; k < again.size(); ++k) {
      EXPECT_EQ(again[k].SerializeAsString(), r.deltas[k].SerializeAsString()) << k;
    }
    }
  }
}

// A bounded round is updated in one pass, the same bits as in two: store,
// sums, the messages a sink gets batch by batch, the norm to the last bit;
// with clipping (which needs the norm before AdamW) or not bounded, in two.
TEST(RoundUpdateTest, ABoundedRoundIsOnePassWithTheSameBits) {
  constexpr int64_t kR = 200, kC = 400;
  struct Run {
    std::string messages, store;
    float norm = 0;
    bool two_pass = false;
  };
  auto run = [&](bool bounded, float max_grad_norm) {
    TensorStore store({{kR, kC}});
    RoundAccumulator acc({{kR, kC}}, 2, true);
    std::vector<RoundUpdateTensor> tensors{{"w", kR, DType::kF32}};
    std::vector<std::vector<int32_t>> remote{FillLarge(kR, kC, &store, &acc)};
    for (int32_t c = 0; c < kC; ++c) {
      for (int64_t i = 0; i < kR; ++i) acc.sum_of(0, 1, 0, c)[i] = 0.5f * acc.sum(0, 0, c)[i] - 0.25f;
    }
    ThreadPool pool(2);
    RoundUpdateInput in;
    in.round = 0;
    in.steps_sum = 4;
    in.lr = 1e-3f;
    in.tensors = &tensors;
    in.remote = &remote;
    in.moments = true;
    in.max_shard_bytes = 16 << 10;
    in.window_bytes = 40 << 10;
    in.pool = &pool;
    in.bounded = bounded;
    in.max_grad_norm = max_grad_norm;
    Run out;
    in.sink = [&](v1::DownMessage d) { out.messages += d.SerializeAsString(); };
    const RoundUpdateResult r = UpdateRound(in, UpdateLease::Grant(0, &store, &acc));
    EXPECT_FALSE(r.skipped);
    out.norm = r.grad_norm;
    out.two_pass = r.two_pass;
    for (int32_t c = 0; c < kC; ++c) {
      out.store.append(reinterpret_cast<const char*>(store.master(0, c)), kR * 4);
      out.store.append(reinterpret_cast<const char*>(store.m(0, c)), kR * 4);
      out.store.append(reinterpret_cast<const char*>(store.v(0, c)), kR * 4);
      out.store += std::to_string(store.count(0, c));
      for (int rank = 0; rank < 2; ++rank) {
        out.store.append(reinterpret_cast<const char*>(acc.sum_of(0, rank, 0, c)), kR * 4);
      }
    }
    return out;
  };
  const Run two = run(false, 0), one = run(true, 0);
  EXPECT_TRUE(two.two_pass);
  EXPECT_FALSE(one.two_pass);
  EXPECT_GT(two.messages.size(), size_t{kR * kC * 4});
  EXPECT_TRUE(one.messages == two.messages);
  EXPECT_TRUE(one.store == two.store);
  EXPECT_GT(two.norm, 0.0f);
  EXPECT_EQ(0, std::memcmp(&one.norm, &two.norm, sizeof(float)));
  // Clipping needs the norm first: two passes even when bounded.
  const Run clipped = run(true, 0.5f);
  EXPECT_TRUE(clipped.two_pass);
  EXPECT_LT(0.5f, clipped.norm);  // (so the clip was applied)
  EXPECT_FALSE(clipped.messages == two.messages);
}

// RunRoundUpdateKernels runs AdamW and the encode: the same bits as the
// kernels called directly, for any pool, with and without arithmetic.
TEST(RoundUpdateTest, RoundKernelsAreAdamWAndTheEncode) {
  const size_t n = static_cast<size_t>(kUpdateBlockElements) * 2 + 1234;
  for (bool arithmetic : {false, true}) {
    std::vector<float> g(n), p(n), m(n, 0.01f), v(n, 1e-4f);
    for (size_t i = 0; i < n; ++i) {
      g[i] = std::cos(0.001f * static_cast<float>(i));
      p[i] = std::sin(0.002f * static_cast<float>(i));
    }
    std::vector<float> rp = p, rm = m, rv = v;
    RoundKernelOptions o;
    o.simd = BestSimdLevel();
    o.step = 3;
    o.grad_scale = 0.5f;
    o.values = DType::kBF16;
    o.arithmetic = arithmetic;
    o.moments = !arithmetic;
    AdamWUpdate(o.simd, o.hyper, 3, 0.5f, g.data(), rp.data(), rm.data(), rv.data(), n);
    std::string want_values(n * (arithmetic ? 4 : 2), '\0'), want_m(n * 2, '\0'), want_v(n * 2, '\0');
    if (arithmetic) {
      std::vector<float> diff(n);
      for (size_t i = 0; i < n; ++i) diff[i] = rp[i] - p[i];
      Encode(DType::kF32, diff.data(), n, want_values.data());
    } else {
      Encode(DType::kBF16, rp.data(), n, want_values.data());
      Encode(DType::kBF16, rm.data(), n, want_m.data());
      Encode(DType::kBF16, rv.data(), n, want_v.data());
    }
    ThreadPool pool(3);
    for (ThreadPool* on : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> kp = p, km = m, kv = v;
      std::string values(want_values.size(), '\0'), mo(n * 2, '\0'), vo(n * 2, '\0');
      RoundKernelBuffers b;
      b.grad = g.data();
      b.master = kp.data();
      b.m = km.data();
      b.v = kv.data();
      b.n = n;
      b.values_out = values.data();
      b.m_out = mo.data();
      b.v_out = vo.data();
      RunRoundUpdateKernels(o, b, on);
      EXPECT_TRUE(kp == rp);
      EXPECT_TRUE(km == rm);
      EXPECT_TRUE(kv == rv);
      EXPECT_TRUE(values == want_values) << "arithmetic " << arithmetic;
      EXPECT_TRUE(mo == want_m);
      EXPECT_TRUE(vo == want_v);
    }
  }
}

// 8-bit m and v (design rule 15): the round update equals Adam8Update
// column by column with each column's own count, on a pool as on one
// thread; the deltas' m and v (the predicted step's) are the stored state
// dequantized; ValueDeltas makes the same messages again.
TEST(RoundUpdateTest, EightBitStateUpdatesAsAdam8Update) {
  constexpr int64_t kR = 300, kC = 40;
  auto run = [&](int threads, std::string* bytes) {
    auto store = std::make_unique<TensorStore>(std::vector<TensorStore::Shape>{{kR, kC}},
                                               StateFormat::k8bit);
    TensorStore ref({{kR, kC}}, StateFormat::k8bit);
    RoundAccumulator acc({{kR, kC}}, 1, false);
    std::vector<RoundUpdateTensor> tensors{{"w", kR, DType::kF32}};
    std::vector<std::vector<int32_t>> remote(1);
    std::vector<float> g(kR);
    for (int32_t c = 0; c < kC; ++c) {
      if (c % 9 != 4) remote[0].push_back(c);
      for (TensorStore* s : {store.get(), &ref}) {
        s->set_count(0, c, c % 5 == 0 ? 2 : 0);
        for (int64_t i = 0; i < kR; ++i) s->master(0, c)[i] = std::sin(0.01f * (i * kC + c));
      }
      for (int64_t i = 0; i < kR; ++i) acc.sum(0, 0, c)[i] = std::cos(0.003f * (i * 7 + c));
    }
    RoundUpdateInput in;
    in.round = 0;
    in.steps_sum = 2;
    in.lr = 1e-2f;
    in.tensors = &tensors;
    in.remote = &remote;
    in.moments = true;
    in.max_shard_bytes = 64 << 10;
    in.simd = BestSimdLevel();
    ThreadPool pool(threads);
    in.pool = &pool;
    for (int32_t c : remote[0]) {
      std::memcpy(g.data(), acc.sum(0, 0, c), kR * sizeof(float));
      AdamWHyper h = in.hyper;
      h.lr = in.lr;
      Adam8Update(in.simd, h, ref.count(0, c) + 1, 0.5f, g.data(), ref.master(0, c), ref.q8(0, c),
                  kR, 1, nullptr, nullptr);
    }
    RoundUpdateResult r = UpdateRound(in, UpdateLease::Grant(0, store.get(), &acc));
    ASSERT_FALSE(r.skipped);
    for (const v1::DownMessage& d : r.deltas) *bytes += d.SerializeAsString();
    std::vector<float> m(kR), v(kR), rm(kR), rv(kR);
    std::vector<char> m16(kR * 2), v16(kR * 2);
    for (int32_t c : remote[0]) {
      ASSERT_EQ(std::memcmp(store->master(0, c), ref.master(0, c), kR * sizeof(float)), 0) << c;
      store->CopyMoments(0, c, 1, m.data(), v.data());
      ref.CopyMoments(0, c, 1, rm.data(), rv.data());
      ASSERT_EQ(m, rm) << c;
      ASSERT_EQ(v, rv) << c;
    }
    // The first message's first column: its m and v are the stored ones in bf16.
    const v1::ParameterDelta& d = r.deltas[0].delta();
    store->CopyMoments(0, d.columns(0), 1, m.data(), v.data());
    Encode(DType::kBF16, m.data(), kR, m16.data());
    Encode(DType::kBF16, v.data(), kR, v16.data());
    EXPECT_EQ(std::memcmp(d.m().data(), m16.data(), kR * 2), 0);
    EXPECT_EQ(std::memcmp(d.v().data(), v16.data(), kR * 2), 0);
    std::string again;
    for (const v1::DownMessage& x :
         ValueDeltas(0, tensors, remote, store.get(), in.max_shard_bytes, true, false, 0.999f)) {
      again += x.SerializeAsString();
    }
    EXPECT_EQ(again, *bytes);
  };
  std::string one, two;
  run(1, &one);
  run(2, &two);
  EXPECT_EQ(one, two);
  EXPECT_FALSE(one.empty());
}

}  // namespace
}  // namespace zenflow
