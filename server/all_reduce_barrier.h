// The all-reduce rendezvous of one job: every rank's named fp32 vectors for
// one step, the calls waiting for the mean, and the payload they hold. The
// mean is summed in rank order, so every rank gets bit-identical results
// whatever order the calls arrived in. A rank waits on one all-reduce at a
// time (that bounds what pending calls hold to one request per rank); a
// retry for the same step replaces its earlier call, and a withdrawn
// (cancelled) call leaves nothing behind. A replayed part (a rank that
// reconnected after a daemon restart resends its last all-reduce, for ranks
// that lost the answer) is kept without a waiter, one per rank, until its
// step completes or a later step does.
//
//   AllReduceBarrier b(/*world=*/2);
//   ZF_RETURN_IF_ERROR(b.Submit(req, call_id, done));   // done(mean) once all ranks are in
//
// Thread-safe; callbacks run without the lock held, on the calling thread.
#ifndef ZENFLOW_SERVER_ALL_REDUCE_BARRIER_H_
#define ZENFLOW_SERVER_ALL_REDUCE_BARRIER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

class AllReduceBarrier {
 public:
  using Done = std::function<void(absl::StatusOr<v1::AllReduceResponse>)>;

  explicit AllReduceBarrier(int world) : world_(world), replay_step_(world, -1) {}

  // Records the call of rank req.rank() (in [0, world), checked by the
  // caller). A rejection (INVALID_ARGUMENT: negative step, a part that is
  // not finite fp32, parts that differ in names or sizes from another
  // rank's; FAILED_PRECONDITION: the rank waits on another step) records
  // nothing and does not call `done`. Once every rank is in, every waiter
  // gets the mean before this returns; a replaced call gets ABORTED.
  absl::Status Submit(const v1::AllReduceRequest& req, uint64_t call, Done done);
  // Drops `rank`'s call `call` (a no-op if it was replaced or completed).
  void Withdraw(int32_t rank, uint64_t call);
  // Fails every waiting call and every later Submit with `why`.
  void Shutdown(absl::Status why);
  // Fails every waiting call with `why` and drops every part held; later
  // calls start afresh.
  void FailWaiters(absl::Status why);
  // Payload bytes held by waiting calls.
  int64_t bytes();

 private:
  struct Pending {
    std::vector<bool> submitted;
    int32_t count = 0;
    std::vector<v1::AllReduceRequest> parts;  // by rank
    std::vector<Done> waiters;
    std::vector<uint64_t> calls;
  };

  // A call: records it (a retry replaces the rank's earlier call of the
  // step) and completes the step if it was the last.
  absl::Status SubmitCallLocked(const v1::AllReduceRequest& req, uint64_t call, Done done,
                                Done* replaced, std::vector<Done>* waiters,
                                v1::AllReduceResponse* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A replay: keeps the part (replacing the rank's older replayed part);
  // completes the step if it was the last. Fills what to call after.
  absl::Status SubmitReplayLocked(const v1::AllReduceRequest& req, std::vector<Done>* waiters,
                                  v1::AllReduceResponse* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The step's rendezvous, made empty for every rank if new.
  Pending& PendingLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step `step` has every part: the mean into `result`, the waiters to
  // answer; drops the step and replayed parts of earlier ones.
  std::vector<Done> CompleteLocked(int64_t step, v1::AllReduceResponse* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int world_;
  Mutex mu_;
  absl::Status shut_down_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);  // by step
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> replay_step_ ABSL_GUARDED_BY(mu_);  // by rank; -1: none
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_ALL_REDUCE_BARRIER_H_
