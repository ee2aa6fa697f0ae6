// Telling connection failures apart; see connect_diagnosis.h.
#include "client/connect_diagnosis.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "openssl/ssl.h"
#include "zenflow/v1/zenflow.grpc.pb.h"

namespace zenflow {

namespace {

absl::Status BadTarget(absl::string_view target, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("target '", target, "' ", why, "; want ", kTargetForms));
}

// The resolver schemes gRPC itself knows besides unix: (the client library
// takes none of them: its messages and probes need a plain address).
constexpr const char* kGrpcSchemes[] = {"dns:", "ipv4:", "ipv6:", "unix-abstract:", "vsock:"};

}  // namespace

absl::StatusOr<ParsedTarget> ParseTarget(absl::string_view target) {
  const absl::string_view s = target;
  if (s.empty()) return BadTarget(target, "is empty");
  ParsedTarget t;
  if (absl::StartsWith(s, "unix:")) {
    absl::string_view path = s.substr(5);
    // gRPC's unix:///abs/path form, besides unix:PATH.
    if (absl::StartsWith(path, "//")) path.remove_prefix(2);
    if (path.empty()) return BadTarget(target, "names no socket path after unix:");
    t.kind = ParsedTarget::Kind::kUnix;
    t.path = std::string(path);
    return t;
  }
  for (const char* scheme : kGrpcSchemes) {
    if (absl::StartsWith(s, scheme)) {
      return BadTarget(target, absl::StrCat("starts with the gRPC resolver scheme '", scheme,
                                            "', which the client library does not take"));
    }
  }
  if (const size_t scheme = s.find("://"); scheme != absl::string_view::npos) {
    absl::string_view rest = s.substr(scheme + 3);
    while (absl::EndsWith(rest, "/")) rest.remove_suffix(1);
    return BadTarget(target, absl::StrCat("is a URL (", s.substr(0, scheme),
                                          "://), but zenflowd's target has no scheme",
                                          rest.empty() ? "" : absl::StrCat(" (try ", rest, ")")));
  }
  absl::string_view port;
  if (s.front() == '[') {
    const size_t close = s.find(']');
    if (close == absl::string_view::npos) return BadTarget(target, "has a '[' without its ']'");
    t.host = std::string(s.substr(1, close - 1));
    const absl::string_view rest = s.substr(close + 1);
    if (rest.empty()) return BadTarget(target, "has no port");
    if (rest.front() != ':') return BadTarget(target, "has something other than :PORT after ']'");
    port = rest.substr(1);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == absl::string_view::npos) return BadTarget(target, "has no port");
    t.host = std::string(s.substr(0, colon));
    port = s.substr(colon + 1);
    if (absl::StrContains(t.host, ':')) {
      return BadTarget(target, "looks like an IPv6 address without brackets (write [ADDRESS]:PORT)");
    }
  }
  if (t.host.empty()) return BadTarget(target, "has an empty host");
  if (t.host.find_first_of("/ \t") != std::string::npos) {
    return BadTarget(target, absl::StrCat("has a host ('", t.host, "') with '/' or a space in it"));
  }
  if (port.empty()) return BadTarget(target, "has no port");
  if (!std::all_of(port.begin(), port.end(), [](char c) { return absl::ascii_isdigit(c); }) ||
      port.size() > 9) {
    return BadTarget(target, absl::StrCat("has port '", port, "', which is not a number"));
  }
  int n = 0;
  if (!absl::SimpleAtoi(port, &n) || n < 1 || n > 65535) {
    return BadTarget(target, absl::StrCat("has port ", port, ", outside 1-65535"));
  }
  t.port = n;
  return t;
}

// ---- Resolving ------------------------------------------------------------------

