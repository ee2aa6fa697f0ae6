#include "tools/bench/cpu_time.h"

#include <sys/resource.h>
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

absl::StatusOr<double> ProcessCpuSeconds(int pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
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

}  // namespace zenflow
