// zenflowd as a systemd service: the unit in deploy/systemd passes
// `systemd-analyze verify` and rates at most 4.0 in `systemd-analyze
// security`, and loads the TLS files the shipped flags name; a real zenflowd
// speaks the notify protocol (READY=1, periodic WATCHDOG=1, STOPPING=1) to a
// notify socket the test binds, also with client certificates required,
// reads its flags from a flag file (and the shipped one serves TLS beyond
// loopback), refuses a port another daemon holds, and prints its version.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "server/version.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/files.h"
#include "tests/testing/harness.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_certs.h"

extern char** environ;

namespace zenflow::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return path;  // run from the workspace root
  return absl::StrCat(srcdir, "/", ws != nullptr ? ws : "zenflow", "/", path);
}

// A fresh directory, removed with everything in it on destruction. Under
// TEST_TMPDIR when that is short: a notify socket's path must fit in
// sockaddr_un (108 bytes).
class ScopedTempDir {
 public:
  ScopedTempDir() {
    const char* tmp = getenv("TEST_TMPDIR");
    std::string templ = absl::StrCat(tmp != nullptr && strlen(tmp) < 64 ? tmp : "/tmp",
                                     "/zf_systemd.XXXXXX");
    if (mkdtemp(templ.data()) != nullptr) path_ = templ;
  }
  ~ScopedTempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::string& path() const { return path_; }  // empty if mkdtemp failed

 private:
  std::string path_;
};

struct SpawnOptions {
  std::string stdout_path;  // empty: inherited
  std::string stderr_path;  // empty: inherited
  std::vector<std::string> env;  // added to (and replacing) the test's environment
  // Sets WATCHDOG_PID to the child's own pid, as systemd does.
  bool watchdog_pid = false;
};

