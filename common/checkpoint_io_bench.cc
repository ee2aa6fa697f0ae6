// checkpoint_io_bench: checkpoint file I/O against plain write()/read().
//
// In one run and one directory it times
//   checkpoint  WriteCheckpoint of --bytes of data in 64 MiB sections
//               (CRC-32C, io_uring, O_DIRECT where allowed, fsync, rename,
//               directory fsync), then ReadCheckpoint of the file (verified);
//   baseline    write() of the same sections to one file and fsync, then
//               read() of it back into freshly allocated sections.
// Between each write and its read the file's pages are dropped from the page
// cache with posix_fadvise(POSIX_FADV_DONTNEED) after the fsync (dropping
// the whole cache needs root), so both reads come from the disk; the
// checkpoint's O_DIRECT I/O does not use the cache to begin with. Each
// figure is the median of --repeats runs. *_fraction is checkpoint /
// baseline throughput: what the checksums and the atomic protocol cost (or,
// above 1, what io_uring and O_DIRECT gain).
//
// Flags: --dir (default: a new directory under /tmp, removed afterwards),
// --bytes (1 GiB), --repeats (1), --out (JSON file; none: stdout only),
// --buffer_bytes and --buffers (the checkpoint's I/O buffers).

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint_file.h"
#include "common/json_writer.h"

ABSL_FLAG(std::string, dir, "",
          "directory for the files (default: a new directory under /tmp, removed afterwards)");
ABSL_FLAG(int64_t, bytes, int64_t{1} << 30, "bytes of checkpoint data");
ABSL_FLAG(int, repeats, 1, "runs; each figure is the median");
ABSL_FLAG(std::string, out, "", "JSON result file (default: none, stdout only)");
ABSL_FLAG(int64_t, buffer_bytes, int64_t{1} << 20,
          "checkpoint I/O buffer size (a multiple of 4096)");
ABSL_FLAG(int, buffers, 4, "checkpoint I/O buffers (I/Os in flight)");

namespace zenflow {
namespace {

constexpr size_t kSectionBytes = size_t{64} << 20;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Drops the file's pages from the page cache; written-back pages only, so
// after the fsync.
void DropCache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

bool Fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_io_bench: %s\n", what.c_str());
  return false;
}

bool WriteBaseline(const std::string& path, const std::vector<std::string>& data) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Fail(absl::StrCat("create of ", path, ": ", std::strerror(errno)));
  for (const std::string& s : data) {
    for (size_t done = 0; done < s.size();) {
      const ssize_t r = write(fd, s.data() + done, s.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        close(fd);
        return Fail(absl::StrCat("write of ", path, ": ", std::strerror(errno)));
      }
      done += r;
    }
  }
  const bool ok = fsync(fd) == 0;
  close(fd);
  return ok || Fail(absl::StrCat("fsync of ", path, ": ", std::strerror(errno)));
}

bool ReadBaseline(const std::string& path, const std::vector<std::string>& data) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Fail(absl::StrCat("open of ", path, ": ", std::strerror(errno)));
  std::vector<std::string> back(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    back[i].resize(data[i].size());  // as ReadCheckpoint allocates its sections
    for (size_t done = 0; done < back[i].size();) {
      const ssize_t r = read(fd, back[i].data() + done, back[i].size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        close(fd);
        return Fail(absl::StrCat("read of ", path, ": ", r == 0 ? "short file" : std::strerror(errno)));
      }
      done += r;
    }
  }
  close(fd);
  return true;
}

struct Run {
  double write_s = 0, read_s = 0, base_write_s = 0, base_read_s = 0;
  bool direct_io = false, io_uring = false, fixed_buffers = false;
};

