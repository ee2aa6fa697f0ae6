// zenflowd's checkpoints (docs/checkpoints.md): each job's state written to
// --state_dir/<job id>/ckpt-<round>.zfck through server/checkpoint_file (io_uring,
// checksummed sections, atomic rename), on request, every N rounds in the
// background, and at shutdown; and every job found there restored at start.
//
//   Checkpointer cp(&registry, {.state_dir = "/var/lib/zenflowd", .keep = 2, .every_rounds = 100});
//   ZF_RETURN_IF_ERROR(cp.RestoreAll());          // before serving
//   cp.Request("job", [](absl::StatusOr<v1::CheckpointResponse> r) {...});
#ifndef ZENFLOW_SERVER_CHECKPOINTER_H_
#define ZENFLOW_SERVER_CHECKPOINTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "server/job.h"
#include "server/registry.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

struct CheckpointOptions {
  std::string state_dir;  // must exist
  int keep = 2;           // newest checkpoints kept per job (>= 1)
  int every_rounds = 0;   // a background checkpoint every N rounds; 0: none
};

// Thread-safe. Writes run on one thread of its own, so rounds never wait
// for the disk: a job pauses only for its snapshot's copy.
class Checkpointer {
 public:
  Checkpointer(JobRegistry* registry, CheckpointOptions options);
  ~Checkpointer();  // finishes the writes queued so far

  // Restores every job under state_dir from its newest checkpoint that
  // reads back whole; a corrupt, truncated or mismatched file is refused
  // with a log line naming it and why, and the previous one is tried.
  // Returns how many jobs came back.
  absl::StatusOr<int> RestoreAll();

  using Done = std::function<void(absl::StatusOr<v1::CheckpointResponse>)>;
  // Checkpoints `job_id` (every job when empty) on the writer thread, then
  // calls `done` there.
  void Request(const std::string& job_id, Done done);
  // Checkpoints every job now, on the calling thread (shutdown).
  absl::StatusOr<v1::CheckpointResponse> CheckpointAllNow();
  // A job finished the update of round `rounds_updated - 1`: every
  // every_rounds rounds it is checkpointed in the background.
  void RoundUpdated(const std::string& job_id, int64_t rounds_updated);
  // A deleted job's checkpoints go with it.
  void JobDeleted(const std::string& job_id);

  int64_t checkpoints_written() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Work {
    std::string job_id;  // empty: every job
    Done done;           // null: a background checkpoint
  };
  void Loop();
  absl::StatusOr<v1::CheckpointInfo> CheckpointJob(const std::shared_ptr<Job>& job);
  absl::StatusOr<v1::CheckpointResponse> Run(const std::string& job_id);
  std::string JobDir(const std::string& job_id) const;

  JobRegistry* const registry_;
  const CheckpointOptions options_;
  // One job's checkpoint at a time (the writer thread, shutdown, deletes).
  Mutex write_mu_;
  Mutex mu_;
  std::deque<Work> queue_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> queued_background_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_CHECKPOINTER_H_
