// Rounds from down messages; see round_assembler.h.
#include "client/round_assembler.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/stream_error.h"

namespace zenflow {

void RoundAssembler::Open() {
  MutexLock lock(&mu_);
  open_ = true;
  partial_.clear();
  done_seen_ = -1;
  close_seqs_.clear();  // a new stream numbers its messages anew
}

void RoundAssembler::Reset() {
  MutexLock lock(&mu_);
  partial_.clear();
  ready_.clear();
  delivered_.clear();
  floor_ = -1;
  durable_rounds_ = 0;
  close_seqs_.clear();
  refused_.clear();
}

void RoundAssembler::CloseQueued(int64_t round) {
  MutexLock lock(&mu_);
  refused_.erase(round);
}

void RoundAssembler::NoteClose(uint64_t seq, int64_t round) {
  MutexLock lock(&mu_);
  refused_.erase(round);
  close_seqs_[seq] = round;
  while (close_seqs_.size() > 64) close_seqs_.erase(close_seqs_.begin());
}

bool RoundAssembler::DeliveredLocked(int64_t round) const {
  return round <= floor_ || delivered_.count(round) > 0;
}

bool RoundAssembler::WaitDoneSeen(int64_t round, absl::Duration timeout) {
  MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done_seen_ >= round || !open_; }, timeout);
  return done_seen_ >= round;
}

int64_t RoundAssembler::newest_complete() {
  MutexLock lock(&mu_);
  int64_t newest = floor_;
  if (!delivered_.empty()) newest = std::max(newest, *delivered_.rbegin());
  for (const RoundUpdate& u : ready_) newest = std::max(newest, u.round);
  return newest;
}

int64_t RoundAssembler::durable_rounds() {
  MutexLock lock(&mu_);
  return durable_rounds_;
}

void RoundAssembler::Close() {
  MutexLock lock(&mu_);
  open_ = false;
}

absl::Status RoundAssembler::Deliver(v1::DownMessage msg, int64_t bytes) {
  std::function<void(RoundUpdate)> cb;
  std::optional<RoundUpdate> complete;
  absl::Status fatal;
  {
    MutexLock lock(&mu_);
    stats_.bytes_received += bytes;
    switch (msg.kind_case()) {
      case v1::DownMessage::kDelta: {
        ++stats_.deltas_received;
        stats_.delta_bytes_received += static_cast<int64_t>(msg.ByteSizeLong());
        if (DeliveredLocked(msg.delta().round())) break;  // sent again: dropped at its end
        RoundUpdate& u = partial_[msg.delta().round()];
        u.round = msg.delta().round();
        u.deltas.push_back(std::move(*msg.mutable_delta()));
        break;
      }
      case v1::DownMessage::kDone: {
        const int64_t r = msg.done().round();
        durable_rounds_ = std::max(durable_rounds_, msg.done().durable_rounds());
        done_seen_ = std::max(done_seen_, r);
        if (DeliveredLocked(r)) {
          // The daemon restarted from a checkpoint and updated this round
          // again from the replayed shards: it was delivered already.
          ++stats_.rounds_dropped_duplicate;
          break;
        }
        delivered_.insert(r);
        while (delivered_.size() > 64) {  // older rounds count as delivered
          floor_ = *delivered_.begin();
          delivered_.erase(delivered_.begin());
        }
        RoundUpdate u;
        auto it = partial_.find(r);
        if (it != partial_.end()) {
          u = std::move(it->second);
          partial_.erase(it);
        }
        u.round = r;
        u.done = std::move(*msg.mutable_done());
        ++stats_.rounds_received;
        if (callback_) {
          cb = callback_;
          complete = std::move(u);
        } else {
          ready_.push_back(std::move(u));
        }
        break;
      }
      case v1::DownMessage::kError: {
        ++stats_.stream_errors;
        const absl::Status err = StreamErrorStatus(msg.error());
        if (msg.error().fatal()) fatal = err;
        errors_.push_back(absl::Status(
            err.code(), absl::StrCat(err.message(), " (message #", msg.error().seq(), ")")));
        auto close = close_seqs_.find(msg.error().seq());
        // An earlier close of the same round still on record had no error
        // before this one (errors come in the stream's order): it stands,
        // and the round will come, so this refusal (e.g. "already closed")
        // does not end a wait for it.
        bool earlier_stands = false;
        if (close != close_seqs_.end()) {
          for (auto it = close_seqs_.begin(); it != close; ++it) {
            if (it->second == close->second) earlier_stands = true;
          }
        }
        if (close != close_seqs_.end() && earlier_stands) {
          close_seqs_.erase(close);
        } else if (close != close_seqs_.end()) {
          // A refused close: the round will not come (for this close).
          refused_[close->second] = absl::Status(
              err.code(), absl::StrCat("the daemon refused the close of round ", close->second,
                                       ": ", err.message(), " (message #", close->first, ")"));
          close_seqs_.erase(close);
          while (refused_.size() > 64) refused_.erase(refused_.begin());
        }
        break;
      }
      default:
        break;
    }
  }
  if (cb && complete) cb(std::move(*complete));
  return fatal;
}

void RoundAssembler::AddError(absl::Status error) {
  MutexLock lock(&mu_);
  ++stats_.stream_errors;
  errors_.push_back(std::move(error));
}

void RoundAssembler::SetCallback(std::function<void(RoundUpdate)> cb) {
  std::deque<RoundUpdate> pending;
  {
    MutexLock lock(&mu_);
    callback_ = cb;
    if (cb) pending.swap(ready_);
  }
  for (auto& u : pending) cb(std::move(u));
}

absl::StatusOr<RoundUpdate> RoundAssembler::Wait(int64_t round, absl::Duration timeout) {
  MutexLock lock(&mu_);
  const auto t0 = std::chrono::steady_clock::now();
  auto find = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = ready_.begin(); it != ready_.end(); ++it) {
      if (it->round == round) return it;
    }
    return ready_.end();
  };
  mu_.AwaitWithTimeout(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return find() != ready_.end() || refused_.count(round) > 0 || !open_;
      },
      timeout);
  stats_.wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto it = find();
  if (it != ready_.end()) {
    RoundUpdate u = std::move(*it);
    ready_.erase(it);
    return u;
  }
  if (auto refused = refused_.find(round); refused != refused_.end()) return refused->second;
  if (!open_) return absl::CancelledError("stream closed");
  return absl::DeadlineExceededError(absl::StrCat(
      "round ", round, "'s update did not arrive within ", absl::FormatDuration(timeout)));
}

std::optional<RoundUpdate> RoundAssembler::Poll() {
  MutexLock lock(&mu_);
  if (ready_.empty()) return std::nullopt;
  RoundUpdate u = std::move(ready_.front());
  ready_.pop_front();
  return u;
}

std::vector<absl::Status> RoundAssembler::TakeErrors() {
  MutexLock lock(&mu_);
  std::vector<absl::Status> out;
  out.swap(errors_);
  return out;
}

bool RoundAssembler::WaitForErrors(size_t n, absl::Duration timeout) {
  MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
             [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return errors_.size() >= n || !open_; },
             timeout) &&
         errors_.size() >= n;
}

RoundAssembler::Stats RoundAssembler::stats() {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace zenflow
