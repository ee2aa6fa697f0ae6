// gRPC adapter of zenflowd; see service.h.
#include "server/service.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/quote.h"
#include "common/stream_error.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/checkpointer.h"
#include "server/ingest.h"
#include "common/metrics.h"
#include "server/ucx_plane.h"

namespace zenflow {

namespace {

// Requests between the service's limit and gRPC's (twice as large) are
// rejected here, so that they are counted and a stream survives them.
absl::Status CheckSize(const google::protobuf::Message& m, JobRegistry* registry) {
  return registry->CheckMessageSize(m.ByteSizeLong());
}

// The method label of zenflow_grpc_calls_total: the RPC's name for the
// daemon's own services, "other" for anything else (a client's made-up
// method names must not grow the label set).
std::string MethodLabel(const char* full) {
  static const char* const kKnown[] = {
      "/zenflow.v1.ZenFlow/", "/grpc.health.v1.Health/",
      "/grpc.reflection.v1alpha.ServerReflection/"};
  const absl::string_view m(full == nullptr ? "" : full);
  for (const char* prefix : kKnown) {
    if (absl::StartsWith(m, prefix)) {
      const absl::string_view name = m.substr(strlen(prefix));
      if (!name.empty() && name.size() <= 32 &&
          name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") ==
              absl::string_view::npos) {
        return std::string(name);
      }
    }
  }
  return "other";
}

// Counts every finished call by method and status code.
class CallCounter final : public grpc::experimental::Interceptor {
 public:
  CallCounter(grpc::experimental::ServerRpcInfo* info, JobRegistry* registry)
      : method_(MethodLabel(info->method())), registry_(registry) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      registry_->CountCall(method_,
                           static_cast<absl::StatusCode>(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  JobRegistry* const registry_;
};

class CallCounterFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCounterFactory(JobRegistry* registry) : registry_(registry) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallCounter(info, registry_);
  }

