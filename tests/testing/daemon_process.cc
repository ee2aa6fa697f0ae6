// Test support: a real zenflowd child process; see daemon_process.h.
#include "tests/testing/daemon_process.h"

#include <stdlib.h>

#include <chrono>
#include <fstream>

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

absl::Status DaemonProcess::Start(const std::vector<std::string>& extra_flags) {
  const char* tmp = getenv("TEST_TMPDIR");
  child_.set_parent_dir(tmp != nullptr ? tmp : "/tmp");
  // The daemon's stderr stays the test's, where a failure's log is read.
  child_.set_stderr_to_log(false);
  absl::Status made = child_.MakeDir("zenflowd");
  if (!made.ok()) return made;
  // The tests' token (TestClientOptions) is the test daemon's admin token:
  // tests read daemon-wide figures (GetStats without a job, UCX counts).
  // tests/auth_test gives its daemon another admin token (a later flag
  // wins) and checks job tokens, isolation and limits there.
  const std::string admin_file = child_.dir() + "/admin_token";
  {
    std::ofstream admin(admin_file);
    admin << "zenflow-test-token-0123456789\n";  // harness.h's kTestToken
  }
  std::vector<std::string> args = {"--listen=127.0.0.1:0", "--admin_token_file=" + admin_file};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  return child_.Start(BinaryPath(), std::move(args), "--port_file", "zenflowd");
}

absl::Status DaemonProcess::Stop() { return child_.Stop(std::chrono::seconds(10)); }

DaemonProcess::~DaemonProcess() { (void)Stop(); }

}  // namespace zenflow::testing
