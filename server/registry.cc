// The daemon's jobs; see registry.h.
#include "server/registry.h"

#include <utility>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "server/version.h"

namespace zenflow {

namespace {

std::string Bytes(int64_t b) {
  return absl::StrFormat("%d bytes (%.2f GiB)", b, static_cast<double>(b) / (1 << 30));
}

}  // namespace

int64_t DefaultMemoryBudget() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  int64_t limit = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{1} << 32;
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  std::string v;
  if (cg >> v && v != "max") {
    int64_t c = 0;
    if (absl::SimpleAtoi(v, &c) && c > 0) limit = std::min(limit, c);
  }
  return limit / 4 * 3;
}

namespace {

// `options` with update_nice left as it is if a new thread may add it to
// its nice value (tried on a thread of its own, which then ends), else 0
// with a line on stderr saying why.
RegistryOptions WithUpdateNiceAllowed(RegistryOptions options) {
  if (options.update_nice == 0) return options;
  absl::Status s;
  std::thread probe([&] { s = AdjustThreadNice(options.update_nice); });
  probe.join();
  if (s.ok()) return options;
  std::fprintf(stderr,
               "zenflowd: the update threads keep the daemon's priority (--update_nice=%d: %s; "
               "a negative value needs CAP_SYS_NICE)\n",
               options.update_nice, std::string(s.message()).c_str());
  options.update_nice = 0;
  return options;
}

}  // namespace

JobRegistry::JobRegistry(const RegistryOptions& options)
    : options_(WithUpdateNiceAllowed(options)),
      pool_(std::max(1, options.update_threads), kUpdateThreadName, options_.update_nice),
      scheduler_(options.update_drivers, options_.update_nice),
      budget_(options.memory_budget_bytes > 0 ? options.memory_budget_bytes
                                              : DefaultMemoryBudget()) {
  ctx_.pool = &pool_;
  ctx_.scheduler = &scheduler_;
  ctx_.simd = options_.simd.value_or(BestSimdLevel());
  ctx_.adam8_draw_seed = options_.adam8_draw_seed;
  ctx_.outbox_limit_bytes = options.max_outbox_bytes;
  ctx_.round_updated = options.round_updated;
  ctx_.emulate_round_seconds = options.emulate_round_seconds;
  ctx_.nothing_survives_restart = options.nothing_survives_restart;
}

JobRegistry::~JobRegistry() {
  MutexLock lock(&mu_);
  for (auto& [id, job] : jobs_) job->Shutdown();
  jobs_.clear();
}

absl::StatusOr<v1::JobSpec> JobRegistry::CreateJob(v1::JobSpec spec,
                                                   const std::string& credential) {
  // Checked before the spec's sizes are used for anything.
  if (spec.world_size() > options_.max_world_size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "world_size ", spec.world_size(), " is over this daemon's limit of ",
        options_.max_world_size, " ranks per job (--max_world_size)"));
  }
  ZF_RETURN_IF_ERROR(NormalizeJobSpec(&spec, options_.max_message_bytes));
  ZF_ASSIGN_OR_RETURN(const JobFootprint f, ComputeJobFootprint(spec));
  const int64_t bytes = f.total();
  {
    MutexLock lock(&mu_);
    if (jobs_.count(spec.job_id()) > 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "job '", spec.job_id(), "' already exists (DeleteJob it first or pick another id)"));
    }
    if (static_cast<int64_t>(jobs_.size()) >= options_.max_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon holds ", jobs_.size(), " jobs, its limit (--max_jobs ", options_.max_jobs,
          "): delete a job or use another daemon"));
    }
    if (!credential.empty()) {
      int jobs = 0;
      int64_t params = 0;
      for (const auto& [id, c] : credential_of_) {
        if (c.credential != credential) continue;
        ++jobs;
        params += c.params;
      }
      if (jobs >= options_.max_jobs_per_credential) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "this token already holds ", jobs, " jobs, its limit (--max_jobs_per_credential ",
            options_.max_jobs_per_credential, "): delete one of them first"));
      }
      if (f.params > options_.max_params_per_credential - params) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "job '", spec.job_id(), "' has ", f.params, " parameters; this token's jobs hold ",
            params, " of at most ", options_.max_params_per_credential,
            " (--max_params_per_credential)"));
      }
    }
    // Compared without adding, so that nothing can overflow.
    if (f.params > options_.max_params - params_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job '", spec.job_id(), "' has ", f.params, " parameters; the daemon holds ", params_,
          " of at most ", options_.max_params, " (--max_params)"));
    }
    if (bytes > budget_ - bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job '", spec.job_id(), "' needs ", Bytes(bytes), " (", f.params,
          " parameters: state ", f.state_bytes, ", per-column and per-rank bookkeeping ",
          f.bookkeeping_bytes, ", deltas ", f.delta_bytes, "); the daemon's jobs hold ",
          Bytes(bytes_), " of its memory budget of ", Bytes(budget_),
          " (--memory_budget_bytes): shrink the job, delete others or use another daemon"));
    }
    // Reserve the id and the bytes; allocate outside the lock.
    params_ += f.params;
    bytes_ += bytes;
    jobs_[spec.job_id()] = nullptr;
    credential_of_[spec.job_id()] = {credential, f.params};
  }
  absl::StatusOr<std::shared_ptr<Job>> job = Job::Create(spec, ctx_);
  if (job.ok()) (*job)->set_credential(credential);
  MutexLock lock(&mu_);
  if (!job.ok()) {
    // Nothing stays reserved.
    jobs_.erase(spec.job_id());
    credential_of_.erase(spec.job_id());
    params_ -= f.params;
    bytes_ -= bytes;
    return job.status();
  }
  jobs_[spec.job_id()] = *std::move(job);
  return spec;
}

