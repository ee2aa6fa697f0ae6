// One optimizer job; see job.h.
#include "server/job.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype_proto.h"
#include "common/geometry.h"
#include "common/quote.h"
#include "common/selection.h"
#include "common/status_macros.h"
#include "common/stream_error.h"
#include "common/worker_stats.h"

namespace zenflow {
namespace {

constexpr int64_t kDefaultShardBytes = 4 << 20;
constexpr int64_t kMinShardBytes = 1024;
constexpr int32_t kMaxWorldSize = 4096;


}  // namespace

absl::Status CheckJobId(absl::string_view id) {
  bool ok = !id.empty() && id.size() <= kMaxJobIdBytes;
  for (char c : id) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '_' || c == '.');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("job_id ", Quote(id), " is invalid: use 1-",
                                                 kMaxJobIdBytes,
                                                 " characters from [A-Za-z0-9._-]"));
}

namespace {

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

void RejectionCounter::Export(google::protobuf::Map<std::string, int64_t>* out) const {
  for (int i = 0; i < 32; ++i) {
    const int64_t n = counts_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(i));
    (*out)[name] += n;
  }
}

absl::Status NormalizeJobSpec(v1::JobSpec* spec, int64_t max_message_bytes) {
  ZF_RETURN_IF_ERROR(CheckJobId(spec->job_id()));
  if (spec->tensors_size() == 0) {
    return absl::InvalidArgumentError("job has no tensors");
  }
  if (spec->tensors_size() > kMaxTensors) {
    return absl::InvalidArgumentError(absl::StrCat("job has ", spec->tensors_size(),
                                                   " tensors; at most ", kMaxTensors));
  }
  std::map<std::string, int> seen;
  for (int i = 0; i < spec->tensors_size(); ++i) {
    v1::TensorSpec* t = spec->mutable_tensors(i);
    if (t->name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor #", i, " has no name"));
    }
    if (t->name().size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor #", i, " name ", Quote(t->name()), " is longer than ",
                       kMaxTensorNameBytes, " bytes"));
    }
    if (!seen.emplace(t->name(), i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t->name(), "' is listed twice"));
    }
    if (t->shape_size() < 1 || t->shape_size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t->name(), "': shape ", ShapeString(t->shape()),
                       " must be 1-D [n] or 2-D [rows, cols]"));
    }
    for (int64_t d : t->shape()) {
      if (d <= 0 || d > kMaxTensorDim) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t->name(), "': shape ", ShapeString(t->shape()),
                         " must have dimensions in [1, 2^31]"));
      }
    }
    if (t->dtype() == v1::DTYPE_UNSPECIFIED) t->set_dtype(v1::DTYPE_FP32);
    ZF_RETURN_IF_ERROR(FromProto(t->dtype(), "tensor dtype").status());
  }
  if (spec->world_size() == 0) spec->set_world_size(1);
  if (spec->world_size() < 1 || spec->world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size ", spec->world_size(), " must be in [1, ", kMaxWorldSize, "]"));
  }
  if (spec->wire_dtype() == v1::DTYPE_UNSPECIFIED) spec->set_wire_dtype(v1::DTYPE_BF16);
  if (spec->wire_dtype() != v1::DTYPE_INT8) {
    ZF_RETURN_IF_ERROR(FromProto(spec->wire_dtype(), "wire_dtype").status());
  }
  if (spec->delta_kind() == v1::DELTA_UNSPECIFIED) spec->set_delta_kind(v1::DELTA_VALUES);
  if (spec->delta_kind() != v1::DELTA_VALUES && spec->delta_kind() != v1::DELTA_ARITHMETIC) {
    return absl::InvalidArgumentError(absl::StrCat("delta_kind ", static_cast<int>(spec->delta_kind()),
                                                   " is unknown (DELTA_VALUES or DELTA_ARITHMETIC)"));
  }
  if (spec->delta_kind() == v1::DELTA_ARITHMETIC) {
    // new - old of the fp32 master added to a rounded bf16/fp16 parameter
    // drifts from the master by a rounding every round: values only.
    for (const v1::TensorSpec& t : spec->tensors()) {
      if (t.dtype() != v1::DTYPE_FP32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name(), "' is ", DTypeName(*FromProto(t.dtype(), "")),
            ": DELTA_ARITHMETIC needs fp32 parameters; use DELTA_VALUES (the default), which "
            "returns values in the tensor's dtype"));
      }
    }
  }
  if (spec->mode() == v1::MODE_UNSPECIFIED) spec->set_mode(v1::MODE_ZENFLOW);
  if (spec->max_shard_bytes() == 0) {
    spec->set_max_shard_bytes(std::min<int64_t>(kDefaultShardBytes, max_message_bytes / 2));
  }
  if (spec->max_shard_bytes() < kMinShardBytes ||
      spec->max_shard_bytes() > max_message_bytes - 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_shard_bytes ", spec->max_shard_bytes(), " must be in [", kMinShardBytes,
        ", ", max_message_bytes - 4096, "] (the daemon's max message size less headers)"));
  }

  v1::AdamWConfig* a = spec->mutable_adamw();
  if (!a->has_lr()) a->set_lr(1e-3f);
  if (!a->has_beta1()) a->set_beta1(0.9f);
  if (!a->has_beta2()) a->set_beta2(0.999f);
  if (!a->has_eps()) a->set_eps(1e-8f);
  if (!a->has_weight_decay()) a->set_weight_decay(0.01f);
  if (!(a->lr() > 0 && std::isfinite(a->lr()))) {
    return absl::InvalidArgumentError(absl::StrCat("adamw.lr ", a->lr(), " must be > 0"));
  }
  if (!(a->beta1() >= 0 && a->beta1() < 1) || !(a->beta2() >= 0 && a->beta2() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("adamw betas (", a->beta1(), ", ",
                                                   a->beta2(), ") must be in [0, 1)"));
  }
  if (!(a->eps() > 0 && std::isfinite(a->eps()))) {
    return absl::InvalidArgumentError(absl::StrCat("adamw.eps ", a->eps(), " must be > 0"));
  }
  if (!(a->weight_decay() >= 0 && std::isfinite(a->weight_decay()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("adamw.weight_decay ", a->weight_decay(), " must be >= 0"));
  }
  if (!(a->max_grad_norm() >= 0 && std::isfinite(a->max_grad_norm()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adamw.max_grad_norm ", a->max_grad_norm(), " must be >= 0 (0 = no clipping)"));
  }

  v1::ZenFlowConfig* z = spec->mutable_zenflow();
  if (spec->mode() == v1::MODE_ZERO_OFFLOAD) {
    z->set_topk_ratio(0);
    z->set_update_interval(1);
    z->set_select_interval(1);
    z->set_full_warmup_rounds(0);
    z->set_auto_update_interval(false);
    z->mutable_apply_delay()->set_sync(true);
    z->set_predicted_step(false);
  } else if (spec->mode() == v1::MODE_ZENFLOW) {
    if (!z->has_predicted_step()) z->set_predicted_step(spec->delta_kind() != v1::DELTA_ARITHMETIC);
    if (z->predicted_step() && spec->delta_kind() == v1::DELTA_ARITHMETIC) {
      return absl::InvalidArgumentError(
          "zenflow.predicted_step needs DELTA_VALUES: a rank's predicted step is replaced by the "
          "next round's values, which arithmetic deltas would add to it instead");
    }
    if (!z->has_topk_ratio()) z->set_topk_ratio(0.1f);
    // Unset: update_interval auto with S_max 4 (DESIGN rule 10, README's 11:
    // rounds as short as the daemon keeps hidden, one step where it can).
    if (z->update_interval() == 0) {
      z->set_update_interval(4);
      z->set_auto_update_interval(true);
    }
    // (Only for an update_interval in range, checked below: 25 x a larger
    // one would overflow.)
    if (z->select_interval() == 0 && z->update_interval() >= 1 &&
        z->update_interval() <= 1 << 20) {
      z->set_select_interval(25 * z->update_interval());
    }
    if (z->apply_delay().kind_case() == v1::ApplyDelay::KIND_NOT_SET) {
      z->mutable_apply_delay()->set_adaptive(true);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "mode ", static_cast<int>(spec->mode()), " is unknown (MODE_ZENFLOW or MODE_ZERO_OFFLOAD)"));
  }
  if (!(z->topk_ratio() >= 0 && z->topk_ratio() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("zenflow.topk_ratio ", z->topk_ratio(), " must be in [0, 1]"));
  }
  if (z->update_interval() < 1 || z->update_interval() > 1 << 20) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zenflow.update_interval ", z->update_interval(), " must be in [1, 2^20]"));
  }
  if (z->select_interval() < z->update_interval() ||
      z->select_interval() % z->update_interval() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zenflow.select_interval ", z->select_interval(),
        " must be a positive multiple of update_interval ", z->update_interval()));
  }
  if (z->full_warmup_rounds() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zenflow.full_warmup_rounds ", z->full_warmup_rounds(), " must be >= 0"));
  }
  if (z->importance() == v1::IMPORTANCE_UNSPECIFIED) z->set_importance(v1::IMPORTANCE_L1);
  const v1::ApplyDelay& d = z->apply_delay();
  if (d.kind_case() == v1::ApplyDelay::kSteps &&
      (d.steps() < 1 || d.steps() > z->update_interval())) {
    return absl::InvalidArgumentError(
        absl::StrCat("zenflow.apply_delay.steps ", d.steps(), " must be in [1, ",
                     z->update_interval(), "] (use sync for 0)"));
  }
  if (d.kind_case() == v1::ApplyDelay::kOverlapStep) {
    z->mutable_apply_delay()->set_steps(z->update_interval());
  }
  if (spec->has_partition()) ZF_RETURN_IF_ERROR(CheckPartition(*spec));
  return absl::OkStatus();
}

