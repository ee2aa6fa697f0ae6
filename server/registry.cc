// The daemon's jobs; see registry.h.
#include "server/registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {

JobRegistry::JobRegistry(const RegistryOptions& options)
    : options_(options), pool_(std::max(1, options.update_threads)) {
  ctx_.pool = &pool_;
  ctx_.executor = &executor_;
  ctx_.simd = BestSimdLevel();
}

JobRegistry::~JobRegistry() {
  MutexLock lock(&mu_);
  for (auto& [id, job] : jobs_) job->Shutdown();
  jobs_.clear();
}

absl::StatusOr<v1::JobSpec> JobRegistry::CreateJob(v1::JobSpec spec) {
  ZF_RETURN_IF_ERROR(NormalizeJobSpec(&spec, options_.max_message_bytes));
  int64_t params = 0;
  for (const v1::TensorSpec& t : spec.tensors()) {
    int64_t n = 1;
    for (int64_t d : t.shape()) n *= d;
    params += n;
  }
  {
    MutexLock lock(&mu_);
    if (jobs_.count(spec.job_id()) > 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "job '", spec.job_id(), "' already exists (DeleteJob it first or pick another id)"));
    }
    if (params_ + params > options_.max_params) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job '", spec.job_id(), "' has ", params, " parameters; the daemon holds ", params_,
          " of at most ", options_.max_params, " (--max_params)"));
    }
    params_ += params;
    // Reserve the id; allocate outside the lock (20 bytes/param).
    jobs_[spec.job_id()] = nullptr;
  }
  std::shared_ptr<Job> job = Job::Create(spec, ctx_);
  MutexLock lock(&mu_);
  jobs_[spec.job_id()] = std::move(job);
  return spec;
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Find(const std::string& job_id) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "' (create it with CreateJob)"));
  }
  return it->second;
}

absl::Status JobRegistry::DeleteJob(const std::string& job_id) {
  std::shared_ptr<Job> job;
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end() || it->second == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    }
    job = std::move(it->second);
    jobs_.erase(it);
    params_ -= job->params();
  }
  job->Shutdown();
  return absl::OkStatus();
}

absl::Status JobRegistry::CheckMessageSize(size_t bytes) const {
  if (static_cast<int64_t>(bytes) <= options_.max_message_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("request of ", bytes, " bytes exceeds the daemon's limit of ",
                   options_.max_message_bytes,
                   " bytes (--max_message_bytes); split it (client max_shard_bytes)"));
}

absl::StatusOr<v1::GetStatsResponse> JobRegistry::Stats(const std::string& job_id) {
  v1::GetStatsResponse resp;
  std::vector<std::shared_ptr<Job>> jobs;
  {
    MutexLock lock(&mu_);
    if (!job_id.empty()) {
      auto it = jobs_.find(job_id);
      if (it == jobs_.end() || it->second == nullptr) {
        return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
      }
      jobs.push_back(it->second);
    } else {
      for (auto& [id, job] : jobs_) {
        if (job != nullptr) jobs.push_back(job);
      }
    }
  }
  for (auto& job : jobs) job->Stats(resp.add_jobs());
  rejected_.Export(resp.mutable_rejected());
  resp.set_simd(SimdLevelName(ctx_.simd));
  resp.set_update_threads(pool_.num_threads());
  return resp;
}

}  // namespace zenflow