namespace {

std::string AddressText(const sockaddr* a) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, buf, sizeof(buf));
  } else if (a->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

absl::StatusOr<std::vector<Endpoint>> Lookup(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    const std::string why = rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc);
    if (rc == EAI_NONAME || rc == EAI_NODATA || rc == EAI_FAIL || rc == EAI_ADDRFAMILY) {
      return absl::NotFoundError(absl::StrCat("host '", host, "' does not resolve (", why,
                                              "): check the name in the target"));
    }
    return absl::UnavailableError(
        absl::StrCat("cannot resolve host '", host, "' now (", why, "): check DNS on this host"));
  }
  std::vector<Endpoint> out;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Endpoint e;
    std::memcpy(&e.addr, a->ai_addr, a->ai_addrlen);
    e.len = a->ai_addrlen;
    e.text = AddressText(a->ai_addr);
    out.push_back(std::move(e));
  }
  freeaddrinfo(res);
  if (out.empty()) {
    return absl::NotFoundError(absl::StrCat("host '", host, "' has no address"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Endpoint>> ResolveHost(const ParsedTarget& t, absl::Duration timeout) {
  if (t.kind == ParsedTarget::Kind::kUnix) {
    Endpoint e;
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    if (t.path.size() >= sizeof(un.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("unix socket path '", t.path, "' is longer than ",
                                                     sizeof(un.sun_path) - 1, " bytes"));
    }
    std::memcpy(un.sun_path, t.path.data(), t.path.size());
    std::memcpy(&e.addr, &un, sizeof(un));
    e.len = sizeof(un);
    e.text = t.path;
    return std::vector<Endpoint>{std::move(e)};
  }
  // getaddrinfo has no timeout of its own: it runs on a thread of its own,
  // which outlives a caller that stopped waiting for it.
  auto result = std::make_shared<std::promise<absl::StatusOr<std::vector<Endpoint>>>>();
  std::future<absl::StatusOr<std::vector<Endpoint>>> done = result->get_future();
  std::thread([result, host = t.host, port = t.port] { result->set_value(Lookup(host, port)); })
      .detach();
  if (done.wait_for(absl::ToChronoMilliseconds(timeout)) != std::future_status::ready) {
    return absl::DeadlineExceededError(absl::StrCat("resolving host '", t.host, "' takes longer than ",
                                                    absl::FormatDuration(timeout)));
  }
  return done.get();
}

// ---- Probing ---------------------------------------------------------------------

namespace {

// Closes a descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  const int fd_;
};

int PollMs(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0, 60000));
}

// At most 60 printable characters of `b` (others as '.'), up to its first
// line end.
std::string Printable(absl::string_view b) {
  std::string out;
  for (char c : b) {
    if (c == '\r' || c == '\n' || out.size() >= 60) break;
    out.push_back(absl::ascii_isprint(c) ? c : '.');
  }
  return out;
}

// The HTTP/2 client preface and an empty SETTINGS frame: what a plaintext
// gRPC client sends first.
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;

void Sniff(int fd, absl::Duration timeout, ProbeResult* r) {
  if (send(fd, kPreface, kPrefaceBytes, MSG_NOSIGNAL) < 0) {
    r->speaks = ProbeResult::Speaks::kClosed;
    return;
  }
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, PollMs(timeout)) <= 0) {
    r->speaks = ProbeResult::Speaks::kSilent;
    return;
  }
  unsigned char buf[256];
  const ssize_t n = recv(fd, buf, sizeof(buf), 0);
  if (n <= 0) {
    r->speaks = ProbeResult::Speaks::kClosed;
    return;
  }
  const absl::string_view got(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
  if (n >= 2 && (buf[0] == 0x15 || buf[0] == 0x16) && buf[1] == 0x03) {
    r->speaks = ProbeResult::Speaks::kTls;  // an alert or a handshake record
  } else if (absl::StartsWith(got, "HTTP/")) {
    r->speaks = ProbeResult::Speaks::kHttp1;
    r->answer = Printable(got);
  } else if (n >= 9 && (buf[3] == 0x04 || buf[3] == 0x07)) {
    r->speaks = ProbeResult::Speaks::kHttp2;  // SETTINGS or GOAWAY
  } else {
    r->speaks = ProbeResult::Speaks::kOther;
    r->answer = Printable(got);
  }
}

