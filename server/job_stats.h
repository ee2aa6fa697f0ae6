// A job's statistics: what GetStats and /metrics report of it beyond its
// state. Counters only; nothing here decides anything.
#ifndef ZENFLOW_SERVER_JOB_STATS_H_
#define ZENFLOW_SERVER_JOB_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/histogram.h"
#include "server/mailbox.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Counts of rejected requests by status code. Thread-safe.
class RejectionCounter {
 public:
  void Add(absl::StatusCode code) {
    counts_[static_cast<int>(code) & 31].fetch_add(1, std::memory_order_relaxed);
  }
  void Export(google::protobuf::Map<std::string, int64_t>* out) const;

 private:
  std::array<std::atomic<int64_t>, 32> counts_{};
};

// The counters of one job, updated as shards arrive, rounds close and
// updates finish. Not thread-safe: the job guards it with its lock.
struct JobStatistics {
  int64_t shards_received = 0;
  int64_t shard_bytes_received = 0;
  struct Received {
    int64_t shards = 0;
    int64_t bytes = 0;
  };
  Received received[2];  // by Wire
  HistogramCounts update_seconds{RoundSecondsBuckets()};
  HistogramCounts accumulate_seconds{RoundSecondsBuckets()};
  int64_t rounds_skipped = 0;
  int32_t last_round_steps = 0;  // of the last fully closed round
  // The last measured round's update divergence (docs/design.md rule 14).
  std::optional<float> last_update_divergence;
  // Of those, rounds whose accepted shards summed to a non-finite gradient.
  int64_t rounds_overflowed = 0;
  // Rounds updated in two passes, the norm first (RoundUpdateResult::two_pass).
  int64_t rounds_norm_first = 0;
  int64_t delta_messages_sent = 0;
  int64_t delta_bytes_sent = 0;
  double update_seconds_total = 0;
  double last_update_seconds = 0;
  // Messages a rank sent again after a restart that the job already had.
  int64_t replays_dropped = 0;

  // A shard of `bytes` bytes arrived over `wire`.
  void CountShard(Wire wire, int64_t bytes) {
    ++shards_received;
    shard_bytes_received += bytes;
    ++received[static_cast<int>(wire)].shards;
    received[static_cast<int>(wire)].bytes += bytes;
  }

  // Fills the job-wide counters and histograms of `out` (the per-transport
  // figures are the job's to fill: they include its ranks' outboxes).
  void Export(v1::JobStats* out) const;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_JOB_STATS_H_
