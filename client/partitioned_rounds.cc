// The partitioned client's rounds: each daemon delivers its part of a round
// (its tensors' deltas and its RoundDone), and a round is whole once every
// daemon's part is in; see partitioned_client.h.
#include "client/partitioned_client.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {

absl::StatusOr<RoundUpdate> PartitionedClient::Combine(std::vector<RoundUpdate> parts) {
  RoundUpdate out;
  out.round = parts[0].round;
  out.done = parts[0].done;
  double norm2 = 0;
  int32_t messages = 0;
  std::map<std::string, Blocks> blocks;  // of the deltas' tensors (null: not split)
  for (int i = 0; i < n(); ++i) {
    RoundUpdate& u = parts[i];
    const v1::RoundDone& d = u.done;
    if (d.selection_version() != out.done.selection_version() || d.steps() != out.done.steps()) {
      return absl::InternalError(absl::StrCat(
          "round ", out.round, ": the job's daemons disagree (", map_.target(0), ": selection ",
          out.done.selection_version(), ", ", out.done.steps(), " steps; ", map_.target(i),
          ": selection ", d.selection_version(), ", ", d.steps(), " steps)"));
    }
    for (v1::ParameterDelta& delta : u.deltas) {
      // A split tensor's block: back to the tensor's columns.
      auto it = blocks.find(delta.tensor());
      if (it == blocks.end()) it = blocks.emplace(delta.tensor(), map_.SplitOf(delta.tensor())).first;
      if (const Block* b = PartitionMap::BlockOn(it->second, i); b != nullptr && b->first != 0) {
        for (int32_t& c : *delta.mutable_columns()) c = static_cast<int32_t>(c + b->first);
      }
      out.deltas.push_back(std::move(delta));
    }
    messages += d.delta_messages();
    norm2 += static_cast<double>(d.grad_norm()) * d.grad_norm();
    // What every rank gets alike, so ranks that decide from it (adaptive
    // delay, auto interval) still decide alike: the slowest daemon's times.
    out.done.set_close_to_done_seconds(
        std::max(out.done.close_to_done_seconds(), d.close_to_done_seconds()));
    out.done.set_round_interval_seconds(
        std::max(out.done.round_interval_seconds(), d.round_interval_seconds()));
    out.done.set_stall_seconds(std::max(out.done.stall_seconds(), d.stall_seconds()));
    out.done.set_durable_rounds(std::min(out.done.durable_rounds(), d.durable_rounds()));
    out.done.set_skipped_nonfinite(out.done.skipped_nonfinite() || d.skipped_nonfinite());
    // The update divergence (docs/design.md rule 14): the largest daemon's.
    if (d.has_update_divergence() && (!out.done.has_update_divergence() ||
                                      d.update_divergence() > out.done.update_divergence())) {
      out.done.set_update_divergence(d.update_divergence());
    }
  }
  out.done.set_delta_messages(messages);
  out.done.set_grad_norm(static_cast<float>(std::sqrt(norm2)));
  return out;
}