// Whether the peer at `e` answers a TLS ClientHello with TLS records. (A
// gRPC TLS server closes the connection on an HTTP/2 preface without a
// word, so the first sniff cannot tell it from a server that closes every
// connection.) Only OpenSSL's handshake is used: nothing is verified.
bool AnswersTls(const Endpoint& e, absl::Duration timeout) {
  const int family = reinterpret_cast<const sockaddr*>(&e.addr)->sa_family;
  Fd fd(socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return false;
  timeval tv{};
  tv.tv_sec = absl::ToInt64Seconds(timeout);
  tv.tv_usec = absl::ToInt64Microseconds(timeout) % 1000000;
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&e.addr), e.len) != 0) return false;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                       &SSL_CTX_free);
  if (ctx == nullptr) return false;
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn));
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), &SSL_free);
  if (ssl == nullptr) return false;
  // Memory BIOs, pumped by hand: the socket is written with MSG_NOSIGNAL
  // (OpenSSL's socket BIO would raise SIGPIPE on a closed peer) and read
  // with a deadline. SSL_set_bio hands both BIOs to `ssl`.
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  if (in == nullptr || out == nullptr) {
    BIO_free(in);
    BIO_free(out);
    return false;
  }
  SSL_set_bio(ssl.get(), in, out);
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  for (;;) {
    const int rc = SSL_connect(ssl.get());
    int pending;
    while ((pending = BIO_read(out, buf, sizeof(buf))) > 0) {
      if (send(fd.get(), buf, static_cast<size_t>(pending), MSG_NOSIGNAL) != pending) return false;
    }
    if (rc == 1) return true;  // a whole handshake: certainly TLS
    if (SSL_get_error(ssl.get(), rc) != SSL_ERROR_WANT_READ) break;
    pollfd p{fd.get(), POLLIN, 0};
    if (poll(&p, 1, PollMs(deadline - absl::Now())) <= 0) break;
    const ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    // The first record's header: handshake (22) or alert (21), version 3.x.
    if (n >= 2 && (buf[0] == 0x16 || buf[0] == 0x15) && buf[1] == 0x03) return true;
    return false;
  }
  return false;
}

}  // namespace

ProbeResult ProbeEndpoint(const Endpoint& e, absl::Duration timeout, bool sniff) {
  ProbeResult r;
  const int family = reinterpret_cast<const sockaddr*>(&e.addr)->sa_family;
  Fd fd(socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    r.error = std::strerror(errno);
    return r;
  }
  int err = 0;
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&e.addr), e.len) != 0) {
    err = errno;
    if (err == EINPROGRESS || err == EAGAIN) {
      pollfd p{fd.get(), POLLOUT, 0};
      if (poll(&p, 1, PollMs(timeout)) <= 0) {
        r.reach = ProbeResult::Reach::kNoAnswer;
        return r;
      }
      socklen_t len = sizeof(err);
      if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
  }
  if (err != 0) {
    r.error = std::strerror(err);
    switch (err) {
      case ECONNREFUSED:
        r.reach = ProbeResult::Reach::kRefused;
        break;
      case ENOENT:
      case ENOTDIR:
        r.reach = ProbeResult::Reach::kNoSocket;
        break;
      case EACCES:
      case EPERM:
        r.reach = ProbeResult::Reach::kDenied;
        break;
      case ENETUNREACH:
      case EHOSTUNREACH:
      case ENETDOWN:
      case EHOSTDOWN:
        r.reach = ProbeResult::Reach::kUnreachable;
        break;
      case ETIMEDOUT:
        r.reach = ProbeResult::Reach::kNoAnswer;
        break;
      default:
        r.reach = ProbeResult::Reach::kError;
    }
    return r;
  }
  r.reach = ProbeResult::Reach::kAccepted;
  if (sniff) Sniff(fd.get(), timeout, &r);
  // A TLS server answers the ClientHello after a key exchange's work: more
  // time than a plain answer takes on a loaded host.
  if (r.speaks == ProbeResult::Speaks::kClosed && AnswersTls(e, 2 * timeout)) {
    r.speaks = ProbeResult::Speaks::kTls;
  }
  return r;
}

