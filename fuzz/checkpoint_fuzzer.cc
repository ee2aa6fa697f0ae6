// Fuzz target "checkpoint": checkpoint files (server/checkpoint_file.h
// ReadCheckpoint) and the restore of a job from one (server/checkpointer.cc
// RestoreAll, server/job_checkpoint.cc Job::LoadSnapshot), as zenflowd does
// at start over its --state_dir, then the restored job at work.
//
// Input: a mode byte, then
//   mode bit 0 clear: the file's bytes, zero-padded to a multiple of 4096;
//     with mode bit 1, the header checksum is made right (for a header that
//     fits in the file), so that the fields behind it are reached;
//   mode bit 0 set: sections as records (tag: the name's length, body: the
//     name, then the data) until a record with tag 0xff, written with
//     WriteCheckpoint (so every checksum is right); then ops (fuzz/ops.h)
//     for the restored job.
// The file is <scratch>/state/ck/ckpt-<seq>.zfck: it restores job "ck".
// Properties checked: at most that job is restored; its snapshot loads into
// a fresh job of the same spec and snapshots to the same sections; the ops'
// properties (RunOps).
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "fuzz/check.h"
#include "fuzz/fuzz_job.h"
#include "fuzz/input.h"
#include "fuzz/ops.h"
#include "server/checkpoint_file.h"

namespace zenflow {
namespace fuzz {
namespace {

constexpr char kJobId[] = "ck";

void WriteRaw(const std::string& path, absl::string_view bytes, bool fix_header_crc) {
  std::string file(bytes);
  file.resize((file.size() + 4095) / 4096 * 4096, '\0');
  if (fix_header_crc && file.size() >= 16) {
    uint32_t count = 0;
    std::memcpy(&count, file.data() + 12, 4);
    const size_t header = 16 + size_t{56} * count + 4;
    if (count <= kCheckpointMaxSections && header <= file.size()) {
      const uint32_t crc = Crc32c(file.data(), header - 4);
      std::memcpy(file.data() + header - 4, &crc, 4);
    }
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  FUZZ_CHECK(f != nullptr, "cannot create ", path);
  FUZZ_CHECK(std::fwrite(file.data(), 1, file.size(), f) == file.size(), "cannot write ", path);
  std::fclose(f);
}

// Sections from records up to the one tagged 0xff; false when they cannot
// be a checkpoint (WriteCheckpoint refuses them).
bool WriteSections(const std::string& dir, const std::string& name, FuzzInput* in) {
  std::vector<CheckpointSectionView> views;
  while (std::optional<FuzzRecord> r = in->Record()) {
    if (r->tag == 0xff) break;
    const size_t n = r->tag < r->body.size() ? r->tag : r->body.size();
    views.push_back({std::string(r->body.substr(0, n)), r->body.data() + n, r->body.size() - n});
  }
  CheckpointIoOptions io;
  io.buffer_bytes = 64 << 10;
  io.buffers = 2;
  return WriteCheckpoint(dir, name, views, io).ok();
}

// The restored job's snapshot, loaded into a fresh job, snapshots the same.
void CheckSnapshotLoads(const FuzzJob& restored) {
  absl::StatusOr<std::map<std::string, std::string>> state = JobState(restored.job.get());
  FUZZ_CHECK(state.ok(), "a restored job cannot be snapshotted: ", state.status().ToString());
  v1::JobSpec spec = restored.spec;
  spec.set_job_id("ck2");
  absl::StatusOr<FuzzJob> copy = CreateFuzzJob(spec);
  if (!copy.ok()) return;  // no room for two (the memory budget)
  const absl::Status loaded = LoadJobState(copy->job.get(), *state);
  FUZZ_CHECK(loaded.ok(), "a restored job's snapshot does not load: ", loaded.ToString());
  absl::StatusOr<std::map<std::string, std::string>> again = JobState(copy->job.get());
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(again->size() == state->size(), "snapshot of a reloaded job has ", again->size(),
             " sections, not ", state->size());
  for (const auto& [name, bytes] : *state) {
    // The job's identity (its id; its credential, which the restore sets
    // apart from LoadSnapshot) is the copy's own.
    if (name == "spec" || name == "credential") continue;
    FUZZ_CHECK(again->count(name) > 0 && again->at(name) == bytes, "section '", name,
               "' of a reloaded job's snapshot differs");
  }
  (void)Registry()->DeleteJob("ck2");
}

}  // namespace
}  // namespace fuzz
}  // namespace zenflow

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zenflow;
  using namespace zenflow::fuzz;
  const std::string state = ScratchDir() + "/state";
  const std::string dir = state + "/" + kJobId;
  const std::string name = CheckpointFileName("ckpt-", 1);
  const std::string path = dir + "/" + name;
  mkdir(state.c_str(), 0700);
  mkdir(dir.c_str(), 0700);

  FuzzInput in(data, size);
  const uint8_t mode = in.Byte();
  bool written = true;
  if (mode & 1) {
    written = WriteSections(dir, name, &in);
  } else {
    WriteRaw(path, in.Rest(), (mode & 2) != 0);
  }
  if (written) {
    absl::StatusOr<int> restored = RestoreAll(state);
    FUZZ_CHECK(restored.ok() && *restored <= 1, "RestoreAll: ",
               restored.ok() ? std::to_string(*restored) : restored.status().ToString());
    if (*restored == 1) {
      absl::StatusOr<FuzzJob> job = FindFuzzJob(kJobId);
      FUZZ_CHECK(job.ok(), "restored, job 'ck' is not there: ", job.status().ToString());
      CheckSnapshotLoads(*job);
      RunOps(*job, &in);
    }
  }
  DeleteAllJobs();
  unlink(path.c_str());
  rmdir(dir.c_str());
  rmdir(state.c_str());
  return 0;
}
