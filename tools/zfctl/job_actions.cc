// zfctl delete JOB (DeleteJob) and zfctl checkpoint JOB (the Checkpoint
// RPC: the job's state to the daemon's --state_dir now).
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "tools/zfctl/commands.h"
#include "tools/zfctl/daemon.h"
#include "tools/zfctl/stats_text.h"

namespace zenflow::ctl {

int RunDelete(const Args& args) {
  const std::string job = OneJob("delete", args);
  if (job.empty()) return 2;
  absl::StatusOr<Endpoint> e = ChooseEndpoint();
  if (!e.ok()) return FailEarly("delete", e.status());
  absl::StatusOr<Daemon> d = Daemon::Open(*e);
  if (!d.ok()) return FailEarly("delete", d.status());
  if (absl::Status s = d->DeleteJob(job); !s.ok()) return d->Fail("delete", s);
  std::printf("deleted job %s on %s (its memory is free; its checkpoints will not be restored)\n",
              job.c_str(), d->name().c_str());
  return 0;
}

int RunCheckpoint(const Args& args) {
  const std::string job = OneJob("checkpoint", args);
  if (job.empty()) return 2;
  absl::StatusOr<Endpoint> e = ChooseEndpoint();
  if (!e.ok()) return FailEarly("checkpoint", e.status());
  absl::StatusOr<Daemon> d = Daemon::Open(*e);
  if (!d.ok()) return FailEarly("checkpoint", d.status());
  absl::StatusOr<v1::CheckpointResponse> r = d->Checkpoint(job);
  if (!r.ok()) return d->Fail("checkpoint", r.status());
  for (const v1::CheckpointInfo& c : r->checkpoints()) {
    std::printf(
        "checkpointed job %s at round %lld: %s (%s; paused the job %.3f s, wrote in %.3f s)\n",
                c.job_id().c_str(), static_cast<long long>(c.rounds_updated()), c.path().c_str(),
                Bytes(c.bytes()).c_str(), c.snapshot_pause_seconds(), c.write_seconds());
  }
  return 0;
}

}  // namespace zenflow::ctl
