// `./zf bench checkpoint`: what a checkpoint costs, against plain I/O of the
// same bytes measured in the same run and directory.
//
// A job of about --state_bytes of state (one [4096, C] tensor, one rank) gets
// one full round of gradients; its update time is round_update_ms. Then
// Job::Snapshot copies the state (snapshot_pause_ms: the time the job's lock
// is held), WriteCheckpoint writes it (io_uring, checksums, fsync, rename,
// directory fsync) and ReadCheckpoint reads and verifies it. The baseline
// writes the same bytes with plain write() and fsync, and reads them back
// with read(). Before each read the file's pages are dropped from the page
// cache (fsync, then posix_fadvise DONTNEED), for both paths alike.
//
//   bazel build -c opt //tools/bench:checkpoint_bench
//   bazel-bin/tools/bench/checkpoint_bench --dir=/var/tmp --out=bench-results/checkpoint.json
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/json_writer.h"
#include "common/malloc_tuning.h"
#include "server/checkpoint_file.h"
#include "server/registry.h"

ABSL_FLAG(std::string, dir, "/var/tmp", "directory to write in (the state directory's file system)");
ABSL_FLAG(int64_t, state_bytes, int64_t{1} << 30, "the job's state size (about)");
ABSL_FLAG(int, repeats, 3, "runs of each measurement; the median is reported");
ABSL_FLAG(std::string, out, "", "write the results as JSON here");

