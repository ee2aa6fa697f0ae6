// The client's one retry loop: attempts with a doubling pause between them,
// within a deadline. (Reconnecting the channel is gRPC's own backoff; this
// is for conditions only the daemon can change: a job another rank has not
// uploaded yet, a stream the daemon has not let go of yet.)
//
//   bool ok = RetryWithBackoff(absl::Seconds(10), absl::Milliseconds(10),
//                              absl::Milliseconds(200), [&] { return TryIt(); });
#ifndef ZENFLOW_CLIENT_BACKOFF_H_
#define ZENFLOW_CLIENT_BACKOFF_H_

#include <algorithm>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zenflow {

// Calls `attempt` until it returns true; between calls sleeps `first`,
// doubling up to `max`. Gives up (false) when the next pause would end past
// `timeout` from now. `attempt` runs at least once.
template <typename Attempt>
bool RetryWithBackoff(absl::Duration timeout, absl::Duration first, absl::Duration max,
                      Attempt attempt) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = first;
  for (;;) {
    if (attempt()) return true;
    if (absl::Now() + pause > deadline) return false;
    absl::SleepFor(pause);
    pause = std::min(pause * 2, max);
  }
}

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_BACKOFF_H_
