// A job's rounds: the shards and closes its ranks send (HandleUp), their
// values added to the round's sums, and the update of a closed round into
// deltas for every rank (RunUpdate). Part of Job; see job.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/codec.h"
#include "common/copy_scan.h"
#include "common/dtype_proto.h"
#include "common/geometry.h"
#include "common/status_macros.h"
#include "common/worker_stats.h"
#include "server/job.h"

namespace zenflow {

// ---- Data -------------------------------------------------------------------

absl::Status Job::HandleUp(int32_t rank, const v1::UpMessage& up, Wire wire,
                           const ShardPayload* payload) {
  ZF_RETURN_IF_ERROR(CheckRankInRange(rank));  // before ranks_[rank]
  MutexLock lock(&mu_);
  // One message of a rank at a time (its shard's add may be running outside
  // the lock), and none while someone waits to quiesce the adds.
  mu_.Await([&] {
    AwaitHoldsMu();
    return !ranks_[rank].adding && quiesce_waiters_ == 0;
  });
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
  mu_.Await([&] {
    AwaitHoldsMu();
    return adds_in_flight_ == 0;
  });
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
    ++stats_.replays_dropped;  // the rank closed that round before the restart
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
      ++stats_.replays_dropped;
      return absl::OkStatus();
    }
  }
  bool increasing = true;  // (as clients send them: then no column repeats)
  int32_t last = -1;
  for (int32_t c : shard.columns()) {
    increasing = increasing && c > last;
    last = c;
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
  if (!increasing) {
    // The thread's scratch, whose room stays: no allocation per shard.
    thread_local std::vector<int32_t> sorted;
    sorted.assign(shard.columns().begin(), shard.columns().end());
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size(); ++i) {
      if (sorted[i] == sorted[i - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name, "': column ", sorted[i], " is repeated in one shard"));
      }
    }
  }
  // Everything but the payload's values checked. The values are checked and
  // added outside the job's lock (docs/architecture.md#the-daemon-under-many-ranks): the
  // add goes to this rank's own sum buffers (rank-ordered sums) or, in the
  // shared buffer, under the column blocks' stripe locks, so the shards of
  // different ranks accumulate in parallel. While it runs, the rank sends
  // nothing else (`adding`), the round's buffer cannot be leased (the rank
  // has not closed the round) and whatever changes what the shard was
  // checked against, or reads the sums, waits (QuiesceAddsLocked).
  RankState& me = ranks_[rank];
  // The round's divergence sample is drawn at its first shard, from the
  // daemon's columns then (they stay until the round's update).
  if (!divergence_->Began(round)) divergence_->BeginRound(round, RemoteColumnsLocked());
  // Where each rank has a buffer of its own, the rank's first shard of the
  // round for a column stores instead of adding (its stale values from two
  // rounds before are not read, so nothing zeroes them): known here, under
  // the lock, from the columns' arrivals (a rank's adds are one at a time;
  // Seen stops at the first step that has the column: counting every step
  // of a long round per column, hits(), halved ucx_sm's 4 MiB goodput in
  // the transport bench, whose round never closes). The thread's flags keep
  // their room: no allocation per shard.
  thread_local std::vector<uint8_t> first;
  const uint8_t* first_flags = nullptr;
  if (acc_->first_add_stores()) {
    first.resize(ncols);
    for (size_t i = 0; i < ncols; ++i) {
      first[i] = acc_->Seen(ti, rank, shard.columns(static_cast<int>(i))) ? 0 : 1;
    }
    first_flags = first.data();
  }
  me.adding = true;
  ++adds_in_flight_;
  AddPlan plan{ti, round, int8, dt, esize, shard.step() - rs.round_first_step};
  plan.first = first_flags;
  mu_.Unlock();
  bool finite = true, bounded = false;
  const absl::Status checked = AddShard(rank, shard, payload, plan, &finite, &bounded);
  mu_.Lock();
  me.adding = false;
  --adds_in_flight_;
  if (!checked.ok()) return checked;
  if (!finite) rounds_[round].nonfinite = true;
  if (!bounded) rounds_[round].unbounded = true;
  for (int32_t c : shard.columns()) acc_->MarkReceived(ti, rank, shard.step(), c);
  me.round_last_step = std::max(me.round_last_step, shard.step());
  stats_.CountShard(wire, static_cast<int64_t>(payload.size()));
  RoundState& rstate = rounds_[round];
  if (!rstate.first_shard_seen) {
    rstate.first_shard_seen = true;
    rstate.first_shard = std::chrono::steady_clock::now();
  }
  return absl::OkStatus();
}

