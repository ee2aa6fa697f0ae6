// The all-reduce rendezvous; see all_reduce_barrier.h.
#include "server/all_reduce_barrier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/status_macros.h"
#include "server/quote.h"

namespace zenflow {
namespace {

int64_t PartsBytes(const v1::AllReduceRequest& req) {
  int64_t n = 0;
  for (const v1::ReducePart& p : req.parts()) {
    n += static_cast<int64_t>(p.payload().size() + p.name().size());
  }
  return n;
}

absl::Status CheckParts(const v1::AllReduceRequest& req) {
  if (req.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("all-reduce step ", req.step(), " is negative"));
  }
  for (const v1::ReducePart& p : req.parts()) {
    if (p.payload().size() % 4 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("all-reduce part ", Quote(p.name()), ": ",
                                                     p.payload().size(),
                                                     " bytes is not fp32 values"));
    }
    size_t bad = 0;
    if (!AllFinite(DType::kF32, p.payload().data(), p.payload().size() / 4, &bad)) {
      return absl::InvalidArgumentError(
          absl::StrCat("all-reduce part ", Quote(p.name()), ": non-finite value at ", bad));
    }
  }
  return absl::OkStatus();
}

bool SameShape(const v1::AllReduceRequest& a, const v1::AllReduceRequest& b) {
  if (a.parts_size() != b.parts_size()) return false;
  for (int i = 0; i < a.parts_size(); ++i) {
    if (a.parts(i).name() != b.parts(i).name() ||
        a.parts(i).payload().size() != b.parts(i).payload().size()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status AllReduceBarrier::Submit(const v1::AllReduceRequest& req, uint64_t call, Done done) {
  Done replaced;
  Done replay_answer;  // a replay is answered at once, with no parts
  std::vector<Done> waiters;
  v1::AllReduceResponse result;
  {
    MutexLock lock(&mu_);
    if (!shut_down_.ok()) return shut_down_;
    if (absl::Status s = CheckParts(req); !s.ok()) return s;
    if (req.replay()) {
      ZF_RETURN_IF_ERROR(SubmitReplayLocked(req, &waiters, &result));
      replay_answer = std::move(done);
    } else {
      ZF_RETURN_IF_ERROR(SubmitCallLocked(req, call, std::move(done), &replaced, &waiters, &result));
    }
  }
  if (replay_answer) replay_answer(v1::AllReduceResponse());
  if (replaced) {
    replaced(absl::AbortedError(absl::StrCat("all-reduce of rank ", req.rank(), " for step ",
                                             req.step(),
                                             " was replaced by a newer call for the same step")));
  }
  for (Done& w : waiters) w(result);
  return absl::OkStatus();
}

absl::Status AllReduceBarrier::SubmitCallLocked(const v1::AllReduceRequest& req, uint64_t call,
                                                Done done, Done* replaced,
                                                std::vector<Done>* waiters,
                                                v1::AllReduceResponse* result) {
  const int32_t rank = req.rank();
  for (const auto& [step, other] : pending_) {
    if (step != req.step() && other.submitted[rank] && other.waiters[rank]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " is still in the all-reduce of step ", step,
          "; a rank takes part in one all-reduce at a time (cancel that call first)"));
    }
  }
  auto found = pending_.find(req.step());
  if (found != pending_.end()) {
    // Every rank must send the same parts with the same sizes.
    const Pending& p = found->second;
    for (int r = 0; r < world_; ++r) {
      if (!p.submitted[r] || r == rank) continue;
      if (!SameShape(p.parts[r], req)) {
        return absl::InvalidArgumentError(
            absl::StrCat("all-reduce for step ", req.step(), ": rank ", rank,
                         "'s parts differ in names or sizes from rank ", r, "'s"));
      }
      break;
    }
  }
  Pending& p = PendingLocked(req.step());
  if (p.submitted[rank]) {
    *replaced = std::move(p.waiters[rank]);  // a retry: the newer call wins
    bytes_ -= PartsBytes(p.parts[rank]);
    if (replay_step_[rank] == req.step()) replay_step_[rank] = -1;  // a call now
  } else {
    ++p.count;
  }
  p.submitted[rank] = true;
  p.parts[rank] = req;
  p.waiters[rank] = std::move(done);
  p.calls[rank] = call;
  bytes_ += PartsBytes(req);
  if (p.count == world_) *waiters = CompleteLocked(req.step(), result);
  return absl::OkStatus();
}

AllReduceBarrier::Pending& AllReduceBarrier::PendingLocked(int64_t step) {
  Pending& p = pending_[step];
  if (p.submitted.empty()) {  // a new step: nobody in yet
    p.submitted.assign(world_, false);
    p.parts.resize(world_);
    p.waiters.resize(world_);
    p.calls.assign(world_, 0);
  }
  return p;
}

std::vector<AllReduceBarrier::Done> AllReduceBarrier::CompleteLocked(
    int64_t step, v1::AllReduceResponse* result) {
  Pending& p = pending_[step];
  // Everyone is in: the mean, summed in rank order.
  const v1::AllReduceRequest& shape = p.parts[0];
  const float inv = 1.0f / static_cast<float>(world_);
  for (int i = 0; i < shape.parts_size(); ++i) {
    const size_t n = shape.parts(i).payload().size() / 4;
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < world_; ++r) {
      DecodeAdd(DType::kF32, p.parts[r].parts(i).payload().data(), n, sum.data());
    }
    for (float& x : sum) x *= inv;
    v1::ReducePart* out = result->add_parts();
    out->set_name(shape.parts(i).name());
    out->set_payload(reinterpret_cast<const char*>(sum.data()), n * 4);
  }
  std::vector<Done> waiters;
  for (Done& w : p.waiters) {
    if (w) waiters.push_back(std::move(w));
  }
  for (int r = 0; r < world_; ++r) {
    bytes_ -= PartsBytes(p.parts[r]);
    if (replay_step_[r] == step) replay_step_[r] = -1;
  }
  pending_.erase(step);
  // Every rank has passed the earlier steps: replayed parts kept for them
  // are of no use any more.
  for (auto it = pending_.begin(); it != pending_.end() && it->first < step;) {
    bool live = false;
    for (const Done& w : it->second.waiters) live = live || static_cast<bool>(w);
    if (live) {
      ++it;
      continue;
    }
    for (int r = 0; r < world_; ++r) {
      if (!it->second.submitted[r]) continue;
      bytes_ -= PartsBytes(it->second.parts[r]);
      if (replay_step_[r] == it->first) replay_step_[r] = -1;
    }
    it = pending_.erase(it);
  }
  return waiters;
}

