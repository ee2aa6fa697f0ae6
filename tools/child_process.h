// A server started as a child process for the benchmarks and the soak
// (zf_soak, transport_bench): it is told a port file, its stderr goes to a
// log in a fresh /tmp directory, and Start waits until it serves.
//
//   ChildProcess d;
//   ZF_RETURN_IF_ERROR(d.Start(zenflowd, {"--listen=127.0.0.1:0"}, "--port_file", "zf_soak"));
//   ... d.target() ...
//   ZF_RETURN_IF_ERROR(d.Stop());   // SIGTERM, exit 0 expected
//
// (Tests use tests/testing/daemon_process.h, which is testonly.)
#ifndef ZENFLOW_TOOLS_CHILD_PROCESS_H_
#define ZENFLOW_TOOLS_CHILD_PROCESS_H_

#include <sys/types.h>

#include <cstdint>

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace zenflow {

// The resident memory of process `pid` (/proc/PID/status VmRSS), bytes; -1
// if it cannot be read.
int64_t ResidentBytes(pid_t pid);

// Not thread-safe. The destructor SIGKILLs a child still running.
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Runs `binary args... port_flag=<dir>/port` with stderr into <dir>/stderr.log
  // (<dir> = /tmp/<name>.XXXXXX) and waits up to 30 s for the port file:
  // then target() is 127.0.0.1:<port>. An exit meanwhile reports the log.
  absl::Status Start(const std::string& binary, std::vector<std::string> args,
                     const std::string& port_flag, const std::string& name);
  // SIGTERM; OK if the child exits 0 within 30 s (else SIGKILL and an error).
  absl::Status Stop();
  // The last 4000 bytes of the child's stderr.
  std::string LogTail() const;
  // Removes the log, the port file and their directory (after a run that passed).
  void RemoveFiles();

  pid_t pid() const { return pid_; }
  const std::string& target() const { return target_; }
  const std::string& log() const { return log_; }
  const std::string& dir() const { return dir_; }

 private:
  pid_t pid_ = -1;
  std::string dir_, log_, target_;
};

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_CHILD_PROCESS_H_
