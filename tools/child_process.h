// The project's one launcher of child processes, for the benchmarks, the
// soak and the tests (zf_soak, transport_bench, tests/testing/daemon_process).
// ChildProcess starts a server: it is told a port file, its stderr goes to a
// log in a fresh directory (or stays the parent's), and Start waits until it
// serves.
//
//   ChildProcess d;
//   ZF_RETURN_IF_ERROR(d.Start(zenflowd, {"--listen=127.0.0.1:0"}, "--port_file", "zf_soak"));
//   ... d.target() ...
//   ZF_RETURN_IF_ERROR(d.Stop());   // SIGTERM, exit 0 expected
//
// SpawnProcess starts any program and leaves the waiting to the caller.
#ifndef ZENFLOW_TOOLS_CHILD_PROCESS_H_
#define ZENFLOW_TOOLS_CHILD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace zenflow {

// The resident memory of process `pid` (/proc/PID/status VmRSS), bytes; -1
// if it cannot be read.
int64_t ResidentBytes(pid_t pid);

// Starts args[0] with `args` as its argv (no PATH search), with the
// parent's environment and file descriptors 0-2. Returns the child's pid, or
// -1 if it could not be started. Safe in a threaded program (posix_spawn).
pid_t SpawnProcess(std::vector<std::string> args);

// Not thread-safe. The destructor SIGKILLs a child still running.
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Where Start makes its directory (default /tmp).
  void set_parent_dir(std::string parent) { parent_ = std::move(parent); }
  // A program that execs the rest of its arguments in its own process (so
  // that pid() stays the server's), e.g. {"/usr/bin/prlimit", "--as=N", "--"}.
  void set_command_prefix(std::vector<std::string> prefix) { prefix_ = std::move(prefix); }
  // With false the child writes to the parent's stderr (a test's log)
  // instead of <dir>/stderr.log, and LogTail() is empty.
  void set_stderr_to_log(bool to_log) { stderr_to_log_ = to_log; }

  // Makes Start's directory <parent>/<name>.XXXXXX now, so that the caller
  // can put files there that the child's flags name; Start then uses it.
  absl::Status MakeDir(const std::string& name);

  // Runs `binary args... port_flag=<dir>/port` with stderr into <dir>/stderr.log
  // (<dir> = <parent>/<name>.XXXXXX, made here unless MakeDir made it) and
  // waits up to 30 s for the port file: then target() is 127.0.0.1:<port>.
  // An exit meanwhile reports the log.
  absl::Status Start(const std::string& binary, std::vector<std::string> args,
                     const std::string& port_flag, const std::string& name);
  // SIGTERM; OK if the child exits 0 within `timeout` (else SIGKILL and an
  // error).
  absl::Status Stop(std::chrono::seconds timeout = std::chrono::seconds(30));
  // The last 4000 bytes of the child's stderr.
  std::string LogTail() const;
  // Removes the log, the port file and their directory (after a run that passed).
  void RemoveFiles();

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  const std::string& target() const { return target_; }
  const std::string& log() const { return log_; }
  const std::string& dir() const { return dir_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string parent_ = "/tmp";
  std::vector<std::string> prefix_;
  bool stderr_to_log_ = true;
  bool dir_made_ = false;  // by MakeDir, for the next Start
  std::string dir_, log_, target_;
};

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_CHILD_PROCESS_H_
