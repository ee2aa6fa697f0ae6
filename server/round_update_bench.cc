// round_update_bench: UpdateRound on the scale bench's job shape (four
// [4096, 512] tensors, one column in ten important: 7.5M daemon values),
// timed against the kernels the update must run (RunRoundUpdateKernels:
// AdamW and the delta encode over as many values, on the same pool), in
// the same process, alternating. Prints one line per configuration:
//
//   bazel run -c opt //server:round_update_bench -- [threads] [reps] [world] [rows] [recycle]
//
// (a world given, not 0: only that many ranks' runs, for a profile of one
// case; rows: of each tensor, 4096 unless given: server:round_update_bench_smoke
// runs it tiny; the last line: a round not proven bounded, in two passes).
// round_update_fraction = kernels / update (medians). Sums
// are refilled before every update (outside the timing), so each update
// reads and clears real sums. With rank-ordered sums the daemon folds each
// rank's sums into rank 0's as the ranks close (Job::FoldClosedRanksLocked,
// on the ingest threads, before the round's update): the bench does the
// same before each update, timed apart and printed as `close-path fold`
// (it counts against ingest, not the update). As in zenflowd, the delta
// messages go to a sink and their buffers back to a DeltaRecycler once
// "sent" (after the rep), so each update sizes them from the last one's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/adamw.h"
#include "common/huge_pages.h"
#include "common/malloc_tuning.h"
#include "common/thread_pool.h"
#include "server/delta_recycler.h"
#include "server/round_update.h"

