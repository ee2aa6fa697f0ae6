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

void ReplayLog::AddUp(int64_t round, v1::UpMessage msg) {
  auto e = std::make_shared<ReplayEntry>();
  e->kind = ReplayEntry::Kind::kUp;
  e->round = round;
  e->bytes = static_cast<int64_t>(msg.ByteSizeLong());
  e->up = std::move(msg);
  e->up.set_replay(true);
  Add(std::move(e));
}

void ReplayLog::AddSelection(int64_t round, v1::SubmitImportanceRequest req) {
  auto e = std::make_shared<ReplayEntry>();
  e->kind = ReplayEntry::Kind::kSelection;
  e->round = round;
  e->bytes = static_cast<int64_t>(req.ByteSizeLong());
  e->selection = std::move(req);
  e->selection.set_replay(true);
  Add(std::move(e));
}

void ReplayLog::AddHandOff(int64_t round, v1::HandOffRequest req) {
  auto e = std::make_shared<ReplayEntry>();
  e->kind = ReplayEntry::Kind::kHandOff;
  e->round = round;
  e->bytes = static_cast<int64_t>(req.ByteSizeLong());
  e->hand_off = std::move(req);
  e->hand_off.set_replay(true);
  Add(std::move(e));
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
