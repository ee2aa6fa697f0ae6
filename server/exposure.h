// What zenflowd's listeners expose beyond this host, and the rule it starts
// by: nothing goes beyond this host in plaintext unless --allow_insecure
// says so. gRPC is encrypted with --tls_cert/--tls_key; the UCX data plane
// and the Prometheus /metrics endpoint are never encrypted.
// docs/security.md explains the rule.
//
//   ExposureConfig c{.listen = "0.0.0.0:50051", .tls = true, ...};
//   ZF_RETURN_IF_ERROR(CheckExposure(c));         // refuses plaintext beyond loopback
//   std::fprintf(stderr, "%s\n", DescribeExposure(c).c_str());
#ifndef ZENFLOW_SERVER_EXPOSURE_H_
#define ZENFLOW_SERVER_EXPOSURE_H_

#include <string>

#include "absl/status/status.h"

namespace zenflow {

// Whether `listen` (an address as --listen and --metrics_listen take it)
// can only be reached from this host: a unix socket ("unix:PATH",
// "unix-abstract:NAME"), an IPv4 address in 127.0.0.0/8, ::1 (or ::ffff:
// 127.x.y.z), or "localhost". Any other name counts when every address it
// resolves to (getaddrinfo) is one of those; a name that does not resolve,
// an empty host (":50051"), 0.0.0.0 and [::] do not. Thread-safe.
bool IsLoopbackListen(const std::string& listen);

// The first transport in `ucx_tls` (UCX_TLS syntax, as --ucx_tls) that can
// cross a network, or "" when all of them stay on this host. Host-local
// transports: sm, shm, self, cma, knem, xpmem, posix, sysv, and the GPU copy
// transports cuda_copy, cuda_ipc, rocm_copy, rocm_ipc, gdr_copy (a ":aux"
// suffix is ignored). Everything else (tcp, rc, ud, dc, ib, ...) is network;
// so are "all", an empty list (UCX's default: all) and a "^..." exclusion
// list (it keeps every transport it does not name), which are returned as
// written.
std::string NetworkTransportIn(const std::string& ucx_tls);

struct ExposureConfig {
  std::string listen;         // --listen
  bool tls = false;           // --tls_cert and --tls_key given
  bool client_certs = false;  // --tls_ca given (client certificates required)
  bool ucx = false;           // --ucx: the UCX data plane is offered
  std::string ucx_tls;        // --ucx_tls
  std::string ucx_net_devices;  // --ucx_net_devices ("" = all devices)
  std::string metrics_listen;   // --metrics_listen ("" = no metrics)
  bool allow_insecure = false;  // --allow_insecure
};

// OK, or INVALID_ARGUMENT naming every listener that would carry plaintext
// beyond this host without `allow_insecure`, each with what to give instead:
//  - gRPC on a non-loopback --listen without TLS;
//  - the UCX data plane (never encrypted) with a network transport in
//    --ucx_tls and --ucx_net_devices other than exactly "lo";
//  - /metrics (plaintext HTTP) on a non-loopback --metrics_listen.
absl::Status CheckExposure(const ExposureConfig& c);

// One line for the start-up log: how gRPC is served (TLS with or without
// client certificates, plaintext on loopback only, or plaintext beyond this
// host by --allow_insecure) and the same for the UCX data plane and
// /metrics.
std::string DescribeExposure(const ExposureConfig& c);

// `listen` (HOST:PORT) with the port a listener bound when it asked for
// port 0 ("127.0.0.1:0", 43123 -> "127.0.0.1:43123"); otherwise as it is.
std::string WithBoundPort(const std::string& listen, int port);

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_EXPOSURE_H_