absl::Status CheckPartition(const v1::JobSpec& spec) {
  const v1::Partition& p = spec.partition();
  if (p.version() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition.version ", p.version(), " is unknown (this daemon reads version 1)"));
  }
  if (p.parts() < 2 || p.parts() > kMaxPartitionParts) {
    return absl::InvalidArgumentError(absl::StrCat("partition.parts ", p.parts(),
                                                   " must be in [2, ", kMaxPartitionParts,
                                                   "] (one daemon: leave partition unset)"));
  }
  if (p.part() < 0 || p.part() >= p.parts()) {
    return absl::InvalidArgumentError(absl::StrCat("partition.part ", p.part(), " must be in [0, ",
                                                   p.parts(), ")"));
  }
  if (p.tensors_size() > kMaxTensors) {
    return absl::InvalidArgumentError(absl::StrCat("partition lists ", p.tensors_size(),
                                                   " tensors; a job has at most ", kMaxTensors));
  }
  // Clipping needs the norm of the whole mean gradient and a non-finite
  // round must be skipped on every part alike: both would need the daemons
  // to agree before updating, which they do not do.
  if (spec.adamw().max_grad_norm() > 0) {
    return absl::InvalidArgumentError(
        "adamw.max_grad_norm > 0 cannot be used with a partition: each daemon sees only its "
        "part's gradient norm; clip on the workers or run the job on one daemon");
  }
  if (spec.skip_nonfinite_rounds()) {
    return absl::InvalidArgumentError(
        "skip_nonfinite_rounds cannot be used with a partition: the daemons would skip a round "
        "apart; leave it false (a non-finite shard is then rejected) or use one daemon");
  }
  std::set<std::string> names;
  std::vector<bool> used(p.parts(), false);
  int mine = 0;
  for (int i = 0; i < p.tensors_size(); ++i) {
    const v1::PartitionEntry& e = p.tensors(i);
    if (e.tensor().empty() || e.tensor().size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition entry #", i, ": tensor name must have 1 to ", kMaxTensorNameBytes, " bytes"));
    }
    // A block continues the previous entry's tensor, or starts a new one at
    // column 0; a whole tensor appears once.
    const bool block = e.columns() != 0;
    const bool continues = i > 0 && p.tensors(i - 1).tensor() == e.tensor();
    if (block) {
      if (e.columns() < 0 || e.first_column() < 0 || e.columns() > kMaxTensorDim ||
          e.first_column() > kMaxTensorDim - e.columns()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "partition: block of tensor ", Quote(e.tensor()), " has first_column ",
            e.first_column(), " and columns ", e.columns(), "; need columns in [1, 2^31] and the "
            "block inside [0, 2^31]"));
      }
      const v1::PartitionEntry* prev = continues ? &p.tensors(i - 1) : nullptr;
      const int64_t want = prev == nullptr ? 0 : prev->first_column() + prev->columns();
      if (prev != nullptr && prev->columns() == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "partition lists tensor ", Quote(e.tensor()), " whole and as a block"));
      }
      if (e.first_column() != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "partition: block of tensor ", Quote(e.tensor()), " starts at column ",
            e.first_column(), ", not ", want, " (a split tensor's blocks come one after another "
            "in column order, from column 0)"));
      }
      if (prev == nullptr && !names.insert(e.tensor()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("partition lists tensor ", Quote(e.tensor()), " twice"));
      }
      const bool last = i + 1 == p.tensors_size() || p.tensors(i + 1).tensor() != e.tensor();
      if (last && prev == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "partition: tensor ", Quote(e.tensor()), " has a single block; a split tensor has "
            "two or more (list it whole with columns 0)"));
      }
      for (int j = i - 1; j >= 0 && p.tensors(j).tensor() == e.tensor(); --j) {
        if (p.tensors(j).part() == e.part()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "partition: two blocks of tensor ", Quote(e.tensor()), " are on part ", e.part(),
              " (each block of a tensor has a part of its own)"));
        }
      }
    } else {
      if (e.first_column() != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "partition: tensor ", Quote(e.tensor()), " has first_column ", e.first_column(),
            " but columns 0 (a whole tensor starts at column 0; a block needs columns > 0)"));
      }
      if (!names.insert(e.tensor()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("partition lists tensor ", Quote(e.tensor()), " twice"));
      }
    }
    if (e.part() < 0 || e.part() >= p.parts()) {
      return absl::InvalidArgumentError(absl::StrCat("partition: tensor ", Quote(e.tensor()),
                                                     " is on part ", e.part(), ", not in [0, ",
                                                     p.parts(), ")"));
    }
    if (e.params() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: tensor ", Quote(e.tensor()), " has params < 0"));
    }
    used[e.part()] = true;
    if (e.part() != p.part()) continue;
    // This part's tensors are the spec's, in the same order.
    if (mine >= spec.tensors_size() || spec.tensors(mine).name() != e.tensor()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: part ", p.part(), "'s tensors must be the job's tensors in the same order; "
          "the map has ", Quote(e.tensor()), " where the spec has ",
          mine < spec.tensors_size() ? Quote(spec.tensors(mine).name()) : "no more tensors"));
    }
    if (block) {
      // The block is a 2-D tensor of the block's columns, chosen by top-k.
      const v1::TensorSpec& t = spec.tensors(mine);
      if (t.shape_size() != 2 || t.shape(1) != e.columns() || t.local()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "partition: tensor ", Quote(e.tensor()), " is split into blocks, so part ", p.part(),
            "'s spec must give it as a 2-D tensor of its block's ", e.columns(),
            " columns, not local (it has shape [", absl::StrJoin(t.shape(), ", "), "]",
            t.local() ? ", local" : "", ")"));
      }
    }
    ++mine;
  }
  if (mine != spec.tensors_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition: tensor ", Quote(spec.tensors(mine).name()), " of the spec is not on part ",
        p.part(), " in the map"));
  }
  for (int i = 0; i < p.parts(); ++i) {
    if (!used[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: part ", i, " of ", p.parts(), " hosts no tensor (use fewer daemons)"));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------

absl::StatusOr<JobFootprint> ComputeJobFootprint(const v1::JobSpec& spec) {
  JobFootprint f;
  bool overflow = false;
  auto mul = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    overflow |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&](int64_t* acc, int64_t b) { overflow |= __builtin_add_overflow(*acc, b, acc); };
  const bool arithmetic = spec.delta_kind() == v1::DELTA_ARITHMETIC;
  int64_t delta_round = 0;
  for (const v1::TensorSpec& t : spec.tensors()) {
    const ColumnGeometry geo = GeometryOf(t);
    const int64_t rows = geo.rows, cols = geo.cols;
    const int64_t n = mul(rows, cols);
    add(&f.params, n);
    // Rank-ordered sums: two accumulation buffers per rank.
    const int64_t sums = spec.rank_ordered_sums() ? spec.world_size() : 1;
    add(&f.state_bytes, mul(n, mul(3 + 2 * sums, sizeof(float))));
    add(&f.bookkeeping_bytes, mul(cols, sizeof(int64_t) + 1 + 2 * sizeof(int32_t)));
    add(&f.bookkeeping_bytes,
        mul(mul(cols, spec.world_size()), sizeof(int64_t) + sizeof(int32_t)));
    int64_t out = arithmetic ? 2 * 4 : (t.dtype() == v1::DTYPE_FP32 ? 4 : 2);
    // One-step rounds' deltas carry bf16 m and v for the predicted step.
    if (RoundsMayCarryPredictedState(spec)) out += kPredictedStateBytesPerValue;
    add(&delta_round, mul(n, out));
  }
  f.delta_bytes = mul(delta_round, 2);
  int64_t total = f.state_bytes;
  add(&total, f.bookkeeping_bytes);
  add(&total, f.delta_bytes);
  if (overflow) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", Quote(spec.job_id()), " is too large: its size in bytes overflows 64 bits"));
  }
  return f;
}

absl::StatusOr<std::shared_ptr<Job>> Job::Create(const v1::JobSpec& spec, JobContext ctx) {
  ZF_ASSIGN_OR_RETURN(JobFootprint f, ComputeJobFootprint(spec));
  try {
    return std::shared_ptr<Job>(new Job(spec, ctx, f));
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "job '%s': allocating %d bytes for %d parameters failed (out of memory); "
      "nothing was kept",
      spec.job_id(), f.total(), f.params));
}