// fork + execve; the child only calls async-signal-safe functions.
pid_t Spawn(std::vector<std::string> args, const SpawnOptions& o) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool replaced = name == "NOTIFY_SOCKET" || absl::StartsWith(name, "WATCHDOG_");
    for (const std::string& add : o.env) replaced |= absl::StartsWith(add, name + "=");
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), o.env.begin(), o.env.end());
  std::string pid_var = "WATCHDOG_PID=" + std::string(20, '\0');
  if (o.watchdog_pid) env.push_back(pid_var);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  char* pid_digits = o.watchdog_pid ? envp[envp.size() - 2] + strlen("WATCHDOG_PID=") : nullptr;
  const int out = o.stdout_path.empty()
                      ? -1
                      : open(o.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = o.stderr_path.empty()
                      ? -1
                      : open(o.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = fork();
  if (pid == 0) {
    if (out >= 0) dup2(out, 1);
    if (err >= 0) dup2(err, 2);
    if (pid_digits != nullptr) {
      char rev[20];
      int n = 0;
      for (pid_t p = getpid(); p > 0; p /= 10) rev[n++] = static_cast<char>('0' + p % 10);
      for (int i = 0; i < n; ++i) pid_digits[i] = rev[n - 1 - i];
      pid_digits[n] = '\0';
    }
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (out >= 0) close(out);
  if (err >= 0) close(err);
  return pid;
}

// A child process, killed (SIGKILL) and reaped on destruction unless it was
// reaped already: a failed assertion leaves no daemon behind.
class Child {
 public:
  Child(std::vector<std::string> args, const SpawnOptions& o) : pid_(Spawn(std::move(args), o)) {}
  ~Child() {
    if (running()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool running() const { return pid_ > 0 && !status_.has_value(); }
  void Signal(int sig) {
    if (running()) kill(pid_, sig);
  }
  // The wait status once it exits (polled for up to `timeout`), or nullopt.
  std::optional<int> Wait(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (running() && Clock::now() < deadline) {
      Poll();
      if (running()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }
  // The port in `port_file` once the daemon writes it (up to 30 s), or 0 if
  // it does not, or exits first.
  int WaitForPort(const std::string& port_file) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (running() && Clock::now() < deadline) {
      std::ifstream in(port_file);
      int port = 0;
      if (in >> port && port > 0) return port;
      Poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }

 private:
  void Poll() {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) status_ = status;
  }
  pid_t pid_;
  std::optional<int> status_;
};

bool ExitedZero(const std::optional<int>& status) {
  return status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

absl::Status AnswersGetStats(int port) {
  ClientOptions co;
  co.target = absl::StrCat("127.0.0.1:", port);
  co.token = kTestToken;
  co.connect_timeout = absl::Seconds(30);
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(co));
  return c->GetStats().status();
}

struct Command {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Command RunCommand(const std::vector<std::string>& args, const std::string& dir) {
  SpawnOptions o;
  o.stdout_path = dir + "/stdout.txt";
  o.stderr_path = dir + "/stderr.txt";
  Command c;
  Child child(args, o);
  const std::optional<int> status = child.Wait(std::chrono::seconds(120));
  if (!status.has_value()) {
    c.output = "(timed out)";
    return c;
  }
  c.exit_code = WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  c.output = ReadFile(o.stdout_path) + ReadFile(o.stderr_path);
  return c;
}

std::string SystemdAnalyze() {
  for (const char* p : {"/usr/bin/systemd-analyze", "/bin/systemd-analyze"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

const char kUnit[] = "deploy/systemd/zenflowd.service";
const char kInstalledBinary[] = "/usr/local/bin/zenflowd";

// `systemd-analyze verify` checks that ExecStart's program exists, and the
// unit names where it is installed: the test verifies a copy whose only
// change is that path, pointing at the zenflowd just built.
TEST(SystemdUnitTest, VerifyPrintsNothing) {
  const std::string analyze = SystemdAnalyze();
  ASSERT_FALSE(analyze.empty()) << "systemd-analyze not found: install systemd (./zf setup)";
  const std::string unit = ReadFile(Runfile(kUnit));
  ASSERT_FALSE(unit.empty()) << Runfile(kUnit);
  const std::string exec = absl::StrCat("\nExecStart=", kInstalledBinary, " ");
  const size_t at = unit.find(exec);
  ASSERT_NE(at, std::string::npos) << "the unit's ExecStart is not " << kInstalledBinary;
  ASSERT_EQ(unit.find(exec, at + 1), std::string::npos) << "more than one ExecStart";
  char binary[PATH_MAX];
  ASSERT_NE(realpath(DaemonProcess::BinaryPath().c_str(), binary), nullptr);
  std::string copy = unit;
  copy.replace(at, exec.size(), absl::StrCat("\nExecStart=", binary, " "));
  ScopedTempDir tmp;
  const std::string& dir = tmp.path();
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/zenflowd.service";  // the unit's name is the file's
  ASSERT_TRUE(WriteFile(path, copy));
  const Command c = RunCommand({analyze, "verify", path}, dir);
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(c.output, "");
}

// Each TLS file the shipped flags name is one the unit loads as a
// credential (LoadCredential=NAME:/etc/zenflowd/tls/NAME), where systemd
// puts credentials.
TEST(SystemdUnitTest, TlsFilesAreTheUnitsCredentials) {
  const std::string unit = ReadFile(Runfile(kUnit));
  const std::string flags = ReadFile(Runfile("deploy/systemd/zenflowd.flags"));
  ASSERT_FALSE(unit.empty());
  ASSERT_FALSE(flags.empty());
  const std::string dir = "/run/credentials/zenflowd.service/";
  int named = 0;
  std::istringstream lines(flags);
  for (std::string line; std::getline(lines, line);) {
    for (const char* flag : {"--tls_cert=", "--tls_key=", "--tls_ca="}) {
      if (!absl::StartsWith(line, flag)) continue;
      ++named;
      const std::string path = line.substr(strlen(flag));
      ASSERT_TRUE(absl::StartsWith(path, dir)) << line;
      const std::string name = path.substr(dir.size());
      EXPECT_TRUE(absl::StrContains(
          unit, absl::StrCat("\nLoadCredential=", name, ":/etc/zenflowd/tls/", name, "\n")))
          << line << " is not loaded by the unit";
    }
  }
  EXPECT_EQ(named, 3) << "the shipped flags do not give --tls_cert, --tls_key and --tls_ca";
}

TEST(SystemdUnitTest, SecurityExposureAtMostFour) {
  const std::string analyze = SystemdAnalyze();
  ASSERT_FALSE(analyze.empty()) << "systemd-analyze not found: install systemd (./zf setup)";
  ScopedTempDir tmp;
  const std::string& dir = tmp.path();
  ASSERT_FALSE(dir.empty());
  const Command c =
      RunCommand({analyze, "security", "--offline=true", "--no-pager", Runfile(kUnit)}, dir);
  const std::string key = "Overall exposure level for zenflowd.service: ";
  const size_t at = c.output.find(key);
  ASSERT_NE(at, std::string::npos) << c.output;
  const double level = std::strtod(c.output.c_str() + at + key.size(), nullptr);
  std::cerr << c.output.substr(at, c.output.find('\n', at) - at) << "\n";
  EXPECT_GT(level, 0.0) << c.output;
  EXPECT_LE(level, 4.0) << c.output;
}

// TimeoutStopSec= leaves zenflowd the time a SIGTERM checkpoint of the
// unit's MemoryMax= takes at the measured write rate (deploy/stop_timeout.py
// applies the rule of docs/operating.md#stop-timeouts), and the same check
// fails a copy with the 20 s the unit had before.
TEST(SystemdUnitTest, StopTimeoutCoversACheckpointOfMemoryMax) {
  ScopedTempDir tmp;
  const std::string& dir = tmp.path();
  ASSERT_FALSE(dir.empty());
  const std::vector<std::string> check = {"/usr/bin/python3", Runfile("deploy/stop_timeout.py"),
                                          "--checkpoint_json=" +
                                              Runfile("bench-results/checkpoint.json")};
  std::vector<std::string> args = check;
  args.push_back("--systemd_unit=" + Runfile(kUnit));
  const Command ok = RunCommand(args, dir);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  std::cerr << ok.output;

  std::string unit = ReadFile(Runfile(kUnit));
  const size_t at = unit.find("\nTimeoutStopSec=");
  ASSERT_NE(at, std::string::npos) << "the unit sets no TimeoutStopSec=";
  unit.replace(at, unit.find('\n', at + 1) - at, "\nTimeoutStopSec=20s");
  ASSERT_TRUE(WriteFile(dir + "/short.service", unit));
  args = check;
  args.push_back("--systemd_unit=" + dir + "/short.service");
  const Command short_one = RunCommand(args, dir);
  EXPECT_EQ(short_one.exit_code, 1) << short_one.output;
  EXPECT_TRUE(absl::StrContains(short_one.output, "TimeoutStopSec=20s is shorter than"))
      << short_one.output;
}

// A datagram socket standing in for systemd's notify socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) return;
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~NotifySocket() {
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  bool ok() const { return fd_ >= 0; }

  // The next message (one datagram may carry several lines), or "" after
  // `timeout`.
  std::string Next(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return "";
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, n) : "";
  }

  // Waits (up to 30 s) until `count` messages contain `line`, keeping all.
  bool WaitFor(const std::string& line, int count) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    int seen = 0;
    while (Clock::now() < deadline) {
      const std::string m = Next(std::chrono::milliseconds(200));
      if (m.empty()) continue;
      log_.push_back(m);
      if (absl::StrContains(m, line) && ++seen == count) return true;
    }
    return false;
  }
  std::string Log() const {
    std::string s;
    for (const std::string& m : log_) absl::StrAppend(&s, "[", m, "] ");
    return s;
  }
  const std::vector<std::string>& log() const { return log_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<std::string> log_;
};

TEST(SystemdNotifyTest, ReadyWatchdogPingsAndStopping) {
  ScopedTempDir tmp;
  const std::string& dir = tmp.path();
  ASSERT_FALSE(dir.empty());
  NotifySocket notify(dir + "/notify");
  ASSERT_TRUE(notify.ok()) << dir;
  SpawnOptions o;
  o.env = {"NOTIFY_SOCKET=" + dir + "/notify", "WATCHDOG_USEC=200000"};
  o.watchdog_pid = true;
  Child daemon({DaemonProcess::BinaryPath(), "--listen=127.0.0.1:0", "--ucx=false",
                "--port_file=" + dir + "/port"},
               o);
  ASSERT_TRUE(daemon.running());
  ASSERT_TRUE(notify.WaitFor("READY=1", 1)) << notify.Log();
  // Nothing before READY=1: the watchdog starts once the daemon serves.
  EXPECT_EQ(notify.log().size(), 1u) << notify.Log();
  // Each ping follows an answered health check (every 200 ms / 3).
  EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", 2)) << notify.Log();
  EXPECT_GT(daemon.WaitForPort(dir + "/port"), 0);
  daemon.Signal(SIGTERM);
  EXPECT_TRUE(notify.WaitFor("STOPPING=1", 1)) << notify.Log();
  EXPECT_TRUE(ExitedZero(daemon.Wait(std::chrono::seconds(30))))
      << "zenflowd did not exit 0 within 30 s of SIGTERM";
}

// With TLS and client certificates required on --listen, the watchdog's
// health check still answers: it dials the server's local unix socket, made
// in a private directory under systemd's RuntimeDirectory= and removed at
// exit.
TEST(SystemdNotifyTest, WatchdogPingsWithClientCertificatesRequired) {
  ScopedTempDir tmp;
  const std::string& dir = tmp.path();
  ASSERT_FALSE(dir.empty());
  ScopedTempDir certs;
  ASSERT_FALSE(certs.path().empty());
  absl::StatusOr<TestPki> pki = TestPki::Create(certs.path());
  ASSERT_OK(pki.status());
  const std::string runtime = dir + "/run";
  ASSERT_EQ(mkdir(runtime.c_str(), 0755), 0);
  NotifySocket notify(dir + "/notify");
  ASSERT_TRUE(notify.ok()) << dir;
  SpawnOptions o;
  o.env = {"NOTIFY_SOCKET=" + dir + "/notify", "WATCHDOG_USEC=200000",
           "RUNTIME_DIRECTORY=" + runtime};
  o.watchdog_pid = true;
  o.stderr_path = dir + "/stderr";
  Child daemon({DaemonProcess::BinaryPath(), "--listen=127.0.0.1:0", "--ucx=false",
                "--port_file=" + dir + "/port", "--tls_cert=" + pki->server.cert,
                "--tls_key=" + pki->server.key, "--tls_ca=" + pki->ca},
               o);
  ASSERT_TRUE(daemon.running());
  ASSERT_TRUE(notify.WaitFor("READY=1", 1)) << notify.Log() << ReadFile(o.stderr_path);
  EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", 2)) << notify.Log() << ReadFile(o.stderr_path);
  // One private directory (0700) holding the socket.
  std::vector<std::filesystem::directory_entry> entries;
  for (const auto& e : std::filesystem::directory_iterator(runtime)) entries.push_back(e);
  ASSERT_EQ(entries.size(), 1u);
  struct stat st;
  ASSERT_EQ(stat(entries[0].path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((entries[0].path() / "grpc.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_TRUE(absl::StrContains(ReadFile(o.stderr_path),
                                "systemd watchdog: health check on unix:" + entries[0].path().string()))
      << ReadFile(o.stderr_path);
  daemon.Signal(SIGTERM);
  EXPECT_TRUE(notify.WaitFor("STOPPING=1", 1)) << notify.Log();
  EXPECT_TRUE(ExitedZero(daemon.Wait(std::chrono::seconds(30))))
      << "zenflowd did not exit 0 within 30 s of SIGTERM: " << ReadFile(o.stderr_path);
  EXPECT_TRUE(std::filesystem::is_empty(runtime)) << "the socket's directory is left behind";
}

TEST(SystemdDaemonTest, SecondDaemonOnTakenPortFails) {
  DaemonProcess first;
  ASSERT_OK(first.Start({"--ucx=false"}));
  ScopedTempDir tmp;
  const std::string& dir = tmp.path();
  ASSERT_FALSE(dir.empty());
  const std::string address = first.target();  // 127.0.0.1:<port>
  SpawnOptions o;
  o.stderr_path = dir + "/stderr";
  Child second({DaemonProcess::BinaryPath(), "--listen=" + address, "--ucx=false"}, o);
  const std::optional<int> status = second.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value()) << "the second zenflowd serves on a taken port";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << *status;
  const std::string err = ReadFile(o.stderr_path);
  EXPECT_TRUE(absl::StrContains(
      err, absl::StrCat("cannot listen on ", address,
                        ": the address is already in use (another process listens on it)")))
      << err;
  // The first daemon still serves.
  EXPECT_EQ(AnswersGetStats(first.port()), absl::OkStatus());
  EXPECT_EQ(first.Stop(), absl::OkStatus());
}

TEST(SystemdDaemonTest, FlagFile) {
  ScopedTempDir tmp;
  const std::string& dir = tmp.path();
  ASSERT_FALSE(dir.empty());
  const std::string flags = dir + "/zenflowd.flags";
  ASSERT_TRUE(WriteFile(flags, absl::StrCat("# a comment, then an empty line\n\n",
                                            "--listen=127.0.0.1:0\n", "  --ucx=false\n",
                                            "--port_file=", dir, "/port\n")));
  Child daemon({DaemonProcess::BinaryPath(), "--flagfile=" + flags}, {});
  const int port = daemon.WaitForPort(dir + "/port");
  ASSERT_GT(port, 0) << "zenflowd did not serve with " << flags;
  EXPECT_EQ(AnswersGetStats(port), absl::OkStatus());
  daemon.Signal(SIGTERM);
  EXPECT_TRUE(ExitedZero(daemon.Wait(std::chrono::seconds(30))));
}

// Every flag in the shipped flag file exists and its value parses; only the
// host's own settings (the addresses, the interface and the state directory)
// are overridden.
TEST(SystemdDaemonTest, ShippedFlagFileParses) {
  DaemonProcess d;
  ScopedTempDir state;
  ASSERT_FALSE(state.path().empty());
  // The daemon-wide figures below are the admin's to read.
  const std::string admin = "systemd-test-admin-token-0123";
  ASSERT_TRUE(WriteFile(state.path() + "/admin_token", admin + "\n"));
  // The file's TLS paths are where systemd puts the unit's credentials:
  // certificates made here stand in for them. Its --listen is a
  // documentation address; every interface (0.0.0.0) stands in for it, so
  // that the daemon starting proves the file serves beyond loopback without
  // --allow_insecure (TLS, UCX on lo, metrics on loopback).
  const std::string flags = ReadFile(Runfile("deploy/systemd/zenflowd.flags"));
  EXPECT_FALSE(absl::StrContains(flags, "\n--allow_insecure")) << "the shipped flags allow plaintext";
  for (const char* f : {"tls_cert", "tls_key", "tls_ca"}) {
    EXPECT_TRUE(absl::StrContains(
        flags, absl::StrCat("\n--", f, "=/run/credentials/zenflowd.service/")))
        << "--" << f << " is not one of the unit's credentials (LoadCredential=)";
  }
  ScopedTempDir certs;
  ASSERT_FALSE(certs.path().empty());
  absl::StatusOr<TestPki> pki = TestPki::Create(certs.path());
  ASSERT_OK(pki.status());
  ASSERT_OK(d.Start({"--flagfile=" + Runfile("deploy/systemd/zenflowd.flags"),
                     "--listen=0.0.0.0:0", "--tls_cert=" + pki->server.cert,
                     "--tls_key=" + pki->server.key, "--tls_ca=" + pki->ca,
                     "--metrics_listen=127.0.0.1:0", "--state_dir=" + state.path(),
                     "--admin_token_file=" + state.path() + "/admin_token"}));
  ClientOptions co;
  co.target = d.target();
  co.token = admin;
  co.tls_ca = pki->ca;
  co.tls_cert = pki->client.cert;
  co.tls_key = pki->client.key;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(co);
  ASSERT_OK(c.status());
  absl::StatusOr<v1::GetStatsResponse> stats = (*c)->GetStats();
  ASSERT_OK(stats.status());
  EXPECT_EQ(stats->update_threads(), 8);  // from the file
  EXPECT_EQ(stats->ucx().transports(), "tcp,self");
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

TEST(SystemdDaemonTest, Version) {
  ScopedTempDir tmp;
  const std::string& dir = tmp.path();
  ASSERT_FALSE(dir.empty());
  const Command c = RunCommand({DaemonProcess::BinaryPath(), "--version"}, dir);
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_TRUE(absl::StartsWith(c.output, absl::StrCat("zenflowd ", kZenflowVersion, " (commit ")))
      << c.output;
}

}  // namespace
}  // namespace zenflow::testing
