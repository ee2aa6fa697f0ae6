// The update of one closed round; see round_update.h.
#include "server/round_update.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>

#include "common/dtype_proto.h"
#include "common/geometry.h"
#include "server/delta_recycler.h"
#include "server/factored_moment.h"

namespace zenflow {
namespace {

// Updates of fewer elements run without the shared thread pool: they never
// wait for it, which another job's large update may hold.
constexpr int64_t kInlineUpdateElements = int64_t{1} << 16;

// Runs task(k) for every k in [0, n): on the pool, threads claiming tasks
// as they finish (ThreadPool::ForEach), or on the caller.
void ForEachTask(ThreadPool* pool, size_t n, const std::function<void(size_t)>& task) {
  if (pool == nullptr) {
    for (size_t k = 0; k < n; ++k) task(k);
  } else {
    pool->ForEach(n, task);
  }
}

// One delta message: columns [begin, end) of remote[tensor].
struct MessagePlan {
  int tensor;
  size_t begin, end;
};

// The messages of the columns' deltas, in column order: whole columns, at
// most max_shard_bytes each (with the predicted step's state and the
// factored moment when asked).
std::vector<MessagePlan> PlanMessages(const std::vector<RoundUpdateTensor>& tensors,
                                      const std::vector<std::vector<int32_t>>& remote,
                                      bool arithmetic, int64_t max_shard_bytes, bool moments,
                                      bool factored) {
  std::vector<MessagePlan> out;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const RoundUpdateTensor& t = tensors[ti];
    const DType dt = arithmetic ? DType::kF32 : t.param_dtype;
    // With moments every element also takes bf16 m and v.
    const int64_t state_bytes = moments ? kPredictedStateBytesPerValue : 0;
    const size_t per = static_cast<size_t>(DeltaColumnsPerMessage(
        max_shard_bytes, t.rows, static_cast<int64_t>(DTypeSize(dt)) + state_bytes, factored));
    for (size_t i = 0; i < remote[ti].size(); i += per) {
      out.push_back({static_cast<int>(ti), i, std::min(remote[ti].size(), i + per)});
    }
  }
  return out;
}

// Sizes *s to n bytes: a buffer of the recycler's when one fits (resized
// without a write when it held n bytes before), else a fresh one (which
// resize zero-fills). Returns the bytes it holds for the recycler's bound.
int64_t SizeBuffer(std::string* s, size_t n, DeltaRecycler* recycler) {
  if (recycler == nullptr) {
    s->resize(n);
    return 0;
  }
  std::string spare = recycler->Take(n);
  const bool taken = spare.capacity() >= n && n >= DeltaRecycler::kMinBytes;
  if (taken) *s = std::move(spare);
  s->resize(n);
  const int64_t cap = static_cast<int64_t>(s->capacity());
  if (!taken) recycler->Hold(cap);
  return cap;
}

// Sets a delta message's fields and sizes its payload (and m, v) for its
// columns; counts(c) is column c's update count after the update. Returns
// the bytes its buffers hold for the recycler (0 without one).
int64_t PrepareMessage(int64_t round, const RoundUpdateTensor& t, const MessagePlan& mp,
                       const std::vector<int32_t>& cols, bool arithmetic, bool moments,
                       const std::function<int64_t(int32_t)>& counts, v1::ParameterDelta* d,
                       DeltaRecycler* recycler = nullptr) {
  const DType dt = arithmetic ? DType::kF32 : t.param_dtype;
  d->set_round(round);
  d->set_tensor(t.name);
  d->set_kind(arithmetic ? v1::DELTA_ARITHMETIC : v1::DELTA_VALUES);
  d->set_dtype(ToProto(dt));
  const size_t n = mp.end - mp.begin;
  d->mutable_columns()->Add(cols.begin() + static_cast<std::ptrdiff_t>(mp.begin),
                            cols.begin() + static_cast<std::ptrdiff_t>(mp.end));
  int64_t held = SizeBuffer(d->mutable_payload(), n * t.rows * DTypeSize(dt), recycler);
  if (moments) {
    const size_t col_bytes = static_cast<size_t>(t.rows) * 2;  // bf16
    held += SizeBuffer(d->mutable_m(), n * col_bytes, recycler);
    held += SizeBuffer(d->mutable_v(), n * col_bytes, recycler);
    d->mutable_update_counts()->Reserve(static_cast<int>(n));
    for (size_t i = mp.begin; i < mp.end; ++i) d->add_update_counts(counts(cols[i]));
  }
  return held;
}

// The factored moment of the columns as the update left them, into every
// message (docs/design.md rule 13).
void AddFactoredMoments(const std::vector<RoundUpdateTensor>& tensors,
                        const std::vector<std::vector<int32_t>>& remote, TensorStore* store,
                        float beta2, const std::vector<MessagePlan>& plan, ThreadPool* pool,
                        std::vector<v1::DownMessage>* deltas) {
  std::vector<FactoredMomentTensor> in(tensors.size());
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const int t = static_cast<int>(ti);
    in[ti].rows = tensors[ti].rows;
    in[ti].columns = &remote[ti];
    in[ti].v = [store, t](int32_t c) -> const float* {
      if (!store->quantized(t)) return store->v(t, c);
      thread_local std::vector<float> column;  // 8-bit v: the column dequantized
      column.resize(static_cast<size_t>(store->shape(t).rows));
      store->CopyMoments(t, c, 1, nullptr, column.data());
      return column.data();
    };
    in[ti].count = [store, t](int32_t c) { return store->count(t, c); };
  }
  const std::vector<FactoredMoment> fm = ComputeFactoredMoments(
      in, beta2, [pool](size_t n, const std::function<void(size_t, size_t)>& fn) {
        if (pool == nullptr) {
          if (n > 0) fn(0, n);
        } else {
          pool->ParallelFor(n, 1, fn);
        }
      });
  for (size_t k = 0; k < plan.size(); ++k) {
    const MessagePlan& mp = plan[k];
    const FactoredMoment& f = fm[mp.tensor];
    v1::ParameterDelta* d = (*deltas)[k].mutable_delta();
    d->mutable_row_v()->Add(f.row_v.begin(), f.row_v.end());
    d->mutable_col_v()->Add(f.col_v.begin() + static_cast<std::ptrdiff_t>(mp.begin),
                            f.col_v.begin() + static_cast<std::ptrdiff_t>(mp.end));
    d->set_v_mean(f.v_mean);
  }
}

