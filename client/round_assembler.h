// What the daemon sends a rank, put together: each round's deltas collected
// until its RoundDone marker, complete rounds queued for WaitRound/PollRound
// (or handed to a callback), and the in-band errors for rejected up
// messages. It knows nothing about transports: the stream delivers every
// down message here, in arrival order.
//
//   RoundAssembler rounds;
//   rounds.Open();
//   rounds.Deliver(std::move(down), bytes);             // the receive thread
//   absl::StatusOr<RoundUpdate> u = rounds.Wait(round, absl::Seconds(30));
#ifndef ZENFLOW_CLIENT_ROUND_ASSEMBLER_H_
#define ZENFLOW_CLIENT_ROUND_ASSEMBLER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/round_update.h"
#include "common/mutex.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Thread-safe. The callback, when set, runs on the delivering thread
// without the lock held.
class RoundAssembler {
 public:
  // A new stream: partial rounds of the last one are dropped (complete
  // ones stay queued) and waits block again.
  void Open();
  // The stream ended: waits return.
  void Close();
  // Another job or rank: forgets every round (Open keeps complete ones and
  // drops rounds it already delivered, which a daemon that restarted from a
  // checkpoint sends again).
  void Reset();
  // The newest RoundDone.durable_rounds seen.
  int64_t durable_rounds();
  // The newest round this client has whole (delivered, or complete and
  // queued), from any stream since the last Reset; -1 if none.
  int64_t newest_complete();
  // Waits until this stream saw round `round`'s RoundDone (delivered or
  // dropped as a duplicate); false on timeout or when the stream closed.
  bool WaitDoneSeen(int64_t round, absl::Duration timeout);

  // Takes one down message (deltas, markers and errors; others are
  // ignored). Returns the error's status if it is fatal (the daemon ends
  // the stream), OK otherwise.
  absl::Status Deliver(v1::DownMessage msg, int64_t bytes);

  // Complete rounds go to `cb` from now on (those already queued first);
  // null: they queue again.
  void SetCallback(std::function<void(RoundUpdate)> cb);
  // The round, once complete; DEADLINE_EXCEEDED after `timeout`; CANCELLED
  // when the stream closed first (the stream knows why); the daemon's error
  // (its code, its message) as soon as it refused the round's close.
  absl::StatusOr<RoundUpdate> Wait(int64_t round, absl::Duration timeout);

  // The stream's writer sends a close of `round` as message `seq`: an
  // in-band error for `seq` refuses the round, and Wait(round) returns it
  // instead of waiting for a round that will not come; unless an earlier
  // close of the round on this stream was not refused (it stands: a second
  // close "already closed" does not stop the round).
  void NoteClose(uint64_t seq, int64_t round);
  // A close of `round` is queued (sent again, corrected, or replayed): an
  // earlier refusal of the round no longer counts. (NoteClose does the
  // same, when the close goes out.)
  void CloseQueued(int64_t round);
  std::optional<RoundUpdate> Poll();

  // The errors reported so far, oldest first; clears them.
  std::vector<absl::Status> TakeErrors();
  // Waits until `n` errors are pending (false: timeout or closed first).
  bool WaitForErrors(size_t n, absl::Duration timeout);

  struct Stats {
    int64_t bytes_received = 0;
    int64_t rounds_received = 0;
    double wait_seconds = 0;  // Wait blocked: the stall
    int64_t stream_errors = 0;
    int64_t deltas_received = 0;
    int64_t delta_bytes_received = 0;  // serialized DownMessage sizes
    int64_t rounds_dropped_duplicate = 0;  // sent again after a daemon restart
  };
  Stats stats();
  // Counts an error found below this layer (a frame that cannot be read).
  void AddError(absl::Status error);

 private:
  Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int64_t, RoundUpdate> partial_ ABSL_GUARDED_BY(mu_);
  std::deque<RoundUpdate> ready_ ABSL_GUARDED_BY(mu_);
  std::function<void(RoundUpdate)> callback_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> errors_ ABSL_GUARDED_BY(mu_);
  // Rounds delivered: the newest 64, and every round up to floor_.
  bool DeliveredLocked(int64_t round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::set<int64_t> delivered_ ABSL_GUARDED_BY(mu_);
  int64_t floor_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t durable_rounds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_seen_ ABSL_GUARDED_BY(mu_) = -1;  // newest RoundDone on this stream
  // The closes sent on this stream (seq -> round) and the rounds whose
  // close the daemon refused (round -> its error); the newest 64 of each.
  std::map<uint64_t, int64_t> close_seqs_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, absl::Status> refused_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_ROUND_ASSEMBLER_H_
