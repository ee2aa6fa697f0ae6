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
#include "server/factored_moment.h"

namespace zenflow {
namespace {

// Updates of fewer elements run without the shared thread pool: they never
// wait for it, which another job's large update may hold.
constexpr int64_t kInlineUpdateElements = int64_t{1} << 16;

// A run of adjacent columns with the same update count: contiguous in the
// column-major buffers, so one kernel call covers it.
struct ColumnRun {
  int tensor;
  int64_t first_col;
  int64_t ncols;
};

// The factored second moment of every tensor's daemon columns as the
// update left them (docs/design.md rule 13).
std::vector<FactoredMoment> FactoredMoments(const std::vector<RoundUpdateTensor>& tensors,
                                            const std::vector<std::vector<int32_t>>& remote,
                                            TensorStore* store, float beta2,
                                            const ParallelRange& parallel) {
  std::vector<FactoredMomentTensor> in(tensors.size());
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const int t = static_cast<int>(ti);
    in[ti].rows = tensors[ti].rows;
    in[ti].columns = &remote[ti];
    in[ti].v = [store, t](int32_t c) -> const float* { return store->v(t, c); };
    in[ti].count = [store, t](int32_t c) { return store->count(t, c); };
  }
  return ComputeFactoredMoments(in, beta2, parallel);
}

// The columns' new values (with `old_values`: fp32 new - old) as
// ParameterDelta messages of at most max_shard_bytes, in column order.
std::vector<v1::DownMessage> EncodeDeltas(
    int64_t round, const std::vector<RoundUpdateTensor>& tensors,
    const std::vector<std::vector<int32_t>>& remote, TensorStore* store,
    const std::vector<std::vector<float>>* old_values, int64_t max_shard_bytes, bool moments,
    bool factored, float beta2, const ParallelRange& parallel) {
  const bool arithmetic = old_values != nullptr;
  std::vector<FactoredMoment> fm;
  if (factored) fm = FactoredMoments(tensors, remote, store, beta2, parallel);
  struct Chunk {
    int tensor;
    size_t begin, end;  // indices into remote[tensor]
  };
  std::vector<Chunk> chunks;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const RoundUpdateTensor& t = tensors[ti];
    const DType out = arithmetic ? DType::kF32 : t.param_dtype;
    // With moments every element also takes bf16 m and v.
    const int64_t state_bytes = moments ? kPredictedStateBytesPerValue : 0;
    const size_t per = static_cast<size_t>(DeltaColumnsPerMessage(
        max_shard_bytes, t.rows, static_cast<int64_t>(DTypeSize(out)) + state_bytes, factored));
    for (size_t i = 0; i < remote[ti].size(); i += per) {
      chunks.push_back({static_cast<int>(ti), i, std::min(remote[ti].size(), i + per)});
    }
  }
  std::vector<v1::DownMessage> deltas(chunks.size());
  parallel(chunks.size(), [&](size_t b, size_t e) {
    std::vector<float> diff;
    for (size_t k = b; k < e; ++k) {
      const Chunk& ch = chunks[k];
      const RoundUpdateTensor& t = tensors[ch.tensor];
      const DType out = arithmetic ? DType::kF32 : t.param_dtype;
      v1::ParameterDelta* d = deltas[k].mutable_delta();
      d->set_round(round);
      d->set_tensor(t.name);
      d->set_kind(arithmetic ? v1::DELTA_ARITHMETIC : v1::DELTA_VALUES);
      d->set_dtype(ToProto(out));
      const size_t n = ch.end - ch.begin;
      std::string* payload = d->mutable_payload();
      payload->resize(n * t.rows * DTypeSize(out));
      char* dst = payload->data();
      const size_t col_bytes = static_cast<size_t>(t.rows) * 2;  // bf16
      if (moments) {
        d->mutable_m()->resize(n * col_bytes);
        d->mutable_v()->resize(n * col_bytes);
      }
      if (factored) {
        const FactoredMoment& f = fm[ch.tensor];
        d->mutable_row_v()->Add(f.row_v.begin(), f.row_v.end());
        d->mutable_col_v()->Add(f.col_v.begin() + static_cast<std::ptrdiff_t>(ch.begin),
                                f.col_v.begin() + static_cast<std::ptrdiff_t>(ch.end));
        d->set_v_mean(f.v_mean);
      }
      for (size_t i = ch.begin; i < ch.end; ++i) {
        const int32_t c = remote[ch.tensor][i];
        d->add_columns(c);
        const float* src = store->master(ch.tensor, c);
        if (arithmetic) {
          diff.resize(t.rows);
          const float* old = (*old_values)[ch.tensor].data() + i * t.rows;
          for (int64_t r = 0; r < t.rows; ++r) diff[r] = src[r] - old[r];
          src = diff.data();
        }
        if (moments) {
          const size_t at = (i - ch.begin) * col_bytes;
          Encode(DType::kBF16, store->m(ch.tensor, c), t.rows, d->mutable_m()->data() + at);
          Encode(DType::kBF16, store->v(ch.tensor, c), t.rows, d->mutable_v()->data() + at);
          d->add_update_counts(store->count(ch.tensor, c));
        }
        Encode(out, src, t.rows, dst);
        dst += t.rows * DTypeSize(out);
      }
    }
  });
  return deltas;
}

}  // namespace

