// Fuzz target "job_spec": a CreateJob request's spec (v1.JobSpec bytes)
// through JobRegistry::CreateJob, which normalizes and checks it, sizes the
// job and allocates it, under a 64 MiB memory budget. Run with libFuzzer's
// -malloc_limit_mb (./zf fuzz does), so that an allocation sized from a
// number the spec gives, before that number is checked, is caught.
//
// Properties checked: a created job's normalized spec normalizes to itself,
// its footprint fits the budget and counts its parameters, and a small one
// takes an upload, its ranks and a snapshot; a refused one leaves the
// registry empty.
#include <cstddef>
#include <cstdint>

#include "common/geometry.h"
#include "fuzz/check.h"
#include "fuzz/fuzz_job.h"
#include "server/job.h"
#include "server/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zenflow;
  using namespace zenflow::fuzz;
  v1::JobSpec spec;
  if (!ParseRequest(absl::string_view(reinterpret_cast<const char*>(data), size), &spec).ok()) {
    return 0;
  }
  absl::StatusOr<FuzzJob> job = CreateFuzzJob(spec);
  if (!job.ok()) {
    FUZZ_CHECK(Registry()->Jobs().empty(), "a refused job was kept: ", job.status().ToString());
    return 0;
  }
  v1::JobSpec again = job->spec;
  const absl::Status s = NormalizeJobSpec(&again, kFuzzMaxMessageBytes);
  FUZZ_CHECK(s.ok(), "a normalized spec is refused: ", s.ToString());
  FUZZ_CHECK(again.SerializeAsString() == job->spec.SerializeAsString(),
             "normalizing a normalized spec changed it: ", job->spec.ShortDebugString(), " -> ",
             again.ShortDebugString());
  const JobFootprint& f = job->job->footprint();
  FUZZ_CHECK(f.total() > 0 && f.total() <= kFuzzMemoryBudget, "job of ", f.total(),
             " bytes admitted under a budget of ", kFuzzMemoryBudget);
  int64_t params = 0;
  for (const v1::TensorSpec& t : job->spec.tensors()) {
    const ColumnGeometry g = GeometryOf(t);
    params += g.rows * g.cols;
  }
  FUZZ_CHECK(params == f.params && params == job->job->params(), "job of ", params,
             " parameters has a footprint of ", f.params, " and holds ", job->job->params());
  if (params <= 4096 && job->spec.world_size() <= 16) {
    const absl::Status up = UploadAndJoin(*job);
    FUZZ_CHECK(up.ok(), "a created job refuses its upload or ranks: ", up.ToString());
    const absl::Status snap = JobState(job->job.get()).status();
    FUZZ_CHECK(snap.ok(), "a created job cannot be snapshotted: ", snap.ToString());
  }
  DeleteAllJobs();
  return 0;
}
