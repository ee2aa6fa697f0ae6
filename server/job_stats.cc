// A job's statistics; see job_stats.h.
#include "server/job_stats.h"

namespace zenflow {

void RejectionCounter::Export(google::protobuf::Map<std::string, int64_t>* out) const {
  for (int i = 0; i < 32; ++i) {
    const int64_t n = counts_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(i));
    (*out)[name] += n;
  }
}

void JobStatistics::Export(v1::JobStats* out) const {
  out->set_shards_received(shards_received);
  out->set_shard_bytes_received(shard_bytes_received);
  out->set_rounds_skipped_nonfinite(rounds_skipped);
  out->set_delta_messages_sent(delta_messages_sent);
  out->set_delta_bytes_sent(delta_bytes_sent);
  out->set_update_seconds_total(update_seconds_total);
  out->set_last_update_seconds(last_update_seconds);
  out->set_replays_dropped(replays_dropped);
  out->set_last_round_steps(last_round_steps);
  if (last_update_divergence) out->set_update_divergence(*last_update_divergence);
  out->set_rounds_overflowed(rounds_overflowed);
  out->set_rounds_norm_first(rounds_norm_first);
  update_seconds.Export(out->mutable_round_update_seconds());
  accumulate_seconds.Export(out->mutable_round_accumulate_seconds());
}

}  // namespace zenflow