 private:
  JobRegistry* const registry_;
};

// Where a rejection happened, for zenflow_rejections_total{reason}.
const char* RpcReason(const v1::SubmitImportanceRequest&) { return "submit_importance"; }
const char* RpcReason(const v1::HandOffRequest&) { return "hand_off"; }
const char* RpcReason(const v1::AllReduceRequest&) { return "all_reduce"; }

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

void ZenFlowService::Finish(grpc::ServerUnaryReactor* reactor, const absl::Status& s, Job* job,
                            const char* reason) {
  if (!s.ok()) {
    registry_->CountRejection(s.code(), reason);
    if (job != nullptr) job->CountRejection(s.code());
  }
  reactor->Finish(ToGrpcStatus(s));
}

grpc::ServerUnaryReactor* ZenFlowService::CreateJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CreateJobRequest* req,
                                                    v1::CreateJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::Status s = CheckSize(*req, registry_); !s.ok()) {
    Finish(reactor, s, nullptr, "create_job");
    return reactor;
  }
  absl::StatusOr<v1::JobSpec> spec = registry_->CreateJob(req->spec());
  if (spec.ok()) *resp->mutable_spec() = *std::move(spec);
  Finish(reactor, spec.status(), nullptr, "create_job");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::JoinJob(grpc::CallbackServerContext* ctx,
                                                  const v1::JoinJobRequest* req,
                                                  v1::JoinJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(req->job_id());
  if (!job.ok()) {
    Finish(reactor, job.status(), nullptr, "join_job");
    return reactor;
  }
  absl::StatusOr<v1::JoinJobResponse> r = (*job)->Join(req->rank());
  if (r.ok()) *resp = *std::move(r);
  Finish(reactor, r.status(), job->get(), "join_job");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::GetJob(grpc::CallbackServerContext* ctx,
                                                 const v1::GetJobRequest* req,
                                                 v1::GetJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(req->job_id());
  if (job.ok()) (*job)->Describe(resp);
  Finish(reactor, job.status(), nullptr, "get_job");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                    const v1::DeleteJobRequest* req,
                                                    v1::DeleteJobResponse*) {
  auto* reactor = ctx->DefaultReactor();
  const absl::Status s = registry_->DeleteJob(req->job_id());
  // A deleted job is not restored after a restart.
  if (s.ok() && checkpointer_ != nullptr) checkpointer_->JobDeleted(req->job_id());
  Finish(reactor, s, nullptr, "delete_job");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::Checkpoint(grpc::CallbackServerContext* ctx,
                                                     const v1::CheckpointRequest* req,
                                                     v1::CheckpointResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::Status s = req->job_id().empty() ? absl::OkStatus() : CheckJobId(req->job_id());
  if (s.ok() && checkpointer_ == nullptr) {
    s = absl::FailedPreconditionError(
        "this zenflowd keeps no checkpoints: start it with --state_dir=DIR");
  }
  if (!s.ok()) {
    Finish(reactor, s, nullptr, "checkpoint");
    return reactor;
  }
  // Written on the checkpointer's thread; the call ends when the files are durable.
  checkpointer_->Request(req->job_id(), [this, reactor, resp](
                                            absl::StatusOr<v1::CheckpointResponse> r) {
    if (r.ok()) *resp = *std::move(r);
    Finish(reactor, r.status(), nullptr, "checkpoint");
  });
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::GetState(grpc::CallbackServerContext* ctx,
                                                   const v1::GetStateRequest* req,
                                                   v1::GetStateResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(req->job_id());
  if (!job.ok()) {
    Finish(reactor, job.status(), nullptr, "get_state");
    return reactor;
  }
  absl::StatusOr<v1::GetStateResponse> r = (*job)->GetState(*req);
  if (r.ok()) *resp = *std::move(r);
  Finish(reactor, r.status(), job->get(), "get_state");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::SetState(grpc::CallbackServerContext* ctx,
                                                   const v1::SetStateRequest* req,
                                                   v1::SetStateResponse*) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::Status s = CheckSize(*req, registry_); !s.ok()) {
    Finish(reactor, s, nullptr, "set_state");
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(req->job_id());
  if (!job.ok()) {
    Finish(reactor, job.status(), nullptr, "set_state");
    return reactor;
  }
  Finish(reactor, (*job)->SetState(*req), job->get(), "set_state");
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
  Finish(reactor, s.status(), nullptr, "get_stats");
  return reactor;
}


// ---- Rendezvous calls (SubmitImportance, AllReduce) -------------------------

template <typename Request>
grpc::ServerUnaryReactor* ZenFlowService::LookUp(grpc::CallbackServerContext* ctx,
                                                 const Request& req, std::shared_ptr<Job>* job) {
  absl::StatusOr<std::shared_ptr<Job>> found = registry_->Find(req.job_id());
  absl::Status s = found.status();
  if (s.ok()) s = CheckSize(req, registry_);
  if (s.ok()) {
    *job = *std::move(found);
    return nullptr;
  }
  auto* reactor = ctx->DefaultReactor();
  Finish(reactor, s, found.ok() ? found->get() : nullptr, RpcReason(req));
  return reactor;
}

namespace {

std::atomic<uint64_t> next_call_id{1};

// A call that waits for every rank. A cancelled call (its deadline passed,
// its client went away) withdraws its contribution from the job at once, so
// it holds no memory and a retry of the same step is welcome.
class RendezvousReactor final : public grpc::ServerUnaryReactor {
 public:
  RendezvousReactor(JobRegistry* registry, const char* reason,
                    std::function<void(uint64_t)> withdraw)
      : state_(std::make_shared<State>()), withdraw_(std::move(withdraw)) {
    state_->reactor = this;
    state_->registry = registry;
    state_->reason = reason;
  }

  uint64_t call_id() const { return call_id_; }

  // The job's completion: answers the call unless it was cancelled.
  template <typename Result, typename Store>
  std::function<void(absl::StatusOr<Result>)> Completion(Store store) {
    std::shared_ptr<State> st = state_;
    return [st, store](absl::StatusOr<Result> r) {
      MutexLock lock(&st->mu);
      if (st->finished) return;
      st->finished = true;
      if (r.ok()) {
        store(*std::move(r));
      } else {
        st->registry->CountRejection(r.status().code(), st->reason);
      }
      st->reactor->Finish(ToGrpcStatus(r.status()));
    };
  }

  void OnCancel() override {
    withdraw_(call_id_);  // the job drops the call's contribution and callback
    std::shared_ptr<State> st = state_;
    MutexLock lock(&st->mu);
    if (st->finished) return;
    st->finished = true;
    st->reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                                     "call cancelled; its contribution was withdrawn"));
  }

  void OnDone() override { delete this; }

 private:
  struct State {
    Mutex mu;
    bool finished ABSL_GUARDED_BY(mu) = false;
    grpc::ServerUnaryReactor* reactor = nullptr;
    JobRegistry* registry = nullptr;
    const char* reason = "";
  };
  const std::shared_ptr<State> state_;
  const std::function<void(uint64_t)> withdraw_;
  const uint64_t call_id_ = next_call_id.fetch_add(1);
};

}  // namespace

grpc::ServerUnaryReactor* ZenFlowService::SubmitImportance(grpc::CallbackServerContext* ctx,
                                                           const v1::SubmitImportanceRequest* req,
                                                           v1::SubmitImportanceResponse* resp) {
  std::shared_ptr<Job> job;
  if (grpc::ServerUnaryReactor* failed = LookUp(ctx, *req, &job)) return failed;
  const int32_t rank = req->rank();
  auto* reactor = new RendezvousReactor(registry_, "submit_importance", [job, rank](uint64_t call) {
    job->WithdrawImportance(rank, call);
  });
  job->SubmitImportance(*req, reactor->call_id(),
                        reactor->Completion<v1::Selection>([resp](v1::Selection sel) {
                          *resp->mutable_selection() = std::move(sel);
                        }));
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::HandOff(grpc::CallbackServerContext* ctx,
                                                  const v1::HandOffRequest* req,
                                                  v1::HandOffResponse* resp) {
  std::shared_ptr<Job> job;
  if (grpc::ServerUnaryReactor* failed = LookUp(ctx, *req, &job)) return failed;
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<v1::HandOffResponse> r = job->HandOff(*req);
  if (r.ok()) *resp = *std::move(r);
  Finish(reactor, r.status(), job.get(), "hand_off");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::AllReduce(grpc::CallbackServerContext* ctx,
                                                    const v1::AllReduceRequest* req,
                                                    v1::AllReduceResponse* resp) {
  std::shared_ptr<Job> job;
  if (grpc::ServerUnaryReactor* failed = LookUp(ctx, *req, &job)) return failed;
  const int32_t rank = req->rank();
  auto* reactor = new RendezvousReactor(registry_, "all_reduce", [job, rank](uint64_t call) {
    job->WithdrawAllReduce(rank, call);
  });
  job->AllReduce(*req, reactor->call_id(),
                 reactor->Completion<v1::AllReduceResponse>(
                     [resp](v1::AllReduceResponse r) { *resp = std::move(r); }));
  return reactor;
}

// ---- Raw messages -------------------------------------------------------------

namespace {

// Parses a raw request; INVALID_ARGUMENT (saying which message of the
// stream) when the bytes are not a `Message`.
template <typename Message>
absl::Status ParseRaw(grpc::ByteBuffer* buf, int64_t index, Message* out,
                      JobRegistry* registry) {
  const size_t size = buf->Length();
  ZF_RETURN_IF_ERROR(registry->CheckMessageSize(size));
  grpc::Status g = grpc::SerializationTraits<Message>::Deserialize(buf, out);
  if (!g.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message #", index, " of this stream (", size, " bytes) is not a valid ",
        Message::descriptor()->full_name(), "; it was dropped"));
  }
  return absl::OkStatus();
}

// ---- UploadParameters ---------------------------------------------------------

class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(JobRegistry* registry, grpc::ByteBuffer* resp)
      : registry_(registry), resp_(resp) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      if (cancelled_.load()) return Done(absl::CancelledError("upload cancelled"));
      if (upload_ == nullptr) {
        return Done(absl::InvalidArgumentError("upload stream carried no chunks"));
      }
      absl::StatusOr<v1::UploadParametersResponse> r = upload_->Commit();
      if (r.ok()) {
        bool own = false;
        grpc::Status g = grpc::SerializationTraits<v1::UploadParametersResponse>::Serialize(
            *r, resp_, &own);
        if (!g.ok()) return Done(absl::InternalError("cannot serialize the upload's answer"));
      }
      return Done(r.status());
    }
    absl::Status s = ParseRaw(&in_, ++index_, &chunk_, registry_);
    if (!s.ok()) return Done(s);
    if (upload_ == nullptr) {
      absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(chunk_.job_id());
      if (!job.ok()) return Done(job.status());
      job_ = *std::move(job);
      job_id_ = chunk_.job_id();
      absl::StatusOr<std::unique_ptr<Job::Upload>> up = Job::Upload::Begin(job_);
      if (!up.ok()) return Done(up.status());
      upload_ = *std::move(up);
    } else if (chunk_.job_id() != job_id_ && !chunk_.job_id().empty()) {
      return Done(absl::InvalidArgumentError(absl::StrCat("chunk for job ", Quote(chunk_.job_id()),
                                                          " in an upload stream of job '",
                                                          job_id_, "'")));
    }
    s = upload_->AddChunk(chunk_);
    if (!s.ok()) return Done(s);
    StartRead(&in_);
  }

  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override { delete this; }