Job::Job(const v1::JobSpec& spec, JobContext ctx, const JobFootprint& footprint)
    : spec_(spec),
      ctx_(ctx),
      world_(spec.world_size()),
      interval_(spec.zenflow().update_interval()),
      auto_interval_(spec.mode() == v1::MODE_ZENFLOW && spec.zenflow().auto_update_interval()),
      selection_(spec.world_size()),
      footprint_(footprint),
      strand_(ctx.scheduler->NewStrand()),
      hand_off_(spec.world_size(), spec.tensors_size()),
      all_reduce_(spec.world_size()) {
  tensors_.resize(spec.tensors_size());
  for (int i = 0; i < spec.tensors_size(); ++i) {
    const v1::TensorSpec& ts = spec.tensors(i);
    TensorState& t = tensors_[i];
    t.name = ts.name();
    const ColumnGeometry geo = GeometryOf(ts);
    t.rows = geo.rows;
    t.cols = geo.cols;
    t.always_important = AlwaysImportant(ts, spec.mode());
    t.param_dtype = *FromProto(ts.dtype(), "dtype");
    const size_t n = static_cast<size_t>(t.rows * t.cols);
    params_ += static_cast<int64_t>(n);
    t.important.assign(t.cols, 0);  // version 0: every column remote
    t.select_cols = t.cols;
  }
  if (spec.has_partition()) {
    // Blocks of split tensors (CheckPartition has checked the map): where
    // this part's block starts and how many columns the whole tensor has.
    const v1::Partition& p = spec.partition();
    int mine = 0;
    for (int i = 0; i < p.tensors_size(); ++i) {
      const v1::PartitionEntry& e = p.tensors(i);
      if (e.part() != p.part()) continue;
      TensorState& t = tensors_[mine++];
      if (e.columns() == 0) continue;
      t.block_first = e.first_column();
      int j = i;
      while (j > 0 && p.tensors(j - 1).tensor() == e.tensor()) --j;
      t.select_cols = 0;
      for (; j < p.tensors_size() && p.tensors(j).tensor() == e.tensor(); ++j) {
        t.select_cols += p.tensors(j).columns();
      }
    }
  }
  std::vector<TensorStore::Shape> shapes;
  for (const TensorState& t : tensors_) shapes.push_back({t.rows, t.cols});
  store_ = std::make_unique<TensorStore>(shapes);
  acc_ = std::make_unique<RoundAccumulator>(shapes, world_, spec.rank_ordered_sums());
  for (const TensorState& t : tensors_) update_tensors_.push_back({t.name, t.rows, t.param_dtype});
  ranks_.resize(world_);
  for (RankState& r : ranks_) r.mailbox = std::make_shared<Mailbox>(ctx_.outbox_limit_bytes);
}

absl::Status Job::CheckLive() const {
  if (deleted_) {
    return absl::NotFoundError(absl::StrCat("job '", spec_.job_id(), "' was deleted"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Job::TensorIndex(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return absl::NotFoundError(
      absl::StrCat("job '", spec_.job_id(), "' has no tensor ", Quote(name)));
}

absl::Status Job::CheckRank(int32_t rank) const {
  if (rank < 0 || rank >= world_) {
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " out of range [0, ", world_,
                                              ") of job '", spec_.job_id(), "'"));
  }
  if (!ranks_[rank].joined) {
    return absl::NotFoundError(absl::StrCat("rank ", rank, " has not joined job '",
                                            spec_.job_id(), "' (call JoinJob first)"));
  }
  return absl::OkStatus();
}

absl::Status Job::CheckRoundBuffer(int64_t round) const {
  if (round - 2 >= rounds_updated_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", round, " would reuse the accumulation buffer of round ", round - 2,
        ", whose update has not finished: wait for round ", round - 2,
        "'s deltas (apply delay must not exceed update_interval)"));
  }
  return absl::OkStatus();
}

// ---- Upload ----------------------------------------------------------------

Job::Upload::Upload(std::shared_ptr<Job> job)
    : job_(std::move(job)), filled_(job_->tensors_.size(), 0) {}

absl::StatusOr<std::unique_ptr<Job::Upload>> Job::Upload::Begin(std::shared_ptr<Job> job) {
  MutexLock lock(&job->mu_);
  ZF_RETURN_IF_ERROR(job->CheckLive());
  if (job->uploaded_) {
    return absl::AlreadyExistsError(absl::StrCat(
        "parameters of job '", job->spec_.job_id(),
        "' were already uploaded; they can be uploaded once (delete and recreate the job to "
        "start over)"));
  }
  if (job->uploading_) {
    return absl::AbortedError(absl::StrCat(
        "another UploadParameters stream of job '", job->spec_.job_id(),
        "' is in progress; one upload runs at a time (retry once it has ended)"));
  }
  job->uploading_ = true;
  return std::unique_ptr<Upload>(new Upload(job));
}

Job::Upload::~Upload() {
  MutexLock lock(&job_->mu_);
  if (!committed_) {
    // Clear what was staged: the buffer accumulates odd rounds later.
    for (size_t i = 0; i < job_->tensors_.size(); ++i) {
      job_->acc_->ClearStaging(static_cast<int>(i), filled_[i]);
    }
  }
  job_->uploading_ = false;
}

absl::Status Job::Upload::AddChunk(const v1::UploadParametersRequest& chunk) {
  {
    MutexLock lock(&job_->mu_);
    ZF_RETURN_IF_ERROR(job_->CheckLive());
    if (job_->uploaded_) {
      return absl::AlreadyExistsError(absl::StrCat(
          "parameters of job '", job_->spec_.job_id(),
          "' were already uploaded; they can be uploaded once (delete and recreate the job to "
          "start over)"));
    }
  }
  ZF_ASSIGN_OR_RETURN(int ti, job_->TensorIndex(chunk.tensor()));
  const TensorState& t = job_->tensors_[ti];
  const v1::TensorSpec& ts = job_->spec_.tensors(ti);
  const int64_t numel = t.rows * t.cols;
  if (chunk.shape_size() > 0) {
    bool same = chunk.shape_size() == ts.shape_size();
    for (int i = 0; same && i < ts.shape_size(); ++i) same = chunk.shape(i) == ts.shape(i);
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': uploaded shape ", ShapeString(chunk.shape()),
          " does not match the job's shape ", ShapeString(ts.shape())));
    }
  } else if (filled_[ti] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': the first chunk must carry the shape ", ShapeString(ts.shape())));
  }
  if (chunk.offset() != filled_[ti]) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name, "': chunk at offset ", chunk.offset(),
                     " out of order; expected offset ", filled_[ti],
                     " (chunks of a tensor are sent in row-major order)"));
  }
  const v1::DType pd = chunk.dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP32 : chunk.dtype();
  ZF_ASSIGN_OR_RETURN(DType dt, FromProto(pd, "upload dtype"));
  const size_t esize = DTypeSize(dt);
  if (chunk.payload().size() % esize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': payload of ", chunk.payload().size(),
        " bytes is not a whole number of ", DTypeName(dt), " values"));
  }
  const int64_t n = static_cast<int64_t>(chunk.payload().size() / esize);
  if (chunk.offset() + n > numel) {
    return absl::OutOfRangeError(absl::StrCat("tensor '", t.name, "': chunk [", chunk.offset(),
                                              ", ", chunk.offset() + n,
                                              ") exceeds the tensor's ", numel, " elements"));
  }
  size_t bad = 0;
  if (!AllFinite(dt, chunk.payload().data(), n, &bad)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name,
                                                   "': non-finite value at element ",
                                                   chunk.offset() + static_cast<int64_t>(bad)));
  }
  // Only this upload touches the staging buffer before the parameters are in.
  float* staged = job_->acc_->staging(ti);
  Decode(dt, chunk.payload().data(), n, staged + chunk.offset());
  filled_[ti] += n;
  return absl::OkStatus();
}

absl::StatusOr<v1::UploadParametersResponse> Job::Upload::Commit() {
  MutexLock lock(&job_->mu_);
  job_->QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(job_->CheckLive());
  if (job_->uploaded_) {
    return absl::AlreadyExistsError(absl::StrCat("parameters of job '", job_->spec_.job_id(),
                                                 "' were already uploaded"));
  }
  for (size_t i = 0; i < job_->tensors_.size(); ++i) {
    const TensorState& t = job_->tensors_[i];
    if (filled_[i] != t.rows * t.cols) {
      return absl::FailedPreconditionError(
          absl::StrCat("upload incomplete: tensor '", t.name, "' has ", filled_[i], " of ",
                       t.rows * t.cols, " elements; nothing was stored"));
    }
  }
  int64_t total = 0;
  for (size_t i = 0; i < job_->tensors_.size(); ++i) {
    TensorState& t = job_->tensors_[i];
    job_->store_->LoadRowMajor(static_cast<int>(i), job_->acc_->staging(static_cast<int>(i)));
    total += t.rows * t.cols;
    job_->acc_->ClearStaging(static_cast<int>(i), t.rows * t.cols);
  }
  job_->uploaded_ = true;
  committed_ = true;
  v1::UploadParametersResponse resp;
  resp.set_elements(total);
  resp.set_tensors(static_cast<int64_t>(job_->tensors_.size()));
  return resp;
}

// ---- Control ---------------------------------------------------------------

v1::Selection Job::SelectionLocked() const {
  v1::Selection s;
  s.set_version(selection_version_);
  s.set_step(selection_step_);
  for (const TensorState& t : tensors_) {
    v1::ColumnSet* cs = s.add_important();
    cs->set_tensor(t.name);
    cs->mutable_columns()->Add(t.important_cols.begin(), t.important_cols.end());
  }
  return s;
}

absl::StatusOr<v1::JoinJobResponse> Job::Join(int32_t rank) {
  MutexLock lock(&mu_);
  QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(CheckLive());
  if (rank < 0 || rank >= world_) {
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " out of range [0, ", world_,
                                              ") of job '", spec_.job_id(), "'"));
  }
  if (ranks_[rank].joined) {
    return absl::AlreadyExistsError(
        absl::StrCat("rank ", rank, " already joined job '", spec_.job_id(), "'"));
  }
  ranks_[rank].joined = true;
  v1::JoinJobResponse resp;
  *resp.mutable_spec() = spec_;
  *resp.mutable_selection() = SelectionLocked();
  return resp;
}

void Job::Describe(v1::GetJobResponse* out) {
  MutexLock lock(&mu_);
  *out->mutable_spec() = spec_;
  out->set_parameters_uploaded(uploaded_);
  for (int r = 0; r < world_; ++r) {
    if (ranks_[r].joined) out->add_joined_ranks(r);
  }
  out->set_rounds_updated(rounds_updated_);
  out->set_selection_version(selection_version_);
}