std::vector<v1::DownMessage> ValueDeltas(int64_t round, const std::vector<RoundUpdateTensor>& tensors,
                                         const std::vector<std::vector<int32_t>>& remote,
                                         TensorStore* store, int64_t max_shard_bytes,
                                         bool moments, bool factored_moment, float beta2) {
  return EncodeDeltas(round, tensors, remote, store, nullptr, max_shard_bytes, moments,
                      factored_moment, beta2,
                      [](size_t n, const std::function<void(size_t, size_t)>& fn) {
                        if (n > 0) fn(0, n);
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
  const std::vector<RoundUpdateTensor>& tensors_ = *in.tensors;
  const std::vector<std::vector<int32_t>>& remote = *in.remote;
  const int64_t round = in.round;
  TensorStore* const store_ = lease.store();
  RoundAccumulator* const acc_ = lease.acc();

  // Runs of adjacent columns with equal counts, split to bound their size.
  std::vector<ColumnRun> runs;
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const RoundUpdateTensor& t = tensors_[ti];
    const int64_t max_cols = std::max<int64_t>(1, (int64_t{1} << 16) / t.rows);
    const std::vector<int32_t>& cols = remote[ti];
    size_t i = 0;
    while (i < cols.size()) {
      size_t j = i + 1;
      while (j < cols.size() && cols[j] == cols[j - 1] + 1 &&
             store_->count(static_cast<int>(ti), cols[j]) ==
                 store_->count(static_cast<int>(ti), cols[i]) &&
             static_cast<int64_t>(j - i) < max_cols) {
        ++j;
      }
      runs.push_back({static_cast<int>(ti), cols[i], static_cast<int64_t>(j - i)});
      i = j;
    }
  }

  // A small update runs on this driver alone: it never waits for the shared
  // pool, which a large job's update may hold. (Runs are independent and the
  // norm is summed by run, so the result is the same either way.)
  int64_t work = 0;
  for (const ColumnRun& run : runs) work += run.ncols * tensors_[run.tensor].rows;
  auto parallel = [&](size_t n, const std::function<void(size_t, size_t)>& fn) {
    if (work < kInlineUpdateElements) {
      if (n > 0) fn(0, n);
    } else {
      in.pool->ParallelFor(n, 1, fn);
    }
  };

  float grad_norm = 0.0f;
  const double scale = in.steps_sum > 0 ? 1.0 / static_cast<double>(in.steps_sum) : 0.0;
  std::vector<std::vector<float>> old_values;
  bool skip = in.nonfinite;
  bool overflowed = false;
  double norm = 0, clip = 1.0;
  if (!skip) {
    // Norm of the round's mean gradient: per-run partial sums, added in order;
    // and the largest magnitude, to see whether the update can be finite.
    std::vector<double> partial(runs.size(), 0.0), largest(runs.size(), 0.0);
    parallel(runs.size(), [&](size_t b, size_t e) {
      for (size_t k = b; k < e; ++k) {
        const ColumnRun& run = runs[k];
        const RoundUpdateTensor& t = tensors_[run.tensor];
        acc_->Fold(run.tensor, round, run.first_col, run.ncols);
        const float* g = acc_->sum(run.tensor, round, run.first_col);
        double s = 0;
        float big = 0;
        for (int64_t i = 0; i < run.ncols * t.rows; ++i) {
          s += static_cast<double>(g[i]) * g[i];
          big = std::max(big, std::fabs(g[i]));
        }
        partial[k] = s;
        largest[k] = big;
      }
    });
    double sum = 0, big = 0;
    for (size_t k = 0; k < runs.size(); ++k) {
      sum += partial[k];
      big = std::max(big, largest[k]);
    }
    norm = std::sqrt(sum) * scale;
    grad_norm = static_cast<float>(norm);
    if (in.max_grad_norm > 0 && norm > in.max_grad_norm) {
      clip = in.max_grad_norm / (norm + 1e-6);
    }
    // Finite shards can still sum to Inf, or to a mean whose square (Adam's
    // v) overflows fp32: such a round cannot update finitely and is skipped
    // (after the fact: the shards were accepted), as a non-finite round is.
    if (!std::isfinite(sum) || !(big * scale * clip < 1.8e19)) {
      skip = true;
      overflowed = true;
    }
  }
  if (!skip) {
    const float grad_scale = static_cast<float>(scale * clip);
    if (arithmetic) {
      old_values.resize(tensors_.size());
      for (size_t ti = 0; ti < tensors_.size(); ++ti) {
        const RoundUpdateTensor& t = tensors_[ti];
        old_values[ti].resize(remote[ti].size() * t.rows);
        for (size_t i = 0; i < remote[ti].size(); ++i) {
          std::memcpy(old_values[ti].data() + i * t.rows,
                      store_->master(static_cast<int>(ti), remote[ti][i]), t.rows * sizeof(float));
        }
      }
    }
    AdamWHyper h = in.hyper;
    h.lr = in.lr;
    parallel(runs.size(), [&](size_t b, size_t e) {
      for (size_t k = b; k < e; ++k) {
        const ColumnRun& run = runs[k];
        const RoundUpdateTensor& t = tensors_[run.tensor];
        const int64_t step = store_->count(run.tensor, run.first_col) + 1;
        const size_t n = static_cast<size_t>(run.ncols * t.rows);
        float* g = acc_->sum(run.tensor, round, run.first_col);
        AdamWUpdate(in.simd, h, step, grad_scale, g, store_->master(run.tensor, run.first_col),
                    store_->m(run.tensor, run.first_col), store_->v(run.tensor, run.first_col), n);
        std::memset(g, 0, n * sizeof(float));
        for (int64_t c = 0; c < run.ncols; ++c) store_->set_count(run.tensor, run.first_col + c, step);
      }
    });
  } else {
    parallel(runs.size(), [&](size_t b, size_t e) {
      for (size_t k = b; k < e; ++k) {
        const ColumnRun& run = runs[k];
        acc_->Clear(run.tensor, round, run.first_col, run.ncols);
      }
    });
  }

  std::vector<v1::DownMessage> deltas;
  if (!skip) {
    deltas = EncodeDeltas(round, tensors_, remote, store_, arithmetic ? &old_values : nullptr,
                          in.max_shard_bytes, in.moments && !arithmetic,
                          in.factored_moment && !arithmetic, in.hyper.beta2, parallel);
  }
  RoundUpdateResult out;
  out.skipped = skip;
  out.overflowed = overflowed;
  out.grad_norm = grad_norm;
  out.deltas = std::move(deltas);
  return out;
}

}  // namespace zenflow