 private:
  void Done(const absl::Status& s) {
    if (!s.ok()) {
      registry_->CountRejection(s.code(), "upload_parameters");
      if (job_ != nullptr) job_->CountRejection(s.code());
    }
    upload_.reset();  // an upload that did not commit clears its staging now
    Finish(ToGrpcStatus(s));
  }

  JobRegistry* const registry_;
  grpc::ByteBuffer* const resp_;
  grpc::ByteBuffer in_;
  int64_t index_ = 0;
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
// Flow control: while the rank's outbox holds more than --max_outbox_bytes
// (the rank does not read what it is sent), no read is started, so gRPC's
// own flow control stops the rank's sends; reading resumes once the outbox
// has drained below half the limit.

class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                            public Mailbox::Writer,
                            public Lifeline {
 public:
  // Owned by itself until OnDone, and by the UCX data plane while it ends
  // the stream (Abort).
  static StreamReactor* Start(JobRegistry* registry, UcxDataPlane* ucx,
                              const std::string* no_ucx_reason) {
    auto r = std::shared_ptr<StreamReactor>(new StreamReactor(registry, ucx, no_ucx_reason));
    r->self_ = r;
    r->StartRead(&r->in_);
    return r.get();
  }

  // The data plane closed the rank's UCX connection: end the stream.
  void Abort(absl::Status why) override {
    {
      MutexLock lock(&mu_);
      if (done_) return;
    }
    RequestFinish(std::move(why));
  }

  void OnReadDone(bool ok) override {
    if (!ok) return RequestFinish(absl::OkStatus());  // the client half-closed
    absl::Status s = ParseRaw(&in_, ++index_, &up_, registry_);
    if (job_ == nullptr) {
      if (s.ok()) s = Attach();
      if (!s.ok()) {
        registry_->CountRejection(s.code(), "stream");
        if (job_ != nullptr) job_->CountRejection(s.code());
        job_ = nullptr;
        return RequestFinish(s);
      }
    } else {
      (void)IngestUp(registry_, job_.get(), rank_, Wire::kGrpc, mailbox_.get(), std::move(s), up_);
    }
    up_.Clear();
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return;
      if (ucx_ == nullptr) read_paused_ = true;
    }
    if (ucx_ == nullptr && mailbox_->Full(this)) return;  // Resume() reads again
    {
      MutexLock lock(&mu_);
      read_paused_ = false;
    }
    StartRead(&in_);
  }