void Job::Stats(v1::JobStats* out) {
  MutexLock lock(&mu_);
  out->set_job_id(spec_.job_id());
  out->set_shards_received(shards_received_);
  out->set_shard_bytes_received(shard_bytes_received_);
  out->set_rounds_updated(rounds_updated_);
  out->set_rounds_skipped_nonfinite(rounds_skipped_);
  out->set_delta_messages_sent(delta_messages_sent_);
  out->set_delta_bytes_sent(delta_bytes_sent_);
  out->set_update_seconds_total(update_seconds_total_);
  out->set_last_update_seconds(last_update_seconds_);
  out->set_params(params_);
  out->set_replays_dropped(replays_dropped_);
  out->set_durable_rounds(durable_rounds_);
  out->set_last_round_steps(last_round_steps_);
  rejected_.Export(out->mutable_rejected());
  out->set_memory_bytes(footprint_.total());
  out->set_state_bytes(footprint_.state_bytes);
  out->set_bookkeeping_bytes(footprint_.bookkeeping_bytes);
  out->set_delta_bytes(footprint_.delta_bytes);
  out->set_pending_rendezvous_bytes(all_reduce_.bytes() + selection_.bytes());
  out->set_rounds_overflowed(rounds_overflowed_);
  for (int r = 0; r < world_; ++r) {
    const RankState& rs = ranks_[r];
    if (!rs.joined) continue;
    v1::RankStats* o = out->add_ranks();
    o->set_rank(r);
    o->set_next_round(rs.next_round);
    o->set_outbox_bytes(rs.mailbox->bytes());
    o->set_outbox_messages(static_cast<int64_t>(rs.mailbox->queued()));
    o->set_reading_paused(rs.mailbox->paused());
    Wire wire;
    if (rs.mailbox->attached(&wire)) {
      o->set_attached(true);
      o->set_transport(WireName(wire));
    }
    *o->mutable_worker() = rs.worker;
    rs.stall_per_step.Export(o->mutable_worker()->mutable_stall_per_step_seconds());
  }
  out->set_world_size(world_);
  if (spec_.has_partition()) *out->mutable_partition() = spec_.partition();
  for (Wire wire : {Wire::kGrpc, Wire::kUcx}) {
    v1::TransportStats* t = out->add_transports();
    t->set_transport(WireName(wire));
    t->set_shards_received(received_[static_cast<int>(wire)].shards);
    t->set_shard_bytes_received(received_[static_cast<int>(wire)].bytes);
    for (const RankState& rs : ranks_) {
      const Mailbox::Sent sent = rs.mailbox->sent(wire);
      t->set_deltas_sent(t->deltas_sent() + sent.deltas);
      t->set_delta_bytes_sent(t->delta_bytes_sent() + sent.bytes);
    }
  }
  update_seconds_.Export(out->mutable_round_update_seconds());
  accumulate_seconds_.Export(out->mutable_round_accumulate_seconds());
  out->set_update_queue_depth(rounds_closed_ - rounds_updated_);
}

absl::Status Job::CheckWorkerReport(const v1::RoundClose& close, int64_t steps) const {
  if (close.step_reports_size() > steps) {
    return absl::InvalidArgumentError(absl::StrCat("round ", close.round(), ": ",
                                                   close.step_reports_size(),
                                                   " step reports for a round of ", steps,
                                                   " steps"));
  }
  if (close.apply_delay_steps() < 0 || close.staleness_steps() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", close.round(), ": apply_delay_steps ", close.apply_delay_steps(),
        " and staleness_steps ", close.staleness_steps(), " must be >= 0"));
  }
  for (int i = 0; i < close.step_reports_size(); ++i) {
    const v1::StepReport& r = close.step_reports(i);
    const double seconds[] = {r.step_seconds(), r.stall_seconds(), r.send_blocked_seconds()};
    for (double x : seconds) {
      // A day per step bounds what a report can add to the sums.
      if (!(x >= 0 && x <= 86400)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "round ", close.round(), ": step report ", i, " has a time of ", x,
            " s; times must be in [0, 86400]"));
      }
    }
    if (r.up_bytes() < 0 || r.down_bytes() < 0 || r.up_bytes() > (int64_t{1} << 50) ||
        r.down_bytes() > (int64_t{1} << 50)) {
      return absl::InvalidArgumentError(absl::StrCat("round ", close.round(), ": step report ", i,
                                                     " has byte counts ", r.up_bytes(), " and ",
                                                     r.down_bytes(), "; they must be in [0, 2^50]"));
    }
  }
  return absl::OkStatus();
}

void Job::AddWorkerReport(const v1::RoundClose& close, RankState* rs) {
  v1::WorkerStats& w = rs->worker;
  for (const v1::StepReport& r : close.step_reports()) {
    AddStep(r, &w);
    rs->stall_per_step.Observe(r.stall_seconds());
  }
  if (close.step_reports_size() > 0) {
    w.set_apply_delay_steps(close.apply_delay_steps());
    w.set_staleness_steps(close.staleness_steps());
  }
}

absl::StatusOr<std::shared_ptr<Mailbox>> Job::MailboxFor(int32_t rank) {
  MutexLock lock(&mu_);
  ZF_RETURN_IF_ERROR(CheckLive());
  ZF_RETURN_IF_ERROR(CheckRank(rank));
  return ranks_[rank].mailbox;
}

v1::DownMessage Job::AttachedMessage(int32_t rank) {
  MutexLock lock(&mu_);
  v1::DownMessage msg;
  msg.mutable_attached()->set_selection_version(selection_version_);
  msg.mutable_attached()->set_rounds_updated(rounds_updated_);
  msg.mutable_attached()->set_durable_rounds(durable_rounds_);
  if (rank >= 0 && rank < world_) msg.mutable_attached()->set_next_round(ranks_[rank].next_round);
  return msg;
}

absl::StatusOr<std::vector<Mailbox::Message>> Job::MissedRound(int32_t rank,
                                                              int64_t rounds_done) {
  MutexLock lock(&mu_);
  ZF_RETURN_IF_ERROR(CheckLive());
  ZF_RETURN_IF_ERROR(CheckRank(rank));
  if (rounds_done < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach: rounds_done ", rounds_done, " must be >= 0"));
  }
  // Rounds this daemon updated itself are in the rank's mailbox until
  // written; only those updated before a restart can have been lost.
  if (rounds_done >= restored_rounds_ || rounds_done >= rounds_updated_) {
    return std::vector<Mailbox::Message>{};
  }
  if (rounds_done == resend_round_) return resend_;
  std::string why;
  if (rounds_done == restored_rounds_ - 1) {
    why = spec_.delta_kind() == v1::DELTA_ARITHMETIC
              ? "arithmetic deltas cannot be made again from the restored state"
              : "the checkpoint the job was restored from does not hold that round's RoundDone";
  } else {
    why = "only the newest round updated before the restart can be sent again";
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank, " of job '", spec_.job_id(), "' has the updates of rounds [0, ",
      rounds_done, ") but zenflowd restarted with ", restored_rounds_,
      " rounds updated: the deltas of rounds ", rounds_done, "..", restored_rounds_ - 1,
      " never reached the rank and ", why, "; it cannot continue exactly"));
}

void Job::Shutdown() {
  std::vector<std::function<void(absl::StatusOr<v1::Selection>)>> waiters;
  std::vector<std::shared_ptr<Mailbox>> boxes;
  {
    MutexLock lock(&mu_);
    QuiesceAddsLocked();
    deleted_ = true;
    for (const RankState& r : ranks_) {
      if (r.joined) boxes.push_back(r.mailbox);
    }
    for (auto& w : selection_.Take()) waiters.push_back(std::move(w));
  }
  const absl::Status gone = absl::NotFoundError(absl::StrCat("job '", spec_.job_id(), "' was deleted"));
  for (auto& w : waiters) w(gone);
  all_reduce_.Shutdown(gone);
  // Attached ranks hear it at once, and their streams end.
  for (const auto& box : boxes) {
    box->Push(StreamErrorMessage(gone, 0, /*fatal=*/true));
  }
}

uint64_t Job::StreamAttached(int32_t rank) {
  MutexLock lock(&mu_);
  if (rank < 0 || rank >= world_) return 0;
  ranks_[rank].streaming = true;
  ranks_[rank].absence_reported = false;
  return ++ranks_[rank].stream_number;
}

void Job::StreamEnded(int32_t rank, uint64_t stream) {
  MutexLock lock(&mu_);
  if (rank < 0 || rank >= world_ || ranks_[rank].stream_number != stream) return;
  ranks_[rank].streaming = false;
  ranks_[rank].stream_gone = std::chrono::steady_clock::now();
}

void Job::FailIfRankGone(absl::Duration timeout) {
  std::vector<std::function<void(absl::StatusOr<v1::Selection>)>> waiters;
  std::vector<std::shared_ptr<Mailbox>> boxes;
  absl::Status why;
  {
    MutexLock lock(&mu_);
    if (deleted_) return;
    const auto now = std::chrono::steady_clock::now();
    int gone = -1;
    double seconds = 0;
    for (int r = 0; r < world_; ++r) {
      RankState& rs = ranks_[r];
      if (!rs.joined || rs.streaming || rs.absence_reported) continue;
      seconds = Seconds(now - rs.stream_gone);
      if (seconds < absl::ToDoubleSeconds(timeout)) continue;
      rs.absence_reported = true;
      gone = r;
      break;
    }
    if (gone < 0) return;
    why = absl::AbortedError(absl::StrCat(
        "rank ", gone, " of job '", spec_.job_id(), "' has had no data stream for ",
        static_cast<int64_t>(seconds), " s (zenflowd --dead_rank_timeout_s): the job cannot go on "
        "without it (round ", rounds_closed_, " waits for its close); a rank that kept its "
        "worker state may attach again (Client::Attach) and go on from the daemon's state, "
        "otherwise start the job's ranks again"));
    for (auto& w : selection_.Take()) waiters.push_back(std::move(w));
    for (const RankState& r : ranks_) {
      if (r.joined && r.streaming) boxes.push_back(r.mailbox);
    }
  }
  // Nobody waits and no rank is attached (a finished job): nothing to say.
  if (waiters.empty() && boxes.empty() && all_reduce_.bytes() == 0) return;
  std::fprintf(stderr, "zenflowd: %s\n", std::string(why.message()).c_str());
  for (auto& w : waiters) w(why);
  all_reduce_.FailWaiters(why);
  for (const auto& box : boxes) box->Push(StreamErrorMessage(why, 0, /*fatal=*/true));
}