bool RunOnce(const std::string& dir, const std::vector<std::string>& data,
             const CheckpointIoOptions& options, Run* run) {
  std::vector<CheckpointSectionView> views;
  for (size_t i = 0; i < data.size(); ++i) {
    views.push_back({absl::StrCat("s", i), data[i].data(), data[i].size()});
  }
  const std::string name = "bench.zfck";
  const std::string path = absl::StrCat(dir, "/", name);
  double t = Now();
  auto stats = WriteCheckpoint(dir, name, views, options);
  run->write_s = Now() - t;
  if (!stats.ok()) return Fail(stats.status().ToString());
  run->direct_io = stats->direct_io;
  run->io_uring = stats->io_uring;
  run->fixed_buffers = stats->fixed_buffers;
  DropCache(path);
  {
    t = Now();
    auto back = ReadCheckpoint(path, options);
    run->read_s = Now() - t;
    if (!back.ok()) return Fail(back.status().ToString());
    for (size_t i = 0; i < data.size(); ++i) {
      if ((*back)[i].data != data[i]) return Fail(absl::StrCat("section ", i, " read back differs"));
    }
  }
  unlink(path.c_str());

  const std::string base = absl::StrCat(dir, "/baseline.bin");
  t = Now();
  if (!WriteBaseline(base, data)) return false;
  run->base_write_s = Now() - t;
  DropCache(base);
  t = Now();
  if (!ReadBaseline(base, data)) return false;
  run->base_read_s = Now() - t;
  unlink(base.c_str());
  return true;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Checkpoint write/read throughput against plain write()+fsync and read() of the same "
      "bytes in the same directory; JSON into --out.");
  absl::ParseCommandLine(argc, argv);
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (bytes <= 0 || repeats < 1) {
    std::fprintf(stderr, "--bytes and --repeats must be positive\n");
    return 2;
  }
  CheckpointIoOptions options;
  options.buffer_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_buffer_bytes));
  options.buffers = absl::GetFlag(FLAGS_buffers);

  std::string dir = absl::GetFlag(FLAGS_dir);
  const bool own_dir = dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/zf_checkpoint_io_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::fprintf(stderr, "mkdtemp under /tmp: %s\n", std::strerror(errno));
      return 1;
    }
    dir = tmpl;
  }

  // Data that does not compress or dedupe: a xorshift stream.
  std::vector<std::string> data;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t left = bytes; left > 0; left -= kSectionBytes) {
    std::string& s = data.emplace_back(std::min<int64_t>(left, kSectionBytes), '\0');
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      std::memcpy(&s[i], &x, 8);
    }
    for (; i < s.size(); ++i) s[i] = static_cast<char>(i);
  }

  std::vector<Run> runs(repeats);
  bool ok = true;
  for (int r = 0; r < repeats && ok; ++r) ok = RunOnce(dir, data, options, &runs[r]);
  if (own_dir) rmdir(dir.c_str());
  if (!ok) return 1;

  auto median_rate = [&](double Run::*field) {
    std::vector<double> rates;
    for (const Run& r : runs) rates.push_back(static_cast<double>(bytes) / (r.*field));
    return Median(rates);
  };
  const double write_bps = median_rate(&Run::write_s);
  const double read_bps = median_rate(&Run::read_s);
  const double base_write_bps = median_rate(&Run::base_write_s);
  const double base_read_bps = median_rate(&Run::base_read_s);

  JsonWriter json;
  json.BeginObject();
  json.Key("bytes").Int(bytes);
  json.Key("section_bytes").Int(static_cast<int64_t>(kSectionBytes));
  json.Key("repeats").Int(repeats);
  json.Key("statistic").String("median");
  json.Key("write_bytes_per_s").Double(write_bps);
  json.Key("read_bytes_per_s").Double(read_bps);
  json.Key("baseline_write_bytes_per_s").Double(base_write_bps);
  json.Key("baseline_read_bytes_per_s").Double(base_read_bps);
  json.Key("write_fraction").Double(write_bps / base_write_bps);
  json.Key("read_fraction").Double(read_bps / base_read_bps);
  json.Key("direct_io").Bool(runs[0].direct_io);
  json.Key("io_uring").Bool(runs[0].io_uring);
  json.Key("fixed_buffers").Bool(runs[0].fixed_buffers);
  json.Key("buffer_bytes").Int(static_cast<int64_t>(options.buffer_bytes));
  json.Key("buffers").Int(options.buffers);
  json.Key("cache_drop").String("posix_fadvise(POSIX_FADV_DONTNEED) after fsync, both paths");
  json.EndObject();
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (absl::Status s = json.WriteFile(out); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  std::printf("%s\n", json.str().c_str());
  std::printf(
      "checkpoint_io_bench: %.0f MiB in %s, median of %d: write %.2f GB/s (baseline %.2f, "
      "%.2fx), read %.2f GB/s (baseline %.2f, %.2fx); direct_io=%d io_uring=%d\n",
      bytes / 1048576.0, dir.c_str(), repeats, write_bps / 1e9, base_write_bps / 1e9,
      write_bps / base_write_bps, read_bps / 1e9, base_read_bps / 1e9, read_bps / base_read_bps,
      runs[0].direct_io, runs[0].io_uring);
  return 0;
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) { return zenflow::Main(argc, argv); }