std::vector<std::shared_ptr<Job>> JobRegistry::Jobs() {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Job>> out;
  for (const auto& [id, job] : jobs_) {
    if (job != nullptr) out.push_back(job);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Find(const std::string& job_id) {
  ZF_RETURN_IF_ERROR(CheckJobId(job_id));
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "' (create it with CreateJob)"));
  }
  return it->second;
}

absl::Status JobRegistry::DeleteJob(const std::string& job_id) {
  ZF_RETURN_IF_ERROR(CheckJobId(job_id));
  std::shared_ptr<Job> job;
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end() || it->second == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    }
    job = std::move(it->second);
    jobs_.erase(it);
    credential_of_.erase(job_id);
    params_ -= job->params();
    bytes_ -= job->footprint().total();
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
  if (!job_id.empty()) ZF_RETURN_IF_ERROR(CheckJobId(job_id));
  {
    MutexLock lock(&mu_);
    resp.set_memory_budget_bytes(budget_);
    resp.set_memory_reserved_bytes(bytes_);
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
  {
    MutexLock lock(&counts_mu_);
    for (const auto& [key, n] : rejections_) {
      v1::RejectionCount* r = resp.add_rejections();
      r->set_code(absl::StatusCodeToString(key.first));
      r->set_reason(key.second);
      r->set_count(n);
    }
    for (const auto& [key, n] : calls_) {
      v1::CallCount* c = resp.add_calls();
      c->set_method(key.first);
      c->set_code(absl::StatusCodeToString(key.second));
      c->set_count(n);
    }
  }
  resp.set_version(kZenflowVersion);
  resp.set_commit(ZenflowCommit());
  resp.set_max_jobs(options_.max_jobs);
  const ProcessUsage usage = ReadProcessUsage();
  resp.set_resident_bytes(usage.resident_bytes);
  resp.set_cpu_seconds(usage.cpu_seconds);
  resp.set_simd(SimdLevelName(ctx_.simd));
  resp.set_update_threads(pool_.num_threads());
  resp.set_max_outbox_bytes(options_.max_outbox_bytes);
  return resp;
}

v1::GetStatsResponse JobRegistry::StatsOf(const std::string& credential,
                                          const std::string& job_id) {
  v1::GetStatsResponse resp;
  std::vector<std::shared_ptr<Job>> jobs;
  {
    MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) {
      if (job != nullptr && !credential.empty() && job->credential() == credential &&
          (job_id.empty() || id == job_id)) {
        jobs.push_back(job);
      }
    }
  }
  for (auto& job : jobs) job->Stats(resp.add_jobs());
  resp.set_daemon_wide_withheld(true);
  resp.set_version(kZenflowVersion);
  resp.set_commit(ZenflowCommit());
  resp.set_simd(SimdLevelName(ctx_.simd));
  resp.set_update_threads(pool_.num_threads());
  resp.set_max_outbox_bytes(options_.max_outbox_bytes);
  return resp;
}

void JobRegistry::CountRejection(absl::StatusCode code, const char* reason) {
  rejected_.Add(code);
  MutexLock lock(&counts_mu_);
  ++rejections_[{code, reason}];
}

void JobRegistry::CountCall(const std::string& method, absl::StatusCode code) {
  MutexLock lock(&counts_mu_);
  ++calls_[{method, code}];
}

ProcessUsage ReadProcessUsage() {
  ProcessUsage u;
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    u.cpu_seconds = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                    static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  }
  // /proc/self/statm: sizes in pages; the second is the resident set.
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (statm >> size >> resident) u.resident_bytes = resident * sysconf(_SC_PAGESIZE);
  return u;
}

absl::Status JobRegistry::ReserveBytes(int64_t bytes, const std::string& job_id) {
  MutexLock lock(&mu_);
  if (bytes > budget_ - bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a checkpoint of job '", job_id, "' copies ", Bytes(bytes), " of its state; the daemon's ",
        "jobs hold ", Bytes(bytes_), " of its memory budget of ", Bytes(budget_),
        " (--memory_budget_bytes): raise the budget, or checkpoint while fewer jobs are held"));
  }
  bytes_ += bytes;
  return absl::OkStatus();
}

void JobRegistry::ReleaseBytes(int64_t bytes) {
  MutexLock lock(&mu_);
  bytes_ -= bytes;
}

}  // namespace zenflow