namespace zenflow {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

void DropCache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// Plain write() of the sections one after another, then fsync; seconds.
double BaselineWrite(const std::string& path, const std::vector<CheckpointSectionView>& views) {
  const double t0 = Now();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0640);
  if (fd < 0) std::abort();
  for (const CheckpointSectionView& v : views) {
    const char* p = static_cast<const char*>(v.data);
    size_t left = v.size;
    while (left > 0) {
      const ssize_t n = write(fd, p, std::min<size_t>(left, size_t{8} << 20));
      if (n <= 0) std::abort();
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  fsync(fd);
  close(fd);
  return Now() - t0;
}

// Plain read() of the whole file into memory of its own, as ReadCheckpoint
// returns it (allocation and page faults included on both sides); seconds.
double BaselineRead(const std::string& path, int64_t bytes) {
  DropCache(path);
  const double t0 = Now();
  std::string buf(static_cast<size_t>(bytes), '\0');
  const int fd = open(path.c_str(), O_RDONLY);
  int64_t got = 0;
  for (ssize_t n; got < bytes && (n = read(fd, buf.data() + got, std::min<int64_t>(bytes - got, int64_t{8} << 20))) > 0;) got += n;
  close(fd);
  if (got != bytes) std::abort();
  return Now() - t0;
}

int Main() {
  TuneMallocForBulkBuffers();
  const int64_t rows = 4096;
  // 20 B of state per parameter (master, m, v, two rounds' sums).
  const int64_t cols = std::max<int64_t>(1, absl::GetFlag(FLAGS_state_bytes) / (20 * rows));
  RegistryOptions ro;
  ro.max_message_bytes = int64_t{64} << 20;
  JobRegistry registry(ro);
  v1::JobSpec spec;
  spec.set_job_id("bench");
  v1::TensorSpec* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(rows);
  t->add_shape(cols);
  spec.set_world_size(1);
  spec.set_wire_dtype(v1::DTYPE_FP32);
  spec.mutable_zenflow()->set_update_interval(1);
  if (absl::Status s = registry.CreateJob(spec).status(); !s.ok()) {
    std::fprintf(stderr, "checkpoint_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  std::shared_ptr<Job> job = *registry.Find("bench");
  {
    // Parameters, uploaded in 16 MiB chunks.
    absl::StatusOr<std::unique_ptr<Job::Upload>> up = Job::Upload::Begin(job);
    const int64_t n = rows * cols, per = int64_t{4} << 20;
    std::vector<float> vals(static_cast<size_t>(per), 0.5f);
    for (int64_t off = 0; off < n; off += per) {
      v1::UploadParametersRequest chunk;
      chunk.set_tensor("w");
      if (off == 0) {
        chunk.add_shape(rows);
        chunk.add_shape(cols);
      }
      chunk.set_offset(off);
      const int64_t k = std::min(per, n - off);
      chunk.set_payload(reinterpret_cast<const char*>(vals.data()), k * sizeof(float));
      if (!(*up)->AddChunk(chunk).ok()) std::abort();
    }
    if (!up.ok() || !(*up)->Commit().ok() || !job->Join(0).ok()) std::abort();
  }
  // One round: every column's gradient, in shards of 256 columns.
  std::vector<float> grad(static_cast<size_t>(rows * 256));
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1e-3f * static_cast<float>(i % 97);
  for (int64_t c0 = 0; c0 < cols; c0 += 256) {
    v1::UpMessage m;
    v1::GradientShard* s = m.mutable_shard();
    s->set_step(0);
    s->set_tensor("w");
    s->set_dtype(v1::DTYPE_FP32);
    const int64_t k = std::min<int64_t>(256, cols - c0);
    for (int64_t c = c0; c < c0 + k; ++c) s->add_columns(static_cast<int32_t>(c));
    s->set_payload(reinterpret_cast<const char*>(grad.data()), k * rows * sizeof(float));
    if (!job->HandleUp(0, m, Wire::kGrpc).ok()) std::abort();
  }
  v1::UpMessage close;
  close.mutable_close()->set_round(0);
  close.mutable_close()->set_lr(1e-3f);
  if (!job->HandleUp(0, close, Wire::kGrpc).ok()) std::abort();

  const std::string dir = absl::GetFlag(FLAGS_dir);
  const std::string base_path = absl::StrCat(dir, "/zf_checkpoint_bench.baseline");
  std::vector<double> pause, wsec, rsec, bw, br;
  int64_t bytes = 0;
  bool direct = false, uring = false;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_repeats)); ++i) {
    absl::StatusOr<JobSnapshot> snap = job->Snapshot();  // waits for the round's update
    if (!snap.ok()) std::abort();
    pause.push_back(snap->pause_seconds);
    std::vector<CheckpointSectionView> views;
    int64_t payload = 0;
    for (const auto& [name, data] : snap->sections) {
      views.push_back({name, data.data(), data.size()});
      payload += static_cast<int64_t>(data.size());
    }
    const std::string name = CheckpointFileName("zf_checkpoint_bench.", static_cast<uint64_t>(i));
    absl::StatusOr<CheckpointWriteStats> w = WriteCheckpoint(dir, name, views);
    if (!w.ok()) {
      std::fprintf(stderr, "checkpoint_bench: %s\n", w.status().ToString().c_str());
      return 1;
    }
    bytes = payload;
    direct = w->direct_io;
    uring = w->io_uring;
    wsec.push_back(w->seconds);
    const std::string path = absl::StrCat(dir, "/", name);
    DropCache(path);
    const double t0 = Now();
    absl::StatusOr<std::vector<CheckpointSection>> back = ReadCheckpoint(path);
    rsec.push_back(Now() - t0);
    if (!back.ok()) std::abort();
    back->clear();
    unlink(path.c_str());
    bw.push_back(BaselineWrite(base_path, views));
    br.push_back(BaselineRead(base_path, payload));
    unlink(base_path.c_str());
  }
  v1::JobStats st;
  job->Stats(&st);
  const double write_bps = bytes / Median(wsec), read_bps = bytes / Median(rsec);
  const double base_w = bytes / Median(bw), base_r = bytes / Median(br);
  JsonWriter j;
  j.BeginObject();
  j.Key("bytes").Int(bytes);
  j.Key("write_bytes_per_s").Double(write_bps);
  j.Key("read_bytes_per_s").Double(read_bps);
  j.Key("baseline_write_bytes_per_s").Double(base_w);
  j.Key("baseline_read_bytes_per_s").Double(base_r);
  j.Key("write_fraction").Double(write_bps / base_w);
  j.Key("read_fraction").Double(read_bps / base_r);
  j.Key("snapshot_pause_ms").Double(Median(pause) * 1e3);
  j.Key("round_update_ms").Double(st.last_update_seconds() * 1e3);
  j.Key("direct_io").Bool(direct);
  j.Key("io_uring").Bool(uring);
  j.Key("repeats").Int(static_cast<int64_t>(wsec.size()));
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
  if (!absl::GetFlag(FLAGS_out).empty()) {
    if (absl::Status s = j.WriteFile(absl::GetFlag(FLAGS_out)); !s.ok()) {
      std::fprintf(stderr, "checkpoint_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return zenflow::Main();
}
