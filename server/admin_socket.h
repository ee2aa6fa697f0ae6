// zenflowd's admin socket (docs/operating.md#the-admin-socket): a unix
// socket on the daemon's host where a peer that is root or the daemon's own
// user is the admin, without a token. The peer's user is the kernel's word
// (SO_PEERCRED, recorded when the peer connected), not anything the peer
// sends.
//
// The socket's listener is the daemon's own: it accepts each connection,
// reads the peer's credentials and hands the connection to one of two gRPC
// servers (grpc::AddInsecureChannelFromFd): an admitted peer to `admin` (a
// server whose ZenFlowService treats every call as the admin's), any other
// to a server whose every call ends with PERMISSION_DENIED saying why
// (NewRefusingService). A refused peer thus never reaches the service.
//
//   ZF_ASSIGN_OR_RETURN(auto sock, AdminSocket::Start(path, admin_server, refusing_server, {}));
//   ... sock.reset();  // stops accepting and removes the socket file
#ifndef ZENFLOW_SERVER_ADMIN_SOCKET_H_
#define ZENFLOW_SERVER_ADMIN_SOCKET_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"

namespace zenflow {

// The file name of the socket in the directories of the default rule.
inline constexpr char kAdminSocketName[] = "admin.sock";

// The default path rule of zenflowd --admin_socket=auto (docs/operating.md),
// the first that applies:
//   1. $ZENFLOW_ADMIN_SOCKET when set (empty: no admin socket);
//   2. $RUNTIME_DIRECTORY/admin.sock (systemd's RuntimeDirectory=, the
//      unit's /run/zenflowd);
//   3. /run/zenflowd/admin.sock when that directory exists or can be made
//      (mode 0700) and the daemon may write there (root);
//   4. $XDG_RUNTIME_DIR/zenflowd/admin.sock (a user's login session);
//   5. STATE_DIR/admin.sock with --state_dir;
//   6. none (empty).
// `flag` other than "auto" is returned as it is. Makes the directories of
// rules 3 and 4 when missing.
std::string ResolveAdminSocketPath(const std::string& flag, const std::string& state_dir);

// Where zfctl looks when given no --target: $ZENFLOW_ADMIN_SOCKET when set,
// else the first of /run/zenflowd/admin.sock and
// $XDG_RUNTIME_DIR/zenflowd/admin.sock that exists. Empty: none.
std::string FindAdminSocket();

// Whether a peer of user `peer` is the admin of a daemon running as `self`:
// root, or the same user.
inline bool AdmitsPeer(uid_t peer, uid_t self) { return peer == 0 || peer == self; }

// A gRPC generic service that ends every call with PERMISSION_DENIED and
// `why`.
std::unique_ptr<grpc::CallbackGenericService> NewRefusingService(std::string why);
// Keeps the services gRPC adds to every server (health checking, and the
// plugins such as reflection) off `builder`, so that the refusing server
// answers nothing but its refusal.
void WithoutAddedServices(grpc::ServerBuilder* builder);

struct AdminSocketOptions {
  // Connections open at once, admitted and refused counted apart, so that
  // refused peers cannot crowd out the admin. One more is closed at once.
  int max_admitted = 64;
  int max_refused = 8;
  // Called for each refused peer (uid, pid), for the audit log.
  std::function<void(uid_t, pid_t)> on_refused;
};

// Thread-safe. The servers outlive it.
class AdminSocket {
 public:
  // Binds `path` (mode 0660) and starts accepting. A socket file left by a
  // daemon that is gone is replaced; FAILED_PRECONDITION when a process
  // listens on it, or `path` exists and is not a socket.
  static absl::StatusOr<std::unique_ptr<AdminSocket>> Start(const std::string& path,
                                                            grpc::Server* admin,
                                                            grpc::Server* refusing,
                                                            AdminSocketOptions options);
  // Stops accepting and removes the socket file.
  ~AdminSocket();
  AdminSocket(const AdminSocket&) = delete;
  AdminSocket& operator=(const AdminSocket&) = delete;

  const std::string& path() const { return path_; }
  // Connections handed to the servers that are still open.
  int admitted_open();
  int refused_open();

 private:
  AdminSocket(std::string path, int fd, grpc::Server* admin, grpc::Server* refusing,
              AdminSocketOptions options);
  void AcceptLoop();
  // Forgets handed-over connections gRPC has closed.
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int listen_fd_;
  int wake_fd_ = -1;  // an eventfd that ends AcceptLoop
  grpc::Server* const admin_;
  grpc::Server* const refusing_;
  const AdminSocketOptions options_;
  const uid_t self_;
  // The connections handed over: fd -> (inode, admitted). gRPC owns and
  // closes them; a changed or missing inode says it did.
  struct Conn {
    ino_t inode;
    bool admitted;
  };
  Mutex mu_;
  std::map<int, Conn> conns_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_ADMIN_SOCKET_H_
