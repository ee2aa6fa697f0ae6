// The one-daemon client's riding through a restart of its daemon:
// reconnecting, re-attaching the rank's stream and replaying what the
// restarted daemon may have lost from the replay log (replay_log.h); see
// one_daemon_client.h.
#include "client/one_daemon_client.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/stream.h"
#include "common/status_macros.h"

namespace zenflow {

// ---- Riding through a daemon restart -----------------------------------------

bool OneDaemonClient::Recoverable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled;
}

int64_t OneDaemonClient::RoundOfStep(int64_t step) const {
  // Rounds of changing length: a step belongs to the rank's open round.
  if (auto_interval_.load()) return open_round_.load();
  const int64_t s = std::max<int64_t>(1, interval_.load());
  return step / s;
}

absl::Status OneDaemonClient::RideThrough(const std::function<absl::Status()>& call) {
  for (;;) {
    const uint64_t seen = generation_.load();
    if (ride_through()) {
      // The stream already knows the daemon went away: come back first, so
      // that the call finds this rank's earlier work replayed.
      std::shared_ptr<AttachedStream> st = current_stream();
      if (st != nullptr && !st->open() && Recoverable(st->status())) {
        ZF_RETURN_IF_ERROR(Recover(seen));
        continue;
      }
    }
    absl::Status s = call();
    if (s.ok() || !ride_through() || !Recoverable(s)) return s;
    ZF_RETURN_IF_ERROR(Recover(seen));
  }
}

absl::Status OneDaemonClient::RecoverBrokenStream() {
  const uint64_t seen = generation_.load();
  std::shared_ptr<AttachedStream> st = current_stream();
  if (st == nullptr || st->open()) return absl::OkStatus();
  const absl::Status s = st->status();
  if (s.ok()) return s;
  if (!ride_through() || !Recoverable(s)) return s;
  return Recover(seen);
}

absl::Status OneDaemonClient::Recover(uint64_t seen) {
  MutexLock lock(&recover_mu_);
  if (generation_.load() != seen) return absl::OkStatus();  // another thread did
  std::string job_id;
  int32_t rank;
  {
    MutexLock l(&mu_);
    job_id = job_id_;
    rank = rank_;
  }
  if (rank < 0) return absl::FailedPreconditionError("no rank attached to recover");
  const absl::Time deadline = absl::Now() + options_.daemon_wait;
  absl::Status last = absl::UnavailableError("not tried");
  absl::Duration pause = absl::Milliseconds(50);
  std::fprintf(stderr, "zenflow client: job '%s' rank %d lost zenflowd at %s; reconnecting for up to %s\n",
               job_id.c_str(), rank, options_.target.c_str(),
               absl::FormatDuration(options_.daemon_wait).c_str());
  while (absl::Now() < deadline) {
    channel_->WaitForConnected(std::chrono::system_clock::now() +
                               absl::ToChronoMilliseconds(std::min(absl::Seconds(2),
                                                                   deadline - absl::Now())));
    last = ReattachAndReplay(job_id, rank);
    if (last.ok()) {
      generation_.fetch_add(1);
      std::fprintf(stderr, "zenflow client: job '%s' rank %d re-attached and replayed\n",
                   job_id.c_str(), rank);
      return absl::OkStatus();
    }
    const absl::StatusCode c = last.code();
    // A job the restarted daemon has not restored yet answers NOT_FOUND, or
    // PERMISSION_DENIED to a job token (which may not learn whether a job
    // exists): both are waited out.
    if (!Recoverable(last) && c != absl::StatusCode::kNotFound &&
        c != absl::StatusCode::kPermissionDenied && c != absl::StatusCode::kAlreadyExists &&
        c != absl::StatusCode::kDeadlineExceeded) {
      return last;  // the daemon is back and refuses: waiting will not help
    }
    absl::SleepFor(std::min(pause, std::max(absl::ZeroDuration(), deadline - absl::Now())));
    pause = std::min(pause * 2, absl::Seconds(1));
  }
  return absl::UnavailableError(absl::StrCat(
      "zenflowd at ", options_.target, " did not take job '", job_id, "' rank ", rank,
      " back within ", absl::FormatDuration(options_.daemon_wait), " (--daemon_wait); last: ",
      last.ToString()));
}

absl::Status OneDaemonClient::ReattachAndReplay(const std::string& job_id, int32_t rank) {
  CloseStream();
  ZF_RETURN_IF_ERROR(Attach(job_id, rank));
  std::shared_ptr<AttachedStream> st = current_stream();
  if (st == nullptr) return absl::UnavailableError("no stream after attach");
  const v1::Attached hello = st->greeting();
  const int64_t complete = log_.complete_from();
  if (complete > hello.next_round()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "zenflowd restarted job '", job_id, "' at round ", hello.next_round(), " of rank ", rank,
        ", but this rank's replay log starts at round ", complete,
        " (max_replay_bytes filled up before the daemon made a checkpoint): the rank cannot "
        "continue exactly; checkpoint more often (--checkpoint_every_rounds)"));
  }
  for (const std::shared_ptr<const ReplayEntry>& e : log_.Entries()) {
    switch (e->kind) {
      case ReplayEntry::Kind::kUp: {
        // Round X reuses round X-2's accumulation buffer on the daemon:
        // its update must be done first (the engine's apply delay keeps
        // that true as it runs; a replay goes faster).
        ZF_RETURN_IF_ERROR(WaitRoundUpdated(e->round - 2));
        Outgoing out;
        out.msg = e->up;
        out.size = static_cast<int64_t>(e->bytes);
        out.payload_bytes = e->up.has_shard() ? static_cast<int64_t>(e->up.shard().payload().size()) : 0;
        ZF_RETURN_IF_ERROR(window_.Push(std::move(out)));
        break;
      }
      case ReplayEntry::Kind::kSelection: {
        // The engine drained before it selected: the rounds before the
        // selection's are updated first (their closes, replayed above,
        // travel on the stream, which a unary call can overtake).
        ZF_RETURN_IF_ERROR(WaitRoundUpdated(e->round - 1));
        v1::SubmitImportanceResponse resp;
        ZF_RETURN_IF_ERROR(RawSubmitImportance(e->selection, &resp));
        break;
      }
      case ReplayEntry::Kind::kHandOff: {
        v1::HandOffResponse resp;
        ZF_RETURN_IF_ERROR(RawHandOff(e->hand_off, &resp));
        break;
      }
    }
  }
  if (std::optional<v1::AllReduceRequest> ar = log_.LastAllReduce()) {
    v1::AllReduceResponse resp;
    ZF_RETURN_IF_ERROR(RawAllReduce(*ar, &resp));
  }
  // The engine goes on as if every round it already has whole were
  // updated, and pushes up to two rounds past the newest, which reuse
  // their accumulation buffers: the restarted daemon must have updated
  // them again first (every rank replays its closes of them).
  return WaitRoundUpdated(rounds_.newest_complete());
}

absl::Status OneDaemonClient::WaitRoundUpdated(int64_t round) {
  std::shared_ptr<AttachedStream> st = current_stream();
  if (round < 0 || (st != nullptr && round < st->greeting().rounds_updated()) ||
      rounds_.WaitDoneSeen(round, options_.selection_timeout)) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("the replay waited for round ", round, "'s update and the stream ended"));
}

}  // namespace zenflow
