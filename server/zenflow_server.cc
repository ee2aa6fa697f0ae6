// zenflowd's server: the gRPC server that hosts the service, its listeners
// (TLS, the local socket, the health-check probe) and what runs beside it
// (checkpoints, /metrics, the dead-rank watchdog); ZenFlowServer in
// service.h.
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_keepalive.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/admin_socket.h"
#include "server/checkpointer.h"
#include "server/health_probe.h"
#include "server/job_end.h"
#include "server/service.h"
#include "server/ucx_plane.h"

namespace zenflow {

namespace {

constexpr char kSeeGrpcError[] = "see gRPC's error above";
constexpr char kLocalSocketName[] = "grpc.sock";

// Why gRPC could not bind `listen` (it logs the reason but only returns a
// null server): binds each of the address's resolutions again, as gRPC does
// (SO_REUSEADDR, no SO_REUSEPORT), and describes the first failure.
std::string WhyCannotListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return "not a host:port address";
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &addrs);
  if (rc != 0) return absl::StrCat("cannot resolve it: ", gai_strerror(rc));
  std::string why;
  for (addrinfo* a = addrs; a != nullptr && why.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      const int err = errno;
      if (err == EADDRINUSE) {
        why = "the address is already in use (another process listens on it)";
      } else if (err == EADDRNOTAVAIL) {
        why = "no interface of this host has that address";
      } else {
        why = std::strerror(err);
      }
    }
    close(fd);
  }
  freeaddrinfo(addrs);
  return why.empty() ? kSeeGrpcError : why;
}

// The channel arguments and limits every gRPC server of the daemon shares.
void ConfigureServer(const ServerOptions& options, grpc::ServerBuilder* builder) {
  // gRPC sets SO_REUSEPORT by default on Linux, and then a second daemon on
  // the same port also "serves" and the kernel splits connections between
  // the two. Without it, binding a port another process listens on fails.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Keepalive: a rank whose host or link went away without a FIN (a cut
  // cable, a frozen VM) is noticed in ~20 s instead of at TCP's hours-long
  // timeout, and the pings the clients send (client.cc) are welcome.
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              kMinPingIntervalMs);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // gRPC's own limit is twice the service's, so moderately oversized
  // messages reach the service and get a counted, in-band rejection.
  const int64_t hard = std::min<int64_t>(2 * options.max_message_bytes, (int64_t{1} << 31) - 1);
  builder->SetMaxReceiveMessageSize(static_cast<int>(hard));
  builder->SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
}

// A fresh directory only this user can enter (mkdtemp makes it 0700) under
// `parent` (empty: /tmp), for the local socket.
absl::StatusOr<std::string> MakePrivateDir(const std::string& parent) {
  std::string templ = absl::StrCat(parent.empty() ? "/tmp" : parent, "/zenflowd-local.XXXXXX");
  // The socket's path must fit in sockaddr_un.sun_path (108 bytes).
  if (templ.size() + 1 + strlen(kLocalSocketName) >= 108) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the local socket's directory ", parent, " is too long a path for a unix socket"));
  }
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make the local socket's directory under ", parent.empty() ? "/tmp" : parent, ": ",
        std::strerror(errno)));
  }
  return templ;
}

}  // namespace

ExposureConfig ExposureOf(const ServerOptions& options) {
  ExposureConfig c;
  c.listen = options.listen;
  c.tls = !options.tls_cert_pem.empty();
  c.client_certs = c.tls && !options.tls_client_ca_pem.empty();
  c.ucx = options.ucx;
  c.ucx_tls = options.ucx_options.tls;
  c.ucx_net_devices = options.ucx_options.net_devices;
  c.metrics_listen = options.metrics_listen;
  c.allow_insecure = options.allow_insecure;
  return c;
}