// The kernels of one block: AdamW, then the values (fp32 new - old with
// arithmetic: `old` holds n floats of scratch) and m, v encoded. With q8
// (a tensor with 8-bit m and v: common/adam8.h, n / rows whole columns) the
// update is Adam8Update's, and the m, v encoded are the stored ones.
void UpdateAndEncode(const RoundKernelOptions& o, const AdamWHyper& h, int64_t step,
                     const float* grad, float* p, float* m, float* v, size_t n, char* values_out,
                     char* m_out, char* v_out, std::vector<float>* old,
                     const Adam8Columns* q8 = nullptr, int64_t rows = 0) {
  if (o.arithmetic) {
    old->resize(n);
    std::memcpy(old->data(), p, n * sizeof(float));
  }
  if (q8 != nullptr) {
    thread_local std::vector<float> moments;
    if (o.moments) moments.resize(2 * n);
    m = o.moments ? moments.data() : nullptr;
    v = o.moments ? moments.data() + n : nullptr;
    Adam8Update(o.simd, h, step, o.grad_scale, grad, p, *q8, rows,
                static_cast<int64_t>(n) / rows, m, v, o.adam8_draw_seed);
  } else {
    AdamWUpdate(o.simd, h, step, o.grad_scale, grad, p, m, v, n);
  }
  if (o.arithmetic) {
    float* diff = old->data();
    for (size_t i = 0; i < n; ++i) diff[i] = p[i] - diff[i];
    Encode(DType::kF32, diff, n, values_out);
  } else {
    Encode(o.values, p, n, values_out);
  }
  if (o.moments) {
    Encode(DType::kBF16, m, n, m_out);
    Encode(DType::kBF16, v, n, v_out);
  }
}