void Job::SetDurableRounds(int64_t rounds) {
  MutexLock lock(&mu_);
  durable_rounds_ = std::max(durable_rounds_, rounds);
}

// ---- Data ------------------------------------------------------------------

absl::Status Job::HandleUp(int32_t rank, const v1::UpMessage& up, Wire wire,
                           const ShardPayload* payload) {
  if (rank < 0 || rank >= world_) return CheckRank(rank);  // before ranks_[rank]
  MutexLock lock(&mu_);
  // One message of a rank at a time (its shard's add may be running outside
  // the lock), and none while someone waits to quiesce the adds.
  mu_.Await([&] { return !ranks_[rank].adding && quiesce_waiters_ == 0; });
  ZF_RETURN_IF_ERROR(CheckLive());
  ZF_RETURN_IF_ERROR(CheckRank(rank));
  switch (up.kind_case()) {
    case v1::UpMessage::kShard:
      if (payload == nullptr) {
        return HandleShard(rank, up.shard(), ShardPayload(up.shard().payload()), wire,
                           up.replay());
      }
      if (!up.shard().payload().empty()) {
        return absl::InternalError("a shard with its payload in two places");
      }
      return HandleShard(rank, up.shard(), *payload, wire, up.replay());
    case v1::UpMessage::kClose:
      return HandleClose(rank, up.close(), up.replay());
    default:
      return absl::InvalidArgumentError("empty message: set shard or close");
  }
}

void Job::QuiesceAddsLocked() {
  ++quiesce_waiters_;
  mu_.Await([&] { return adds_in_flight_ == 0; });
  --quiesce_waiters_;
}

absl::Status Job::HandleShard(int32_t rank, const v1::GradientShard& shard,
                              const ShardPayload& payload, Wire wire, bool replay) {
  if (!uploaded_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", spec_.job_id(), "': upload the parameters before sending gradients"));
  }
  const RankState& rs = ranks_[rank];
  if (shard.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", shard.step(), " is negative"));
  }
  // With a fixed interval a step's round is step / S. With rounds of
  // changing length (auto_update_interval) a rank's shards belong to its
  // open round: the steps after its previous close, at most S_max of them.
  const int64_t round =
      auto_interval_ ? (shard.step() < rs.round_first_step    ? rs.next_round - 1
                        : shard.step() >= rs.round_first_step + interval_ ? rs.next_round + 1
                                                                          : rs.next_round)
                     : shard.step() / interval_;
  if (replay && round < rs.next_round) {
    ++replays_dropped_;  // the rank closed that round before the restart
    return absl::OkStatus();
  }
  // (The selection step is a round boundary: its round and later ones wait.)
  if (selection_.submitted(rank) && shard.step() >= selection_.step()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " submitted importance for the selection at step ",
                     selection_.step(), "; wait for the selection and hand off state first"));
  }
  if (auto_interval_ && round != rs.next_round) {
    return round < rs.next_round
               ? absl::FailedPreconditionError(absl::StrCat(
                     "step ", shard.step(), " is before rank ", rank, "'s open round ",
                     rs.next_round, ", which starts at step ", rs.round_first_step,
                     ": its round was already closed"))
               : absl::OutOfRangeError(absl::StrCat(
                     "step ", shard.step(), " is too far ahead: rank ", rank, "'s open round ",
                     rs.next_round, " starts at step ", rs.round_first_step, " and has at most ",
                     interval_, " steps (update_interval)"));
  }
  if (round < rs.next_round) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", shard.step(), " belongs to round ", round, ", which rank ", rank,
                     " already closed"));
  }
  if (round > rs.next_round) {
    return absl::OutOfRangeError(absl::StrCat(
        "step ", shard.step(), " is in round ", round, ", too far ahead: rank ", rank,
        " has not closed round ", rs.next_round, " (steps ", rs.next_round * interval_, "..",
        rs.next_round * interval_ + interval_ - 1, ")"));
  }
  ZF_RETURN_IF_ERROR(CheckRoundBuffer(round));
  if (shard.selection_version() != selection_version_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "column-set version ", shard.selection_version(), " is ",
        shard.selection_version() < selection_version_ ? "stale" : "unknown",
        "; the current version is ", selection_version_));
  }
  if (hand_off_.rank_version(rank) != selection_version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " must call HandOff for selection version ",
                     selection_version_, " before sending shards"));
  }
  ZF_ASSIGN_OR_RETURN(int ti, TensorIndex(shard.tensor()));
  TensorState& t = tensors_[ti];
  const v1::DType pd = shard.dtype() == v1::DTYPE_UNSPECIFIED ? spec_.wire_dtype() : shard.dtype();
  const bool int8 = pd == v1::DTYPE_INT8;
  DType dt = DType::kF32;
  if (!int8) {
    ZF_ASSIGN_OR_RETURN(dt, FromProto(pd, "shard dtype"));
  }
  const size_t esize = int8 ? 1 : DTypeSize(dt);
  const char* dname = int8 ? "int8" : DTypeName(dt);
  const size_t ncols = static_cast<size_t>(shard.columns_size());
  if (ncols == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name, "': shard for step ", shard.step(), " has no columns"));
  }
  const size_t expected = ncols * static_cast<size_t>(t.rows) * esize;
  if (payload.size() != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor '%s': payload is %d bytes but %d columns x %d rows of %s need %d bytes",
        t.name, payload.size(), ncols, t.rows, dname, expected));
  }
  if (int8 != (shard.scales_size() > 0) ||
      (int8 && static_cast<size_t>(shard.scales_size()) != ncols)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': ", shard.scales_size(), " scales for ", ncols, " columns; int8 ",
        "shards carry exactly one scale per column and other dtypes none"));
  }
  for (int i = 0; i < shard.scales_size(); ++i) {
    if (!(shard.scales(i) >= 0 && std::isfinite(shard.scales(i)))) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': scale of column ",
                                                     shard.columns(i), " is ", shard.scales(i),
                                                     "; need finite >= 0"));
    }
  }
  if (replay && ncols > 0 && shard.columns(0) >= 0 && shard.columns(0) < t.cols &&
      acc_->Received(ti, rank, shard.step(), shard.columns(0))) {
    // Shards are replayed as they were sent: the first column decides.
    bool all = true;
    for (int32_t c : shard.columns()) {
      all = all && c >= 0 && c < t.cols && acc_->Received(ti, rank, shard.step(), c);
    }
    if (all) {
      ++replays_dropped_;
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> sorted(shard.columns().begin(), shard.columns().end());
  for (int32_t c : sorted) {
    if (c < 0 || c >= t.cols) {
      return absl::OutOfRangeError(absl::StrCat("tensor '", t.name, "': column ", c,
                                                " out of range [0, ", t.cols, ")"));
    }
    if (t.important[c]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': column ", c, " is important under selection version ",
          selection_version_, " and is updated on the worker; send only unimportant columns"));
    }
    if (acc_->Received(ti, rank, shard.step(), c)) {
      return absl::AlreadyExistsError(absl::StrCat("tensor '", t.name, "': column ", c,
                                                   " of step ", shard.step(),
                                                   " was already received from rank ", rank));
    }
  }
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i] == sorted[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': column ", sorted[i], " is repeated in one shard"));
    }
  }
  // Everything but the payload's values checked. The values are checked and
  // added outside the job's lock (README "The daemon under many ranks"): the
  // add goes to this rank's own sum buffers (rank-ordered sums) or, in the
  // shared buffer, under the column blocks' stripe locks, so the shards of
  // different ranks accumulate in parallel. While it runs, the rank sends
  // nothing else (`adding`), the round's buffer cannot be leased (the rank
  // has not closed the round) and whatever changes what the shard was
  // checked against, or reads the sums, waits (QuiesceAddsLocked).
  RankState& me = ranks_[rank];
  me.adding = true;
  ++adds_in_flight_;
  const AddPlan plan{ti, round, int8, dt, esize};
  mu_.Unlock();
  bool finite = true;
  const absl::Status checked = AddShard(rank, shard, payload, plan, &finite);
  mu_.Lock();
  me.adding = false;
  --adds_in_flight_;
  if (!checked.ok()) return checked;
  if (!finite) rounds_[round].nonfinite = true;
  for (int32_t c : shard.columns()) acc_->MarkReceived(ti, rank, shard.step(), c);
  me.round_last_step = std::max(me.round_last_step, shard.step());
  ++shards_received_;
  shard_bytes_received_ += static_cast<int64_t>(payload.size());
  ++received_[static_cast<int>(wire)].shards;
  received_[static_cast<int>(wire)].bytes += static_cast<int64_t>(payload.size());
  RoundState& rstate = rounds_[round];
  if (!rstate.first_shard_seen) {
    rstate.first_shard_seen = true;
    rstate.first_shard = std::chrono::steady_clock::now();
  }
  return absl::OkStatus();
}

