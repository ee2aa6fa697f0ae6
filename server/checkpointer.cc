// zenflowd's checkpoints; see checkpointer.h.
#include "server/checkpointer.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/checkpoint_file.h"

namespace zenflow {
namespace {

constexpr char kPrefix[] = "ckpt-";

// The job ids with a folder under `dir` (names that are valid job ids).
std::vector<std::string> JobDirs(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (stat(absl::StrCat(dir, "/", name).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (CheckJobId(name).ok()) out.push_back(name);
  }
  closedir(d);
  return out;
}

}  // namespace

Checkpointer::Checkpointer(JobRegistry* registry, CheckpointOptions options)
    : registry_(registry), options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

Checkpointer::~Checkpointer() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

std::string Checkpointer::JobDir(const std::string& job_id) const {
  return absl::StrCat(options_.state_dir, "/", job_id);
}

absl::StatusOr<int> Checkpointer::RestoreAll() {
  int restored = 0;
  for (const std::string& id : JobDirs(options_.state_dir)) {
    const std::string dir = JobDir(id);
    bool done = false;
    for (const std::string& path : ListCheckpoints(dir, kPrefix)) {
      absl::Status s = [&]() -> absl::Status {
        ZF_ASSIGN_OR_RETURN(std::vector<CheckpointSection> sections, ReadCheckpoint(path));
        std::map<std::string, const std::string*> by_name;
        for (const CheckpointSection& sec : sections) by_name[sec.name] = &sec.data;
        v1::JobSpec spec;
        if (by_name.count("spec") == 0 || !spec.ParseFromString(*by_name["spec"])) {
          return absl::DataLossError("no readable spec section");
        }
        if (spec.job_id() != id) {
          return absl::DataLossError(absl::StrCat("it holds job '", spec.job_id(), "'"));
        }
        // The job's credential (its token's digest); a checkpoint from
        // before credentials has none: then only the admin token reaches it.
        std::string credential;
        if (by_name.count("credential") != 0) {
          credential = *by_name["credential"];
        } else {
          std::fprintf(stderr,
                       "zenflowd: checkpoint %s holds no job credential: job '%s' is reachable "
                       "with the admin token only\n",
                       path.c_str(), id.c_str());
        }
        ZF_RETURN_IF_ERROR(registry_->CreateJob(spec, credential).status());
        ZF_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(id));
        absl::Status loaded = job->LoadSnapshot(by_name);
        if (!loaded.ok()) (void)registry_->DeleteJob(id);  // a half-loaded job goes
        return loaded;
      }();
      if (s.ok()) {
        std::fprintf(stderr, "zenflowd: restored job '%s' from %s\n", id.c_str(), path.c_str());
        ++restored;
        done = true;
        break;
      }
      std::fprintf(stderr, "zenflowd: checkpoint %s refused: %s; trying the previous one\n",
                   path.c_str(), std::string(s.message()).c_str());
    }
    if (!done) {
      std::fprintf(stderr, "zenflowd: no usable checkpoint of job '%s' in %s\n", id.c_str(),
                   dir.c_str());
    }
  }
  return restored;
}

absl::StatusOr<v1::CheckpointInfo> Checkpointer::CheckpointJob(const std::shared_ptr<Job>& job) {
  MutexLock write(&write_mu_);
  // The snapshot is a copy of the job's state and bookkeeping: it counts
  // against the memory budget while the file is written.
  const int64_t copy = job->footprint().state_bytes + job->footprint().bookkeeping_bytes;
  ZF_RETURN_IF_ERROR(registry_->ReserveBytes(copy, job->spec().job_id()));
  absl::Cleanup release = [&] { registry_->ReleaseBytes(copy); };
  ZF_ASSIGN_OR_RETURN(JobSnapshot snap, job->Snapshot());
  const std::string dir = JobDir(snap.job_id);
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", strerror(errno)));
  }
  std::vector<CheckpointSectionView> views;
  views.reserve(snap.sections.size());
  for (const auto& [name, bytes] : snap.sections) {
    views.push_back({name, bytes.data(), bytes.size()});
  }
  const std::string name = CheckpointFileName(kPrefix, static_cast<uint64_t>(snap.rounds_updated));
  ZF_ASSIGN_OR_RETURN(CheckpointWriteStats w, WriteCheckpoint(dir, name, views));
  job->SetDurableRounds(snap.rounds_updated);
  ZF_RETURN_IF_ERROR(PruneCheckpoints(dir, kPrefix, options_.keep));
  {
    MutexLock lock(&mu_);
    ++written_;
  }
  v1::CheckpointInfo info;
  info.set_job_id(snap.job_id);
  info.set_rounds_updated(snap.rounds_updated);
  info.set_path(absl::StrCat(dir, "/", name));
  info.set_bytes(w.bytes);
  info.set_snapshot_pause_seconds(snap.pause_seconds);
  info.set_write_seconds(w.seconds);
  return info;
}

