// gRPC adapter of zenflowd: the zenflow.v1.ZenFlow callback service over a
// JobRegistry, and the server that hosts it (health checking, reflection,
// explicit message size limits).
//
//   ServerOptions opts; opts.listen = "127.0.0.1:0";
//   ZF_ASSIGN_OR_RETURN(std::unique_ptr<ZenFlowServer> server, ZenFlowServer::Start(opts));
//   server->Wait();
#ifndef ZENFLOW_SERVER_SERVICE_H_
#define ZENFLOW_SERVER_SERVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/ucx.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/audit.h"
#include "server/auth.h"
#include "server/exposure.h"
#include "server/registry.h"
#include "zenflow/v1/zenflow.grpc.pb.h"

namespace zenflow {

class AdminSocket;
class Checkpointer;
class IdleJobReaper;
class HealthProbeServer;
class MetricsServer;
class UcxDataPlane;

// Converts at the RPC boundary; the codes are the same numbers.
grpc::Status ToGrpcStatus(const absl::Status& s);

// The interceptor that counts every finished call by method and status
// code (zenflow_grpc_calls_total) in `registry`.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewCallCounterFactory(
    JobRegistry* registry);

// The callback service, with UploadParameters and Stream taking raw bytes:
// the service parses them itself, so that an unparseable message gets a
// precise answer instead of looking like the end of the stream.
using ZenFlowServiceBase = v1::ZenFlow::WithCallbackMethod_CreateJob<
    v1::ZenFlow::WithRawCallbackMethod_UploadParameters<v1::ZenFlow::WithCallbackMethod_JoinJob<
        v1::ZenFlow::WithCallbackMethod_GetJob<v1::ZenFlow::WithCallbackMethod_DeleteJob<
            v1::ZenFlow::WithCallbackMethod_GetStats<v1::ZenFlow::WithCallbackMethod_SubmitImportance<
                v1::ZenFlow::WithCallbackMethod_HandOff<v1::ZenFlow::WithCallbackMethod_AllReduce<
                    v1::ZenFlow::WithRawCallbackMethod_Stream<
                        v1::ZenFlow::WithCallbackMethod_Checkpoint<
                            v1::ZenFlow::WithCallbackMethod_GetState<
                                v1::ZenFlow::WithCallbackMethod_SetState<
                                    v1::ZenFlow::Service>>>>>>>>>>>>>;

// Who called, as one RPC's context says: its credential (server/auth.h),
// its address and its TLS identity (a client certificate's names).
struct Who {
  Caller caller;
  std::string peer;
  std::string identity;
};

// A Stream or UploadParameters call that has not sent its first message:
// ended after the service's attach timeout, so that an idle call does not
// hold one of --max_streams for ever.
class IdleCall {
 public:
  // The DEADLINE_EXCEEDED an expired call ends with: no `what` (its first
  // message) within `waited`.
  static absl::Status NoFirstMessage(const char* what, absl::Duration waited);

  virtual ~IdleCall() = default;
  // The sweep: ends the call (Expire) unless its first message arrived;
  // true if it ended it. Exactly one of this and FirstMessage wins.
  bool ExpireIfIdle(absl::Duration waited) {
    int idle = kIdle;
    if (!state_.compare_exchange_strong(idle, kExpired)) return false;
    Expire(waited);
    return true;
  }

 protected:
  // The call's first message arrived: false if the sweep ended it first.
  bool FirstMessage() {
    int idle = kIdle;
    return state_.compare_exchange_strong(idle, kStarted) || idle != kExpired;
  }
  // Ends the call with DEADLINE_EXCEEDED, saying why.
  virtual void Expire(absl::Duration waited) = 0;

 private:
  enum { kIdle, kStarted, kExpired };
  std::atomic<int> state_{kIdle};
};

// Thread-safe (all state lives in the registry).
class ZenFlowService final : public ZenFlowServiceBase {
 public:
  // `ucx` may be null (no UCX data plane; `no_ucx_reason` says why).
  // `checkpointer` may be null (no --state_dir). `auth` and `audit` outlive
  // the service; at most `max_streams` Stream and UploadParameters calls
  // are open at once, and each must send its first message within
  // `attach_timeout` (zero: no limit).
  ZenFlowService(JobRegistry* registry, UcxDataPlane* ucx, std::string no_ucx_reason,
                 Checkpointer* checkpointer, const Authenticator* auth, AuditLog* audit,
                 int max_streams, absl::Duration attach_timeout);
  ~ZenFlowService() override;

  // Makes every call the admin's, for the service behind the admin socket
  // (server/admin_socket.h), whose listener admits only trusted peers;
  // `where` is the peer the audit log names. Before the server starts.
  void ServeAsAdmin(std::string where) { admin_transport_ = std::move(where); }

  // Idle calls: Watch registers one (until Unwatch, or it is expired).
  uint64_t Watch(std::weak_ptr<IdleCall> call);
  void Unwatch(uint64_t id);