// ---- Waiting for zenflowd ----------------------------------------------------------

namespace {

constexpr absl::Duration kProbeTimeout = absl::Seconds(1);
constexpr absl::Duration kRecheck = absl::Seconds(2);

// What the probes make of a channel that is not (usefully) READY.
struct Verdict {
  absl::Status fatal;  // not OK: stop waiting, return this
  std::string cause;   // otherwise: why we are still waiting
  std::string advice;  // what to do about `cause`, for the final error
};

// The answer of the cheapest zenflowd call: GetJob with an empty job id,
// which zenflowd rejects (INVALID_ARGUMENT) before it looks at tokens or
// jobs, and does not count as a rejection. Without wait-for-ready: on a
// failing channel it returns at once with gRPC's last connection error.
grpc::Status AskZenflowd(const std::shared_ptr<grpc::Channel>& channel, absl::Duration timeout) {
  std::unique_ptr<v1::ZenFlow::Stub> stub = v1::ZenFlow::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  v1::GetJobRequest req;
  v1::GetJobResponse resp;
  return stub->GetJob(&ctx, req, &resp);
}

std::string Where(const ParsedTarget& t, const ConnectHints& h) {
  return t.kind == ParsedTarget::Kind::kUnix ? absl::StrCat("the socket ", t.path) : h.target;
}

std::string CheckPort() { return "check the port in the target (zenflowd's --listen)"; }

absl::Status TlsHandshakeFailed(const ConnectHints& h, const ParsedTarget& t,
                                absl::string_view detail) {
  const std::string name = !h.tls_server_name.empty() ? h.tls_server_name : t.host;
  return absl::UnavailableError(absl::StrCat(
      "the TLS handshake with zenflowd at ", h.target, " failed",
      detail.empty() ? "" : absl::StrCat(" (", detail, ")"), ": check that --tls_ca (", h.tls_ca,
      ") is the CA that signed zenflowd's certificate, that the certificate carries the name ",
      name, " (--tls_server_name sets another), and ",
      h.client_cert ? "that zenflowd's --tls_ca signed this client's --tls_cert"
                    : "whether zenflowd requires client certificates (then pass --tls_cert and "
                      "--tls_key)"));
}

absl::Status NotZenflowd(const ConnectHints& h, const ParsedTarget& t, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat("the server at ", Where(t, h),
                                                    " is not zenflowd: ", what, "; ", CheckPort()));
}

