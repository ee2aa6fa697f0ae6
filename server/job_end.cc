// When a job ends; see job_end.h.
#include "server/job_end.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/auth.h"
#include "server/checkpointer.h"
#include "server/quote.h"

namespace zenflow {

std::string TakenIdMessage(Job& job, absl::Time now) {
  const Job::Presence p = job.GetPresence();
  const std::string& id = job.spec().job_id();
  // Whole seconds ("2h3m4s"; "0s" for a job made this second).
  const int64_t seconds = std::max<int64_t>(0, absl::ToInt64Seconds(now - p.held_since));
  const std::string age = seconds == 0 ? "0s" : absl::FormatDuration(absl::Seconds(seconds));
  std::string what;
  if (p.attached > 0) {
    what = "its ranks are still training";
  } else if (p.finished > 0) {
    what = "no rank is attached: its run ended (kept with keep_job / --keep_job, or some ranks "
           "never finished)";
  } else {
    what = "no rank is attached: its run ended without finishing (it crashed or was killed), "
           "or it was restored from a checkpoint";
  }
  return absl::StrCat(
      "job ", Quote(id), " already exists on this daemon: held since ",
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", p.held_since, absl::UTCTimeZone()), " (", age,
      " ago), ", p.attached, " of ", job.spec().world_size(),
      " ranks attached, ", p.finished, " finished, ", p.rounds_updated, " rounds updated; ", what,
      ". Delete it with `zfctl delete ", id, "` (from the source tree: `./zf ctl delete ", id,
      "`, with this token) and run again, or pick another job name (a run ends its job when "
      "its last rank finishes, unless keep_job=True / --keep_job)");
}

std::string TakenByAnotherMessage(const std::string& job_id) {
  return absl::StrCat(
      "job id ", Quote(job_id), " is taken on this daemon, by a job this call's token does not "
      "reach: pick another job name, or, if the job is yours, use the token it was created with "
      "(the same token_file / ZENFLOW_TOKEN on every run) to delete it (`zfctl delete ", job_id,
      "`). A job made without a token is reachable only with the admin token; it ends when its "
      "last rank finishes, or after zenflowd --job_idle_ttl_s with no rank attached");
}

IdleJobReaper::IdleJobReaper(JobRegistry* registry, Checkpointer* checkpointer, AuditLog* audit,
                             absl::Duration ttl)
    : registry_(registry), checkpointer_(checkpointer), audit_(audit), ttl_(ttl) {
  const absl::Duration tick =
      std::max(absl::Milliseconds(10), std::min(absl::Seconds(1), ttl_ / 4));
  thread_ = std::thread([this, tick] {
    for (;;) {
      {
        MutexLock lock(&mu_);
        mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; }, tick);
        if (stopping_) return;
      }
      Sweep();
    }
  });
}

IdleJobReaper::~IdleJobReaper() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int IdleJobReaper::Sweep() {
  int deleted = 0;
  for (const std::shared_ptr<Job>& job : registry_->Jobs()) {
    const absl::Duration idle = job->IdleFor();
    if (idle < ttl_) continue;
    Expire(job, idle);
    ++deleted;
  }
  return deleted;
}

void IdleJobReaper::Expire(const std::shared_ptr<Job>& job, absl::Duration idle) {
  const std::string id = job->spec().job_id();
  std::string detail = absl::StrCat("no rank attached for ", absl::ToInt64Seconds(idle),
                                    " s (--job_idle_ttl_s ", absl::FormatDuration(ttl_), ")");
  if (checkpointer_ != nullptr) {
    // Waited for here: the thread does nothing else, and a job is deleted
    // only once its state is on disk (or the write failed, said below).
    // The project's Mutex (not absl::Notification): ThreadSanitizer sees it.
    struct Written {
      Mutex mu;
      bool done ABSL_GUARDED_BY(mu) = false;
      absl::Status status ABSL_GUARDED_BY(mu);
    } w;
    checkpointer_->Request(id, [&w](absl::StatusOr<v1::CheckpointResponse> r) {
      MutexLock lock(&w.mu);
      w.status = r.status();
      w.done = true;
    });
    absl::Status cs;
    {
      MutexLock lock(&w.mu);
      w.mu.Await([&w]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return w.done; });
      cs = w.status;
    }
    if (cs.ok()) {
      absl::StrAppend(&detail, "; checkpointed: it comes back at the daemon's next start");
    } else {
      absl::StrAppend(&detail, "; its checkpoint failed: ", cs.message());
    }
  } else {
    absl::StrAppend(&detail, "; no --state_dir: not checkpointed");
  }
  // A rank that attached meanwhile keeps the job.
  if (job->IdleFor() < ttl_) return;
  absl::Status s = registry_->DeleteJob(id);
  if (s.code() == absl::StatusCode::kNotFound) return;  // deleted by a call meanwhile
  std::fprintf(stderr, "zenflowd: job '%s' deleted: %s\n", id.c_str(), detail.c_str());
  audit_->Record("expire", "", id, "zenflowd", "", Caller{}, s, detail);
}

}  // namespace zenflow
