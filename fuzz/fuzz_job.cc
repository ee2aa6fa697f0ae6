// The fuzz targets' door into the job API; see fuzz_job.h.
#include "fuzz/fuzz_job.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/geometry.h"
#include "common/status_macros.h"
#include "google/protobuf/stubs/logging.h"
#include "server/checkpointer.h"
#include "server/ingest.h"

namespace zenflow {
namespace fuzz {

JobRegistry* Registry() {
  static JobRegistry* const registry = [] {
    // Protobuf logs every string field that is not UTF-8 as it parses (the
    // parse still succeeds); at fuzzing rates that is most of the output.
    google::protobuf::SetLogHandler(nullptr);
    RegistryOptions o;
    o.update_threads = 1;
    o.update_drivers = 1;
    o.max_message_bytes = kFuzzMaxMessageBytes;
    o.memory_budget_bytes = kFuzzMemoryBudget;
    o.max_outbox_bytes = int64_t{1} << 20;
    o.max_jobs = 8;
    return new JobRegistry(o);
  }();
  return registry;
}

absl::StatusOr<FuzzJob> CreateFuzzJob(const v1::JobSpec& spec) {
  ZF_ASSIGN_OR_RETURN(v1::JobSpec normalized, Registry()->CreateJob(spec));
  ZF_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Registry()->Find(normalized.job_id()));
  return FuzzJob{std::move(job), std::move(normalized)};
}

absl::StatusOr<FuzzJob> FindFuzzJob(const std::string& id) {
  ZF_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Registry()->Find(id));
  v1::JobSpec spec = job->spec();
  return FuzzJob{std::move(job), std::move(spec)};
}

absl::Status UploadAndJoin(const FuzzJob& job) {
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<Job::Upload> upload, Job::Upload::Begin(job.job));
  for (const v1::TensorSpec& t : job.spec.tensors()) {
    const ColumnGeometry g = GeometryOf(t);
    std::vector<float> values(static_cast<size_t>(g.rows * g.cols));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
    }
    v1::UploadParametersRequest chunk;
    chunk.set_job_id(job.spec.job_id());
    chunk.set_tensor(t.name());
    *chunk.mutable_shape() = t.shape();
    chunk.set_dtype(v1::DTYPE_FP32);
    chunk.set_payload(values.data(), values.size() * sizeof(float));
    ZF_RETURN_IF_ERROR(upload->AddChunk(chunk));
  }
  ZF_RETURN_IF_ERROR(upload->Commit().status());
  for (int32_t r = 0; r < job.spec.world_size(); ++r) {
    ZF_RETURN_IF_ERROR(job.job->Join(r).status());
  }
  return absl::OkStatus();
}

absl::Status Ingest(const FuzzJob& job, int32_t rank, Wire wire, absl::Status read,
                    const v1::UpMessage& up) {
  ZF_ASSIGN_OR_RETURN(std::shared_ptr<Mailbox> box, job.job->MailboxFor(rank));
  return IngestUp(Registry(), job.job.get(), rank, wire, box.get(), std::move(read), up);
}

absl::StatusOr<std::map<std::string, std::string>> JobState(Job* job) {
  ZF_ASSIGN_OR_RETURN(JobSnapshot snap, job->Snapshot());
  std::map<std::string, std::string> out;
  for (auto& [name, bytes] : snap.sections) out[name] = std::move(bytes);
  return out;
}

absl::Status LoadJobState(Job* job, const std::map<std::string, std::string>& sections) {
  std::map<std::string, const std::string*> views;
  for (const auto& [name, bytes] : sections) views[name] = &bytes;
  return job->LoadSnapshot(views);
}

absl::StatusOr<int> RestoreAll(const std::string& state_dir) {
  CheckpointOptions o;
  o.state_dir = state_dir;
  Checkpointer checkpointer(Registry(), o);
  return checkpointer.RestoreAll();
}

void DeleteAllJobs() {
  for (const std::shared_ptr<Job>& job : Registry()->Jobs()) {
    (void)Registry()->DeleteJob(job->spec().job_id());
  }
}

const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    std::string base = "/tmp";
    if (const char* t = std::getenv("TEST_TMPDIR"); t != nullptr && *t != '\0') {
      base = t;
    } else if (access("/dev/shm", W_OK) == 0) {
      base = "/dev/shm";
    }
    std::string templ = base + "/zf-fuzz.XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    // The targets leave nothing in it between inputs: it goes at exit.
    static std::string* const made = new std::string(templ);
    std::atexit([] { rmdir(made->c_str()); });
    return made;
  }();
  return *dir;
}

}  // namespace fuzz
}  // namespace zenflow