absl::Status Job::AddShard(int32_t rank, const v1::GradientShard& shard,
                           const ShardPayload& payload, const AddPlan& plan, bool* finite_out) {
  const TensorState& t = tensors_[plan.ti];  // metadata: immutable
  const size_t ncols = static_cast<size_t>(shard.columns_size());
  const size_t col_bytes = static_cast<size_t>(t.rows) * plan.esize;
  // Column i: in place when the payload is contiguous (UCX, protobuf's
  // parse) or the column lies in one of gRPC's slices; else gathered into
  // the reader's one-column scratch.
  const char* whole = payload.contiguous() ? payload.data() : nullptr;
  std::optional<RunReader> reader;
  auto column = [&](size_t i) {
    if (whole != nullptr) return whole + i * col_bytes;
    if (i == 0) reader.emplace(payload, col_bytes);
    return reader->Next();
  };
  size_t bad = 0;
  bool finite = true;
  std::string why;
  if (plan.int8) {
    // value = q * scale, as decoded below: each column's largest |q| decides.
    // With |q| <= 128 and a finite scale >= 0 (HandleShard checked it) every
    // value is finite when 128 * scale is (a power-of-two product: exact),
    // so only columns of a huge scale are read here.
    size_t read = 0;  // columns the reader has passed (pieces: in order only)
    for (size_t i = 0; i < ncols && finite; ++i) {
      if (std::isfinite(128.0f * shard.scales(static_cast<int>(i)))) continue;
      const char* values = nullptr;
      if (whole != nullptr) {
        values = whole + i * col_bytes;
      } else {
        if (read == 0) reader.emplace(payload, col_bytes);
        while (read <= i) {
          values = reader->Next();
          ++read;
        }
      }
      const int8_t* q = reinterpret_cast<const int8_t*>(values);
      int biggest = 0;
      int64_t at = 0;
      for (int64_t r = 0; r < t.rows; ++r) {
        const int a = q[r] < 0 ? -q[r] : q[r];
        if (a > biggest) {
          biggest = a;
          at = r;
        }
      }
      const float scale = shard.scales(static_cast<int>(i));
      if (!std::isfinite(static_cast<float>(q[at]) * scale)) {
        finite = false;
        bad = i * static_cast<size_t>(t.rows) + static_cast<size_t>(at);
        why = absl::StrCat(" (int8 ", static_cast<int>(q[at]), " x scale ", scale, ")");
      }
    }
  } else if (whole != nullptr) {
    finite = AllFinite(plan.dt, whole, ncols * t.rows, &bad);
  } else {
    for (size_t i = 0; i < ncols && finite; ++i) {
      size_t at = 0;
      finite = AllFinite(plan.dt, column(i), static_cast<size_t>(t.rows), &at);
      if (!finite) bad = i * static_cast<size_t>(t.rows) + at;
    }
  }
  if (!finite) {
    if (!spec_.skip_nonfinite_rounds()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': non-finite gradient in column ", shard.columns(bad / t.rows),
          " row ", bad % t.rows, " of step ", shard.step(), why,
          " (the job rejects such shards; set skip_nonfinite_rounds to skip the round instead)"));
    }
    *finite_out = false;  // accepted, and the round is skipped: nothing to add
    return absl::OkStatus();
  }
  // Shared sums: every rank adds into the same columns, so a run of columns
  // of one block is added under that block's stripe lock. Ranks that send
  // their columns in the same order then follow each other block by block.
  const bool shared = acc_->sum_ranks() == 1 && world_ > 1;
  const int64_t block = std::max<int64_t>(1, kStripeElements / t.rows);
  std::unique_lock<std::mutex> stripe;
  int64_t held = -1;
  for (size_t i = 0; i < ncols; ++i) {
    const int32_t c = shard.columns(static_cast<int>(i));
    if (shared && c / block != held) {
      if (stripe.owns_lock()) stripe.unlock();
      held = c / block;
      stripe = std::unique_lock<std::mutex>(
          stripes_[static_cast<size_t>(plan.ti * 7919 + held) % stripes_.size()]);
    }
    float* dst = acc_->sum_of(plan.ti, rank, plan.round, c);
    const char* values = column(i);  // (a second pass: the reader starts over at 0)
    if (plan.int8) {
      DecodeAddInt8(reinterpret_cast<const int8_t*>(values), static_cast<size_t>(t.rows),
                    shard.scales(static_cast<int>(i)), dst);
    } else {
      DecodeAdd(plan.dt, values, t.rows, dst);
    }
  }
  return absl::OkStatus();
}

absl::Status Job::HandleClose(int32_t rank, const v1::RoundClose& close, bool replay) {
  RankState& rs = ranks_[rank];
  if (!uploaded_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", spec_.job_id(), "': upload the parameters before closing rounds"));
  }
  if (replay && close.round() >= 0 && close.round() < rs.next_round) {
    ++replays_dropped_;
    return absl::OkStatus();
  }
  if (close.round() < rs.next_round) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " already closed round ", close.round()));
  }
  if (close.round() > rs.next_round) {
    return absl::OutOfRangeError(absl::StrCat("round ", close.round(), " is too far ahead: rank ",
                                              rank, " must close round ", rs.next_round,
                                              " first"));
  }
  if (selection_.submitted(rank) && (auto_interval_ ? rs.round_first_step >= selection_.step()
                                                     : close.round() >= selection_.step() / interval_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " is waiting for the selection at step ", selection_.step()));
  }
  if (hand_off_.rank_version(rank) != selection_version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " must call HandOff for selection version ",
                     selection_version_, " before closing a round"));
  }
  const int64_t steps = close.steps() == 0 ? interval_ : close.steps();
  if (steps < 1 || steps > interval_) {
    return absl::InvalidArgumentError(
        absl::StrCat("round ", close.round(), ": steps ", close.steps(), " must be in [1, ",
                     interval_, "] (0 means update_interval)"));
  }
  if (auto_interval_) {
    // The round is the rank's steps [first, first + steps): none beyond it,
    // not across a selection step, and as long on every rank.
    const int64_t first = rs.round_first_step;
    if (rs.round_last_step >= first + steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "round ", close.round(), " of rank ", rank, " has steps ", first, "..",
          first + steps - 1, " (steps ", steps, ") but the rank sent gradients of step ",
          rs.round_last_step));
    }
    if (selection_.step() > first && first + steps > selection_.step()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "round ", close.round(), " (steps ", first, "..", first + steps - 1,
          ") would span the selection step ", selection_.step(), "; end it before"));
    }
    auto other = rounds_.find(close.round());
    if (other != rounds_.end() && other->second.closed > 0 && other->second.steps != steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "round ", close.round(), ": steps ", steps, " differ from the ", other->second.steps,
          " steps other ranks closed it with (every rank chooses the same round length)"));
    }
  }
  ZF_RETURN_IF_ERROR(CheckWorkerReport(close, steps));
  if (!(close.lr() >= 0 && std::isfinite(close.lr()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("round ", close.round(), ": lr ", close.lr(), " must be finite and >= 0"));
  }
  ZF_RETURN_IF_ERROR(CheckRoundBuffer(close.round()));
  auto it = rounds_.find(close.round());
  if (it != rounds_.end() && it->second.closed > 0 && it->second.lr != close.lr()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", close.round(), ": lr ", close.lr(), " differs from the lr ", it->second.lr,
        " other ranks closed it with"));
  }
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const TensorState& t = tensors_[ti];
    for (int64_t c = 0; c < t.cols; ++c) {
      const int32_t hits = acc_->hits(static_cast<int>(ti), rank, static_cast<int32_t>(c));
      if (!t.important[c] && hits != steps) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", rank, " cannot close round ", close.round(), ": tensor '", t.name,
            "' column ", c, " has gradients from ", hits, " of ", steps, " steps"));
      }
    }
  }
  // Apply.
  acc_->ResetRank(rank);
  rs.next_round = close.round() + 1;
  rs.round_first_step = auto_interval_ ? rs.round_first_step + steps : rs.next_round * interval_;
  rs.round_last_step = -1;
  AddWorkerReport(close, &rs);
  RoundState& round = rounds_[close.round()];
  round.closed += 1;
  round.steps_sum += steps;
  round.steps = static_cast<int32_t>(steps);
  round.lr = close.lr();
  round.last_close = std::chrono::steady_clock::now();
  double stall = 0;
  for (const v1::StepReport& r : close.step_reports()) stall += r.stall_seconds();
  round.max_stall_seconds = std::max(round.max_stall_seconds, stall);
  if (round.closed == world_) {
    rounds_closed_ = close.round() + 1;
    last_round_steps_ = static_cast<int32_t>(steps);
    if (round.first_shard_seen) {
      accumulate_seconds_.Observe(Seconds(round.last_close - round.first_shard));
    }
    // Rounds close fully in order from 0, so only round 0 has no predecessor.
    if (close.round() > 0) round.interval_seconds = Seconds(round.last_close - last_full_close_);
    last_full_close_ = round.last_close;
    std::shared_ptr<Job> self = shared_from_this();
    // The update's right to the round's buffers; HandleShard and HandOff
    // keep off them until rounds_updated_ passes the round.
    auto lease = std::make_shared<UpdateLease>(
        UpdateLease::Grant(close.round(), store_.get(), acc_.get()));
    strand_->Schedule([self, lease] { self->RunUpdate(std::move(*lease)); });
  }
  return absl::OkStatus();
}

// ---- Update ----------------------------------------------------------------

bool Job::WithMoments(int32_t steps) const { return steps == 1 && RoundsMayCarryPredictedState(spec_); }

std::vector<std::vector<int32_t>> Job::RemoteColumnsLocked() const {
  std::vector<std::vector<int32_t>> remote(tensors_.size());
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const TensorState& t = tensors_[ti];
    for (int64_t c = 0; c < t.cols; ++c) {
      if (!t.important[c]) remote[ti].push_back(static_cast<int32_t>(c));
    }
  }
  return remote;
}

