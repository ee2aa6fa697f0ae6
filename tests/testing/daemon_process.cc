// Test support: a real zenflowd child process; see daemon_process.h.
#include "tests/testing/daemon_process.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace zenflow::testing {

std::string DaemonProcess::BinaryPath() {
  if (const char* p = getenv("ZENFLOWD")) return p;
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    return absl::StrCat(srcdir, "/", ws != nullptr ? ws : "zenflow", "/server/zenflowd");
  }
  return "bazel-bin/server/zenflowd";
}

pid_t SpawnProcess(std::vector<std::string> args) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

absl::Status DaemonProcess::Start(const std::vector<std::string>& extra_flags) {
  const char* tmp = getenv("TEST_TMPDIR");
  std::string templ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/zenflowd.XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  dir_ = templ;
  const std::string port_file = dir_ + "/port";
  const std::string binary = BinaryPath();
  std::vector<std::string> args = prefix_;
  // The tests' token (TestClientOptions) is the test daemon's admin token:
  // tests read daemon-wide figures (GetStats without a job, UCX counts).
  // tests/auth_test gives its daemon another admin token (a later flag
  // wins) and checks job tokens, isolation and limits there.
  const std::string admin_file = dir_ + "/admin_token";
  {
    std::ofstream admin(admin_file);
    admin << "zenflow-test-token-0123456789\n";  // harness.h's kTestToken
  }
  args.insert(args.end(), {binary, "--listen=127.0.0.1:0", "--port_file=" + port_file,
                           "--admin_token_file=" + admin_file});
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  pid_ = SpawnProcess(args);
  if (pid_ < 0) return absl::InternalError("fork failed");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(port_file);
    if (in >> port_ && port_ > 0) return absl::OkStatus();
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("zenflowd (", binary, ") exited during start-up"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError("zenflowd did not start serving within 30 s");
}

absl::Status DaemonProcess::Stop() {
  if (pid_ <= 0) return absl::OkStatus();
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
      return absl::InternalError(absl::StrCat("zenflowd exited with status ", status));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return absl::DeadlineExceededError("zenflowd did not exit within 10 s of SIGTERM");
}

DaemonProcess::~DaemonProcess() { (void)Stop(); }

}  // namespace zenflow::testing
