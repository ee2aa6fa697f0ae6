// CPU time of processes and of the host, from /proc and getrusage: what a
// bench charges to the daemon, to itself and to the machine per round.
#ifndef ZENFLOW_TOOLS_BENCH_CPU_TIME_H_
#define ZENFLOW_TOOLS_BENCH_CPU_TIME_H_

#include "absl/status/statusor.h"

namespace zenflow {

// utime + stime of process `pid`, seconds.
absl::StatusOr<double> ProcessCpuSeconds(int pid);

// Seconds the host's CPUs were busy (all of them, /proc/stat: every state
// but idle and iowait), or -1 when unreadable.
double HostBusySeconds();

// utime + stime of this process, seconds.
double SelfCpuSeconds();

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_BENCH_CPU_TIME_H_