absl::Status Job::AddShard(int32_t rank, const v1::GradientShard& shard,
                           const ShardPayload& payload, const AddPlan& plan, bool* finite_out,
                           bool* bounded_out) {
  const TensorState& t = tensors_[plan.ti];  // metadata: immutable
  const size_t ncols = static_cast<size_t>(shard.columns_size());
  const size_t rows = static_cast<size_t>(t.rows);
  const bool skip = spec_.skip_nonfinite_rounds();
  // The values are read where the transport left them (UCX's receive
  // buffer, gRPC's slices, protobuf's string), a stretch of a column at a
  // time (ForEachStretch: a column cut by a slice boundary in two stretches;
  // only a value cut in two is gathered, on the stack).
  auto scale = [&](size_t i) { return shard.scales(static_cast<int>(i)); };
  size_t bad_col = 0, bad_row = 0;
  auto record_bad = [&](size_t i, size_t row) {
    bad_col = i;
    bad_row = row;
    return false;
  };
  // A shard the job rejects must leave the sums as they were, and other
  // ranks add into them meanwhile (shared sums), so nothing is undone: its
  // values are all checked before any is added. (Int8: only the columns
  // whose scale can overflow are read; see Int8AllFinite.) The check reads
  // the shard a first time, the add a second; a shard that fits in the
  // core's L2 comes from memory once. (Undoing instead was measured slower:
  // an exact undo must keep the sums' old values, 4 bytes written per
  // value against the check's 2 read; docs/benchmarks.md.) The check runs
  // over the payload's pieces whole, not column by column: one call per
  // gRPC slice (or one for a UCX buffer), whatever the columns' length. A
  // payload the transport's receive copy already scanned (UCX, see
  // common/copy_scan.h) and proved finite for its dtype is not read here.
  //
  // The same read finds whether every value is below 2^63 in magnitude
  // (AllBounded, or the receive scan's proof): a round of such shards
  // cannot overflow its update, which then runs in one pass
  // (RoundUpdateInput::bounded). Only a shard with a value that large (or
  // not finite) is read again, to tell which (AllFinite).
  bool bounded = false;
  if (plan.int8) {
    // |q| <= 128: below 2^63 when 128 * scale is (exact: a power of two).
    bounded = true;
    for (size_t i = 0; i < ncols && bounded; ++i) bounded = 128.0f * scale(i) < 0x1p63f;
  } else {
    bounded = payload.scan().ProvesBounded(plan.dt, payload.size());
  }
  if (!skip) {
    bool finite = true;
    if (plan.int8) {
      bool any = false;
      for (size_t i = 0; i < ncols && !any; ++i) any = !std::isfinite(128.0f * scale(i));
      finite = !any || ForEachStretch(payload, rows, plan.esize, 0, ncols,
                                      [&](size_t i, size_t row, const char* v, size_t n) {
                                        size_t at = 0;
                                        return Int8AllFinite(reinterpret_cast<const int8_t*>(v),
                                                             n, scale(i), &at) ||
                                               record_bad(i, row + at);
                                      });
    } else if (!payload.scan().Proves(plan.dt, payload.size())) {
      bounded = ForEachStretch(payload, ncols * rows, plan.esize, 0, 1,
                               [&](size_t, size_t, const char* v, size_t n) {
                                 return AllBounded(plan.dt, v, n);
                               });
      if (!bounded) {
        finite = ForEachStretch(payload, ncols * rows, plan.esize, 0, 1,
                                [&](size_t, size_t from, const char* v, size_t n) {
                                  size_t at = 0;
                                  return AllFinite(plan.dt, v, n, &at) ||
                                         record_bad((from + at) / rows, (from + at) % rows);
                                });
      }
    }
    if (!finite) return NonFiniteShardError(shard, payload, plan, bad_col, bad_row);
  }
  *bounded_out = bounded;
  // Shared sums: every rank adds into the same columns, so a run of columns
  // of one block is added under that block's stripe lock. Ranks that send
  // their columns in the same order then follow each other block by block.
  const bool shared = acc_->sum_ranks() == 1 && world_ > 1;
  const int64_t block = std::max<int64_t>(1, kStripeElements / t.rows);
  std::unique_lock<std::mutex> stripe;
  int64_t held = -1;
  // first: the store of the rank's first add of the round (plan.first).
  auto add = [&](size_t i, size_t row, const char* v, size_t n, float* to, bool first) {
    size_t at = 0;
    if (plan.int8) {
      const int8_t* q = reinterpret_cast<const int8_t*>(v);
      if (!skip) {
        DecodeAddInt8(q, n, scale(i), to, first);
        return true;
      }
      return DecodeAddInt8Finite(q, n, scale(i), to, &at, first) || record_bad(i, row + at);
    }
    if (!skip) {
      DecodeAdd(plan.dt, v, n, to, first);
      return true;
    }
    return DecodeAddFinite(plan.dt, v, n, to, &at, first) || record_bad(i, row + at);
  };
  // One pass: with skip_nonfinite_rounds each block of values is checked
  // and then added (DecodeAddFinite). A non-finite value stops the add part
  // way, which is harmless there: the round is skipped, and its update
  // zeroes its sums (round_update.cc) without reading them.
  const bool finite = ForEachStretch(
      payload, rows, plan.esize, 0, ncols, [&](size_t i, size_t row, const char* v, size_t n) {
        const int32_t c = shard.columns(static_cast<int>(i));
        if (shared && c / block != held) {
          if (stripe.owns_lock()) stripe.unlock();
          held = c / block;
          stripe = std::unique_lock<std::mutex>(
              stripes_[static_cast<size_t>(plan.ti * 7919 + held) % stripes_.size()]);
        }
        return add(i, row, v, n, acc_->sum_of(plan.ti, rank, plan.round, c) + row,
                   plan.first != nullptr && plan.first[i] != 0);
      });
  if (stripe.owns_lock()) stripe.unlock();
  if (!finite) {
    *finite_out = false;  // accepted, and the round is skipped
    return absl::OkStatus();
  }
  // A sampled column's step is also kept apart (docs/design.md rule 14), once
  // the shard is added whole (the few sampled columns read a second time).
  for (size_t i = 0; i < ncols; ++i) {
    const int32_t c = shard.columns(static_cast<int>(i));
    const int slot = divergence_->Slot(plan.ti, plan.round, c);
    if (slot < 0) continue;
    divergence_->Capture(slot, rank, plan.round, plan.step_in_round, [&](float* to) {
      ForEachStretch(payload, rows, plan.esize, i, i + 1,
                     [&](size_t col, size_t row, const char* v, size_t n) {
                       return add(col, row, v, n, to + row, /*first=*/false);
                     });
    });
  }
  return absl::OkStatus();
}

