// Why a connection to zenflowd does not come up, told fast and apart.
//
// gRPC alone reports every failed connection the same way (the channel
// stays in TRANSIENT_FAILURE until the caller's deadline). A client that
// waits 20 s and then says "cannot connect" for a typo in the port, a URL
// instead of HOST:PORT, a name that does not resolve, a TLS mismatch and a
// daemon still starting leaves the user to guess. This file tells them
// apart:
//   - ParseTarget: the target's form (HOST:PORT, [V6]:PORT, unix:PATH),
//     before anything touches the network;
//   - ResolveHost: getaddrinfo with a bound on the wait, so a name that
//     does not exist fails at once, naming the host;
//   - ProbeEndpoint: a plain connect (refused, unreachable, no answer) and,
//     when it is accepted, what the peer answers to an HTTP/2 preface
//     (HTTP/2 frames, a TLS record, an HTTP status line, nothing, a close);
//   - WaitForZenflowd: watches the gRPC channel's state, runs the probes
//     when the channel fails or is slow, and, once it is READY, asks the
//     server whether it hosts zenflow.v1.ZenFlow. Mistakes that waiting
//     cannot mend (TLS mismatch, a server that is not zenflowd) end the wait
//     at once; a refused port (a daemon starting or restarting) is waited
//     for, with a progress line that names the cause.
//
//   ZF_ASSIGN_OR_RETURN(ParsedTarget t, ParseTarget(target));
//   ZF_RETURN_IF_ERROR(WaitForZenflowd(channel, t, hints));
#ifndef ZENFLOW_CLIENT_CONNECT_DIAGNOSIS_H_
#define ZENFLOW_CLIENT_CONNECT_DIAGNOSIS_H_

#include <sys/socket.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace zenflow {

// The forms a zenflowd target may take, for messages.
inline constexpr char kTargetForms[] =
    "HOST:PORT (e.g. 127.0.0.1:50051 or zenflowd.example.com:50051), [IPV6]:PORT or unix:PATH";

struct ParsedTarget {
  enum class Kind { kHostPort, kUnix };
  Kind kind = Kind::kHostPort;
  std::string host;  // kHostPort: a name or an address (an IPv6 one without brackets)
  int port = 0;      // kHostPort: 1-65535
  std::string path;  // kUnix: the socket's path
};

// INVALID_ARGUMENT naming the expected form for anything else: no port, a
// URL scheme (http://, grpc://, dns:), an empty host, a port that is not a
// number in 1-65535, an IPv6 address without brackets, an empty path.
absl::StatusOr<ParsedTarget> ParseTarget(absl::string_view target);

// One address of a resolved host.
struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string text;  // e.g. "127.0.0.1" or "::1"
};

// The host's addresses with t.port (kUnix: the path's one endpoint).
// NOT_FOUND, naming the host, when the name does not exist (or has no
// address); UNAVAILABLE for a temporary failure of the resolver;
// DEADLINE_EXCEEDED when it does not answer within `timeout` (the lookup
// goes on in the background and its result is dropped).
absl::StatusOr<std::vector<Endpoint>> ResolveHost(const ParsedTarget& t, absl::Duration timeout);

// What a plain connect to an endpoint found.
struct ProbeResult {
  enum class Reach {
    kAccepted,     // the connection was made
    kRefused,      // ECONNREFUSED: nothing listens there
    kNoSocket,     // unix: no socket at the path
    kDenied,       // unix: EACCES / EPERM on the socket
    kUnreachable,  // no route to the host or network
    kNoAnswer,     // no answer to the connect within the timeout
    kError,        // anything else (`error` says what)
  };
  // kAccepted: what the peer answered to an HTTP/2 client preface.
  enum class Speaks {
    kUnknown,    // not accepted, or not asked
    kHttp2,      // HTTP/2 frames: a plaintext gRPC (or other HTTP/2) server
    kTls,        // a TLS record: a server that expects TLS
    kHttp1,      // "HTTP/x ...": a plain HTTP server (a /metrics port, say)
    kClosed,     // closed or reset the connection without a word
    kSilent,     // said nothing within the timeout
    kOther,      // other bytes (`answer` shows them)
  };
  Reach reach = Reach::kError;
  Speaks speaks = Speaks::kUnknown;
  std::string error;   // strerror of a failed connect
  std::string answer;  // kHttp1 / kOther: the first line or bytes, printable
};

// Connects to `e` (within `timeout`) and, when accepted and `sniff`, sends
// an HTTP/2 client preface and reads the first answer (within `timeout`).
// A peer that closes without a word is asked once more with a TLS
// ClientHello (a gRPC TLS server closes on the preface). Blocks at most
// about five times `timeout`.
ProbeResult ProbeEndpoint(const Endpoint& e, absl::Duration timeout, bool sniff);

// What the caller asked for, for the messages and the wait.
struct ConnectHints {
  std::string target;  // as the user wrote it (messages quote it)
  bool tls = false;
  std::string tls_ca;
  std::string tls_server_name;
  bool client_cert = false;
  absl::Duration wait = absl::Seconds(20);  // ClientOptions.connect_timeout
  // Progress lines while waiting ("nothing listens at ... yet"); null:
  // stderr, prefixed "zenflow client: ".
  std::function<void(const std::string&)> progress;
};

// Hands `line` to hints.progress, or prints it on stderr.
void ReportProgress(const ConnectHints& hints, const std::string& line);

// Waits until `channel` (to `t`, resolved as `endpoints`) is READY and the
// server there answers as zenflowd, or fails:
//   - UNAVAILABLE at once for a TLS handshake that fails (another CA,
//     another name, a plaintext server for a TLS client and the other way
//     round), saying which --tls_* flag to check;
//   - UNIMPLEMENTED at once for a gRPC server without the ZenFlow service,
//     FAILED_PRECONDITION for a server that is not gRPC (HTTP/1, one that
//     closes every connection, other bytes), saying to check the port;
//   - PERMISSION_DENIED at once for a unix socket this user may not open;
//   - UNAVAILABLE after hints.wait for anything else (refused, unreachable,
//     no socket yet), naming the last cause; the cause is also reported
//     through hints.progress within about a second, and again whenever it
//     changes.
absl::Status WaitForZenflowd(const std::shared_ptr<grpc::Channel>& channel,
                             const ParsedTarget& t, const std::vector<Endpoint>& endpoints,
                             const ConnectHints& hints);

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_CONNECT_DIAGNOSIS_H_