// `failed`: gRPC gave up on its connection (TRANSIENT_FAILURE, or a call
// failed UNAVAILABLE), with `detail` its message; otherwise the channel is
// merely slow to connect.
Verdict Diagnose(const ParsedTarget& t, const std::vector<Endpoint>& endpoints,
                 const ConnectHints& h, bool failed, const std::string& detail) {
  Verdict v;
  if (endpoints.empty()) {
    v.cause = absl::StrCat("host '", t.host, "' has not resolved");
    v.advice = "check DNS on this host";
    return v;
  }
  ProbeResult r;
  const Endpoint* at = nullptr;
  for (size_t i = 0; i < endpoints.size() && i < 4; ++i) {
    ProbeResult one = ProbeEndpoint(endpoints[i], kProbeTimeout, /*sniff=*/true);
    if (at == nullptr || one.reach == ProbeResult::Reach::kAccepted) {
      r = std::move(one);
      at = &endpoints[i];
    }
    if (r.reach == ProbeResult::Reach::kAccepted) break;
  }
  const std::string where = Where(t, h);
  const bool unix_socket = t.kind == ParsedTarget::Kind::kUnix;
  const std::string start_it = unix_socket
      ? "start zenflowd, or check the socket's path"
      : "start zenflowd there, or " + CheckPort();
  switch (r.reach) {
    case ProbeResult::Reach::kRefused:
      v.cause = absl::StrCat("nothing listens at ", where, " yet (connection refused)");
      v.advice = start_it;
      return v;
    case ProbeResult::Reach::kNoSocket:
      v.cause = absl::StrCat("there is no socket at ", t.path, " yet");
      v.advice = start_it;
      return v;
    case ProbeResult::Reach::kDenied:
      v.fatal = absl::PermissionDeniedError(absl::StrCat(
          "cannot connect to zenflowd on the socket ", t.path, " (", r.error,
          "): run as zenflowd's user or root, or connect to its HOST:PORT"));
      return v;
    case ProbeResult::Reach::kUnreachable:
      v.cause = absl::StrCat(t.host, " (", at == nullptr ? "" : at->text,
                             ") cannot be reached from here (", r.error, ")");
      v.advice = "check the host in the target and the network between here and there";
      return v;
    case ProbeResult::Reach::kNoAnswer:
      v.cause = absl::StrCat(where, " does not answer (no reply to a connect within ",
                             absl::FormatDuration(kProbeTimeout),
                             ": the host may be down, or a firewall drops the connection)");
      v.advice = "check the host, its port and the firewalls on the way";
      return v;
    case ProbeResult::Reach::kError:
      v.cause = absl::StrCat("connecting to ", where, " fails (", r.error, ")");
      v.advice = "check the target";
      return v;
    case ProbeResult::Reach::kAccepted:
      break;
  }
  switch (r.speaks) {
    case ProbeResult::Speaks::kTls:
      if (!h.tls) {
        v.fatal = absl::UnavailableError(absl::StrCat(
            "zenflowd at ", where, " serves TLS, but this client connects in plaintext: pass "
            "--tls_ca=FILE, the CA that signed zenflowd's certificate (tls_ca in Python), and "
            "--tls_cert/--tls_key too if zenflowd requires client certificates"));
      } else if (failed) {
        v.fatal = TlsHandshakeFailed(h, t, detail);
      }
      break;
    case ProbeResult::Speaks::kHttp2:
      if (h.tls && failed) {
        v.fatal = absl::UnavailableError(absl::StrCat(
            "the server at ", where, " speaks plaintext gRPC, but this client uses TLS (--tls_ca=",
            h.tls_ca, "): connect without --tls_ca, or start zenflowd with --tls_cert and "
            "--tls_key"));
      }
      break;
    case ProbeResult::Speaks::kHttp1:
      v.fatal = NotZenflowd(h, t, absl::StrCat("it answers plain HTTP ('", r.answer,
                                               "'), as a web server or zenflowd's /metrics port "
                                               "(--metrics_listen) does"));
      return v;
    case ProbeResult::Speaks::kClosed:
      v.fatal = NotZenflowd(h, t, "it accepts connections and closes them without a word");
      return v;
    case ProbeResult::Speaks::kOther:
      v.fatal = NotZenflowd(h, t, absl::StrCat("it answers with bytes that are neither HTTP/2 nor "
                                               "TLS ('", r.answer, "')"));
      return v;
    case ProbeResult::Speaks::kSilent:
      v.cause = absl::StrCat(where, " accepts connections but says nothing (not a gRPC server?)");
      v.advice = CheckPort();
      return v;
    case ProbeResult::Speaks::kUnknown:
      break;
  }
  if (v.fatal.ok()) {
    v.cause = absl::StrCat(where, " accepts connections, but gRPC's connection is not up yet",
                           detail.empty() ? "" : absl::StrCat(" (", detail, ")"));
    v.advice = "check that zenflowd runs there and is not overloaded";
  }
  return v;
}

// gRPC's message for a failed connection, without the part every one of
// them starts with.
std::string Detail(const grpc::Status& s) {
  std::string m = s.error_message();
  constexpr absl::string_view kPrefix = "failed to connect to all addresses; last error: ";
  if (absl::StartsWith(m, kPrefix)) m.erase(0, kPrefix.size());
  return m;
}

}  // namespace

