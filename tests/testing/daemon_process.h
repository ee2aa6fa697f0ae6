// Test support: runs a real zenflowd process on a free loopback port and
// stops it (SIGTERM, then checks it exited cleanly). The process itself is
// tools/child_process.h's ChildProcess; this adds what tests need of a
// daemon: its binary from the runfiles, the tests' admin token, a directory
// under TEST_TMPDIR and its stderr in the test's log.
//
//   DaemonProcess d;
//   ASSERT_TRUE(d.Start().ok());
//   auto client = Client::Connect({.target = d.target()});
#ifndef ZENFLOW_TESTS_TESTING_DAEMON_PROCESS_H_
#define ZENFLOW_TESTS_TESTING_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/child_process.h"

namespace zenflow::testing {

// Starts args[0] with args as its argv; the child's pid or -1
// (tools/child_process.h).
using ::zenflow::SpawnProcess;

// Not thread-safe. The destructor stops the daemon if it still runs.
class DaemonProcess {
 public:
  DaemonProcess() = default;
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // A program that execs the rest of its arguments in its own process (so
  // that the pid stays the daemon's), e.g. {"/usr/bin/prlimit", "--as=N", "--"}.
  void set_command_prefix(std::vector<std::string> prefix) {
    child_.set_command_prefix(std::move(prefix));
  }

  // Starts `zenflowd --listen=127.0.0.1:0 <extra_flags>` and waits (up to
  // 30 s) until it serves.
  absl::Status Start(const std::vector<std::string>& extra_flags = {});
  // SIGTERM; returns an error unless the daemon exits 0 within 10 s.
  absl::Status Stop();

  std::string target() const { return "127.0.0.1:" + std::to_string(port()); }
  int port() const { return child_.port(); }
  pid_t pid() const { return child_.pid(); }

  // Path of the zenflowd binary (runfiles under Bazel, or $ZENFLOWD).
  static std::string BinaryPath();

 private:
  ChildProcess child_;
};

}  // namespace zenflow::testing

#endif  // ZENFLOW_TESTS_TESTING_DAEMON_PROCESS_H_
