#include "tools/bench/cpu_time.h"

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace zenflow {

namespace {

std::string ReadAll(const std::string& path, bool* ok) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  *ok = static_cast<bool>(in);
  return text.str();
}

// utime + stime of a /proc stat file, seconds.
absl::StatusOr<double> StatCpuSeconds(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  // The command name (field 2) is in parentheses and may hold blanks: the
  // fields after the last ')' start at field 3 (state); utime and stime are
  // fields 14 and 15.
  const size_t paren = s.rfind(')');
  if (!in || paren == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path));
  }
  std::vector<std::string> f = absl::StrSplit(s.substr(paren + 2), ' ', absl::SkipEmpty());
  int64_t utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) {
    return absl::InternalError(absl::StrCat("unexpected contents of ", path));
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

absl::StatusOr<double> ProcessCpuSeconds(int pid) {
  return StatCpuSeconds(absl::StrCat("/proc/", pid, "/stat"));
}

double HostBusySeconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  if (!in || cpu != "cpu") return -1;
  int64_t total = 0, idle = 0;
  for (int i = 0; i < 8; ++i) {
    int64_t v = 0;
    if (!(in >> v)) return -1;
    total += v;
    if (i == 3 || i == 4) idle += v;  // idle, iowait
  }
  return static_cast<double>(total - idle) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double SelfCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double ThisThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

absl::StatusOr<ThreadCpuSnapshot> ReadThreadCpu(int pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot list ", dir));
  std::vector<int> tids;
  while (const dirent* e = readdir(d)) {
    int tid = 0;
    if (absl::SimpleAtoi(e->d_name, &tid) && tid > 0) tids.push_back(tid);
  }
  closedir(d);
  ThreadCpuSnapshot out;
  for (int tid : tids) {
    const std::string base = absl::StrCat(dir, "/", tid);
    absl::StatusOr<double> cpu = StatCpuSeconds(base + "/stat");
    bool ok = false;
    std::string comm = ReadAll(base + "/comm", &ok);
    if (!cpu.ok() || !ok) continue;  // the thread ended meanwhile
    while (!comm.empty() && (comm.back() == '\n' || comm.back() == ' ')) comm.pop_back();
    out[tid] = ThreadCpu{comm, *cpu};
  }
  if (out.empty()) return absl::NotFoundError(absl::StrCat("no thread readable in ", dir));
  return out;
}

double NamedThreadsCpuDelta(const ThreadCpuSnapshot& start, const ThreadCpuSnapshot& end,
                            const std::string& name) {
  double out = 0;
  for (const auto& [tid, t] : end) {
    if (t.comm != name) continue;
    const auto it = start.find(tid);
    const bool same = it != start.end() && it->second.comm == t.comm && it->second.cpu_s <= t.cpu_s;
    out += t.cpu_s - (same ? it->second.cpu_s : 0.0);
  }
  return out;
}

}  // namespace zenflow
