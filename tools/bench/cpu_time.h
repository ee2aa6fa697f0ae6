// CPU time of processes and of the host, from /proc and getrusage: what a
// bench charges to the daemon, to itself and to the machine per round.
#ifndef ZENFLOW_TOOLS_BENCH_CPU_TIME_H_
#define ZENFLOW_TOOLS_BENCH_CPU_TIME_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace zenflow {

// utime + stime of process `pid`, seconds.
absl::StatusOr<double> ProcessCpuSeconds(int pid);

// Seconds the host's CPUs were busy (all of them, /proc/stat: every state
// but idle and iowait), or -1 when unreadable.
double HostBusySeconds();

// utime + stime of this process, seconds.
double SelfCpuSeconds();

// CPU seconds of the calling thread (CLOCK_THREAD_CPUTIME_ID).
double ThisThreadCpuSeconds();

// One thread of a process at one instant: its name (/proc/PID/task/TID/comm)
// and its utime + stime (.../stat), seconds.
struct ThreadCpu {
  std::string comm;
  double cpu_s = 0;
};
// Every thread of process `pid`, by thread id. Threads that end while it
// reads are left out.
using ThreadCpuSnapshot = std::map<int, ThreadCpu>;
absl::StatusOr<ThreadCpuSnapshot> ReadThreadCpu(int pid);

// The CPU seconds the threads named `name` spent between two snapshots of
// a process's threads. A thread only in `end` (or whose id was reused: a
// different name, or fewer seconds than before) started in between and
// counts from 0; one only in `start` ended in between and its last seconds
// are lost (read the process's whole total from /proc/PID/stat, which keeps
// the CPU of threads that ended).
double NamedThreadsCpuDelta(const ThreadCpuSnapshot& start, const ThreadCpuSnapshot& end,
                            const std::string& name);

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_BENCH_CPU_TIME_H_
