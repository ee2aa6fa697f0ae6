// Child processes; see child_process.h.
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

// posix_spawn of args[0] with argv `args`; stderr into `log` unless it is empty.
// Returns 0 or the error number.
int Spawn(std::vector<std::string>& args, const std::string& log, pid_t* pid) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!log.empty()) {
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  const int rc = posix_spawn(pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc;
}

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

pid_t SpawnProcess(std::vector<std::string> args) {
  if (args.empty()) return -1;
  pid_t pid = -1;
  return Spawn(args, "", &pid) == 0 ? pid : -1;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::Status ChildProcess::MakeDir(const std::string& name) {
  dir_ = absl::StrCat(parent_, "/", name, ".XXXXXX");
  if (mkdtemp(dir_.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  dir_made_ = true;
  return absl::OkStatus();
}

absl::Status ChildProcess::Start(const std::string& binary, std::vector<std::string> args,
                                 const std::string& port_flag, const std::string& name) {
  if (!dir_made_) {
    absl::Status made = MakeDir(name);
    if (!made.ok()) return made;
  }
  dir_made_ = false;
  log_ = stderr_to_log_ ? dir_ + "/stderr.log" : "";
  const std::string port_file = dir_ + "/port";
  args.insert(args.begin(), binary);
  args.insert(args.begin(), prefix_.begin(), prefix_.end());
  args.push_back(absl::StrCat(port_flag, "=", port_file));
  const int rc = Spawn(args, log_, &pid_);
  if (rc != 0) {
    pid_ = -1;
    return absl::InternalError(absl::StrCat("cannot start ", args[0], ": ", std::strerror(rc)));
  }
  port_ = 0;
  target_.clear();
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      port_ = port;
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

absl::Status ChildProcess::Stop(std::chrono::seconds timeout) {
  if (pid_ <= 0) return absl::OkStatus();
  kill(pid_, SIGTERM);
  const auto deadline = Clock::now() + timeout;
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
  return absl::DeadlineExceededError(
      absl::StrCat("the child did not exit within ", timeout.count(), " s of SIGTERM"));
}

std::string ChildProcess::LogTail() const {
  if (log_.empty()) return "";
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
}

void ChildProcess::RemoveFiles() {
  if (!log_.empty()) unlink(log_.c_str());
  unlink((dir_ + "/port").c_str());
  rmdir(dir_.c_str());
}

}  // namespace zenflow