absl::StatusOr<v1::CheckpointResponse> Checkpointer::Run(const std::string& job_id) {
  std::vector<std::shared_ptr<Job>> jobs;
  if (job_id.empty()) {
    jobs = registry_->Jobs();
  } else {
    ZF_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(job_id));
    jobs.push_back(std::move(job));
  }
  v1::CheckpointResponse resp;
  absl::Status first_error;
  for (const std::shared_ptr<Job>& job : jobs) {
    absl::StatusOr<v1::CheckpointInfo> info = CheckpointJob(job);
    // A job deleted meanwhile has nothing to save.
    if (!info.ok() && info.status().code() == absl::StatusCode::kNotFound && job_id.empty()) {
      continue;
    }
    if (!info.ok() && job_id.empty()) {
      // The other jobs are still saved; the call reports the first failure.
      std::fprintf(stderr, "zenflowd: checkpoint of job '%s' failed: %s\n",
                   job->spec().job_id().c_str(), info.status().ToString().c_str());
      if (first_error.ok()) first_error = info.status();
      continue;
    }
    ZF_RETURN_IF_ERROR(info.status());
    *resp.add_checkpoints() = *std::move(info);
  }
  if (!first_error.ok()) return first_error;
  return resp;
}

void Checkpointer::Request(const std::string& job_id, Done done) {
  MutexLock lock(&mu_);
  queue_.push_back({job_id, std::move(done)});
}

absl::StatusOr<v1::CheckpointResponse> Checkpointer::CheckpointAllNow() { return Run(""); }

void Checkpointer::RoundUpdated(const std::string& job_id, int64_t rounds_updated) {
  if (options_.every_rounds <= 0 || rounds_updated % options_.every_rounds != 0) return;
  MutexLock lock(&mu_);
  // At most one background checkpoint of a job waits at a time.
  if (!queued_background_.insert(job_id).second) return;
  queue_.push_back({job_id, nullptr});
}

void Checkpointer::JobDeleted(const std::string& job_id) {
  MutexLock write(&write_mu_);
  const std::string dir = JobDir(job_id);
  for (const std::string& path : ListCheckpoints(dir, kPrefix)) unlink(path.c_str());
  rmdir(dir.c_str());  // fails, harmlessly, if anything else is left
}

int64_t Checkpointer::checkpoints_written() {
  MutexLock lock(&mu_);
  return written_;
}

void Checkpointer::Loop() {
  for (;;) {
    Work w;
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;
      w = std::move(queue_.front());
      queue_.pop_front();
      if (!w.done) queued_background_.erase(w.job_id);
    }
    absl::StatusOr<v1::CheckpointResponse> r = Run(w.job_id);
    if (w.done) {
      w.done(std::move(r));
    } else if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) {
      std::fprintf(stderr, "zenflowd: background checkpoint of job '%s' failed: %s\n",
                   w.job_id.c_str(), r.status().ToString().c_str());
    }
  }
}

}  // namespace zenflow