absl::StatusOr<RoundUpdate> PartitionedClient::WaitRound(int64_t round, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<RoundUpdate> got(n());
  std::vector<bool> have(n(), false);
  int left = n();
  {
    // What an earlier wait that ran out of time, or PollRound, already took
    // of this round from its daemons (their clients no longer hold it).
    MutexLock lock(&rounds_mu_);
    for (auto it = whole_.begin(); it != whole_.end(); ++it) {
      if (it->round != round) continue;
      RoundUpdate u = std::move(*it);
      whole_.erase(it);
      return u;
    }
    if (auto it = partial_.find(round); it != partial_.end()) {
      for (int i = 0; i < n(); ++i) {
        if (!it->second[static_cast<size_t>(i)].has_value()) continue;
        got[i] = *std::move(it->second[static_cast<size_t>(i)]);
        have[i] = true;
        --left;
      }
      partial_.erase(it);
    }
  }
  // A wait that fails keeps the parts it took for the next wait.
  auto keep = [&]() {
    MutexLock lock(&rounds_mu_);
    std::vector<std::optional<RoundUpdate>>& slot = partial_[round];
    if (slot.empty()) slot.resize(static_cast<size_t>(n()));
    for (int i = 0; i < n(); ++i) {
      if (have[i]) slot[static_cast<size_t>(i)] = std::move(got[i]);
    }
  };
  while (left > 0) {
    // A daemon whose part is in but whose stream broke is acted on too: the
    // daemons still owed may wait for ranks that the same failure cut off
    // (a link between hosts that went down takes the other ranks' closes
    // with it), and a wait on them alone would last until one of them gives
    // up on those ranks, naming itself rather than the daemon that is gone.
    // Ride through its restart now, or fail naming it.
    for (int i = 0; i < n(); ++i) {
      if (!have[i] || clients_[i]->stream_status().ok()) continue;
      const absl::Status s = clients_[i]->RecoverBrokenStream();
      if (!s.ok()) {
        keep();
        return Named(i, s);
      }
    }
    // Wait on the first daemon still owed, a second at a time; but a daemon
    // whose stream broke goes first: its wait rides through its restart or
    // fails, naming it, rather than waiting behind a daemon that cannot
    // finish the round without the ranks it lost.
    int pick = -1;
    for (int i = 0; i < n() && pick < 0; ++i) {
      if (!have[i] && !clients_[i]->stream_status().ok()) pick = i;
    }
    const bool broken = pick >= 0;
    for (int i = 0; i < n() && pick < 0; ++i) {
      if (!have[i]) pick = i;
    }
    const absl::Duration remaining = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::StatusOr<RoundUpdate> u =
        clients_[pick]->WaitRound(round, broken ? remaining : std::min(remaining, absl::Seconds(1)));
    if (u.ok()) {
      got[pick] = *std::move(u);
      have[pick] = true;
      --left;
      continue;
    }
    if (u.status().code() != absl::StatusCode::kDeadlineExceeded || absl::Now() >= deadline) {
      keep();
      return Named(pick, u.status());
    }
  }
  return Combine(std::move(got));
}

absl::StatusOr<std::optional<RoundUpdate>> PartitionedClient::Offer(int part, RoundUpdate u) {
  std::vector<std::optional<RoundUpdate>>& slot = partial_[u.round];
  if (slot.empty()) slot.resize(n());
  const int64_t round = u.round;
  slot[part] = std::move(u);
  for (const std::optional<RoundUpdate>& s : slot) {
    if (!s.has_value()) return std::optional<RoundUpdate>();
  }
  std::vector<RoundUpdate> all;
  for (std::optional<RoundUpdate>& s : slot) all.push_back(*std::move(s));
  partial_.erase(round);
  ZF_ASSIGN_OR_RETURN(RoundUpdate whole, Combine(std::move(all)));
  return std::optional<RoundUpdate>(std::move(whole));
}

void PartitionedClient::SetRoundCallback(std::function<void(RoundUpdate)> cb) {
  {
    MutexLock lock(&rounds_mu_);
    callback_ = std::move(cb);
  }
  for (int i = 0; i < n(); ++i) {
    clients_[i]->SetRoundCallback([this, i](RoundUpdate u) {
      std::function<void(RoundUpdate)> deliver;
      {
        MutexLock lock(&rounds_mu_);
        absl::StatusOr<std::optional<RoundUpdate>> whole = Offer(i, std::move(u));
        if (!whole.ok()) {
          MutexLock elock(&mu_);
          errors_.push_back(whole.status());
          return;
        }
        if (!whole->has_value()) return;
        // Rounds complete in round order (each daemon delivers in order);
        // one thread at a time hands them on, in that order.
        whole_.push_back(**std::move(whole));
        if (delivering_) return;
        delivering_ = true;
      }
      for (;;) {
        RoundUpdate next;
        {
          MutexLock lock(&rounds_mu_);
          if (whole_.empty()) {
            delivering_ = false;
            return;
          }
          next = std::move(whole_.front());
          whole_.pop_front();
          deliver = callback_;
        }
        if (deliver) deliver(std::move(next));
      }
    });
  }
}

std::optional<RoundUpdate> PartitionedClient::PollRound() {
  MutexLock lock(&rounds_mu_);
  for (int i = 0; i < n(); ++i) {
    while (std::optional<RoundUpdate> u = clients_[i]->PollRound()) {
      absl::StatusOr<std::optional<RoundUpdate>> whole = Offer(i, *std::move(u));
      if (!whole.ok()) {
        MutexLock elock(&mu_);
        errors_.push_back(whole.status());
      } else if (whole->has_value()) {
        whole_.push_back(**std::move(whole));
      }
    }
  }
  if (whole_.empty()) return std::nullopt;
  RoundUpdate u = std::move(whole_.front());
  whole_.pop_front();
  return u;
}

}  // namespace zenflow