void Job::RunUpdate(UpdateLease lease) {
  const int64_t round = lease.round();
  const auto t0 = std::chrono::steady_clock::now();
  RoundState rs;
  std::vector<std::vector<int32_t>> remote;
  std::vector<std::shared_ptr<Mailbox>> boxes;
  int64_t version = 0;
  {
    MutexLock lock(&mu_);
    if (deleted_) return;
    rs = rounds_[round];
    remote = RemoteColumnsLocked();
    for (const RankState& r : ranks_) boxes.push_back(r.mailbox);
    version = selection_version_;
  }
  RoundUpdateInput in;
  in.round = round;
  in.steps_sum = rs.steps_sum;
  in.lr = rs.lr;
  in.nonfinite = rs.nonfinite;
  in.tensors = &update_tensors_;
  in.remote = &remote;
  const v1::AdamWConfig& cfg = spec_.adamw();
  in.hyper = AdamWHyper{rs.lr, cfg.beta1(), cfg.beta2(), cfg.eps(), cfg.weight_decay()};
  in.max_grad_norm = cfg.max_grad_norm();
  in.arithmetic = spec_.delta_kind() == v1::DELTA_ARITHMETIC;
  in.moments = WithMoments(rs.steps);
  in.max_shard_bytes = spec_.max_shard_bytes();
  in.simd = ctx_.simd;
  in.pool = ctx_.pool;
  RoundUpdateResult result = UpdateRound(in, std::move(lease));
  const bool skip = result.skipped, overflowed = result.overflowed;
  const float grad_norm = result.grad_norm;
  std::vector<v1::DownMessage>& deltas = result.deltas;

  int64_t delta_bytes = 0;
  for (const v1::DownMessage& d : deltas) {
    const v1::ParameterDelta& x = d.delta();
    delta_bytes += static_cast<int64_t>(x.payload().size() + x.m().size() + x.v().size() +
                                        8 * x.update_counts_size());
  }
  // One copy of each delta, shared by every rank's outbox.
  std::vector<Mailbox::Message> shared;
  shared.reserve(deltas.size());
  for (v1::DownMessage& d : deltas) {
    shared.push_back(std::make_shared<const v1::DownMessage>(std::move(d)));
  }
  for (const auto& box : boxes) {
    for (const Mailbox::Message& d : shared) box->Push(d);
  }

  const auto t1 = std::chrono::steady_clock::now();
  v1::DownMessage done;
  v1::RoundDone* rd = done.mutable_done();
  rd->set_round(round);
  rd->set_delta_messages(static_cast<int32_t>(deltas.size()));
  rd->set_skipped_nonfinite(skip);
  rd->set_grad_norm(grad_norm);
  rd->set_close_to_done_seconds(Seconds(t1 - rs.last_close));
  rd->set_selection_version(version);
  rd->set_round_interval_seconds(rs.interval_seconds);
  rd->set_steps(rs.steps);
  rd->set_stall_seconds(rs.max_stall_seconds);

  std::vector<std::function<void()>> callbacks;
  {
    MutexLock lock(&mu_);
    rounds_updated_ = round + 1;
    rounds_.erase(round);
    done.mutable_done()->set_durable_rounds(durable_rounds_);
    last_done_ = done.done();
    if (resend_round_ >= 0 && round >= resend_round_ + 2) {
      resend_round_ = -1;  // every rank has applied it
      resend_.clear();
    }
    if (skip) ++rounds_skipped_;
    if (overflowed) ++rounds_overflowed_;
    delta_messages_sent_ += static_cast<int64_t>(deltas.size() * boxes.size());
    delta_bytes_sent_ += delta_bytes * static_cast<int64_t>(boxes.size());
    last_update_seconds_ = Seconds(t1 - t0);
    update_seconds_total_ += last_update_seconds_;
    update_seconds_.Observe(last_update_seconds_);
    callbacks = MaybeFinishSelectionLocked();
  }
  if (ctx_.round_updated) ctx_.round_updated(spec_.job_id(), round + 1);
  auto done_shared = std::make_shared<const v1::DownMessage>(std::move(done));
  for (const auto& box : boxes) box->Push(done_shared);
  for (auto& cb : callbacks) cb();
}

// ---- Selection -------------------------------------------------------------

namespace {

absl::Status Replaced(const char* what, int32_t rank, int64_t step) {
  return absl::AbortedError(absl::StrCat(what, " of rank ", rank, " for step ", step,
                                         " was replaced by a newer call for the same step"));
}

}  // namespace

void Job::SubmitImportance(const v1::SubmitImportanceRequest& req, uint64_t call,
                           std::function<void(absl::StatusOr<v1::Selection>)> done) {
  std::vector<std::function<void()>> callbacks;
  std::function<void(absl::StatusOr<v1::Selection>)> replaced;
  std::optional<v1::Selection> replayed_answer;
  absl::Status status = [&]() -> absl::Status {
    MutexLock lock(&mu_);
    QuiesceAddsLocked();
    ZF_RETURN_IF_ERROR(CheckLive());
    ZF_RETURN_IF_ERROR(CheckRank(req.rank()));
    if (spec_.mode() != v1::MODE_ZENFLOW) {
      return absl::FailedPreconditionError(
          "zero_offload jobs keep every column on the daemon and have no selection");
    }
    if (req.step() < 0 || (!auto_interval_ && req.step() % interval_ != 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("selection step ", req.step(),
                       " is not a round boundary (a multiple of update_interval ", interval_, ")"));
    }
    if (req.replay() && selection_version_ > 0 && req.step() <= selection_step_) {
      // Made before the restart: what this rank did next is replayed too.
      ++replays_dropped_;
      replayed_answer = SelectionLocked();
      return absl::OkStatus();
    }
    // The rank's close of the previous round may still be in flight on its
    // stream: the selection then waits for it.
    const RankState& me = ranks_[req.rank()];
    if (auto_interval_) {
      // Rounds of changing length: the step must start the rank's open
      // round, or the next one (the open round's close in flight).
      if (req.step() < me.round_first_step || req.step() > me.round_first_step + interval_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "selection at step ", req.step(), " is not a round boundary of rank ", req.rank(),
            ": its open round ", me.next_round, " starts at step ", me.round_first_step,
            " and has at most ", interval_, " steps"));
      }
    } else {
      const int64_t round = req.step() / interval_;
      const int64_t next = me.next_round;
      if (next != round && next != round - 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "selection at step ", req.step(), " needs rank ", req.rank(),
            " to have closed every round before round ", round, "; its next round is ", next));
      }
    }
    if (selection_version_ > 0 && req.step() <= selection_step_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a selection was already made at step ", selection_step_, "; step ", req.step(),
          " is not later"));
    }
    if (selection_.step() >= 0 && selection_.step() != req.step()) {
      return absl::FailedPreconditionError(
          absl::StrCat("other ranks submitted importance for step ", selection_.step(),
                       ", not step ", req.step()));
    }
    std::vector<std::vector<float>> scores(tensors_.size());
    std::vector<bool> given(tensors_.size(), false);
    for (const v1::TensorImportance& ti : req.tensors()) {
      ZF_ASSIGN_OR_RETURN(int idx, TensorIndex(ti.tensor()));
      const TensorState& t = tensors_[idx];
      if (given[idx]) {
        return absl::InvalidArgumentError(
            absl::StrCat("importance of tensor '", t.name, "' is given twice"));
      }
      given[idx] = true;
      if (t.always_important) continue;  // ignored: fully important anyway
      if (ti.scores_size() != t.select_cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name, "': ", ti.scores_size(), " importance scores for ", t.select_cols,
            " columns",
            t.select_cols != t.cols
                ? absl::StrCat(" (this daemon holds its columns [", t.block_first, ", ",
                               t.block_first + t.cols, "); the scores are the whole tensor's)")
                : ""));
      }
      for (int c = 0; c < ti.scores_size(); ++c) {
        if (!(ti.scores(c) >= 0 && std::isfinite(ti.scores(c)))) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name,
                                                         "': importance of column ", c, " is ",
                                                         ti.scores(c), "; need finite >= 0"));
        }
      }
      scores[idx].assign(ti.scores().begin(), ti.scores().end());
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (!given[i] && !tensors_[i].always_important) {
        return absl::InvalidArgumentError(
            absl::StrCat("missing importance for tensor '", tensors_[i].name, "'"));
      }
    }
    // A retry (the first answer was lost, or the call is still pending here
    // while its client gave up) replaces the rank's earlier call.
    replaced = selection_.Submit(req.rank(), req.step(), std::move(scores), call, std::move(done));
    callbacks = MaybeFinishSelectionLocked();
    return absl::OkStatus();
  }();
  if (replaced) replaced(Replaced("importance", req.rank(), req.step()));
  if (!status.ok()) {
    rejected_.Add(status.code());
    done(status);
    return;
  }
  if (replayed_answer) {
    done(*std::move(replayed_answer));
    return;
  }
  for (auto& cb : callbacks) cb();
}