void ReportProgress(const ConnectHints& h, const std::string& line) {
  if (h.progress) {
    h.progress(line);
  } else {
    std::fprintf(stderr, "zenflow client: %s\n", line.c_str());
  }
}

absl::Status WaitForZenflowd(const std::shared_ptr<grpc::Channel>& channel,
                             const ParsedTarget& t, const std::vector<Endpoint>& endpoints,
                             const ConnectHints& h) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + h.wait;
  // The first diagnosis comes at the first failure, or after a second of
  // CONNECTING; later ones every kRecheck.
  absl::Time next_check = start + absl::Seconds(1);
  bool diagnosed = false;
  Verdict last;
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  for (;;) {
    bool failed = state == GRPC_CHANNEL_TRANSIENT_FAILURE;
    bool slow = false;
    std::string detail;
    if (state == GRPC_CHANNEL_READY) {
      const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(500));
      const grpc::Status s = AskZenflowd(channel, std::min(left, absl::Seconds(2)));
      switch (s.error_code()) {
        case grpc::StatusCode::INVALID_ARGUMENT:  // zenflowd's answer
        case grpc::StatusCode::OK:
        case grpc::StatusCode::NOT_FOUND:
        case grpc::StatusCode::PERMISSION_DENIED:
        case grpc::StatusCode::UNAUTHENTICATED:
          return absl::OkStatus();
        case grpc::StatusCode::UNIMPLEMENTED:
          return absl::UnimplementedError(absl::StrCat(
              "the gRPC server at ", Where(t, h), " does not serve zenflow.v1.ZenFlow (",
              s.error_message(), "): it is not zenflowd (zenflowd's --health_listen port, or "
              "another service?); ", CheckPort()));
        case grpc::StatusCode::UNAVAILABLE:
          failed = true;  // the connection broke: ask the probes why
          detail = Detail(s);
          break;
        case grpc::StatusCode::DEADLINE_EXCEEDED:
          slow = true;  // up, but not answering: wait, and say so
          break;
        default:
          return absl::FailedPreconditionError(absl::StrCat(
              "the server at ", Where(t, h), " answers HTTP/2 but not as zenflowd (",
              absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())), ": ",
              s.error_message(), "); ", CheckPort()));
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    if ((failed && !diagnosed) || now >= next_check || state == GRPC_CHANNEL_READY) {
      if (failed && detail.empty()) detail = Detail(AskZenflowd(channel, kProbeTimeout));
      Verdict v = Diagnose(t, endpoints, h, failed, detail);
      if (!v.fatal.ok()) return v.fatal;
      if (slow) {
        v.cause = absl::StrCat("the server at ", Where(t, h),
                               " took the connection but does not answer");
        v.advice = "check that zenflowd runs there and is not overloaded";
      }
      if (v.cause != last.cause) {
        ReportProgress(h, absl::StrCat(v.cause, "; waiting up to ",
                                       absl::FormatDuration(h.wait), " for zenflowd at ", h.target));
      }
      last = std::move(v);
      diagnosed = true;
      next_check = absl::Now() + kRecheck;
    }
    const absl::Time until = std::min(next_check, deadline);
    if (state == GRPC_CHANNEL_READY) {
      // READY but not answering: ask again at the next check.
      absl::SleepFor(until - absl::Now());
    } else {
      channel->WaitForStateChange(state, absl::ToChronoTime(until));
    }
    state = channel->GetState(/*try_to_connect=*/true);
  }
  return absl::UnavailableError(absl::StrCat(
      "cannot connect to zenflowd at ", h.target, " within ", absl::FormatDuration(h.wait),
      h.tls ? " over TLS" : " in plaintext",
      last.cause.empty() ? "" : absl::StrCat(": ", last.cause, "; ", last.advice)));
}

}  // namespace zenflow
