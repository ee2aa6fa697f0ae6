// A worker's per-step figures (v1.StepReport) summed into its totals
// (v1.WorkerStats): the daemon's per-rank sums and the worker's own agree
// because both add them here, in the same order.
#ifndef ZENFLOW_COMMON_WORKER_STATS_H_
#define ZENFLOW_COMMON_WORKER_STATS_H_

#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Adds one step to `w` (not its stall histogram, which its owner keeps).
inline void AddStep(const v1::StepReport& r, v1::WorkerStats* w) {
  w->set_steps(w->steps() + 1);
  w->set_step_seconds(w->step_seconds() + r.step_seconds());
  w->set_stall_seconds(w->stall_seconds() + r.stall_seconds());
  w->set_send_blocked_seconds(w->send_blocked_seconds() + r.send_blocked_seconds());
  w->set_up_bytes(w->up_bytes() + r.up_bytes());
  w->set_down_bytes(w->down_bytes() + r.down_bytes());
}

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_WORKER_STATS_H_
