// zfctl's connection to zenflowd; see daemon.h.
#include "tools/zfctl/daemon.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tls_flags.h"
#include "server/admin_socket.h"
#include "tools/zfctl/flags.h"

namespace zenflow::ctl {

namespace {

constexpr char kDefaultTarget[] = "127.0.0.1:50051";

// Connects to the unix socket `path` once, to tell a missing daemon, a
// stale file and a socket this user may not open apart before gRPC's
// retries blur them.
absl::Status ProbeSocket(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("the admin socket path ", path, " is too long"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(std::strerror(errno));
  const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  close(fd);
  if (rc == 0) return absl::OkStatus();
  if (err == EACCES || err == EPERM) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this user may not open zenflowd's admin socket ", path,
        " (its file mode admits the daemon's user and group): run zfctl as root or as the "
        "daemon's user, or call its gRPC address with --target=HOST:PORT and --token_file"));
  }
  if (err == ECONNREFUSED) {
    return absl::UnavailableError(absl::StrCat(
        "no zenflowd listens on the admin socket ", path,
        " (a file left by a daemon that stopped?): start zenflowd, or use --target=HOST:PORT"));
  }
  if (err == ENOENT) {
    return absl::UnavailableError(absl::StrCat(
        "there is no admin socket at ", path,
        ": zenflowd's start-up line names its admin socket (zenflowd --admin_socket), or use "
        "--target=HOST:PORT"));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot connect to the admin socket ", path, ": ", std::strerror(err)));
}

}  // namespace

absl::StatusOr<Endpoint> ChooseEndpoint() {
  Endpoint e;
  e.target = absl::GetFlag(FLAGS_target);
  if (!e.target.empty()) return e;
  std::string socket = absl::GetFlag(FLAGS_admin_socket);
  const bool named = !socket.empty();
  if (!named) socket = FindAdminSocket();
  if (!socket.empty()) {
    // The default socket only when this user may use it; a named one always
    // (its errors then say why it cannot be used).
    if (named || access(socket.c_str(), R_OK | W_OK) == 0) {
      e.target = absl::StrCat("unix:", socket);
      e.admin_socket = true;
      return e;
    }
  }
  e.target = kDefaultTarget;
  return e;
}

absl::StatusOr<Daemon> Daemon::Open(const Endpoint& where) {
  Daemon d;
  d.endpoint_ = where;
  const absl::Duration timeout = absl::Seconds(std::max(1, absl::GetFlag(FLAGS_timeout_s)));
  if (where.admin_socket) {
    const std::string path = where.target.substr(strlen("unix:"));
    d.name_ = absl::StrCat("zenflowd's admin socket ", path);
    if (absl::Status s = ProbeSocket(path); !s.ok()) return s;
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    args.SetMaxReceiveMessageSize(-1);
    // The listener checks the peer's user; nothing is sent but the calls.
    d.channel_ = grpc::CreateCustomChannel(where.target, grpc::InsecureChannelCredentials(), args);
    if (!d.channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
      return absl::UnavailableError(absl::StrCat("cannot connect to ", d.name_, " within ",
                                                 absl::FormatDuration(timeout)));
    }
  } else {
    d.name_ = absl::StrCat("zenflowd at ", where.target);
    absl::StatusOr<std::string> token = LoadToken(absl::GetFlag(FLAGS_token_file));
    if (!token.ok()) return token.status();
    d.token_ = *token;
    ClientOptions co;
    co.target = where.target;
    co.token = d.token_;
    ApplyTlsFlags(&co);
    co.connect_timeout = timeout;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(co);
    if (!c.ok()) return c.status();
    d.client_ = *std::move(c);
    d.channel_ = d.client_->channel();
  }
  d.stub_ = v1::ZenFlow::NewStub(d.channel_);
  return d;
}

void Daemon::Prepare(grpc::ClientContext* ctx, absl::Duration deadline) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  if (!endpoint_.admin_socket && !token_.empty()) {
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  }
}

namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

constexpr absl::Duration kCallDeadline = absl::Seconds(60);
// A checkpoint writes the job's whole state (~1 GB/s): give it time.
constexpr absl::Duration kCheckpointDeadline = absl::Minutes(30);

// One unary call about one job (every request zfctl sends names a job id)
// on a prepared context.
template <typename Req, typename Resp>
absl::StatusOr<Resp> CallForJob(
    grpc::Status (v1::ZenFlow::Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
    v1::ZenFlow::Stub& stub, grpc::ClientContext& ctx, const std::string& job_id) {
  Req req;
  req.set_job_id(job_id);
  Resp resp;
  absl::Status s = FromGrpc((stub.*rpc)(&ctx, req, &resp));
  if (!s.ok()) return s;
  return resp;
}

}  // namespace

absl::StatusOr<v1::GetJobResponse> Daemon::GetJob(const std::string& job_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallDeadline);
  return CallForJob(&v1::ZenFlow::Stub::GetJob, *stub_, ctx, job_id);
}

absl::Status Daemon::DeleteJob(const std::string& job_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallDeadline);
  return CallForJob(&v1::ZenFlow::Stub::DeleteJob, *stub_, ctx, job_id).status();
}

absl::StatusOr<v1::GetStatsResponse> Daemon::GetStats(const std::string& job_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallDeadline);
  return CallForJob(&v1::ZenFlow::Stub::GetStats, *stub_, ctx, job_id);
}

absl::StatusOr<v1::CheckpointResponse> Daemon::Checkpoint(const std::string& job_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCheckpointDeadline);
  return CallForJob(&v1::ZenFlow::Stub::Checkpoint, *stub_, ctx, job_id);
}

std::string Hint(const absl::Status& s, bool admin_socket) {
  switch (s.code()) {
    case absl::StatusCode::kUnauthenticated:
      return "send a token: --token_file=FILE (or $ZENFLOW_TOKEN) with your job's token or the "
             "admin's; on the daemon's host, root or the daemon's user needs none "
             "(zfctl without --target uses the admin socket)";
    case absl::StatusCode::kPermissionDenied:
      if (admin_socket) {
        return absl::StrCat("you are uid ", getuid(),
                            "; run zfctl as root or as the daemon's user, or use --target with "
                            "a token");
      }
      return "this token does not reach that job (without the job's token a missing job and "
             "another's look the same): use the token its CreateJob returned or the admin's, "
             "or run zfctl on the daemon's host as root or the daemon's user";
    case absl::StatusCode::kNotFound:
      return "`zfctl jobs` lists the jobs you may see";
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return "is zenflowd running there? start it (./zf daemon, or systemctl start zenflowd), or "
             "name it with --target=HOST:PORT";
    case absl::StatusCode::kInvalidArgument:
      return "check the job id and the flags (zfctl SUB --help)";
    default:
      return "";
  }
}

int Daemon::Fail(const char* sub, const absl::Status& s) const {
  std::fprintf(stderr, "zfctl %s: %s: %s\n", sub, name_.c_str(), s.ToString().c_str());
  const std::string hint = Hint(s, admin_socket());
  if (!hint.empty()) std::fprintf(stderr, "  what to do: %s\n", hint.c_str());
  return 1;
}

int FailEarly(const char* sub, const absl::Status& s) {
  std::fprintf(stderr, "zfctl %s: %s\n", sub, s.ToString().c_str());
  const std::string hint = Hint(s, absl::StrContains(s.message(), "admin socket"));
  if (!hint.empty() && s.code() != absl::StatusCode::kPermissionDenied) {
    std::fprintf(stderr, "  what to do: %s\n", hint.c_str());
  }
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace zenflow::ctl
