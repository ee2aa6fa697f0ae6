// The daemon's jobs and the resources they share (update threads, executor).
// The gRPC service is a thin adapter over this class.
//
//   JobRegistry registry({.update_threads = 2});
//   ZF_ASSIGN_OR_RETURN(v1::JobSpec spec, registry.CreateJob(request_spec));
//   ZF_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry.Find(spec.job_id()));
#ifndef ZENFLOW_SERVER_REGISTRY_H_
#define ZENFLOW_SERVER_REGISTRY_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/adamw.h"
#include "common/mutex.h"
#include "common/thread_pool.h"
#include "server/job.h"
#include "server/update_scheduler.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

struct RegistryOptions {
  int update_threads = 2;                  // AdamW participants
  int update_drivers = 2;                  // jobs whose updates run at once
  // Added to the nice value of the update threads (the pool's and the
  // drivers'): negative puts a round's update ahead of the daemon's other
  // threads (ingest, gRPC) and of other processes when the cores are
  // short. Needs CAP_SYS_NICE; without it the threads keep the daemon's
  // priority (a line on stderr says so).
  int update_nice = 0;
  // The kernels' vector level for round updates (AdamW, 8-bit AdamW, the
  // fold and norm): a supported level, or unset for the host's best. A
  // level's results differ from another's in the last bits (fused
  // multiply-adds), so daemons that must give the same bits (a job moved
  // between hosts of different CPUs) pin one.
  std::optional<SimdLevel> simd;
  // JobContext::adam8_draw_seed (zenflowd --adam8_draw_seed).
  uint32_t adam8_draw_seed = 0;
  int64_t max_message_bytes = int64_t{512} << 20;  // the service's limit
  int64_t max_params = int64_t{1} << 34;   // all jobs together
  // Bytes all jobs together may hold (their JobFootprint). 0: DefaultMemoryBudget().
  int64_t memory_budget_bytes = 0;
  // Per rank: outbox bytes above which its stream stops reading.
  int64_t max_outbox_bytes = int64_t{256} << 20;
  // Jobs held at once: bounds the daemon's per-job bookkeeping and the
  // label cardinality of its metrics.
  int max_jobs = 64;
  // Per credential (one job token, shared by the jobs created with it):
  // jobs and parameters held. Per job: ranks (world_size).
  int max_jobs_per_credential = 16;
  int64_t max_params_per_credential = int64_t{1} << 34;
  int max_world_size = 4096;
  // See JobContext::emulate_round_seconds (zenflowd --emulate_round_ms).
  double emulate_round_seconds = 0;
  // See JobContext::nothing_survives_restart (no --state_dir).
  bool nothing_survives_restart = false;
  // See JobContext::round_updated.
  std::function<void(const std::string& job_id, int64_t rounds_updated)> round_updated;
};

// This process's resident memory and CPU time (user + system).
struct ProcessUsage {
  int64_t resident_bytes = 0;
  double cpu_seconds = 0;
};
ProcessUsage ReadProcessUsage();

// 3/4 of the memory this process may use: physical memory, or the cgroup's
// memory.max when that is lower.
int64_t DefaultMemoryBudget();

// Thread-safe.
class JobRegistry {
 public:
  explicit JobRegistry(const RegistryOptions& options);
  ~JobRegistry();
  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  // Validates and normalizes the spec; returns it with defaults filled in.
  // The job belongs to `credential` (a token's digest, server/auth.h;
  // empty: to the admin only), whose limits it counts against.
  absl::StatusOr<v1::JobSpec> CreateJob(v1::JobSpec spec, const std::string& credential = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::shared_ptr<Job>> Find(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DeleteJob(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::GetStatsResponse> Stats(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Stats of the jobs of one credential only (of `job_id` alone when it is
  // not empty), and no daemon-wide counts (what other jobs did is not this
  // caller's to see).
  v1::GetStatsResponse StatsOf(const std::string& credential, const std::string& job_id = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every open job.
  std::vector<std::shared_ptr<Job>> Jobs() ABSL_LOCKS_EXCLUDED(mu_);

  // Charges `bytes` of passing use (a checkpoint's snapshot of job
  // `job_id`) against the memory budget; RESOURCE_EXHAUSTED, saying so,
  // when they do not fit. Give them back with ReleaseBytes.
  absl::Status ReserveBytes(int64_t bytes, const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseBytes(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Counts a rejected request or stream message (daemon-wide; jobs count
  // their own too) by code and where (`reason`: the RPC in snake_case, or
  // "stream").
  void CountRejection(absl::StatusCode code, const char* reason) ABSL_LOCKS_EXCLUDED(counts_mu_);
  // Counts a finished gRPC call by method and code.
  void CountCall(const std::string& method, absl::StatusCode code) ABSL_LOCKS_EXCLUDED(counts_mu_);

  SimdLevel simd() const { return ctx_.simd; }
  int64_t max_message_bytes() const { return options_.max_message_bytes; }
  // RESOURCE_EXHAUSTED, saying what to do, for a request over that limit.
  absl::Status CheckMessageSize(size_t bytes) const;
  int update_threads() const { return pool_.num_threads(); }
  UpdateScheduler* scheduler() { return &scheduler_; }
  int64_t memory_budget_bytes() const { return budget_; }

 private:
  const RegistryOptions options_;  // update_nice: 0 where threads may not take it
  ThreadPool pool_;
  UpdateScheduler scheduler_;
  JobContext ctx_;
  Mutex mu_;
  const int64_t budget_;
  // A null job is a reservation: CreateJob is allocating it.
  std::map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // Each job's (or reservation's) credential and parameters, for the
  // per-credential limits.
  struct Owner {
    std::string credential;
    int64_t params = 0;
  };
  std::map<std::string, Owner> credential_of_ ABSL_GUARDED_BY(mu_);
  int64_t params_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;  // footprints of jobs and reservations
  RejectionCounter rejected_;
  Mutex counts_mu_;
  std::map<std::pair<absl::StatusCode, std::string>, int64_t> rejections_
      ABSL_GUARDED_BY(counts_mu_);
  std::map<std::pair<std::string, absl::StatusCode>, int64_t> calls_ ABSL_GUARDED_BY(counts_mu_);
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_REGISTRY_H_