absl::Status AllReduceBarrier::SubmitReplayLocked(const v1::AllReduceRequest& req,
                                                  std::vector<Done>* waiters,
                                                  v1::AllReduceResponse* result) {
  const int32_t rank = req.rank();
  auto found = pending_.find(req.step());
  if (found != pending_.end() && found->second.submitted[rank]) {
    return absl::OkStatus();  // already here (a call or an earlier replay)
  }
  if (found != pending_.end()) {
    const Pending& p = found->second;
    for (int r = 0; r < world_; ++r) {
      if (p.submitted[r] && !SameShape(p.parts[r], req)) {
        return absl::InvalidArgumentError(
            absl::StrCat("all-reduce for step ", req.step(), ": rank ", rank,
                         "'s replayed parts differ in names or sizes from rank ", r, "'s"));
      }
    }
  }
  // A rank keeps one replayed part: its newest replay replaces the older.
  if (replay_step_[rank] >= 0) {
    auto old = pending_.find(replay_step_[rank]);
    if (old != pending_.end() && old->second.submitted[rank] && !old->second.waiters[rank]) {
      bytes_ -= PartsBytes(old->second.parts[rank]);
      old->second.submitted[rank] = false;
      old->second.parts[rank] = v1::AllReduceRequest();
      if (--old->second.count == 0) pending_.erase(old);
    }
    replay_step_[rank] = -1;
  }
  Pending& p = PendingLocked(req.step());
  p.submitted[rank] = true;
  p.parts[rank] = req;
  p.parts[rank].set_replay(false);
  ++p.count;
  bytes_ += PartsBytes(req);
  replay_step_[rank] = req.step();
  if (p.count == world_) *waiters = CompleteLocked(req.step(), result);
  return absl::OkStatus();
}

void AllReduceBarrier::Withdraw(int32_t rank, uint64_t call) {
  Done dropped;  // destroyed outside the lock
  MutexLock lock(&mu_);
  if (rank < 0 || rank >= world_) return;
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    Pending& p = it->second;
    if (!p.submitted[rank] || p.calls[rank] != call) continue;
    bytes_ -= PartsBytes(p.parts[rank]);
    p.submitted[rank] = false;
    p.parts[rank] = v1::AllReduceRequest();
    dropped = std::move(p.waiters[rank]);
    p.waiters[rank] = nullptr;
    p.calls[rank] = 0;
    if (--p.count == 0) pending_.erase(it);
    return;
  }
}

void AllReduceBarrier::Shutdown(absl::Status why) {
  std::vector<Done> waiters;
  {
    MutexLock lock(&mu_);
    shut_down_ = why;
    for (auto& [step, p] : pending_) {
      for (Done& w : p.waiters) {
        if (w) waiters.push_back(std::move(w));
      }
    }
    pending_.clear();
    bytes_ = 0;
  }
  for (Done& w : waiters) w(why);
}

void AllReduceBarrier::FailWaiters(absl::Status why) {
  std::vector<Done> waiters;
  {
    MutexLock lock(&mu_);
    for (auto& [step, p] : pending_) {
      for (Done& w : p.waiters) {
        if (w) waiters.push_back(std::move(w));
      }
    }
    pending_.clear();
    bytes_ = 0;
    std::fill(replay_step_.begin(), replay_step_.end(), -1);
  }
  for (Done& w : waiters) w(why);
}

int64_t AllReduceBarrier::bytes() {
  MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace zenflow