  void Resume() override {
    {
      MutexLock lock(&mu_);
      if (!read_paused_ || finish_requested_) return;
      read_paused_ = false;
    }
    StartRead(&in_);
  }

  Wire wire() const override { return Wire::kGrpc; }
  void Write(const v1::DownMessage* msg) override {
    if (msg->kind_case() == v1::DownMessage::kError && msg->error().fatal()) {
      MutexLock lock(&mu_);
      fatal_ = StreamErrorStatus(msg->error());
    }
    bool own = false;
    out_.Clear();
    (void)grpc::SerializationTraits<v1::DownMessage>::Serialize(*msg, &out_, &own);
    StartWrite(&out_);
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
    // Only a stream that attached detaches (a refused attach leaves the
    // rank's stream, if any, alone).
    if (mailbox_ != nullptr) job_->StreamEnded(rank_, stream_number_);
    if (ucx_ != nullptr) {
      ucx_plane_->Close(ucx_);
    } else if (mailbox_ != nullptr) {
      mailbox_->Detach(this);
    }
    {
      MutexLock lock(&mu_);
      done_ = true;
    }
    std::shared_ptr<StreamReactor> last = std::move(self_);  // may delete this
  }

 private:
  StreamReactor(JobRegistry* registry, UcxDataPlane* ucx, const std::string* no_ucx_reason)
      : registry_(registry), ucx_plane_(ucx), no_ucx_reason_(no_ucx_reason) {}

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
    stream_number_ = job_->StreamAttached(rank_);
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
        ucx_plane_->Open(job_, rank_, box, up_.attach().ucx_address(), up_.attach().ucx_tag(),
                         std::weak_ptr<Lifeline>(self_));
    if (!conn.ok()) return conn.status();
    v1::DownMessage hello = job_->AttachedMessage(rank_);
    hello.mutable_attached()->set_ucx_address(ucx_plane_->address());
    hello.mutable_attached()->set_ucx_tag((*conn)->tag());
    bool own = false;
    (void)grpc::SerializationTraits<v1::DownMessage>::Serialize(hello, &out_, &own);
    mailbox_ = box;
    {
      MutexLock lock(&mu_);
      ucx_ = *std::move(conn);
      hello_in_flight_ = true;
    }
    stream_number_ = job_->StreamAttached(rank_);
    StartWrite(&out_);
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
  grpc::ByteBuffer in_;   // the read in flight
  grpc::ByteBuffer out_;  // the write in flight (the mailbox allows one)
  int64_t index_ = 0;     // messages read (reads are serialized)
  v1::UpMessage up_;
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
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;  // waits for Resume()
  bool done_ ABSL_GUARDED_BY(mu_) = false;         // OnDone ran
  std::shared_ptr<StreamReactor> self_;            // until OnDone
  uint64_t stream_number_ = 0;                     // Job::StreamAttached's
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);  // a fatal error was written
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* ZenFlowService::UploadParameters(
    grpc::CallbackServerContext*, grpc::ByteBuffer* resp) {
  return new UploadReactor(registry_, resp);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ZenFlowService::Stream(
    grpc::CallbackServerContext*) {
  return StreamReactor::Start(registry_, ucx_, &no_ucx_reason_);
}

// ---- Server -----------------------------------------------------------------

namespace {

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
  return why.empty() ? "see gRPC's error above" : why;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZenFlowServer>> ZenFlowServer::Start(const ServerOptions& options) {
  std::unique_ptr<ZenFlowServer> s(new ZenFlowServer());
  RegistryOptions ro = options.registry;
  ro.max_message_bytes = options.max_message_bytes;
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
        UcxDataPlane::Start(ucx_options, s->registry_.get(), ro.max_outbox_bytes);
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
  s->service_ = std::make_unique<ZenFlowService>(s->registry_.get(), s->ucx_.get(), no_ucx,
                                                 s->checkpointer_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &s->port_);
  // gRPC sets SO_REUSEPORT by default on Linux, and then a second daemon on
  // the same port also "serves" and the kernel splits connections between
  // the two. Without it, binding a port another process listens on fails.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // gRPC's own limit is twice the service's, so moderately oversized
  // messages reach the service and get a counted, in-band rejection.
  const int64_t hard = std::min<int64_t>(2 * options.max_message_bytes, (int64_t{1} << 31) - 1);
  builder.SetMaxReceiveMessageSize(static_cast<int>(hard));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(s->service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
  counters.push_back(std::make_unique<CallCounterFactory>(s->registry_.get()));
  builder.experimental().SetInterceptorCreators(std::move(counters));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, ": ", WhyCannotListen(options.listen)));
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

int ZenFlowServer::metrics_port() const { return metrics_ == nullptr ? 0 : metrics_->port(); }

v1::GetStatsResponse ZenFlowServer::Snapshot() {
  absl::StatusOr<v1::GetStatsResponse> s = registry_->Stats("");
  v1::GetStatsResponse out = s.ok() ? *std::move(s) : v1::GetStatsResponse();
  if (ucx_ != nullptr) ucx_->FillStats(out.mutable_ucx());
  return out;
}

void ZenFlowServer::Shutdown() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
}

ZenFlowServer::~ZenFlowServer() {
  {
    MutexLock lock(&watchdog_mu_);
    stopping_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  metrics_.reset();  // its scrapes read the registry
  Shutdown();
  round_hook_.store(nullptr, std::memory_order_release);
  checkpointer_.reset();  // finishes queued writes while the jobs exist
  server_.reset();
  service_.reset();
  ucx_.reset();
  registry_.reset();
}

}  // namespace zenflow