std::vector<std::function<void()>> Job::MaybeFinishSelectionLocked() {
  if (!selection_.all_submitted()) return {};
  // Every rank's open round starts at the selection step (otherwise a close
  // is still in flight).
  const int64_t round =
      auto_interval_ ? ranks_[0].next_round : selection_.step() / interval_;
  for (const RankState& r : ranks_) {
    if (r.next_round != round) return {};
    if (auto_interval_ && r.round_first_step != selection_.step()) return {};
  }
  if (rounds_updated_ != round) return {};  // drain first
  const float k = spec_.zenflow().topk_ratio();
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    TensorState& t = tensors_[ti];
    t.prev_important_cols = t.important_cols;
    std::vector<int32_t> chosen;
    if (t.always_important) {
      chosen.resize(t.cols);
      for (int64_t c = 0; c < t.cols; ++c) chosen[c] = static_cast<int32_t>(c);
    } else {
      chosen = SelectTopK(selection_.SummedScores(static_cast<int>(ti), t.select_cols),
                          TopKCount(k, t.select_cols));
      if (t.select_cols != t.cols) {
        // A block: its part of the whole tensor's top-k, in its own columns.
        std::vector<int32_t> in_block;
        for (int32_t c : chosen) {
          if (c >= t.block_first && c < t.block_first + t.cols) {
            in_block.push_back(static_cast<int32_t>(c - t.block_first));
          }
        }
        std::sort(in_block.begin(), in_block.end());
        chosen = std::move(in_block);
      }
    }
    std::fill(t.important.begin(), t.important.end(), 0);
    for (int32_t c : chosen) t.important[c] = 1;
    t.important_cols = std::move(chosen);
  }
  ++selection_version_;
  selection_step_ = selection_.step();
  const v1::Selection sel = SelectionLocked();
  std::vector<std::function<void()>> out;
  for (auto& w : selection_.Take()) {
    out.push_back([w = std::move(w), sel] { w(sel); });
  }
  return out;
}

void Job::FillColumnState(int ti, const std::vector<int32_t>& cols, v1::ColumnState* out) const {
  out->set_tensor(tensors_[ti].name);
  store_->ReadColumns(ti, cols, out);
}

absl::StatusOr<v1::HandOffResponse> Job::HandOff(const v1::HandOffRequest& req) {
  MutexLock lock(&mu_);
  QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(CheckLive());
  ZF_RETURN_IF_ERROR(CheckRank(req.rank()));
  if (req.replay() && req.version() > 0 &&
      (req.version() < selection_version_ || hand_off_.rank_version(req.rank()) >= req.version())) {
    // A later selection was made, or this rank's hand-off of this version
    // is complete (and rounds since may have moved those columns on).
    ++replays_dropped_;
    return v1::HandOffResponse();
  }
  if (req.version() != selection_version_ || req.version() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("hand-off for selection version ", req.version(),
                     " but the current version is ", selection_version_,
                     selection_version_ == 0 ? " (no selection yet)" : ""));
  }
  if (rounds_updated_ != rounds_closed_) {
    return absl::FailedPreconditionError("an update is in flight; hand-off must follow a drain");
  }
  std::vector<HandOffTensor> changes(tensors_.size());
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const TensorState& t = tensors_[ti];
    changes[ti].name = t.name;
    changes[ti].rows = t.rows;
    ColumnsChangingHands(t.prev_important_cols, t.important_cols, &changes[ti].leaving,
                         &changes[ti].joining);
  }
  ZF_ASSIGN_OR_RETURN(HandOffPlan plan,
                      PlanHandOff(req, changes, [this](const std::string& name) {
                        return TensorIndex(name);
                      }));
  // Per tensor: the first rank's state is applied, later ranks' compared.
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    if (!plan.in_call[ti] || !hand_off_.applied(static_cast<int>(ti), req.version())) continue;
    if (changes[ti].leaving.empty()) continue;
    const int differs = store_->FirstDifference(static_cast<int>(ti), *plan.given[ti]);
    if (differs >= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", req.rank(), ": state of tensor '", tensors_[ti].name, "' column ",
          changes[ti].leaving[differs], " differs from the state already handed off for version ",
          req.version(), ": the ranks have diverged"));
    }
  }
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    if (!plan.in_call[ti] || hand_off_.applied(static_cast<int>(ti), req.version())) continue;
    if (!changes[ti].leaving.empty()) store_->WriteColumns(static_cast<int>(ti), *plan.given[ti]);
    hand_off_.MarkApplied(static_cast<int>(ti), req.version());
  }
  hand_off_.Record(req.rank(), plan.in_call, req.version());
  v1::HandOffResponse resp;
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    if (!plan.in_call[ti] || changes[ti].joining.empty()) continue;
    FillColumnState(static_cast<int>(ti), changes[ti].joining, resp.add_joining());
  }
  return resp;
}

void Job::WithdrawImportance(int32_t rank, uint64_t call) {
  MutexLock lock(&mu_);
  selection_.Withdraw(rank, call);
}

void Job::WithdrawAllReduce(int32_t rank, uint64_t call) { all_reduce_.Withdraw(rank, call); }

void Job::AllReduce(const v1::AllReduceRequest& req, uint64_t call,
                    std::function<void(absl::StatusOr<v1::AllReduceResponse>)> done) {
  absl::Status s;
  {
    MutexLock lock(&mu_);
    s = CheckLive();
    if (s.ok()) s = CheckRank(req.rank());
  }
  // After a Shutdown the barrier refuses too: no call waits on a deleted job.
  if (s.ok()) s = all_reduce_.Submit(req, call, done);
  if (!s.ok()) {
    rejected_.Add(s.code());
    done(s);
  }
}

namespace {
// A GetState answer carries at most this much state (values, m, v).
constexpr int64_t kStateResponseBytes = 32 << 20;
}  // namespace

absl::StatusOr<v1::GetStateResponse> Job::GetState(const v1::GetStateRequest& req) {
  MutexLock lock(&mu_);
  QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(CheckLive());
  if (!uploaded_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", spec_.job_id(), "': its parameters are not uploaded yet, so it has no state"));
  }
  ZF_ASSIGN_OR_RETURN(int ti, TensorIndex(req.tensor()));
  const TensorState& t = tensors_[ti];
  if (req.first_column() < 0 || req.first_column() > t.cols) {
    return absl::OutOfRangeError(absl::StrCat("tensor '", t.name, "': first_column ",
                                              req.first_column(), " out of range [0, ", t.cols,
                                              "]"));
  }
  if (req.max_columns() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_columns ", req.max_columns(), " must be >= 0 (0: as many as fit)"));
  }
  // A round boundary: no update owns the store.
  if (!mu_.AwaitWithTimeout(
          [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return rounds_updated_ == rounds_closed_ || deleted_;
          },
          absl::Seconds(60))) {
    return absl::DeadlineExceededError(absl::StrCat("job '", spec_.job_id(), "': round ",
                                                    rounds_updated_,
                                                    "'s update did not finish within 60 s"));
  }
  ZF_RETURN_IF_ERROR(CheckLive());
  const int64_t per_column = t.rows * 3 * static_cast<int64_t>(sizeof(float)) + 8;
  int64_t n = std::max<int64_t>(1, kStateResponseBytes / per_column);
  if (req.max_columns() > 0) n = std::min<int64_t>(n, req.max_columns());
  const int64_t end = std::min<int64_t>(t.cols, req.first_column() + n);
  std::vector<int32_t> cols;
  for (int64_t c = req.first_column(); c < end; ++c) {
    if (!t.important[c]) cols.push_back(static_cast<int32_t>(c));
  }
  v1::GetStateResponse resp;
  FillColumnState(ti, cols, resp.mutable_state());
  resp.set_next_column(static_cast<int32_t>(end));
  resp.set_selection_version(selection_version_);
  resp.set_rounds_updated(rounds_updated_);
  resp.set_columns(static_cast<int32_t>(t.cols));
  return resp;
}

absl::Status Job::SetState(const v1::SetStateRequest& req) {
  MutexLock lock(&mu_);
  QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(CheckLive());
  if (!uploaded_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", spec_.job_id(), "': upload the parameters before setting their state"));
  }
  if (selection_version_ > 0 || rounds_closed_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", spec_.job_id(), "' has started (selection version ", selection_version_, ", ",
        rounds_closed_, " rounds closed): SetState writes the state of a job before its first "
        "selection and round; create a new job to resume from saved state"));
  }
  const v1::ColumnState& in = req.state();
  ZF_ASSIGN_OR_RETURN(int ti, TensorIndex(in.tensor()));
  const TensorState& t = tensors_[ti];
  if (!store_->WellFormed(ti, in)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': the state of ", in.columns_size(), " columns needs columns in [0, ",
        t.cols, "), ", t.rows, " values, m and v per column and one update count each; got ",
        in.values_size(), " values, ", in.m_size(), " m, ", in.v_size(), " v, ",
        in.update_counts_size(), " counts"));
  }
  std::vector<int32_t> sorted(in.columns().begin(), in.columns().end());
  std::sort(sorted.begin(), sorted.end());
  // Before the first selection every column is the daemon's (version 0).
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i] == sorted[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': column ", sorted[i], " is repeated"));
    }
  }
  for (int i = 0; i < in.values_size(); ++i) {
    if (!std::isfinite(in.values(i)) || !std::isfinite(in.m(i)) || !std::isfinite(in.v(i)) ||
        in.v(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': column ", in.columns(i / t.rows), " row ", i % t.rows,
          ": values and m must be finite, v finite and >= 0 (value ", in.values(i), ", m ",
          in.m(i), ", v ", in.v(i), ")"));
    }
  }
  for (int i = 0; i < in.update_counts_size(); ++i) {
    if (in.update_counts(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': column ",
                                                     in.columns(i), ": update count ",
                                                     in.update_counts(i), " must be >= 0"));
    }
  }
  store_->WriteColumns(ti, in);
  return absl::OkStatus();
}

absl::StatusOr<v1::ColumnState> Job::ReadColumns(const std::string& tensor,
                                                 const std::vector<int32_t>& cols) {
  MutexLock lock(&mu_);
  mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return rounds_updated_ == rounds_closed_; });
  ZF_ASSIGN_OR_RETURN(int ti, TensorIndex(tensor));
  const TensorState& t = tensors_[ti];
  for (int32_t c : cols) {
    if (c < 0 || c >= t.cols) {
      return absl::OutOfRangeError(absl::StrCat("tensor '", tensor, "': column ", c,
                                                " out of range [0, ", t.cols, ")"));
    }
  }
  v1::ColumnState out;
  FillColumnState(ti, cols, &out);
  return out;
}

}  // namespace zenflow