// A block of the update: adjacent columns [first_col, first_col + ncols)
// of one tensor, with one update count, in one message (remote index
// `index`: where in the message's columns it starts).
struct Block {
  int tensor;
  int64_t first_col, ncols;
  int message;
  size_t index;
  int64_t step;  // the columns' count after the update
};

}  // namespace

std::vector<v1::DownMessage> ValueDeltas(int64_t round, const std::vector<RoundUpdateTensor>& tensors,
                                         const std::vector<std::vector<int32_t>>& remote,
                                         TensorStore* store, int64_t max_shard_bytes,
                                         bool moments, bool factored_moment, float beta2) {
  const std::vector<MessagePlan> plan =
      PlanMessages(tensors, remote, false, max_shard_bytes, moments, factored_moment);
  std::vector<v1::DownMessage> deltas(plan.size());
  for (size_t k = 0; k < plan.size(); ++k) {
    const MessagePlan& mp = plan[k];
    const RoundUpdateTensor& t = tensors[mp.tensor];
    const std::vector<int32_t>& cols = remote[mp.tensor];
    v1::ParameterDelta* d = deltas[k].mutable_delta();
    PrepareMessage(round, t, mp, cols, false, moments,
                   [&](int32_t c) { return store->count(mp.tensor, c); }, d);
    const size_t col_values = static_cast<size_t>(t.rows) * DTypeSize(t.param_dtype);
    const size_t col_state = static_cast<size_t>(t.rows) * 2;
    std::vector<float> mv(moments ? 2 * static_cast<size_t>(t.rows) : 0);
    for (size_t i = mp.begin; i < mp.end; ++i) {
      const int32_t c = cols[i];
      Encode(t.param_dtype, store->master(mp.tensor, c), t.rows,
             d->mutable_payload()->data() + (i - mp.begin) * col_values);
      if (moments) {
        store->CopyMoments(mp.tensor, c, 1, mv.data(), mv.data() + t.rows);
        Encode(DType::kBF16, mv.data(), t.rows,
               d->mutable_m()->data() + (i - mp.begin) * col_state);
        Encode(DType::kBF16, mv.data() + t.rows, t.rows,
               d->mutable_v()->data() + (i - mp.begin) * col_state);
      }
    }
  }
  if (factored_moment) {
    AddFactoredMoments(tensors, remote, store, beta2, plan, nullptr, &deltas);
  }
  return deltas;
}

void RunRoundUpdateKernels(const RoundKernelOptions& o, const RoundKernelBuffers& b,
                           ThreadPool* pool) {
  const size_t block = static_cast<size_t>(kUpdateBlockElements);
  const size_t vsize = o.arithmetic ? sizeof(float) : DTypeSize(o.values);
  ForEachTask(pool, (b.n + block - 1) / block, [&](size_t k) {
    thread_local std::vector<float> old;
    const size_t at = k * block, n = std::min(block, b.n - at);
    UpdateAndEncode(o, o.hyper, o.step, b.grad + at, b.master + at, b.m + at, b.v + at, n,
                    static_cast<char*>(b.values_out) + at * vsize,
                    o.moments ? static_cast<char*>(b.m_out) + at * 2 : nullptr,
                    o.moments ? static_cast<char*>(b.v_out) + at * 2 : nullptr, &old);
  });
}

