// zfctl's connection to one zenflowd: over its admin socket (on the
// daemon's host, as root or the daemon's user: the admin, no token), or its
// gRPC address with a token. The four calls zfctl makes, with deadlines, and
// errors that say what to do.
//
//   ZF_ASSIGN_OR_RETURN(Daemon d, Daemon::Open(ChooseEndpoint()));
//   absl::StatusOr<v1::GetStatsResponse> s = d.GetStats("");
//   if (!s.ok()) return d.Fail("stats", s.status());
#ifndef ZENFLOW_TOOLS_ZFCTL_DAEMON_H_
#define ZENFLOW_TOOLS_ZFCTL_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "zenflow/v1/zenflow.grpc.pb.h"

namespace zenflow::ctl {

// Where zfctl calls: --target when given (one HOST:PORT, or for `stats`
// several), else the admin socket (--admin_socket, or the default rule of
// server/admin_socket.h FindAdminSocket) when it exists, else
// 127.0.0.1:50051.
struct Endpoint {
  std::string target;       // HOST:PORT, or "unix:PATH" for the admin socket
  bool admin_socket = false;
};
absl::StatusOr<Endpoint> ChooseEndpoint();

// One daemon. Not thread-safe (zfctl makes one call at a time).
class Daemon {
 public:
  // Connects within --timeout_s, with --token_file and the TLS flags for a
  // gRPC address.
  static absl::StatusOr<Daemon> Open(const Endpoint& where);

  // What the daemon is, for messages: "zenflowd at 127.0.0.1:50051" or
  // "zenflowd's admin socket /run/zenflowd/admin.sock".
  const std::string& name() const { return name_; }
  bool admin_socket() const { return endpoint_.admin_socket; }

  absl::StatusOr<v1::GetJobResponse> GetJob(const std::string& job_id);
  absl::Status DeleteJob(const std::string& job_id);
  absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& job_id);
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& job_id);

  // Prints "zfctl SUB: NAME: CODE: message" and what to do on stderr;
  // returns the exit status (1).
  int Fail(const char* sub, const absl::Status& s) const;

 private:
  Daemon() = default;
  void Prepare(grpc::ClientContext* ctx, absl::Duration deadline) const;

  Endpoint endpoint_;
  std::string name_;
  std::string token_;
  std::unique_ptr<Client> client_;  // for a gRPC address (owns its channel)
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::ZenFlow::Stub> stub_;
};

// What to do about `s` from `daemon` (empty when there is nothing to add).
std::string Hint(const absl::Status& s, bool admin_socket);

// Prints a failure before any daemon answered (a bad flag, no connection).
int FailEarly(const char* sub, const absl::Status& s);

}  // namespace zenflow::ctl

#endif  // ZENFLOW_TOOLS_ZFCTL_DAEMON_H_