absl::Status Job::NonFiniteShardError(const v1::GradientShard& shard,
                                      const ShardPayload& payload, const AddPlan& plan,
                                      size_t col, size_t row) const {
  const TensorState& t = tensors_[plan.ti];
  std::string why;
  if (plan.int8) {
    char q = 0;
    payload.CopyOut(col * static_cast<size_t>(t.rows) + row, 1, &q);
    why = absl::StrCat(" (int8 ", static_cast<int>(static_cast<int8_t>(q)), " x scale ",
                       shard.scales(static_cast<int>(col)), ")");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", t.name, "': non-finite gradient in column ",
      shard.columns(static_cast<int>(col)), " row ", row, " of step ", shard.step(), why,
      " (the job rejects such shards; set skip_nonfinite_rounds to skip the round instead)"));
}

absl::Status Job::HandleClose(int32_t rank, const v1::RoundClose& close, bool replay) {
  RankState& rs = ranks_[rank];
  if (!uploaded_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", spec_.job_id(), "': upload the parameters before closing rounds"));
  }
  if (replay && close.round() >= 0 && close.round() < rs.next_round) {
    ++stats_.replays_dropped;
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
  RankArrivals::Miss miss;
  if (acc_->arrivals().FirstIncomplete(rank, steps, &miss)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " cannot close round ", close.round(), ": tensor '",
        tensors_[miss.tensor].name, "' column ", miss.column, " has gradients from ", miss.hits,
        " of ", steps, " steps"));
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
    stats_.last_round_steps = static_cast<int32_t>(steps);
    if (round.first_shard_seen) {
      stats_.accumulate_seconds.Observe(Seconds(round.last_close - round.first_shard));
    }
    // Rounds close fully in order from 0, so only round 0 has no predecessor.
    if (close.round() > 0) round.interval_seconds = Seconds(round.last_close - last_full_close_);
    last_full_close_ = round.last_close;
  }
  FoldClosedRanksLocked(rank, close.round());
  return absl::OkStatus();
}