namespace zenflow {
namespace {

constexpr int64_t kCols = 512, kTensors = 4;
int64_t kRows = 4096;  // (main: the fourth argument)
bool kRecycle = true;   // (main: the fifth; 0: fresh buffers every update)

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Run(int world, bool rank_ordered, bool moments, DType param_dtype, ThreadPool* pool,
         int reps, bool bounded = true) {
  std::vector<TensorStore::Shape> shapes(kTensors, {kRows, kCols});
  TensorStore store(shapes);
  RoundAccumulator acc(shapes, world, rank_ordered);
  std::vector<RoundUpdateTensor> tensors;
  std::vector<std::vector<int32_t>> remote(kTensors);
  int64_t values = 0;
  for (int t = 0; t < kTensors; ++t) {
    tensors.push_back({"w" + std::to_string(t), kRows, param_dtype});
    for (int32_t c = 0; c < kCols; ++c) {
      if (c % 10 != 3) remote[t].push_back(c);
    }
    values += static_cast<int64_t>(remote[t].size()) * kRows;
    for (int64_t c = 0; c < kCols; ++c) {
      for (int64_t r = 0; r < kRows; ++r) store.master(t, c)[r] = 0.01f * static_cast<float>((r + c) % 97);
    }
  }
  std::vector<float> pattern(kRows * kCols);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = 1e-3f * static_cast<float>(i % 113) - 0.05f;
  const int sums = acc.sum_ranks();

  // The kernels' buffers: as many values, apart from the job's, on huge
  // pages as the job's state and sums are (common/huge_pages.h).
  const size_t nv = static_cast<size_t>(values);
  std::vector<float> kg, kp, km, kv;
  AssignOnHugePages(&kg, nv);
  AssignOnHugePages(&kp, nv, 0.5f);
  AssignOnHugePages(&km, nv);
  AssignOnHugePages(&kv, nv);
  const size_t vbytes = DTypeSize(param_dtype);
  std::vector<char> kout, kmo, kvo;
  AssignOnHugePages(&kout, nv * vbytes);
  AssignOnHugePages(&kmo, moments ? nv * 2 : 0);
  AssignOnHugePages(&kvo, moments ? nv * 2 : 0);
  for (size_t i = 0; i < kg.size(); ++i) kg[i] = pattern[i % pattern.size()];

  std::vector<double> upd, ker, fold;
  DeltaRecycler recycler(2 * kDeltaWindowBytes);
  std::vector<v1::DownMessage> sent;
  for (int rep = 0; rep < reps; ++rep) {
    const int64_t round = 2 * rep + 1;
    for (int t = 0; t < kTensors; ++t) {
      for (int r = 0; r < sums; ++r) {
        std::copy(pattern.begin(), pattern.end(), acc.sum_buffer(t, r, round & 1).begin());
      }
    }
    RoundUpdateInput in;
    in.round = round;
    in.steps_sum = 4 * world;
    in.lr = 1e-4f;
    in.tensors = &tensors;
    in.remote = &remote;
    in.moments = moments;
    in.simd = BestSimdLevel();
    in.pool = pool;
    // The sums' values are small, as the ingest proves of real gradients:
    // one pass (RoundUpdateInput::bounded), unless asked for two.
    in.bounded = bounded;
    // As zenflowd: the messages go to a sink (the outboxes), and once the
    // ranks have them their buffers go back to the job's recycler, bounded
    // by the delta reserve the job is charged (two 16 MiB windows here).
    in.recycler = kRecycle ? &recycler : nullptr;
    sent.clear();
    in.sink = [&](v1::DownMessage d) { sent.push_back(std::move(d)); };
    // The close path: rank r folded once ranks 0..r closed (here in order).
    double t0 = Now();
    for (int r = 1; r < sums; ++r) acc.FoldRanks(in.simd, round, r, r + 1);
    fold.push_back(Now() - t0);
    in.folded_ranks = sums;
    // Every rank's part is in the total (each holds the pattern): the
    // sequential float sum of `sums` copies, at the first and last value.
    for (int t = 0; t < kTensors; ++t) {
      const std::vector<float>& total = acc.sum_buffer(t, 0, round & 1);
      for (size_t i : {size_t{0}, total.size() - 1}) {
        float x = pattern[i];
        for (int r = 1; r < sums; ++r) x += pattern[i];
        if (total[i] != x) {
          std::fprintf(stderr, "round_update_bench: the ranks' sums were not folded\n");
          std::exit(1);
        }
      }
    }
    t0 = Now();
    RoundUpdateResult res = UpdateRound(in, UpdateLease::Grant(round, &store, &acc));
    upd.push_back(Now() - t0);
    if (res.skipped || sent.empty() || res.two_pass == bounded) {
      std::fprintf(stderr, "round_update_bench: the update was skipped\n");
      std::exit(1);
    }
    RoundKernelBuffers b;
    b.grad = kg.data();
    b.master = kp.data();
    b.m = km.data();
    b.v = kv.data();
    b.n = static_cast<size_t>(values);
    b.values_out = kout.data();
    b.m_out = moments ? kmo.data() : nullptr;
    b.v_out = moments ? kvo.data() : nullptr;
    RoundKernelOptions o;
    o.simd = in.simd;
    o.step = rep + 1;
    o.grad_scale = 0.25f;
    o.values = param_dtype;
    o.moments = moments;
    t0 = Now();
    RunRoundUpdateKernels(o, b, pool);
    ker.push_back(Now() - t0);
    for (v1::DownMessage& d : sent) recycler.Recycle(&d);  // the ranks have them
  }
  const double u = Median(upd), k = Median(ker), f = Median(fold);
  const DeltaRecycler::Stats rs = recycler.stats();
  std::printf(
      "world=%d sums=%s moments=%d dtype=%s threads=%d recycle=%d passes=%d values=%lld: "
      "update %.2f ms "
      "(%.2f ns/value), "
      "kernels %.2f ms (%.2f ns/value), round_update_fraction %.3f; close-path fold %.2f ms "
      "(%.2f ns/value, one thread, not in the update); buffers from the recycler %lld of "
      "%lld\n",
      world, rank_ordered ? "rank_ordered" : "shared", moments ? 1 : 0, DTypeName(param_dtype),
      pool->num_threads(), kRecycle ? 1 : 0, bounded ? 1 : 2, static_cast<long long>(values),
      u * 1e3,
      u * 1e9 / values, k * 1e3,
      k * 1e9 / values, k / u, f * 1e3, f * 1e9 / values, static_cast<long long>(rs.taken),
      static_cast<long long>(rs.taken + rs.missed));
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  zenflow::TuneMallocForBulkBuffers();  // as zenflowd
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 9;
  const int only = argc > 3 ? std::atoi(argv[3]) : 0;
  if (argc > 4) zenflow::kRows = std::max(1, std::atoi(argv[4]));
  if (argc > 5) zenflow::kRecycle = std::atoi(argv[5]) != 0;
  zenflow::ThreadPool pool(threads, "zf-update");
  for (int world : {1, 8, 16}) {
    if (only > 0 && world != only) continue;
    for (bool ro : {true, false}) {
      if (world == 1 && !ro) continue;
      zenflow::Run(world, ro, false, zenflow::DType::kF32, &pool, reps);
    }
  }
  if (only <= 1) zenflow::Run(1, true, true, zenflow::DType::kBF16, &pool, reps);
  // A round not proven bounded (or clipped): the norm first, in a pass of
  // its own.
  if (only <= 1) zenflow::Run(1, true, false, zenflow::DType::kF32, &pool, reps, false);
  return 0;
}
