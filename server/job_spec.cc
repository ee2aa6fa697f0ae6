// Job spec checks; see job_spec.h.
#include "server/job_spec.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/adam8.h"
#include "common/dtype_proto.h"
#include "common/geometry.h"
#include "common/status_macros.h"
#include "server/divergence.h"
#include "server/rank_arrivals.h"
#include "server/factored_moment.h"
#include "server/quote.h"

namespace zenflow {
namespace {

constexpr int64_t kDefaultShardBytes = 4 << 20;
constexpr int64_t kMinShardBytes = 1024;
constexpr int32_t kMaxWorldSize = 4096;

}  // namespace

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

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
  if (spec->wire_dtype() == v1::DTYPE_UNSPECIFIED) {
    // docs/design.md rule 5: int8 shards (one fp32 scale per column) for
    // zenflow, whose wire carries most of the parameters every step; bf16
    // for zero_offload, the baseline as ZeRO-Offload runs it.
    spec->set_wire_dtype(spec->mode() == v1::MODE_ZERO_OFFLOAD ? v1::DTYPE_BF16 : v1::DTYPE_INT8);
  }
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
    z->set_scale_round_step(false);
    z->set_local_step(false);
  } else if (spec->mode() == v1::MODE_ZENFLOW) {
    if (!z->has_predicted_step()) z->set_predicted_step(spec->delta_kind() != v1::DELTA_ARITHMETIC);
    if (z->predicted_step() && spec->delta_kind() == v1::DELTA_ARITHMETIC) {
      return absl::InvalidArgumentError(
          "zenflow.predicted_step needs DELTA_VALUES: a rank's predicted step is replaced by the "
          "next round's values, which arithmetic deltas would add to it instead");
    }
    // docs/design.md rules 12 and 13: off unless asked on (measured: both
    // cost fidelity on the demo's fine-tuning at lr 3e-3; the local step only
    // with values deltas, as the predicted step).
    if (!z->has_scale_round_step()) z->set_scale_round_step(false);
    if (!z->has_local_step()) z->set_local_step(false);
    if (z->local_step() && spec->delta_kind() == v1::DELTA_ARITHMETIC) {
      return absl::InvalidArgumentError(
          "zenflow.local_step needs DELTA_VALUES: a rank's local steps are replaced by the next "
          "round's values, which arithmetic deltas would add to them instead; set local_step "
          "false or use DELTA_VALUES (the default)");
    }
    if (!z->has_topk_ratio()) z->set_topk_ratio(0.1f);
    // Unset: update_interval auto with S_max 4 (docs/design.md rules 10 and 11:
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
    // Unset: the measured default (docs/design.md rules 10 and 14).
    if (!z->has_fidelity_budget()) z->set_fidelity_budget(kDefaultFidelityBudget);
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
  // Its meaning (and default) belongs to update_interval auto (rule 10);
  // here only that any comparison with it is well defined.
  if (z->has_fidelity_budget() && !std::isfinite(z->fidelity_budget())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zenflow.fidelity_budget ", z->fidelity_budget(),
        " must be finite (0 or below: no limit; unset: the default)"));
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
  if (spec->optimizer_state().empty()) spec->set_optimizer_state("fp32");
  if (spec->optimizer_state() != "fp32" && spec->optimizer_state() != "8bit") {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer_state ", Quote(spec->optimizer_state()),
        " is unknown: \"fp32\" (the default) or \"8bit\" (m and v in 8 bits)"));
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
  const bool factored = DeltasCarryFactoredMoment(spec);
  int64_t delta_round = 0, largest_message = 0;
  for (const v1::TensorSpec& t : spec.tensors()) {
    const ColumnGeometry geo = GeometryOf(t);
    const int64_t rows = geo.rows, cols = geo.cols;
    const int64_t n = mul(rows, cols);
    add(&f.params, n);
    // Rank-ordered sums: two accumulation buffers per rank.
    const int64_t sums = spec.rank_ordered_sums() ? spec.world_size() : 1;
    // fp32 master; m and v in fp32, or 8-bit (codes and block scales,
    // common/adam8.h) for the tensors an 8bit job quantizes.
    const bool eight = spec.optimizer_state() == "8bit" && rows >= kAdam8MinRows;
    add(&f.state_bytes, mul(n, mul(1 + 2 * sums, sizeof(float))));
    add(&f.state_bytes, eight ? Adam8StateBytes(rows, cols) : mul(n, 2 * sizeof(float)));
    add(&f.bookkeeping_bytes, mul(cols, sizeof(int64_t) + 1 + 2 * sizeof(int32_t)));
    // Which rank sent which column (RankArrivals): per column its number.
    add(&f.bookkeeping_bytes, mul(cols + 1, RankArrivals::kBytesPerColumn));
    // The update divergence's side buffers (docs/design.md rule 14): two
    // rounds of ~1% of the columns' per-step values (per rank when
    // rank-ordered), their received flags, a slot per column, and the
    // update's copy of the sample's state (5 floats per value).
    {
      const int64_t sampled = mul(UpdateDivergence::SampleColumns(cols), rows);
      const int64_t steps = std::min<int64_t>(std::max<int64_t>(spec.zenflow().update_interval(), 1),
                                              UpdateDivergence::kMaxSteps);
      add(&f.bookkeeping_bytes, mul(mul(mul(sampled, steps), sums), 2 * sizeof(float)));
      add(&f.bookkeeping_bytes,
          mul(mul(UpdateDivergence::SampleColumns(cols), steps), 2 * spec.world_size()));
      add(&f.bookkeeping_bytes, mul(cols, 2 * sizeof(int32_t)));
      add(&f.bookkeeping_bytes, mul(sampled, 5 * sizeof(float)));
    }
    int64_t out = arithmetic ? 2 * 4 : (t.dtype() == v1::DTYPE_FP32 ? 4 : 2);
    // One-step rounds' deltas carry bf16 m and v for the predicted step.
    if (RoundsMayCarryPredictedState(spec)) out += kPredictedStateBytesPerValue;
    add(&delta_round, mul(n, out));
    // The largest delta message of the tensor (whole columns, at most
    // max_shard_bytes unless one column is larger).
    {
      const int64_t per = DeltaColumnsPerMessage(spec.max_shard_bytes(), rows, out, factored);
      largest_message = std::max(largest_message, mul(mul(std::min(per, cols), rows), out));
    }
    if (factored) {
      // Rule 13: every message carries row_v, v_mean and its columns'
      // col_v; the update sums in doubles (factored_moment.h) and keeps
      // the tensor's result once while it encodes.
      const int64_t per = DeltaColumnsPerMessage(spec.max_shard_bytes(), rows, out, true);
      const int64_t messages = cols / per + (cols % per != 0 ? 1 : 0);
      add(&delta_round, mul(messages, FactoredMomentBytes(rows, 0)));
      add(&delta_round, mul(cols, 4));
      const int64_t blocks = rows / kFactoredRowBlock + (rows % kFactoredRowBlock != 0 ? 1 : 0);
      add(&f.delta_bytes, mul(rows + mul(blocks, cols), sizeof(double)));
      add(&f.delta_bytes, FactoredMomentBytes(rows, cols));
    }
  }
  // The round update hands its deltas to the ranks' outboxes batch by
  // batch as it encodes them and holds at most two batches (round_update.h);
  // with the factored moment it holds the whole round until its end. What
  // the outboxes hold is bounded by the daemon's max_outbox_bytes, not
  // charged to the job (docs/operating.md#limits-and-memory).
  if (factored) {
    add(&f.delta_bytes, delta_round);
  } else {
    add(&f.delta_bytes,
        std::min(delta_round, mul(std::max(kDeltaWindowBytes, largest_message), 2)));
  }
  // And per rank the steps of its open round (at most update_interval),
  // each with RankArrivals::kChargedRunsPerStep runs of columns.
  add(&f.bookkeeping_bytes,
      mul(spec.world_size(),
          RankArrivals::kBytesPerRank +
              mul(std::max<int64_t>(spec.zenflow().update_interval(), 1),
                  RankArrivals::kBytesPerStep)));
  int64_t total = f.state_bytes;
  add(&total, f.bookkeeping_bytes);
  add(&total, f.delta_bytes);
  if (overflow) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", Quote(spec.job_id()), " is too large: its size in bytes overflows 64 bits"));
  }
  return f;
}

bool DeltasCarryFactoredMoment(const v1::JobSpec& spec) {
  return spec.mode() == v1::MODE_ZENFLOW && spec.zenflow().local_step() &&
         spec.delta_kind() != v1::DELTA_ARITHMETIC;
}

float RoundStepLr(const v1::JobSpec& spec, float lr, int32_t steps) {
  if (spec.mode() != v1::MODE_ZENFLOW || !spec.zenflow().scale_round_step() || steps <= 1) {
    return lr;
  }
  return lr * static_cast<float>(steps);
}

}  // namespace zenflow
