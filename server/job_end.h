// When a job ends (docs/protocol.md, "When a job ends"): the messages a second
// run gets for a job id that is still held, and the reaper that deletes jobs
// no rank has been attached to for zenflowd --job_idle_ttl_s.
//
//   IdleJobReaper reaper(&registry, checkpointer, &audit, absl::Hours(1));
//   // ... a job with no data stream for an hour is checkpointed and deleted.
#ifndef ZENFLOW_SERVER_JOB_END_H_
#define ZENFLOW_SERVER_JOB_END_H_

#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "server/audit.h"
#include "server/job.h"
#include "server/registry.h"

namespace zenflow {

class Checkpointer;

// For the job's own token (or the admin's): the id is held by `job`, since
// when, with how many ranks attached, and what to do about it.
std::string TakenIdMessage(Job& job, absl::Time now);
// For any other caller: only that the id is taken (the one thing job names
// being one namespace tells; docs/security.md), and what to do.
std::string TakenByAnotherMessage(const std::string& job_id);

// Deletes every job that has had no rank attached (Job::IdleFor) for `ttl`,
// checkpointing it first when `checkpointer` is not null (its files stay,
// so the job comes back at the daemon's next start), with an audit line
// (event=expire). Looks every min(1 s, ttl / 4) on a thread of its own.
// Thread-safe; the registry, checkpointer and audit log outlive it.
class IdleJobReaper {
 public:
  IdleJobReaper(JobRegistry* registry, Checkpointer* checkpointer, AuditLog* audit,
                absl::Duration ttl);
  ~IdleJobReaper();  // stops the thread (a deletion under way finishes first)
  IdleJobReaper(const IdleJobReaper&) = delete;
  IdleJobReaper& operator=(const IdleJobReaper&) = delete;

  // One pass over the jobs (what the thread does each tick); returns how
  // many it deleted.
  int Sweep();

 private:
  void Expire(const std::shared_ptr<Job>& job, absl::Duration idle);

  JobRegistry* const registry_;
  Checkpointer* const checkpointer_;
  AuditLog* const audit_;
  const absl::Duration ttl_;
  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_JOB_END_H_
