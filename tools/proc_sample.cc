#include "tools/proc_sample.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/child_process.h"

namespace zenflow {
namespace soak {
namespace {

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      out.push_back(e->d_name);
    }
  }
  closedir(d);
  return out;
}

}  // namespace

ProcSample Sample(pid_t pid) {
  ProcSample s;
  s.rss = ResidentBytes(pid);
  s.threads = static_cast<int>(ListDir(absl::StrCat("/proc/", pid, "/task")).size());
  s.fds = static_cast<int>(ListDir(absl::StrCat("/proc/", pid, "/fd")).size());
  return s;
}

MemDetail ReadMemDetail(pid_t pid) {
  MemDetail d;
  {
    std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
    std::string key;
    while (in >> key) {
      int64_t* field = key == "RssAnon:"    ? &d.anon
                       : key == "RssFile:"  ? &d.file
                       : key == "RssShmem:" ? &d.shmem
                                            : nullptr;
      if (field != nullptr) {
        in >> *field;
        *field *= 1024;
      }
      std::getline(in, key);
    }
  }
  std::ifstream in(absl::StrCat("/proc/", pid, "/smaps"));
  std::string line, kind;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // A mapping's header starts with its address range ("7f...-7f... ").
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      std::istringstream h(line);
      std::string range, perms, offset, dev, inode, path;
      h >> range >> perms >> offset >> dev >> inode;
      std::getline(h, path);
      path.erase(0, path.find_first_not_of(' '));
      kind.clear();
      for (char c : path.empty() ? std::string("[anon]") : path) {
        if (c >= '0' && c <= '9') {
          if (kind.empty() || kind.back() != '#') kind += '#';
        } else {
          kind += c;
        }
      }
      ++d.maps[kind].first;
    } else if (line.rfind("Rss:", 0) == 0 && !kind.empty()) {
      d.maps[kind].second += std::atoll(line.c_str() + 4) * 1024;
    }
  }
  return d;
}

// Mappings of shared memory (what UCX's shared-memory transports attach:
// SysV segments, POSIX shm, memfds): one connection's must go when it closes.
int SharedMappings(const MemDetail& d) {
  int n = 0;
  for (const auto& [kind, v] : d.maps) {
    if (kind.rfind("/SYSV", 0) == 0 || kind.rfind("/dev/shm/", 0) == 0 ||
        kind.rfind("/memfd:", 0) == 0) {
      n += v.first;
    }
  }
  return n;
}

// "+16 /dev/shm/x# (+8.3 MiB resident)": the mapping kinds whose number or
// resident size changed by at least 64 KiB.
std::string MapsDiff(const MemDetail& base, const MemDetail& now) {
  std::vector<std::string> parts;
  std::map<std::string, std::pair<int, int64_t>> all = base.maps;
  for (const auto& [k, v] : now.maps) all.emplace(k, std::make_pair(0, int64_t{0}));
  for (const auto& [k, unused] : all) {
    const auto b = base.maps.find(k);
    const auto c = now.maps.find(k);
    const int dn =
        (c == now.maps.end() ? 0 : c->second.first) - (b == base.maps.end() ? 0 : b->second.first);
    const int64_t dr = (c == now.maps.end() ? 0 : c->second.second) -
                       (b == base.maps.end() ? 0 : b->second.second);
    if (dn != 0 || std::llabs(dr) >= (64 << 10)) {
      parts.push_back(absl::StrFormat("%+d %s (%+.2f MiB resident)", dn, k,
                                      static_cast<double>(dr) / (1 << 20)));
    }
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

// What the daemon's fds point at and what its threads are called, counted
// by kind ("socket", "anon_inode:[eventfd]", a path; thread names), to say
// what leaked when a count differs from the baseline.
std::map<std::string, int> FdKinds(pid_t pid) {
  std::map<std::string, int> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd/");
  for (const std::string& fd : ListDir(dir)) {
    char buf[512];
    const ssize_t n = readlink((dir + fd).c_str(), buf, sizeof(buf) - 1);
    if (n < 0) continue;
    std::string target(buf, static_cast<size_t>(n));
    const size_t bracket = target.find(":[");
    if (bracket != std::string::npos && target.back() == ']' &&
        target.find_first_not_of("0123456789", bracket + 2) == target.size() - 1) {
      target = target.substr(0, bracket);  // socket:[12345] -> socket
    }
    ++out[target];
  }
  return out;
}

std::map<std::string, int> ThreadNames(pid_t pid) {
  std::map<std::string, int> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/task/");
  for (const std::string& tid : ListDir(dir)) {
    std::ifstream in(dir + tid + "/comm");
    std::string name;
    std::getline(in, name);
    ++out[name];
  }
  return out;
}

// gRPC's own thread pools (names as /proc shows them, cut to 15
// characters): its timer manager starts another "grpc_global_timer" thread
// whenever every one it has is running timer callbacks, and its executor
// another "default-executor" thread when all are busy; neither pool ever
// retires a thread before the process ends (grpc's timer_manager.cc,
// executor.cc). Their size is the most that were ever busy at once, a
// high-water mark of load, not a resource of a job or a connection; the
// soak bounds their growth (--grpc_pool_slack) instead of asking for exact
// equality.
bool IsGrpcPoolThread(const std::string& name) {
  return name == "grpc_global_tim" || name == "default-executo";
}

// Threads in (pool = true) or outside gRPC's pools.
int CountThreads(const std::map<std::string, int>& names, bool pool) {
  int n = 0;
  for (const auto& [name, count] : names) {
    if (IsGrpcPoolThread(name) == pool) n += count;
  }
  return n;
}

// "+2 socket, -1 ucx-progress": what `now` has more or fewer of than `base`.
std::string Diff(const std::map<std::string, int>& base, const std::map<std::string, int>& now) {
  std::vector<std::string> parts;
  std::map<std::string, int> all = base;
  for (const auto& [k, n] : now) all.emplace(k, 0);
  for (const auto& [k, unused] : all) {
    const auto b = base.find(k);
    const auto c = now.find(k);
    const int d = (c == now.end() ? 0 : c->second) - (b == base.end() ? 0 : b->second);
    if (d != 0) parts.push_back(absl::StrFormat("%+d %s", d, k));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}


}  // namespace soak
}  // namespace zenflow
