// Sampling a process from /proc (for the loopback soak, tools/zf_soak.cc):
// its resident memory, threads and file descriptors, its memory by kind and
// its mappings by what backs them, its fds and threads by kind, and readable
// differences between two such readings. Definitions in proc_sample.cc.
#ifndef ZENFLOW_TOOLS_PROC_SAMPLE_H_
#define ZENFLOW_TOOLS_PROC_SAMPLE_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace zenflow {
namespace soak {

// ---- The daemon process and /proc -----------------------------------------------

struct ProcSample {
  int64_t rss = -1;  // bytes
  int threads = -1;
  int fds = -1;
};

ProcSample Sample(pid_t pid);

// The daemon's resident memory by kind (/proc/<pid>/status) and its
// mappings by what backs them (/proc/<pid>/smaps: the path with digits as
// '#', "[anon]" for none), with their resident bytes: where RSS went.
struct MemDetail {
  int64_t anon = -1, file = -1, shmem = -1;             // RssAnon, RssFile, RssShmem, bytes
  std::map<std::string, std::pair<int, int64_t>> maps;  // kind -> (mappings, resident bytes)
};

MemDetail ReadMemDetail(pid_t pid);
int SharedMappings(const MemDetail& d);
std::string MapsDiff(const MemDetail& base, const MemDetail& now);
std::map<std::string, int> FdKinds(pid_t pid);
std::map<std::string, int> ThreadNames(pid_t pid);
bool IsGrpcPoolThread(const std::string& name);
int CountThreads(const std::map<std::string, int>& names, bool pool);
std::string Diff(const std::map<std::string, int>& base, const std::map<std::string, int>& now);

}  // namespace soak
}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_PROC_SAMPLE_H_