void Job::FoldClosedRanksLocked(int32_t rank, int64_t r) {
  RoundState& round = rounds_[r];  // (a map: stays put while the lock is let go)
  if (acc_->sum_ranks() == 1) {
    round.folded = world_;  // one buffer: nothing to fold
  } else {
    // Rank-ordered sums: the ranks' sums go into rank 0's as soon as they
    // and every rank before them have closed the round, in rank order (the
    // same adds as one fold of them all at the end), on this rank's thread
    // and outside the job's lock, as a shard's add. One fold of a round at
    // a time; a close meanwhile is picked up by the fold in flight.
    RankState& me = ranks_[rank];
    while (!round.folding) {
      const int from = round.folded;
      int to = from;
      while (to < world_ && ranks_[to].next_round > r) ++to;
      if (to == from) break;
      round.folding = true;
      me.adding = true;
      ++adds_in_flight_;
      mu_.Unlock();
      acc_->FoldRanks(ctx_.simd, r, from, to);
      mu_.Lock();
      me.adding = false;
      --adds_in_flight_;
      round.folding = false;
      round.folded = to;
    }
  }
  if (round.closed == world_ && round.folded == world_ && !round.folding && !round.scheduled) {
    round.scheduled = true;
    std::shared_ptr<Job> self = shared_from_this();
    // The update's right to the round's buffers; HandleShard and HandOff
    // keep off them until rounds_updated_ passes the round.
    auto lease =
        std::make_shared<UpdateLease>(UpdateLease::Grant(r, store_.get(), acc_.get()));
    strand_->Schedule([self, lease] { self->RunUpdate(std::move(*lease)); });
  }
}