absl::StatusOr<std::unique_ptr<ZenFlowServer>> ZenFlowServer::Start(const ServerOptions& options) {
  ZF_RETURN_IF_ERROR(CheckExposure(ExposureOf(options)));
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty() ||
      (options.tls_cert_pem.empty() && !options.tls_client_ca_pem.empty())) {
    return absl::InvalidArgumentError(
        "TLS needs a certificate and its key; client certificates (a client CA) need both too");
  }
  std::unique_ptr<ZenFlowServer> s(new ZenFlowServer());
  RegistryOptions ro = options.registry;
  ro.max_message_bytes = options.max_message_bytes;
  ro.nothing_survives_restart = options.state_dir.empty();
  ZenFlowServer* self = s.get();
  ro.round_updated = [self](const std::string& job_id, int64_t rounds_updated) {
    if (Checkpointer* c = self->round_hook_.load(std::memory_order_acquire)) {
      c->RoundUpdated(job_id, rounds_updated);
    }
  };
  s->registry_ = std::make_unique<JobRegistry>(ro);
  std::string no_ucx = "started with --ucx=false";
  UcxOptions ucx_options = options.ucx_options;
  ucx_options.max_message_bytes = options.max_message_bytes;
  if (options.ucx) {
    absl::StatusOr<std::unique_ptr<UcxDataPlane>> plane =
        UcxDataPlane::Start(ucx_options, s->registry_.get(), ro.max_outbox_bytes,
                            options.ucx_dispatch_threads, options.emulate_ucx_frame_seconds);
    if (plane.ok()) {
      s->ucx_ = *std::move(plane);
    } else {
      s->ucx_status_ = plane.status();
      no_ucx = absl::StrCat("UCX did not start: ", plane.status().message());
    }
  } else {
    s->ucx_status_ = absl::FailedPreconditionError(no_ucx);
  }
  if (!options.state_dir.empty()) {
    s->checkpointer_ = std::make_unique<Checkpointer>(
        s->registry_.get(), CheckpointOptions{options.state_dir, options.checkpoint_keep,
                                              options.checkpoint_every_rounds});
    s->round_hook_.store(s->checkpointer_.get(), std::memory_order_release);
  }
  s->auth_ = std::make_unique<Authenticator>(options.admin_token);
  ZF_ASSIGN_OR_RETURN(s->audit_, AuditLog::Open(options.audit_log));
  s->service_ = std::make_unique<ZenFlowService>(s->registry_.get(), s->ucx_.get(), no_ucx,
                                                 s->checkpointer_.get(), s->auth_.get(),
                                                 s->audit_.get(), options.max_streams,
                                                 absl::Seconds(options.attach_timeout_s));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions ssl(
        options.tls_client_ca_pem.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = options.tls_client_ca_pem;
    ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(options.listen, credentials, &s->port_);
  if (options.local_socket || !options.health_listen.empty()) {
    // The same server on a unix socket in a directory only this user can
    // enter: the daemon's own health checks need no certificate.
    absl::StatusOr<std::string> dir = MakePrivateDir(options.local_socket_parent);
    if (!dir.ok()) return dir.status();
    s->local_dir_ = *dir;
    s->local_target_ = absl::StrCat("unix:", s->local_dir_, "/", kLocalSocketName);
    builder.AddListeningPort(s->local_target_, grpc::experimental::LocalServerCredentials(UDS));
  }
  ConfigureServer(options, &builder);
  builder.RegisterService(s->service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
  counters.push_back(NewCallCounterFactory(s->registry_.get()));
  builder.experimental().SetInterceptorCreators(std::move(counters));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    std::string where = options.listen;
    std::string why = WhyCannotListen(options.listen);
    if (why == kSeeGrpcError && !s->local_target_.empty()) {
      where = absl::StrCat(options.listen, " or on the local socket ", s->local_target_);
    }
    if (why == kSeeGrpcError && !options.tls_cert_pem.empty()) {
      why = "gRPC refused it or the TLS certificate and key (see its error above)";
    }
    return absl::UnavailableError(absl::StrCat("cannot listen on ", where, ": ", why));
  }
  if (!options.admin_socket.empty()) {
    const absl::Status admin = s->StartAdminSocket(options);
    if (!admin.ok() && !options.admin_socket_optional) return admin;
    if (!admin.ok()) {
      std::fprintf(stderr, "zenflowd: no admin socket: %s\n", std::string(admin.message()).c_str());
      s->admin_socket_.reset();
    }
  }
  if (!options.health_listen.empty()) {
    // Before the restore below, so that probes see NOT_SERVING meanwhile.
    absl::StatusOr<std::unique_ptr<HealthProbeServer>> probe =
        HealthProbeServer::Start(options.health_listen, s->local_target_);
    if (!probe.ok()) {
      return absl::UnavailableError(absl::StrCat(probe.status().message(), " (health checks): ",
                                                 WhyCannotListen(options.health_listen)));
    }
    s->health_probe_ = *std::move(probe);
  }
  if (s->checkpointer_ != nullptr) {
    // Until every job is back, the health service says NOT_SERVING.
    grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
    if (health != nullptr) health->SetServingStatus(false);
    absl::StatusOr<int> restored = s->checkpointer_->RestoreAll();
    if (!restored.ok()) return restored.status();
    if (health != nullptr) health->SetServingStatus(true);
  }
  if (!options.metrics_listen.empty()) {
    ZenFlowServer* raw = s.get();
    absl::StatusOr<std::unique_ptr<MetricsServer>> m = MetricsServer::Start(
        options.metrics_listen, [raw] { return RenderMetrics(raw->Snapshot()); });
    if (!m.ok()) return m.status();
    s->metrics_ = *std::move(m);
  }
  if (options.job_idle_ttl_s > 0) {
    s->reaper_ = std::make_unique<IdleJobReaper>(s->registry_.get(), s->checkpointer_.get(),
                                                 s->audit_.get(),
                                                 absl::Seconds(options.job_idle_ttl_s));
  }
  if (options.dead_rank_timeout_s > 0) {
    const absl::Duration timeout = absl::Seconds(options.dead_rank_timeout_s);
    ZenFlowServer* raw = s.get();
    s->watchdog_ = std::thread([raw, timeout] {
      for (;;) {
        {
          MutexLock lock(&raw->watchdog_mu_);
          raw->watchdog_mu_.AwaitWithTimeout(
              [raw]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return raw->stopping_; },
              std::min(absl::Seconds(1), timeout / 4));
          if (raw->stopping_) return;
        }
        for (const std::shared_ptr<Job>& job : raw->registry_->Jobs()) job->FailIfRankGone(timeout);
      }
    });
  }
  return s;
}

