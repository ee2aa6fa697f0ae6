// A server as a child process; see child_process.h.
#include "tools/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace zenflow {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

int64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      int64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
    std::getline(in, key);
  }
  return -1;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::Status ChildProcess::Start(const std::string& binary, std::vector<std::string> args,
                                 const std::string& port_flag, const std::string& name) {
  dir_ = absl::StrCat("/tmp/", name, ".XXXXXX");
  if (mkdtemp(dir_.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  log_ = dir_ + "/stderr.log";
  const std::string port_file = dir_ + "/port";
  args.insert(args.begin(), binary);
  args.push_back(absl::StrCat(port_flag, "=", port_file));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int rc = posix_spawn(&pid_, binary.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    pid_ = -1;
    return absl::InternalError(absl::StrCat("cannot start ", binary, ": ", std::strerror(rc)));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      target_ = absl::StrCat("127.0.0.1:", port);
      return absl::OkStatus();
    }
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(
          absl::StrCat(binary, " exited during start-up; its log:\n", LogTail()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(binary, " did not serve within 30 s"));
}

absl::Status ChildProcess::Stop() {
  if (pid_ <= 0) return absl::OkStatus();
  kill(pid_, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  int status = 0;
  while (Clock::now() < deadline) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
      return absl::InternalError(absl::StrCat("the child exited with wait status ", status));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return absl::DeadlineExceededError("the child did not exit within 30 s of SIGTERM");
}

std::string ChildProcess::LogTail() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
}

void ChildProcess::RemoveFiles() {
  unlink(log_.c_str());
  unlink((dir_ + "/port").c_str());
  rmdir(dir_.c_str());
}

}  // namespace zenflow
