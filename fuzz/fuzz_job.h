// The fuzz targets' one door into the daemon's job API (server/registry.h,
// server/ingest.h, server/checkpointer.h): a process-wide JobRegistry with a
// small memory budget, jobs made and fed the way the service makes and
// feeds them, and a job's whole state for before/after comparisons. When
// those APIs change, this file is what changes.
//
//   ZF_ASSIGN_OR_RETURN(FuzzJob job, CreateFuzzJob(spec));
//   ZF_RETURN_IF_ERROR(UploadAndJoin(job));
//   absl::Status s = Ingest(job, /*rank=*/0, Wire::kGrpc, absl::OkStatus(), up);
//   DeleteAllJobs();   // at the end of every input
//
// Thread-safe as JobRegistry is; a target runs one input at a time.
#ifndef ZENFLOW_FUZZ_FUZZ_JOB_H_
#define ZENFLOW_FUZZ_FUZZ_JOB_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/job.h"
#include "server/mailbox.h"
#include "server/registry.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace fuzz {

// What the targets' registry may hold: every job is refused beyond it, so
// no allocation a job makes can exceed it.
inline constexpr int64_t kFuzzMemoryBudget = int64_t{64} << 20;
// Its message size limit (the daemon's default is 512 MiB).
inline constexpr int64_t kFuzzMaxMessageBytes = int64_t{4} << 20;

// The registry (made on first use, never destroyed).
JobRegistry* Registry();

// A job in the registry and its normalized spec.
struct FuzzJob {
  std::shared_ptr<Job> job;
  v1::JobSpec spec;
};

// JobRegistry::CreateJob, then Find.
absl::StatusOr<FuzzJob> CreateFuzzJob(const v1::JobSpec& spec);
// The registry's job `id` (its spec as the job holds it).
absl::StatusOr<FuzzJob> FindFuzzJob(const std::string& id);

// Uploads finite values (one fp32 chunk per tensor, the same values for the
// same shapes) and joins every rank.
absl::Status UploadAndJoin(const FuzzJob& job);

// `up` as a rank's attached stream delivers it (server/ingest.h): `read` is
// how its bytes parsed. Returns the rejection (OK when applied).
absl::Status Ingest(const FuzzJob& job, int32_t rank, Wire wire, absl::Status read,
                    const v1::UpMessage& up);

// The bytes of a message as the service reads them: CheckMessageSize, then
// the parse (INVALID_ARGUMENT when they are not one).
template <typename Message>
absl::Status ParseRequest(absl::string_view bytes, Message* out) {
  absl::Status s = Registry()->CheckMessageSize(bytes.size());
  if (!s.ok()) return s;
  if (!out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("not a valid message");
  }
  return absl::OkStatus();
}

// The job's whole state by section (Job::Snapshot, which first waits for
// the round updates in flight).
absl::StatusOr<std::map<std::string, std::string>> JobState(Job* job);

// Job::LoadSnapshot of sections as JobState returns them, into a job made
// from their spec.
absl::Status LoadJobState(Job* job, const std::map<std::string, std::string>& sections);

// Checkpointer::RestoreAll over `state_dir` (<state_dir>/<job id>/ckpt-*.zfck).
absl::StatusOr<int> RestoreAll(const std::string& state_dir);

// Deletes every job of the registry.
void DeleteAllJobs();

// A directory of this process's own for scratch files: under $TEST_TMPDIR
// when set (bazel test), else /dev/shm (a checkpoint's fsyncs cost nothing
// there), else /tmp.
const std::string& ScratchDir();

}  // namespace fuzz
}  // namespace zenflow

#endif  // ZENFLOW_FUZZ_FUZZ_JOB_H_
