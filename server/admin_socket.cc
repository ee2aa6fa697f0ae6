// The admin socket; see admin_socket.h.
#include "server/admin_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/server_posix.h"

namespace zenflow {

namespace {

const char* Env(const char* name) {
  const char* v = getenv(name);
  return v == nullptr ? "" : v;
}

// `dir` exists (made with mode 0700 when missing) and this process may make
// files in it.
bool UsableDir(const std::string& dir) {
  if (dir.empty()) return false;
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
  struct stat st;
  return stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
         access(dir.c_str(), W_OK | X_OK) == 0;
}

bool IsSocket(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the admin socket's path '", path, "' is empty or longer than a unix socket allows (",
        sizeof(addr.sun_path) - 1, " bytes): give a shorter --admin_socket"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// A generic call answered with PERMISSION_DENIED as soon as it starts.
class RefusingReactor final : public grpc::ServerGenericBidiReactor {
 public:
  explicit RefusingReactor(const std::string& why) {
    Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, why));
  }
  void OnDone() override { delete this; }
};

class RefusingService final : public grpc::CallbackGenericService {
 public:
  explicit RefusingService(std::string why) : why_(std::move(why)) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new RefusingReactor(why_);
  }

 private:
  const std::string why_;
};

// Drops every server plugin (reflection, ...) from a builder.
class NoPlugins final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
  }
};

}  // namespace

void WithoutAddedServices(grpc::ServerBuilder* builder) {
  builder->SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  builder->SetOption(std::make_unique<NoPlugins>());
}

std::string ResolveAdminSocketPath(const std::string& flag, const std::string& state_dir) {
  if (flag != "auto") return flag;
  if (getenv("ZENFLOW_ADMIN_SOCKET") != nullptr) return Env("ZENFLOW_ADMIN_SOCKET");
  const std::string runtime = Env("RUNTIME_DIRECTORY");  // several are separated by ':'
  if (!runtime.empty()) {
    return absl::StrCat(runtime.substr(0, runtime.find(':')), "/", kAdminSocketName);
  }
  if (UsableDir("/run/zenflowd")) return absl::StrCat("/run/zenflowd/", kAdminSocketName);
  const std::string xdg = Env("XDG_RUNTIME_DIR");
  if (!xdg.empty() && UsableDir(absl::StrCat(xdg, "/zenflowd"))) {
    return absl::StrCat(xdg, "/zenflowd/", kAdminSocketName);
  }
  if (!state_dir.empty()) return absl::StrCat(state_dir, "/", kAdminSocketName);
  return "";
}

std::string FindAdminSocket() {
  if (getenv("ZENFLOW_ADMIN_SOCKET") != nullptr) return Env("ZENFLOW_ADMIN_SOCKET");
  const std::string run = absl::StrCat("/run/zenflowd/", kAdminSocketName);
  if (IsSocket(run)) return run;
  const std::string xdg = Env("XDG_RUNTIME_DIR");
  if (!xdg.empty()) {
    const std::string path = absl::StrCat(xdg, "/zenflowd/", kAdminSocketName);
    if (IsSocket(path)) return path;
  }
  return "";
}

std::unique_ptr<grpc::CallbackGenericService> NewRefusingService(std::string why) {
  return std::make_unique<RefusingService>(std::move(why));
}

absl::StatusOr<std::unique_ptr<AdminSocket>> AdminSocket::Start(const std::string& path,
                                                                grpc::Server* admin,
                                                                grpc::Server* refusing,
                                                                AdminSocketOptions options) {
  absl::StatusOr<sockaddr_un> addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the admin socket's path ", path, " exists and is not a socket: remove it or give "
          "another --admin_socket"));
    }
    // A socket file: another daemon's, or one left by a daemon that is gone.
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = probe >= 0 && connect(probe, reinterpret_cast<const sockaddr*>(&*addr),
                                            sizeof(*addr)) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      return absl::FailedPreconditionError(absl::StrCat(
          "another process (another zenflowd?) listens on the admin socket ", path,
          ": stop it, or give this daemon another --admin_socket (empty: none)"));
    }
    unlink(path.c_str());
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket(): ", std::strerror(errno)));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0 ||
      chmod(path.c_str(), 0660) != 0 || listen(fd, 64) != 0) {
    const int err = errno;
    close(fd);
    unlink(path.c_str());
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot listen on the admin socket ", path, ": ", std::strerror(err),
        " (give --admin_socket a path in a directory the daemon may write, or empty for none)"));
  }
  std::unique_ptr<AdminSocket> s(new AdminSocket(path, fd, admin, refusing, std::move(options)));
  s->wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (s->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd(): ", std::strerror(errno)));
  }
  AdminSocket* raw = s.get();
  s->thread_ = std::thread([raw] { raw->AcceptLoop(); });
  return s;
}

AdminSocket::AdminSocket(std::string path, int fd, grpc::Server* admin, grpc::Server* refusing,
                         AdminSocketOptions options)
    : path_(std::move(path)),
      listen_fd_(fd),
      admin_(admin),
      refusing_(refusing),
      options_(std::move(options)),
      self_(geteuid()) {}

AdminSocket::~AdminSocket() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  // The file only when no one listens on it any more: another daemon may
  // have replaced a socket file it took for stale.
  if (IsSocket(path_)) {
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    absl::StatusOr<sockaddr_un> addr = UnixAddress(path_);
    const bool live = probe >= 0 && addr.ok() &&
                      connect(probe, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) == 0;
    if (probe >= 0) close(probe);
    if (!live) unlink(path_.c_str());
  }
}

void AdminSocket::PruneLocked() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    struct stat st;
    if (fstat(it->first, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != it->second.inode) {
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

int AdminSocket::admitted_open() {
  MutexLock lock(&mu_);
  PruneLocked();
  int n = 0;
  for (const auto& [fd, c] : conns_) n += c.admitted ? 1 : 0;
  return n;
}

int AdminSocket::refused_open() {
  MutexLock lock(&mu_);
  PruneLocked();
  int n = 0;
  for (const auto& [fd, c] : conns_) n += c.admitted ? 0 : 1;
  return n;
}

void AdminSocket::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    // gRPC's endpoint wants a non-blocking socket.
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    ucred peer{};
    socklen_t len = sizeof(peer);
    struct stat st;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || fstat(fd, &st) != 0) {
      close(fd);
      continue;
    }
    const bool admitted = AdmitsPeer(peer.uid, self_);
    if (!admitted && options_.on_refused) options_.on_refused(peer.uid, peer.pid);
    {
      MutexLock lock(&mu_);
      PruneLocked();
      int open = 0;
      for (const auto& [other, c] : conns_) open += c.admitted == admitted ? 1 : 0;
      if (open >= (admitted ? options_.max_admitted : options_.max_refused)) {
        close(fd);
        continue;
      }
      conns_[fd] = Conn{st.st_ino, admitted};
    }
    // gRPC owns the descriptor from here on, and closes it.
    grpc::AddInsecureChannelFromFd(admitted ? admin_ : refusing_, fd);
  }
}

}  // namespace zenflow
