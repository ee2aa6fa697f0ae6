// The plaintext health-check listener; see health_probe.h.
#include "server/health_probe.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace zenflow {
namespace {

constexpr char kCheck[] = "/grpc.health.v1.Health/Check";
// A probe without a deadline still gets its answer within this.
constexpr std::chrono::seconds kMaxForward(10);

// Takes every ServerBuilder plugin out of one builder: the proto reflection
// plugin is registered process-wide (by the daemon's main server) and would
// otherwise serve reflection here too.
class NoPlugins final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
  }
};

// Any method but Check.
class Unimplemented final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Unimplemented(const std::string& method) {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        absl::StrCat(method, ": this port answers only ", kCheck)));
  }
  void OnDone() override { delete this; }
};

// One Check: its request goes to the daemon's server as it came, and that
// server's answer (or error) comes back. Finish is called exactly once: on
// a failed read, or from the forwarded call's callback.
class ForwardCheck final : public grpc::ServerGenericBidiReactor {
 public:
  ForwardCheck(grpc::GenericCallbackServerContext* ctx, grpc::GenericStub* stub) : stub_(stub) {
    out_.set_deadline(std::min(ctx->deadline(), std::chrono::system_clock::now() + kMaxForward));
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no health check request"));
      return;
    }
    stub_->UnaryCall(&out_, kCheck, grpc::StubOptions(), &request_, &response_,
                     [this](grpc::Status s) {
                       if (s.ok()) {
                         StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
                       } else {
                         Finish(grpc::Status(s.error_code(),
                                             absl::StrCat("zenflowd's own server did not answer "
                                                          "the health check: ",
                                                          s.error_message())));
                       }
                     });
  }
  // Thread-safe against the call starting (ClientContext locks).
  void OnCancel() override { out_.TryCancel(); }
  void OnDone() override { delete this; }

 private:
  grpc::GenericStub* const stub_;
  grpc::ClientContext out_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

}  // namespace

class HealthProbeServer::Forwarder final : public grpc::CallbackGenericService {
 public:
  explicit Forwarder(grpc::GenericStub* stub) : stub_(stub) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    if (ctx->method() == kCheck) return new ForwardCheck(ctx, stub_);
    return new Unimplemented(ctx->method());
  }

 private:
  grpc::GenericStub* const stub_;
};

absl::StatusOr<std::unique_ptr<HealthProbeServer>> HealthProbeServer::Start(
    const std::string& listen, const std::string& target) {
  std::unique_ptr<HealthProbeServer> s(new HealthProbeServer());
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  // A failed forward must not leave the channel backing off past the next
  // probe.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  const std::shared_ptr<grpc::ChannelCredentials> creds =
      absl::StartsWith(target, "unix:") ? grpc::experimental::LocalCredentials(UDS)
                                        : grpc::InsecureChannelCredentials();
  s->stub_ = std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(target, creds, args));
  s->service_ = std::make_unique<Forwarder>(s->stub_.get());
  grpc::ServerBuilder builder;
  // No default health service (it would answer Check itself, SERVING
  // whatever the daemon's server does) and no reflection.
  builder.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
  builder.SetOption(std::make_unique<NoPlugins>());
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(64 << 10);  // a HealthCheckRequest is a service name
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterCallbackGenericService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  return s;
}

void HealthProbeServer::Shutdown(std::chrono::milliseconds grace) {
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + grace);
}

HealthProbeServer::~HealthProbeServer() {
  Shutdown(std::chrono::milliseconds(0));
  server_.reset();
}

}  // namespace zenflow
