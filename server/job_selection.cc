// A job's column selection (SubmitImportance), the hand-off of the
// columns that change hands at a new selection, and the ranks' all-reduce
// rendezvous. Part of Job; see job.h.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/selection.h"
#include "common/status_macros.h"
#include "server/job.h"

namespace zenflow {

// ---- Selection --------------------------------------------------------------

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
      ++stats_.replays_dropped;
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
    acc_->arrivals().SetImportant(static_cast<int>(ti), t.important);
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

absl::StatusOr<v1::HandOffResponse> Job::HandOff(const v1::HandOffRequest& req) {
  MutexLock lock(&mu_);
  QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(CheckLive());
  ZF_RETURN_IF_ERROR(CheckRank(req.rank()));
  if (req.replay() && req.version() > 0 &&
      (req.version() < selection_version_ || hand_off_.rank_version(req.rank()) >= req.version())) {
    // A later selection was made, or this rank's hand-off of this version
    // is complete (and rounds since may have moved those columns on).
    ++stats_.replays_dropped;
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

}  // namespace zenflow
