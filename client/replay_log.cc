// A rank's replay log; see replay_log.h.
#include "client/replay_log.h"

#include <algorithm>
#include <utility>

namespace zenflow {

void ReplayLog::Add(std::shared_ptr<ReplayEntry> e) {
  MutexLock lock(&mu_);
  if (e->round < durable_) return;  // already durable (a late message)
  bytes_ += e->bytes;
  entries_.push_back(std::move(e));
  // Over the limit: the oldest go, and with them the completeness of their
  // rounds (the newest entry always stays).
  while (bytes_ > max_bytes_ && entries_.size() > 1) {
    const std::shared_ptr<const ReplayEntry>& old = entries_.front();
    bytes_ -= old->bytes;
    complete_from_ = std::max(complete_from_, old->round + 1);
    ++dropped_;
    entries_.pop_front();
  }
}

template <typename Msg>
void ReplayLog::AddMessage(ReplayEntry::Kind kind, int64_t round, Msg msg,
                           Msg ReplayEntry::*field) {
  auto e = std::make_shared<ReplayEntry>();
  e->kind = kind;
  e->round = round;
  msg.set_replay(true);
  e->bytes = static_cast<int64_t>(msg.ByteSizeLong());
  (*e).*field = std::move(msg);
  Add(std::move(e));
}

void ReplayLog::AddUp(int64_t round, v1::UpMessage msg) {
  AddMessage(ReplayEntry::Kind::kUp, round, std::move(msg), &ReplayEntry::up);
}

void ReplayLog::AddSelection(int64_t round, v1::SubmitImportanceRequest req) {
  AddMessage(ReplayEntry::Kind::kSelection, round, std::move(req), &ReplayEntry::selection);
}

void ReplayLog::AddHandOff(int64_t round, v1::HandOffRequest req) {
  AddMessage(ReplayEntry::Kind::kHandOff, round, std::move(req), &ReplayEntry::hand_off);
}

void ReplayLog::SetAllReduce(v1::AllReduceRequest req) {
  req.set_replay(true);
  const int64_t n = static_cast<int64_t>(req.ByteSizeLong());
  MutexLock lock(&mu_);
  bytes_ += n - all_reduce_bytes_;
  all_reduce_bytes_ = n;
  all_reduce_ = std::move(req);
}

void ReplayLog::Forget(int64_t durable_rounds) {
  MutexLock lock(&mu_);
  if (durable_rounds <= durable_) return;
  durable_ = durable_rounds;
  while (!entries_.empty() && entries_.front()->round < durable_rounds) {
    bytes_ -= entries_.front()->bytes;
    entries_.pop_front();
  }
  complete_from_ = std::max(complete_from_, durable_rounds);
}

int64_t ReplayLog::complete_from() {
  MutexLock lock(&mu_);
  return complete_from_;
}

std::vector<std::shared_ptr<const ReplayEntry>> ReplayLog::Entries() {
  MutexLock lock(&mu_);
  return {entries_.begin(), entries_.end()};
}

std::optional<v1::AllReduceRequest> ReplayLog::LastAllReduce() {
  MutexLock lock(&mu_);
  return all_reduce_;
}

ReplayLog::Stats ReplayLog::stats() {
  MutexLock lock(&mu_);
  Stats s;
  s.entries = static_cast<int64_t>(entries_.size());
  s.bytes = bytes_;
  s.dropped_for_space = dropped_;
  return s;
}

}  // namespace zenflow
