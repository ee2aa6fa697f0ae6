// gRPC adapter of zenflowd; see service.h.
#include "server/service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/ucx_plane.h"

namespace zenflow {

namespace {

// Requests between the service's limit and gRPC's (twice as large) are
// rejected here, so that they are counted and a stream survives them.
absl::Status CheckSize(const google::protobuf::Message& m, JobRegistry* registry) {
  return registry->CheckMessageSize(m.ByteSizeLong());
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

void ZenFlowService::Finish(grpc::ServerUnaryReactor* reactor, const absl::Status& s, Job* job) {
  if (!s.ok()) {
    registry_->CountRejection(s.code());
    if (job != nullptr) job->CountRejection(s.code());
  }
  reactor->Finish(ToGrpcStatus(s));
}

grpc::ServerUnaryReactor* ZenFlowService::CreateJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CreateJobRequest* req,
                                                    v1::CreateJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::Status s = CheckSize(*req, registry_); !s.ok()) {
    Finish(reactor, s, nullptr);
    return reactor;
  }
  absl::StatusOr<v1::JobSpec> spec = registry_->CreateJob(req->spec());
  if (spec.ok()) *resp->mutable_spec() = *std::move(spec);
  Finish(reactor, spec.status(), nullptr);
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::JoinJob(grpc::CallbackServerContext* ctx,
                                                  const v1::JoinJobRequest* req,
                                                  v1::JoinJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(req->job_id());
  if (!job.ok()) {
    Finish(reactor, job.status(), nullptr);
    return reactor;
  }
  absl::StatusOr<v1::JoinJobResponse> r = (*job)->Join(req->rank());
  if (r.ok()) *resp = *std::move(r);
  Finish(reactor, r.status(), job->get());
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::GetJob(grpc::CallbackServerContext* ctx,
                                                 const v1::GetJobRequest* req,
                                                 v1::GetJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(req->job_id());
  if (job.ok()) (*job)->Describe(resp);
  Finish(reactor, job.status(), nullptr);
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                    const v1::DeleteJobRequest* req,
                                                    v1::DeleteJobResponse*) {
  auto* reactor = ctx->DefaultReactor();
  Finish(reactor, registry_->DeleteJob(req->job_id()), nullptr);
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::GetStats(grpc::CallbackServerContext* ctx,
                                                   const v1::GetStatsRequest* req,
                                                   v1::GetStatsResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<v1::GetStatsResponse> s = registry_->Stats(req->job_id());
  if (s.ok()) {
    *resp = *std::move(s);
    if (ucx_ != nullptr) ucx_->FillStats(resp->mutable_ucx());
  }
  Finish(reactor, s.status(), nullptr);
  return reactor;
}

// Looks up the request's job and checks its size; on failure finishes the
// call and returns null.
template <typename Request>
std::shared_ptr<Job> ZenFlowService::JobFor(grpc::ServerUnaryReactor* reactor, const Request& req) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(req.job_id());
  if (!job.ok()) {
    Finish(reactor, job.status(), nullptr);
    return nullptr;
  }
  if (absl::Status s = CheckSize(req, registry_); !s.ok()) {
    Finish(reactor, s, job->get());
    return nullptr;
  }
  return *std::move(job);
}

// The completion of a rendezvous call (the job counts its own rejections).
template <typename Result, typename Store>
std::function<void(absl::StatusOr<Result>)> ZenFlowService::Completion(
    grpc::ServerUnaryReactor* reactor, Store store) {
  JobRegistry* registry = registry_;
  return [reactor, store, registry](absl::StatusOr<Result> r) {
    if (r.ok()) {
      store(*std::move(r));
    } else {
      registry->CountRejection(r.status().code());
    }
    reactor->Finish(ToGrpcStatus(r.status()));
  };
}

grpc::ServerUnaryReactor* ZenFlowService::SubmitImportance(grpc::CallbackServerContext* ctx,
                                                           const v1::SubmitImportanceRequest* req,
                                                           v1::SubmitImportanceResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::shared_ptr<Job> job = JobFor(reactor, *req);
  if (job == nullptr) return reactor;
  job->SubmitImportance(*req, Completion<v1::Selection>(reactor, [resp](v1::Selection sel) {
                          *resp->mutable_selection() = std::move(sel);
                        }));
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::HandOff(grpc::CallbackServerContext* ctx,
                                                  const v1::HandOffRequest* req,
                                                  v1::HandOffResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::shared_ptr<Job> job = JobFor(reactor, *req);
  if (job == nullptr) return reactor;
  absl::StatusOr<v1::HandOffResponse> r = job->HandOff(*req);
  if (r.ok()) *resp = *std::move(r);
  Finish(reactor, r.status(), job.get());
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::AllReduce(grpc::CallbackServerContext* ctx,
                                                    const v1::AllReduceRequest* req,
                                                    v1::AllReduceResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  std::shared_ptr<Job> job = JobFor(reactor, *req);
  if (job == nullptr) return reactor;
  job->AllReduce(*req, Completion<v1::AllReduceResponse>(
                           reactor, [resp](v1::AllReduceResponse r) { *resp = std::move(r); }));
  return reactor;
}

// ---- UploadParameters ---------------------------------------------------------

namespace {

class UploadReactor final : public grpc::ServerReadReactor<v1::UploadParametersRequest> {
 public:
  UploadReactor(JobRegistry* registry, v1::UploadParametersResponse* resp)
      : registry_(registry), resp_(resp) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      if (cancelled_.load()) return Done(absl::CancelledError("upload cancelled"));
      if (upload_ == nullptr) {
        return Done(absl::InvalidArgumentError("upload stream carried no chunks"));
      }
      absl::StatusOr<v1::UploadParametersResponse> r = upload_->Commit();
      if (r.ok()) *resp_ = *std::move(r);
      return Done(r.status());
    }
    if (upload_ == nullptr) {
      absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(chunk_.job_id());
      if (!job.ok()) return Done(job.status());
      job_ = *std::move(job);
      job_id_ = chunk_.job_id();
      upload_ = std::make_unique<Job::Upload>(job_);
    } else if (chunk_.job_id() != job_id_ && !chunk_.job_id().empty()) {
      return Done(absl::InvalidArgumentError(absl::StrCat(
          "chunk for job '", chunk_.job_id(), "' in an upload stream of job '", job_id_, "'")));
    }
    absl::Status s = CheckSize(chunk_, registry_);
    if (s.ok()) s = upload_->AddChunk(chunk_);
    if (!s.ok()) return Done(s);
    StartRead(&chunk_);
  }

  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override { delete this; }

 private:
  void Done(const absl::Status& s) {
    if (!s.ok()) {
      registry_->CountRejection(s.code());
      if (job_ != nullptr) job_->CountRejection(s.code());
    }
    Finish(ToGrpcStatus(s));
  }

  JobRegistry* const registry_;
  v1::UploadParametersResponse* const resp_;
  v1::UploadParametersRequest chunk_;
  std::shared_ptr<Job> job_;
  std::string job_id_;
  std::unique_ptr<Job::Upload> upload_;
  std::atomic<bool> cancelled_{false};
};

// ---- Stream -----------------------------------------------------------------
//
// One read in flight (reads are handled in order on gRPC's threads); writes
// are driven by the rank's Mailbox, one in flight. The stream finishes when
// the client half-closes or cancels, after any in-flight write completes.

class StreamReactor final : public grpc::ServerBidiReactor<v1::UpMessage, v1::DownMessage>,
                            public Mailbox::Writer {
 public:
  StreamReactor(JobRegistry* registry, UcxDataPlane* ucx, const std::string* no_ucx_reason)
      : registry_(registry), ucx_plane_(ucx), no_ucx_reason_(no_ucx_reason) {
    StartRead(&up_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return RequestFinish(absl::OkStatus());
    if (job_ == nullptr) {
      absl::Status s = Attach();
      if (!s.ok()) {
        registry_->CountRejection(s.code());
        if (job_ != nullptr) job_->CountRejection(s.code());
        job_ = nullptr;
        return RequestFinish(s);
      }
    } else {
      absl::Status s = CheckSize(up_, registry_);
      if (s.ok()) s = job_->HandleUp(rank_, up_);
      if (!s.ok()) {
        registry_->CountRejection(s.code());
        job_->CountRejection(s.code());
        v1::DownMessage err;
        err.mutable_error()->set_seq(up_.seq());
        err.mutable_error()->set_code(static_cast<int32_t>(s.code()));
        err.mutable_error()->set_message(std::string(s.message()));
        mailbox_->Push(std::move(err));
      }
    }
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return;
    }
    StartRead(&up_);
  }

  void Write(v1::DownMessage* msg) override {
    if (msg->kind_case() == v1::DownMessage::kError && msg->error().fatal()) {
      MutexLock lock(&mu_);
      fatal_ = absl::Status(static_cast<absl::StatusCode>(msg->error().code()),
                            msg->error().message());
    }
    StartWrite(msg);
  }

  void OnWriteDone(bool ok) override {
    if (ucx_ != nullptr) {
      // The greeting, the only message of a UCX stream's gRPC side.
      {
        MutexLock lock(&mu_);
        hello_in_flight_ = false;
      }
      return MaybeFinish();
    }
    absl::Status fatal;
    {
      MutexLock lock(&mu_);
      fatal = fatal_;
    }
    if (mailbox_->WriteDone(this, ok)) MaybeFinish();
    // The job is gone: end the stream with its status.
    if (!fatal.ok()) RequestFinish(fatal);
  }

  void OnCancel() override { RequestFinish(absl::CancelledError("stream cancelled")); }

  void OnDone() override {
    if (ucx_ != nullptr) {
      ucx_plane_->Close(ucx_);
    } else if (mailbox_ != nullptr) {
      mailbox_->Detach(this);
    }
    delete this;
  }

 private:
  absl::Status Attach() {
    if (up_.kind_case() != v1::UpMessage::kAttach) {
      return absl::FailedPreconditionError(
          "the first message of a stream must be attach{job_id, rank}");
    }
    absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(up_.attach().job_id());
    if (!job.ok()) return job.status();
    job_ = *job;
    absl::StatusOr<std::shared_ptr<Mailbox>> box = job_->MailboxFor(up_.attach().rank());
    if (!box.ok()) return box.status();
    rank_ = up_.attach().rank();
    if (!up_.attach().ucx_address().empty()) return AttachUcx(*box);
    // Greet first, so the greeting precedes anything queued for the rank.
    v1::DownMessage hello = job_->AttachedMessage(rank_);
    if (!(*box)->Attach(this)) {
      return absl::AlreadyExistsError(absl::StrCat("rank ", rank_, " of job '",
                                                   up_.attach().job_id(),
                                                   "' already has a stream attached"));
    }
    mailbox_ = *box;
    // The greeting goes behind anything already queued; clients treat it as
    // informational.
    mailbox_->Push(std::move(hello));
    return absl::OkStatus();
  }

  // The rank asked for the UCX data plane: connect to its worker, make the
  // connection the mailbox's writer and greet over gRPC with our address.
  absl::Status AttachUcx(const std::shared_ptr<Mailbox>& box) {
    if (ucx_plane_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this zenflowd has no UCX data plane (", *no_ucx_reason_,
          "); attach without ucx_address to use gRPC"));
    }
    absl::StatusOr<std::shared_ptr<UcxDataPlane::Conn>> conn =
        ucx_plane_->Open(job_, rank_, box, up_.attach().ucx_address(), up_.attach().ucx_tag());
    if (!conn.ok()) {
      if (conn.status().code() == absl::StatusCode::kAlreadyExists &&
          absl::StrContains(conn.status().message(), "stream attached")) {
        return absl::AlreadyExistsError(absl::StrCat("rank ", rank_, " of job '",
                                                     up_.attach().job_id(),
                                                     "' already has a stream attached"));
      }
      return conn.status();
    }
    hello_ = job_->AttachedMessage(rank_);
    hello_.mutable_attached()->set_ucx_address(ucx_plane_->address());
    hello_.mutable_attached()->set_ucx_tag((*conn)->tag());
    mailbox_ = box;
    {
      MutexLock lock(&mu_);
      ucx_ = *std::move(conn);
      hello_in_flight_ = true;
    }
    StartWrite(&hello_);
    return absl::OkStatus();
  }

  void RequestFinish(absl::Status s) {
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return;
      finish_requested_ = true;
      finish_status_ = std::move(s);
    }
    std::shared_ptr<UcxDataPlane::Conn> ucx;
    bool in_flight;
    {
      MutexLock lock(&mu_);
      ucx = ucx_;
      in_flight = hello_in_flight_;
    }
    if (ucx != nullptr) {
      // The rank's lifeline ended: the data plane takes in what has arrived,
      // then closes the connection (and detaches the mailbox).
      ucx_plane_->Close(std::move(ucx));
      if (!in_flight) MaybeFinish();
      return;
    }
    in_flight = mailbox_ != nullptr && mailbox_->Detach(this);
    if (!in_flight) MaybeFinish();
    // else: OnWriteDone reports the end of the write and finishes.
  }

  void MaybeFinish() {
    absl::Status s;
    {
      MutexLock lock(&mu_);
      if (!finish_requested_ || finish_called_) return;
      finish_called_ = true;
      s = finish_status_;
    }
    Finish(ToGrpcStatus(s));
  }

  JobRegistry* const registry_;
  UcxDataPlane* const ucx_plane_;
  const std::string* const no_ucx_reason_;
  v1::UpMessage up_;
  v1::DownMessage hello_;  // the greeting of a UCX stream
  // Set once by the attach (reads are serialized); the UCX connection.
  std::shared_ptr<UcxDataPlane::Conn> ucx_;
  // Set once by the first message (reads are serialized), then read-only.
  std::shared_ptr<Job> job_;
  std::shared_ptr<Mailbox> mailbox_;
  int32_t rank_ = -1;

  Mutex mu_;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool hello_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);  // a fatal error was written
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerReadReactor<v1::UploadParametersRequest>* ZenFlowService::UploadParameters(
    grpc::CallbackServerContext*, v1::UploadParametersResponse* resp) {
  return new UploadReactor(registry_, resp);
}

grpc::ServerBidiReactor<v1::UpMessage, v1::DownMessage>* ZenFlowService::Stream(
    grpc::CallbackServerContext*) {
  return new StreamReactor(registry_, ucx_, &no_ucx_reason_);
}

// ---- Server -----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ZenFlowServer>> ZenFlowServer::Start(const ServerOptions& options) {
  std::unique_ptr<ZenFlowServer> s(new ZenFlowServer());
  RegistryOptions ro = options.registry;
  ro.max_message_bytes = options.max_message_bytes;
  s->registry_ = std::make_unique<JobRegistry>(ro);
  std::string no_ucx = "started with --ucx=false";
  if (options.ucx) {
    absl::StatusOr<std::unique_ptr<UcxDataPlane>> plane =
        UcxDataPlane::Start(options.ucx_options, s->registry_.get());
    if (plane.ok()) {
      s->ucx_ = *std::move(plane);
    } else {
      s->ucx_status_ = plane.status();
      no_ucx = absl::StrCat("UCX did not start: ", plane.status().message());
    }
  } else {
    s->ucx_status_ = absl::FailedPreconditionError(no_ucx);
  }
  s->service_ = std::make_unique<ZenFlowService>(s->registry_.get(), s->ucx_.get(), no_ucx);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &s->port_);
  // gRPC's own limit is twice the service's, so moderately oversized
  // messages reach the service and get a counted, in-band rejection.
  const int64_t hard = std::min<int64_t>(2 * options.max_message_bytes, (int64_t{1} << 31) - 1);
  builder.SetMaxReceiveMessageSize(static_cast<int>(hard));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen,
                                               " (address in use or not local?)"));
  }
  return s;
}

void ZenFlowServer::Shutdown() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
}

ZenFlowServer::~ZenFlowServer() {
  Shutdown();
  server_.reset();
  service_.reset();
  ucx_.reset();
  registry_.reset();
}

}  // namespace zenflow