  // For the stream reactors: see the private methods of the same names.
  Who Identify(grpc::CallbackServerContext* ctx) const;
  absl::StatusOr<std::shared_ptr<Job>> Authorize(const Who& who, const std::string& job_id,
                                                 const char* call);
  void Audit(const Who& who, const char* event, const std::string& job_id,
             const absl::Status& result) {
    audit_->Record(event, "", job_id, who.peer, who.identity, who.caller, result);
  }
  // Stream and upload slots (max_streams); Release gives one back.
  bool AcquireStream();
  void ReleaseStream() { streams_.fetch_sub(1); }
  int max_streams() const { return max_streams_; }

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* ctx,
                                      const v1::CreateJobRequest* req,
                                      v1::CreateJobResponse* resp) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadParameters(grpc::CallbackServerContext* ctx,
                                                              grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* JoinJob(grpc::CallbackServerContext* ctx,
                                    const v1::JoinJobRequest* req,
                                    v1::JoinJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* req,
                                   v1::GetJobResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::GetStatsRequest* req,
                                     v1::GetStatsResponse* resp) override;
  grpc::ServerUnaryReactor* SubmitImportance(grpc::CallbackServerContext* ctx,
                                             const v1::SubmitImportanceRequest* req,
                                             v1::SubmitImportanceResponse* resp) override;
  grpc::ServerUnaryReactor* HandOff(grpc::CallbackServerContext* ctx,
                                    const v1::HandOffRequest* req,
                                    v1::HandOffResponse* resp) override;
  grpc::ServerUnaryReactor* AllReduce(grpc::CallbackServerContext* ctx,
                                      const v1::AllReduceRequest* req,
                                      v1::AllReduceResponse* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const v1::CheckpointRequest* req,
                                       v1::CheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* GetState(grpc::CallbackServerContext* ctx,
                                     const v1::GetStateRequest* req,
                                     v1::GetStateResponse* resp) override;
  grpc::ServerUnaryReactor* SetState(grpc::CallbackServerContext* ctx,
                                     const v1::SetStateRequest* req,
                                     v1::SetStateResponse* resp) override;

 private:
  // CreateJob's ALREADY_EXISTS: the job's own token learns what holds the
  // id and what to do; any other only that it is taken (docs/security.md).
  absl::Status TakenIdError(const Who& who, const std::string& job_id);
  // DeleteJob with finished_rank (docs/protocol.md, "When a job ends").
  void FinishRank(grpc::ServerUnaryReactor* reactor, const Who& who,
                  const std::shared_ptr<Job>& job, const v1::DeleteJobRequest* req,
                  v1::DeleteJobResponse* resp);
  // Finishes a unary call, counting a rejection.
  void Finish(grpc::ServerUnaryReactor* reactor, const absl::Status& s, Job* job,
              const char* reason);
  // Looks up the request's job and checks the request's size: null with
  // *job set, or the default reactor already finished with the error.
  template <typename Request>
  grpc::ServerUnaryReactor* LookUp(grpc::CallbackServerContext* ctx, const Request& req,
                                   std::shared_ptr<Job>* job);

  JobRegistry* registry_;
  UcxDataPlane* ucx_;
  std::string no_ucx_reason_;
  Checkpointer* const checkpointer_;
  const Authenticator* const auth_;
  AuditLog* const audit_;
  std::string admin_transport_;  // ServeAsAdmin's `where`; empty: a normal listener
  const int max_streams_;
  std::atomic<int> streams_{0};
  const absl::Duration attach_timeout_;
  // Idle calls by id, with their deadlines; a thread ends those past it.
  struct Watched {
    absl::Time deadline;
    std::weak_ptr<IdleCall> call;
  };
  Mutex idle_mu_;
  std::map<uint64_t, Watched> idle_ ABSL_GUARDED_BY(idle_mu_);
  uint64_t next_idle_ ABSL_GUARDED_BY(idle_mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(idle_mu_) = false;
  std::thread sweeper_;
};

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // host:port; port 0 picks a free one
  RegistryOptions registry;
  int64_t max_message_bytes = int64_t{512} << 20;  // service limit (gRPC: 2x)
  bool ucx = true;  // offer the UCX data plane (ranks choose it at attach)
  UcxOptions ucx_options;
  int ucx_dispatch_threads = 2;  // threads handling UCX frames (a connection keeps one)
  // Tests: each UCX frame waits this long before it is handled (zenflowd
  // --emulate_ucx_frame_ms). 0: off.
  double emulate_ucx_frame_seconds = 0;
  // host:port of the Prometheus /metrics endpoint; empty: none.
  std::string metrics_listen;
  // Checkpoints (docs/checkpoints.md): empty state_dir: none.
  std::string state_dir;
  int checkpoint_keep = 2;
  int checkpoint_every_rounds = 0;
  // A joined rank without a data stream for this long fails what waits on
  // it (docs/checkpoints.md#dead-ranks); 0: never.
  int dead_rank_timeout_s = 0;
  // TLS for the gRPC listener (docs/security.md), as PEM text checked by
  // common/tls_files.h. Empty tls_cert_pem: plaintext. With
  // tls_client_ca_pem, every client must present a certificate it signed
  // (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
  std::string tls_cert_pem;
  std::string tls_key_pem;
  std::string tls_client_ca_pem;
  // Plaintext beyond this host (server/exposure.h): without it, Start
  // refuses plaintext gRPC on a non-loopback listen, the UCX data plane over
  // a network transport on devices other than "lo", and /metrics on a
  // non-loopback address.
  bool allow_insecure = false;
  // Also serve on a unix socket with gRPC local credentials, in a private
  // directory (mode 0700) made under local_socket_parent (empty: /tmp) and
  // removed with the server. The daemon's own health checks (the systemd
  // watchdog, health_listen) dial it (local_target()), so they work with
  // TLS and with client certificates required; only the daemon's user can
  // open it.
  bool local_socket = false;
  std::string local_socket_parent;
  // host:port of the plaintext listener that answers only the health check,
  // by forwarding it over the local socket (server/health_probe.h), for
  // probes that cannot speak TLS (the kubelet's); empty: none. Needs no
  // local_socket of its own: it implies one.
  std::string health_listen;
  // Credentials (docs/security.md): the admin token (empty: none), where
  // audit lines go (empty: standard error), open streams at most.
  std::string admin_token;
  std::string audit_log;
  int max_streams = 1024;
  // A Stream or UploadParameters call that sends nothing this long is ended.
  int attach_timeout_s = 30;
  // A job with no rank attached this long is checkpointed (with state_dir)
  // and deleted (server/job_end.h); 0: never. zenflowd's default is 3600.
  double job_idle_ttl_s = 0;
  // The admin socket (server/admin_socket.h): a unix socket at this path
  // where root and the daemon's own user are the admin without a token;
  // empty: none. At most this many connections of admitted peers (and an
  // eighth as many, at least 2, of refused ones) are open at once.
  std::string admin_socket;
  int admin_socket_max_connections = 64;
  // When the admin socket cannot be made (another daemon listens on it),
  // the daemon starts without one and says so, instead of failing: for the
  // default path rule (zenflowd --admin_socket=auto).
  bool admin_socket_optional = false;
};

// What `options` expose beyond this host, for CheckExposure and
// DescribeExposure (server/exposure.h).
ExposureConfig ExposureOf(const ServerOptions& options);

// Owns the registry, the service and the gRPC server. Thread-safe.
class ZenFlowServer {
 public:
  // Fails (UNAVAILABLE) when the address cannot be bound, INVALID_ARGUMENT
  // when the options break CheckExposure (server/exposure.h).
  static absl::StatusOr<std::unique_ptr<ZenFlowServer>> Start(const ServerOptions& options);
  ~ZenFlowServer();

  int port() const { return port_; }
  // Null when the UCX data plane is off or could not start (see ucx_status).
  UcxDataPlane* ucx() { return ucx_.get(); }
  const absl::Status& ucx_status() const { return ucx_status_; }
  JobRegistry* registry() { return registry_.get(); }
  // What GetStats answers for all jobs (the metrics' source).
  v1::GetStatsResponse Snapshot();
  // Null without --state_dir.
  Checkpointer* checkpointer() { return checkpointer_.get(); }
  // The /metrics port; 0 without one.
  int metrics_port() const;
  // "unix:PATH" of the local socket (ServerOptions.local_socket); empty
  // without one. Dial it with grpc::experimental::LocalCredentials(UDS).
  const std::string& local_target() const { return local_target_; }
  // The health-check listener's port (ServerOptions.health_listen); 0
  // without one.
  int health_port() const;
  // The admin socket's path (ServerOptions.admin_socket); empty without one.
  std::string admin_socket_path() const;
  void Wait() { server_->Wait(); }
  // Stops accepting calls and cancels the ones in flight (bounded by deadline).
  void Shutdown();

 private:
  ZenFlowServer() = default;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<UcxDataPlane> ucx_;
  absl::Status ucx_status_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<AuditLog> audit_;
  std::unique_ptr<ZenFlowService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsServer> metrics_;
  // The local socket's private directory and address (removed at exit).
  std::string local_dir_;
  std::string local_target_;
  std::unique_ptr<HealthProbeServer> health_probe_;
  // The admin socket: the service its admitted peers reach, the servers of
  // admitted and refused peers (no listening ports of their own) and the
  // listener that hands connections to them.
  absl::Status StartAdminSocket(const ServerOptions& options);
  std::unique_ptr<ZenFlowService> admin_service_;
  std::unique_ptr<grpc::CallbackGenericService> refusing_service_;
  std::unique_ptr<grpc::Server> admin_server_;
  std::unique_ptr<grpc::Server> refusing_server_;
  std::unique_ptr<AdminSocket> admin_socket_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<IdleJobReaper> reaper_;  // with job_idle_ttl_s
  // checkpointer_ for the jobs' round hook (their update threads outlive it).
  std::atomic<Checkpointer*> round_hook_{nullptr};
  int port_ = 0;
  // Looks for dead ranks every second (with dead_rank_timeout_s).
  std::thread watchdog_;
  Mutex watchdog_mu_;
  bool stopping_ ABSL_GUARDED_BY(watchdog_mu_) = false;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_SERVICE_H_