// ---- Update -----------------------------------------------------------------

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
  in.lr = RoundStepLr(spec_, rs.lr, rs.steps);  // docs/design.md rule 12
  in.nonfinite = rs.nonfinite;
  in.bounded = !rs.unbounded;
  in.folded_ranks = rs.folded;  // the rest (none) is folded by the update
  in.tensors = &update_tensors_;
  in.remote = &remote;
  const v1::AdamWConfig& cfg = spec_.adamw();
  in.hyper = AdamWHyper{rs.lr, cfg.beta1(), cfg.beta2(), cfg.eps(), cfg.weight_decay()};
  in.max_grad_norm = cfg.max_grad_norm();
  in.arithmetic = spec_.delta_kind() == v1::DELTA_ARITHMETIC;
  in.moments = WithMoments(rs.steps);
  in.factored_moment = DeltasCarryFactoredMoment(spec_);  // docs/design.md rule 13
  in.max_shard_bytes = spec_.max_shard_bytes();
  in.simd = ctx_.simd;
  in.adam8_draw_seed = ctx_.adam8_draw_seed;
  in.pool = ctx_.pool;
  in.recycler = recycler_.get();
  // The deltas go to every rank's outbox as the update encodes them (one
  // copy of each, shared by the outboxes), unless an emulated round time
  // holds them back until it has passed.
  const bool emulate = ctx_.emulate_round_seconds > 0;
  int64_t delta_bytes = 0;
  std::vector<Mailbox::Message> held;
  in.sink = [&](v1::DownMessage d) {
    const v1::ParameterDelta& x = d.delta();
    delta_bytes += static_cast<int64_t>(x.payload().size() + x.m().size() + x.v().size() +
                                        8 * x.update_counts_size());
    if (x.row_v_size() > 0) delta_bytes += 4 * (x.row_v_size() + x.col_v_size() + 1);
    // Once no outbox holds it, its buffers go back for the next update.
    auto shared = std::shared_ptr<const v1::DownMessage>(
        new v1::DownMessage(std::move(d)), [rec = recycler_](const v1::DownMessage* p) {
          auto* msg = const_cast<v1::DownMessage*>(p);  // made non-const above
          rec->Recycle(msg);
          delete msg;
        });
    if (emulate) {
      held.push_back(std::move(shared));
    } else {
      for (const auto& box : boxes) box->Push(shared);
    }
  };
  TensorStore* const store = lease.store();
  const bool measure = divergence_->Start(round, rs.steps, store);
  RoundUpdateResult result = UpdateRound(in, std::move(lease));
  const bool skip = result.skipped, overflowed = result.overflowed, norm_first = result.two_pass;
  const float grad_norm = result.grad_norm;
  // The update divergence; negative: not measured.
  const float divergence =
      measure && !skip ? MeasureDivergence(rs.lr, grad_norm, store).value_or(-1.0f) : -1.0f;
  const int64_t messages = result.messages;

  if (emulate) {
    // Waits out the rest of the emulated round time (JobContext); the
    // update's real work is done, its deltas not yet sent.
    std::this_thread::sleep_until(
        t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                 std::chrono::duration<double>(ctx_.emulate_round_seconds)));
    for (const auto& box : boxes) {
      for (const Mailbox::Message& d : held) box->Push(d);
    }
    held.clear();
  }

  const auto t1 = std::chrono::steady_clock::now();
  v1::DownMessage done;
  v1::RoundDone* rd = done.mutable_done();
  rd->set_round(round);
  rd->set_delta_messages(static_cast<int32_t>(messages));
  rd->set_skipped_nonfinite(skip);
  rd->set_grad_norm(grad_norm);
  rd->set_close_to_done_seconds(Seconds(t1 - rs.last_close));
  rd->set_selection_version(version);
  rd->set_round_interval_seconds(rs.interval_seconds);
  rd->set_steps(rs.steps);
  rd->set_stall_seconds(rs.max_stall_seconds);
  if (divergence >= 0) rd->set_update_divergence(divergence);

  std::vector<std::function<void()>> callbacks;
  {
    MutexLock lock(&mu_);
    rounds_updated_ = round + 1;
    rounds_.erase(round);
    if (ctx_.nothing_survives_restart) durable_rounds_ = rounds_updated_;
    done.mutable_done()->set_durable_rounds(durable_rounds_);
    last_done_ = done.done();
    if (resend_round_ >= 0 && round >= resend_round_ + 2) {
      resend_round_ = -1;  // every rank has applied it
      resend_.clear();
    }
    if (divergence >= 0) NoteDivergenceLocked(divergence, rs.steps);
    if (skip) ++stats_.rounds_skipped;
    if (overflowed) ++stats_.rounds_overflowed;
    if (norm_first) ++stats_.rounds_norm_first;
    stats_.delta_messages_sent += messages * static_cast<int64_t>(boxes.size());
    stats_.delta_bytes_sent += delta_bytes * static_cast<int64_t>(boxes.size());
    stats_.last_update_seconds = Seconds(t1 - t0);
    stats_.update_seconds_total += stats_.last_update_seconds;
    stats_.update_seconds.Observe(stats_.last_update_seconds);
    callbacks = MaybeFinishSelectionLocked();
  }
  if (ctx_.round_updated) ctx_.round_updated(spec_.job_id(), round + 1);
  auto done_shared = std::make_shared<const v1::DownMessage>(std::move(done));
  for (const auto& box : boxes) box->Push(done_shared);
  for (auto& cb : callbacks) cb();
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

}  // namespace zenflow
