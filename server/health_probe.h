// A plaintext gRPC listener that answers only the standard health check
// (grpc.health.v1.Health/Check), for probes that cannot speak TLS: the
// kubelet's native gRPC probes connect without TLS, so once zenflowd's own
// port requires TLS (and client certificates) they cannot reach it.
//
// Each Check is forwarded, as it came, to the daemon's own server over its
// local unix socket (ZenFlowServer's local_target()), and that answer is
// returned: a probe passes only when the real server dispatches and answers
// a call, as it would for a client. Every other method gets UNIMPLEMENTED;
// the listener has no reflection and no service of its own, so it exposes
// nothing but SERVING / NOT_SERVING.
//
//   ZF_ASSIGN_OR_RETURN(auto probe, HealthProbeServer::Start("0.0.0.0:50053", "unix:/run/x.sock"));
//   probe->port();  // the bound port
#ifndef ZENFLOW_SERVER_HEALTH_PROBE_H_
#define ZENFLOW_SERVER_HEALTH_PROBE_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace zenflow {

// Thread-safe. The destructor shuts the listener down (calls in flight end).
class HealthProbeServer {
 public:
  // Listens on `listen` (host:port; port 0 picks one) and forwards each
  // Check to `target` (a gRPC address; "unix:PATH" is dialled with local
  // credentials, anything else in plaintext). UNAVAILABLE when the address
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<HealthProbeServer>> Start(const std::string& listen,
                                                                  const std::string& target);
  ~HealthProbeServer();
  HealthProbeServer(const HealthProbeServer&) = delete;
  HealthProbeServer& operator=(const HealthProbeServer&) = delete;

  int port() const { return port_; }
  // Stops accepting calls; those in flight end within `grace`.
  void Shutdown(std::chrono::milliseconds grace);

 private:
  class Forwarder;
  HealthProbeServer() = default;
  // Declared before server_: destroyed after it, so no call outlives them.
  std::unique_ptr<grpc::GenericStub> stub_;
  std::unique_ptr<grpc::CallbackGenericService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_HEALTH_PROBE_H_