absl::Status ZenFlowServer::StartAdminSocket(const ServerOptions& options) {
  const std::string where = absl::StrCat("unix:", options.admin_socket);
  admin_service_ = std::make_unique<ZenFlowService>(
      registry_.get(), ucx_.get(), "", checkpointer_.get(), auth_.get(), audit_.get(),
      options.max_streams, absl::Seconds(options.attach_timeout_s));
  admin_service_->ServeAsAdmin(absl::StrCat(where, " (admin socket)"));
  grpc::ServerBuilder admin;
  ConfigureServer(options, &admin);
  admin.RegisterService(admin_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
  counters.push_back(NewCallCounterFactory(registry_.get()));
  admin.experimental().SetInterceptorCreators(std::move(counters));
  admin_server_ = admin.BuildAndStart();
  const uid_t self = geteuid();
  const std::string why = absl::StrCat(
      "zenflowd's admin socket ", options.admin_socket, " admits only root and the daemon's own "
      "user (uid ", self, "), and the kernel says this peer is another user: run zfctl as root "
      "or as uid ", self, " on the daemon's host, or call zenflowd's gRPC address "
      "(zfctl --target=HOST:PORT) with the admin token or your job's token (--token_file)");
  refusing_service_ = NewRefusingService(why);
  grpc::ServerBuilder refusing;
  WithoutAddedServices(&refusing);
  refusing.RegisterCallbackGenericService(refusing_service_.get());
  refusing_server_ = refusing.BuildAndStart();
  if (admin_server_ == nullptr || refusing_server_ == nullptr) {
    return absl::InternalError(
        "gRPC did not start the admin socket's servers (see its error above)");
  }
  AdminSocketOptions o;
  o.max_admitted = options.admin_socket_max_connections;
  o.max_refused = std::max(2, options.admin_socket_max_connections / 8);
  AuditLog* audit = audit_.get();
  o.on_refused = [audit, where, why](uid_t uid, pid_t pid) {
    audit->Record("denied", "admin socket", "", absl::StrCat(where, " uid ", uid, " pid ", pid),
                  "", Caller(), absl::PermissionDeniedError(why));
  };
  ZF_ASSIGN_OR_RETURN(admin_socket_, AdminSocket::Start(options.admin_socket, admin_server_.get(),
                                                        refusing_server_.get(), std::move(o)));
  return absl::OkStatus();
}

std::string ZenFlowServer::admin_socket_path() const {
  return admin_socket_ == nullptr ? std::string() : admin_socket_->path();
}

int ZenFlowServer::metrics_port() const { return metrics_ == nullptr ? 0 : metrics_->port(); }

int ZenFlowServer::health_port() const {
  return health_probe_ == nullptr ? 0 : health_probe_->port();
}

v1::GetStatsResponse ZenFlowServer::Snapshot() {
  absl::StatusOr<v1::GetStatsResponse> s = registry_->Stats("");
  v1::GetStatsResponse out = s.ok() ? *std::move(s) : v1::GetStatsResponse();
  if (ucx_ != nullptr) ucx_->FillStats(out.mutable_ucx());
  return out;
}

void ZenFlowServer::Shutdown() {
  // Probes fail from now on; the ones in flight end when the server does.
  if (health_probe_ != nullptr) health_probe_->Shutdown(std::chrono::seconds(2));
  // No new admin connections; the file goes with the daemon.
  admin_socket_.reset();
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  for (grpc::Server* s : {admin_server_.get(), refusing_server_.get()}) {
    if (s != nullptr) s->Shutdown(deadline);
  }
  if (server_ != nullptr) server_->Shutdown(deadline);
}

ZenFlowServer::~ZenFlowServer() {
  {
    MutexLock lock(&watchdog_mu_);
    stopping_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  reaper_.reset();  // before the checkpointer, registry and audit log it uses
  metrics_.reset();  // its scrapes read the registry
  Shutdown();
  round_hook_.store(nullptr, std::memory_order_release);
  checkpointer_.reset();  // finishes queued writes while the jobs exist
  health_probe_.reset();  // forwards to server_
  server_.reset();
  admin_server_.reset();
  refusing_server_.reset();
  if (!local_dir_.empty()) {
    unlink(absl::StrCat(local_dir_, "/", kLocalSocketName).c_str());
    rmdir(local_dir_.c_str());
  }
  service_.reset();
  admin_service_.reset();
  refusing_service_.reset();
  ucx_.reset();
  registry_.reset();
}

}  // namespace zenflow