RoundUpdateResult UpdateRound(const RoundUpdateInput& in, UpdateLease lease) {
  if (lease.round() != in.round || lease.store() == nullptr) {
    // A programming error: the update would write buffers it does not own.
    std::fprintf(stderr, "UpdateRound: round %lld run without its lease\n",
                 static_cast<long long>(in.round));
    std::abort();
  }
  const bool arithmetic = in.arithmetic;
  const bool moments = in.moments && !arithmetic;
  const bool factored = in.factored_moment && !arithmetic;
  const std::vector<RoundUpdateTensor>& tensors = *in.tensors;
  const std::vector<std::vector<int32_t>>& remote = *in.remote;
  const int64_t round = in.round;
  TensorStore* const store = lease.store();
  RoundAccumulator* const acc = lease.acc();

  // The messages, and in each the blocks: adjacent columns with equal
  // counts, at most kUpdateBlockElements (at least one column).
  const std::vector<MessagePlan> plan =
      PlanMessages(tensors, remote, arithmetic, in.max_shard_bytes, moments, factored);
  std::vector<Block> blocks;
  int64_t work = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    const MessagePlan& mp = plan[k];
    const int t = mp.tensor;
    const int64_t rows = tensors[t].rows;
    const int64_t max_cols = std::max<int64_t>(1, kUpdateBlockElements / rows);
    const std::vector<int32_t>& cols = remote[t];
    size_t i = mp.begin;
    while (i < mp.end) {
      const int64_t count = store->count(t, cols[i]);
      size_t j = i + 1;
      while (j < mp.end && cols[j] == cols[j - 1] + 1 && store->count(t, cols[j]) == count &&
             static_cast<int64_t>(j - i) < max_cols) {
        ++j;
      }
      blocks.push_back({t, cols[i], static_cast<int64_t>(j - i), static_cast<int>(k), i, count + 1});
      work += static_cast<int64_t>(j - i) * rows;
      i = j;
    }
  }
  // A small update runs on this driver alone: it never waits for the shared
  // pool, which a large job's update may hold. (The blocks and their order
  // are the same either way, so is the result.)
  ThreadPool* const pool = work < kInlineUpdateElements ? nullptr : in.pool;

  // The batches: consecutive messages of at most in.window_bytes (at least
  // one message), batch i = messages [batch_at[i], batch_at[i + 1]) and
  // blocks [block_at[i], block_at[i + 1]).
  std::vector<size_t> batch_at{0}, block_at{0};
  {
    int64_t bytes = 0;
    for (size_t k = 0; k < plan.size(); ++k) {
      const MessagePlan& mp = plan[k];
      const RoundUpdateTensor& t = tensors[mp.tensor];
      const int64_t per = static_cast<int64_t>(arithmetic ? sizeof(float) : DTypeSize(t.param_dtype)) +
                          (moments ? kPredictedStateBytesPerValue : 0);
      const int64_t b = static_cast<int64_t>(mp.end - mp.begin) * t.rows * per;
      if (k > batch_at.back() && bytes + b > in.window_bytes) {
        batch_at.push_back(k);
        bytes = 0;
      }
      bytes += b;
    }
    batch_at.push_back(plan.size());
    for (size_t i = 1; i + 1 < batch_at.size(); ++i) {
      size_t j = block_at.back();
      while (j < blocks.size() && static_cast<size_t>(blocks[j].message) < batch_at[i]) ++j;
      block_at.push_back(j);
    }
    block_at.push_back(blocks.size());
  }
  const size_t batches = batch_at.size() - 1;
  // Makes message k: its fields set, its payload (and m, v) sized, from
  // the recycler's buffers where it has them (held[k]: the bytes they count
  // against its bound until the message is handed on or dropped).
  DeltaRecycler* const recycler = in.recycler;
  std::vector<int64_t> held(recycler != nullptr ? plan.size() : 0);
  auto prepare = [&](size_t k, v1::DownMessage* d) {
    const MessagePlan& mp = plan[k];
    const int64_t h = PrepareMessage(
        round, tensors[mp.tensor], mp, remote[mp.tensor], arithmetic, moments,
        [&](int32_t c) { return store->count(mp.tensor, c) + 1; }, d->mutable_delta(), recycler);
    if (recycler != nullptr) held[k] = h;
  };
  auto release = [&](size_t k) {
    if (recycler != nullptr && held[k] != 0) {
      recycler->Release(held[k]);
      held[k] = 0;
    }
  };

  RoundUpdateResult out;
  bool skip = in.nonfinite;
  std::vector<v1::DownMessage> deltas;
  const double scale = in.steps_sum > 0 ? 1.0 / static_cast<double>(in.steps_sum) : 0.0;
  double clip = 1.0;
  // One pass (RoundUpdateInput::bounded): the round cannot overflow and
  // nothing scales the gradient by its norm, so each block's fold and
  // squares come right before its AdamW, and the norm is summed after.
  const bool one_pass = !skip && in.bounded && !(in.max_grad_norm > 0);
  std::vector<BlockSquares> squares(blocks.size());
  if (skip) {
    ForEachTask(pool, blocks.size(), [&](size_t k) {
      acc->Clear(blocks[k].tensor, round, blocks[k].first_col, blocks[k].ncols);
    });
  } else if (one_pass) {
    // The first batch's messages, made before its blocks write into them.
    deltas.resize(plan.size());
    ForEachTask(pool, batches > 0 ? batch_at[1] : 0, [&](size_t k) { prepare(k, &deltas[k]); });
  } else {
    // Pass 1: the first batch's messages made (first, so that their
    // allocation overlaps the blocks), then per block the fold and the
    // squares.
    deltas.resize(plan.size());
    const size_t first = batches > 0 ? batch_at[1] : 0;
    ForEachTask(pool, first + blocks.size(), [&](size_t k) {
      if (k < first) {
        prepare(k, &deltas[k]);
        return;
      }
      const Block& b = blocks[k - first];
      squares[k - first] =
          acc->FoldNorm(in.simd, b.tensor, round, b.first_col, b.ncols, in.folded_ranks);
    });
    // The barrier: the norm of the round's mean gradient (the blocks' sums
    // in block order) and the largest magnitude, to see whether the update
    // can be finite.
    double sum = 0, big = 0;
    for (const BlockSquares& q : squares) {
      sum += q.sum;
      big = std::max(big, static_cast<double>(q.largest));
    }
    const double norm = std::sqrt(sum) * scale;
    out.grad_norm = static_cast<float>(norm);
    out.two_pass = true;
    if (in.max_grad_norm > 0 && norm > in.max_grad_norm) clip = in.max_grad_norm / (norm + 1e-6);
    // Finite shards can still sum to Inf, or to a mean whose square (Adam's
    // v) overflows fp32: such a round cannot update finitely and is skipped
    // (after the fact: the shards were accepted), as a non-finite round is.
    if (!std::isfinite(sum) || !(big * scale * clip < 1.8e19)) {
      skip = true;
      out.overflowed = true;
      for (size_t k = 0; k < held.size(); ++k) release(k);
      deltas.clear();
      ForEachTask(pool, blocks.size(), [&](size_t k) {
        acc->Clear(blocks[k].tensor, round, blocks[k].first_col, blocks[k].ncols);
      });
    }
  }
  if (!skip) {
    // Pass 2 (or the one pass: each block's fold and squares first), batch
    // by batch: per block AdamW, the encode into the
    // messages, shared sums zeroed and the counts advanced, while the block is
    // in cache; beside the blocks, the next batch's messages made. Then the
    // batch's messages go to the sink (without the factored moment, which
    // needs all of v).
    RoundKernelOptions o;
    o.simd = in.simd;
    o.adam8_draw_seed = in.adam8_draw_seed;
    o.grad_scale = static_cast<float>(scale * clip);
    o.arithmetic = arithmetic;
    o.moments = moments;
    AdamWHyper h = in.hyper;
    h.lr = in.lr;
    const bool stream = in.sink && !factored;
    // Where each message's payload, m and v are (taken on this thread, per
    // batch: the blocks only write the bytes).
    struct Out {
      char *values, *m, *v;
    };
    std::vector<Out> outs(plan.size());
    for (size_t i = 0; i < batches; ++i) {
      for (size_t k = batch_at[i]; k < batch_at[i + 1]; ++k) {
        v1::ParameterDelta* d = deltas[k].mutable_delta();
        outs[k] = {d->mutable_payload()->data(), moments ? d->mutable_m()->data() : nullptr,
                   moments ? d->mutable_v()->data() : nullptr};
      }
      const size_t next_begin = batch_at[i + 1];
      const size_t next = i + 1 < batches ? batch_at[i + 2] - next_begin : 0;
      const size_t b0 = block_at[i], nblocks = block_at[i + 1] - b0;
      ForEachTask(pool, next + nblocks, [&](size_t task) {
        if (task < next) {
          prepare(next_begin + task, &deltas[next_begin + task]);
          return;
        }
        thread_local std::vector<float> old;
        const Block& b = blocks[b0 + task - next];
        const RoundUpdateTensor& t = tensors[b.tensor];
        const MessagePlan& mp = plan[b.message];
        const Out& dst = outs[b.message];
        const size_t n = static_cast<size_t>(b.ncols * t.rows);
        const size_t at = (b.index - mp.begin) * static_cast<size_t>(t.rows);
        RoundKernelOptions ok = o;
        ok.values = t.param_dtype;
        const size_t vsize = arithmetic ? sizeof(float) : DTypeSize(t.param_dtype);
        if (one_pass) {
          squares[b0 + task - next] =
              acc->FoldNorm(in.simd, b.tensor, round, b.first_col, b.ncols, in.folded_ranks);
        }
        float* g = acc->sum(b.tensor, round, b.first_col);
        const bool q = store->quantized(b.tensor);
        const Adam8Columns q8 = q ? store->q8(b.tensor, b.first_col) : Adam8Columns{};
        UpdateAndEncode(ok, h, b.step, g, store->master(b.tensor, b.first_col),
                        q ? nullptr : store->m(b.tensor, b.first_col),
                        q ? nullptr : store->v(b.tensor, b.first_col), n,
                        dst.values + at * vsize, moments ? dst.m + at * 2 : nullptr,
                        moments ? dst.v + at * 2 : nullptr, &old, q ? &q8 : nullptr, t.rows);
        acc->Clear(b.tensor, round, b.first_col, b.ncols);  // shared sums only
        for (int64_t c = 0; c < b.ncols; ++c) store->set_count(b.tensor, b.first_col + c, b.step);
      });
      if (stream) {
        for (size_t k = batch_at[i]; k < batch_at[i + 1]; ++k) {
          release(k);
          in.sink(std::move(deltas[k]));
        }
      }
    }
    if (one_pass) {
      // The norm, summed in block order as the first pass would have.
      double sum = 0;
      for (const BlockSquares& q : squares) sum += q.sum;
      out.grad_norm = static_cast<float>(std::sqrt(sum) * scale);
    }
    if (factored) {
      AddFactoredMoments(tensors, remote, store, in.hyper.beta2, plan, pool, &deltas);
      if (in.sink) {
        for (v1::DownMessage& d : deltas) in.sink(std::move(d));
      }
    }
    out.messages = static_cast<int64_t>(plan.size());
    if (in.sink) deltas.clear();
    // What is left is the caller's (no sink): no longer the update's.
    for (size_t k = 0; k < held.size(); ++k) release(k);
  }
  out.skipped = skip;
  out.deltas = std::move(deltas);
  return out;
}

}  // namespace zenflow
