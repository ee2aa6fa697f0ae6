// What one rank did since the daemon's newest durable checkpoint, in order,
// so that it can do it again after the daemon restarted from that
// checkpoint (docs/checkpoints.md#riding-through-a-daemon-restart): the shards and
// round closes it sent, the selections it took part in and the state it
// handed off, each tagged with its round; and its last all-reduce, for a
// rank that lost that answer. Entries of rounds the daemon has made durable
// are forgotten; past `max_bytes` the oldest go too, and the log says from
// which round on it is still complete.
//
//   ReplayLog log(/*max_bytes=*/1 << 30);
//   log.AddUp(round, msg);                  // as each message is queued
//   log.Forget(done.durable_rounds());      // as the daemon reports
//   for (const auto& e : log.Entries()) ... // after a reconnect, in order
//
// Thread-safe.
#ifndef ZENFLOW_CLIENT_REPLAY_LOG_H_
#define ZENFLOW_CLIENT_REPLAY_LOG_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

struct ReplayEntry {
  enum class Kind { kUp, kSelection, kHandOff };
  Kind kind = Kind::kUp;
  int64_t round = 0;
  v1::UpMessage up;                       // kUp: a shard (payload held) or a close
  v1::SubmitImportanceRequest selection;  // kSelection
  v1::HandOffRequest hand_off;            // kHandOff
  int64_t bytes = 0;
};

class ReplayLog {
 public:
  explicit ReplayLog(int64_t max_bytes) : max_bytes_(max_bytes) {}

  void AddUp(int64_t round, v1::UpMessage msg);
  void AddSelection(int64_t round, v1::SubmitImportanceRequest req);
  void AddHandOff(int64_t round, v1::HandOffRequest req);
  // Only the newest all-reduce is kept (docs/checkpoints.md: a rank that lost an answer
  // needs the others' parts of that one step only).
  void SetAllReduce(v1::AllReduceRequest req);

  // The daemon holds rounds [0, durable_rounds) durably: their entries go.
  void Forget(int64_t durable_rounds);
  // The log holds everything the rank did for rounds >= complete_from().
  int64_t complete_from();
  // The entries, oldest first (shared: later changes do not touch them).
  std::vector<std::shared_ptr<const ReplayEntry>> Entries();
  std::optional<v1::AllReduceRequest> LastAllReduce();

  struct Stats {
    int64_t entries = 0;
    int64_t bytes = 0;
    int64_t dropped_for_space = 0;  // entries dropped before they were durable
  };
  Stats stats();

 private:
  void Add(std::shared_ptr<ReplayEntry> e);
  template <typename Msg>
  void AddMessage(ReplayEntry::Kind kind, int64_t round, Msg msg, Msg ReplayEntry::*field);

  const int64_t max_bytes_;
  Mutex mu_;
  std::deque<std::shared_ptr<const ReplayEntry>> entries_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::AllReduceRequest> all_reduce_ ABSL_GUARDED_BY(mu_);
  int64_t all_reduce_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;  // entries and the all-reduce
  int64_t complete_from_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t durable_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_REPLAY_LOG_H_
