// gRPC adapter of zenflowd; see service.h.
#include "server/service.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/up_wire.h"
#include "common/mutex.h"
#include "common/quote.h"
#include "common/stream_error.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/auth.h"
#include "server/checkpointer.h"
#include "server/health_probe.h"
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
const char* RpcCall(const v1::SubmitImportanceRequest&) { return "SubmitImportance"; }
const char* RpcCall(const v1::HandOffRequest&) { return "HandOff"; }
const char* RpcCall(const v1::AllReduceRequest&) { return "AllReduce"; }

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

// ---- Credentials ---------------------------------------------------------------

Who ZenFlowService::Identify(grpc::CallbackServerContext* ctx) const {
  Who who;
  who.caller = auth_->Identify(ctx->client_metadata());
  who.peer = ctx->peer();
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
      if (!who.identity.empty()) who.identity += ",";
      who.identity.append(name.data(), name.size());
    }
  }
  return who;
}

namespace {

// UNAUTHENTICATED unless the call carries a well-formed token.
absl::Status RequireToken(const Who& who, const char* call) {
  if (!who.caller.error.ok()) return who.caller.error;
  if (who.caller.has_token) return absl::OkStatus();
  return absl::UnauthenticatedError(absl::StrCat(
      call, " needs the job's token: send gRPC metadata \"authorization: Bearer <token>\" "
      "(CreateJob returned it; zf_train --token_file, ClientOptions.token)"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<Job>> ZenFlowService::Authorize(const Who& who,
                                                               const std::string& job_id,
                                                               const char* call) {
  // A malformed id can name no job: its error says nothing about others.
  ZF_RETURN_IF_ERROR(CheckJobId(job_id));
  absl::Status s = RequireToken(who, call);
  if (s.ok()) {
    absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(job_id);
    // The admin may learn that a job does not exist.
    if (who.caller.admin) return job;
    // Anyone else gets one answer whether the job does not exist or is
    // another's.
    if (job.ok() && who.caller.Grants((*job)->credential())) return job;
    s = absl::PermissionDeniedError(absl::StrCat(
        "no job ", Quote(job_id), " is reachable with this token (it does not exist, or its "
        "CreateJob gave it another token)"));
  }
  audit_->Record("denied", call, job_id, who.peer, who.identity, who.caller, s);
  return s;
}

ZenFlowService::ZenFlowService(JobRegistry* registry, UcxDataPlane* ucx, std::string no_ucx_reason,
                               Checkpointer* checkpointer, const Authenticator* auth,
                               AuditLog* audit, int max_streams, absl::Duration attach_timeout)
    : registry_(registry),
      ucx_(ucx),
      no_ucx_reason_(std::move(no_ucx_reason)),
      checkpointer_(checkpointer),
      auth_(auth),
      audit_(audit),
      max_streams_(max_streams),
      attach_timeout_(attach_timeout) {
  if (attach_timeout_ <= absl::ZeroDuration()) return;
  sweeper_ = std::thread([this] {
    const absl::Duration tick = std::min(absl::Seconds(1), attach_timeout_ / 4);
    for (;;) {
      std::vector<std::weak_ptr<IdleCall>> due;
      {
        MutexLock lock(&idle_mu_);
        idle_mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; },
                                  tick);
        if (stopping_) return;
        const absl::Time now = absl::Now();
        for (auto it = idle_.begin(); it != idle_.end();) {
          if (it->second.deadline > now) {
            ++it;
            continue;
          }
          due.push_back(std::move(it->second.call));
          it = idle_.erase(it);
        }
      }
      for (const std::weak_ptr<IdleCall>& w : due) {
        if (std::shared_ptr<IdleCall> call = w.lock()) call->ExpireIfIdle(attach_timeout_);
      }
    }
  });
}

ZenFlowService::~ZenFlowService() {
  {
    MutexLock lock(&idle_mu_);
    stopping_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
}

uint64_t ZenFlowService::Watch(std::weak_ptr<IdleCall> call) {
  if (attach_timeout_ <= absl::ZeroDuration()) return 0;
  MutexLock lock(&idle_mu_);
  const uint64_t id = next_idle_++;
  idle_[id] = {absl::Now() + attach_timeout_, std::move(call)};
  return id;
}

void ZenFlowService::Unwatch(uint64_t id) {
  if (id == 0) return;
  MutexLock lock(&idle_mu_);
  idle_.erase(id);
}

namespace {

absl::Status NoFirstMessage(const char* what, absl::Duration waited) {
  return absl::DeadlineExceededError(absl::StrCat(
      "no ", what, " within ", absl::FormatDuration(waited),
      " of the call's start (zenflowd --attach_timeout_s): an idle call may not hold one of "
      "the daemon's --max_streams"));
}

}  // namespace

bool ZenFlowService::AcquireStream() {
  int n = streams_.load();
  do {
    if (n >= max_streams_) return false;
  } while (!streams_.compare_exchange_weak(n, n + 1));
  return true;
}

grpc::ServerUnaryReactor* ZenFlowService::CreateJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CreateJobRequest* req,
                                                    v1::CreateJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (absl::Status s = CheckSize(*req, registry_); !s.ok()) {
    Finish(reactor, s, nullptr, "create_job");
    return reactor;
  }
  const Who who = Identify(ctx);
  if (!who.caller.error.ok()) {
    audit_->Record("denied", "CreateJob", req->spec().job_id(), who.peer, who.identity,
                   who.caller, who.caller.error);
    Finish(reactor, who.caller.error, nullptr, "create_job");
    return reactor;
  }
  // The job belongs to the caller's token; without one (or with the admin
  // token) to a new one, returned once.
  std::string token, credential;
  if (who.caller.has_token && !who.caller.admin) {
    credential = who.caller.digest;
  } else {
    token = NewToken();
    credential = TokenDigest(token);
  }
  absl::StatusOr<v1::JobSpec> spec = registry_->CreateJob(req->spec(), credential);
  if (spec.ok()) {
    *resp->mutable_spec() = *std::move(spec);
    resp->set_token(token);
  }
  Audit(who, "create", req->spec().job_id(), spec.status());
  Finish(reactor, spec.status(), nullptr, "create_job");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::JoinJob(grpc::CallbackServerContext* ctx,
                                                  const v1::JoinJobRequest* req,
                                                  v1::JoinJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  const Who who = Identify(ctx);
  absl::StatusOr<std::shared_ptr<Job>> job = Authorize(who, req->job_id(), "JoinJob");
  if (!job.ok()) {
    Finish(reactor, job.status(), nullptr, "join_job");
    return reactor;
  }
  absl::StatusOr<v1::JoinJobResponse> r = (*job)->Join(req->rank());
  if (r.ok()) *resp = *std::move(r);
  Audit(who, "join", req->job_id(), r.status());
  Finish(reactor, r.status(), job->get(), "join_job");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::GetJob(grpc::CallbackServerContext* ctx,
                                                 const v1::GetJobRequest* req,
                                                 v1::GetJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::StatusOr<std::shared_ptr<Job>> job = Authorize(Identify(ctx), req->job_id(), "GetJob");
  if (job.ok()) (*job)->Describe(resp);
  Finish(reactor, job.status(), nullptr, "get_job");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                    const v1::DeleteJobRequest* req,
                                                    v1::DeleteJobResponse*) {
  auto* reactor = ctx->DefaultReactor();
  const Who who = Identify(ctx);
  absl::StatusOr<std::shared_ptr<Job>> job = Authorize(who, req->job_id(), "DeleteJob");
  absl::Status s = job.status();
  if (s.ok()) {
    s = registry_->DeleteJob(req->job_id());
    // A deleted job is not restored after a restart.
    if (s.ok() && checkpointer_ != nullptr) checkpointer_->JobDeleted(req->job_id());
    Audit(who, "delete", req->job_id(), s);
  }
  Finish(reactor, s, nullptr, "delete_job");
  return reactor;
}

grpc::ServerUnaryReactor* ZenFlowService::Checkpoint(grpc::CallbackServerContext* ctx,
                                                     const v1::CheckpointRequest* req,
                                                     v1::CheckpointResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  const Who who = Identify(ctx);
  absl::Status s;
  if (!req->job_id().empty()) {
    s = Authorize(who, req->job_id(), "Checkpoint").status();
  } else if (!who.caller.admin) {
    // Every job at once is the admin's call.
    s = RequireToken(who, "Checkpoint");
    if (s.ok()) {
      s = absl::PermissionDeniedError(
          "a Checkpoint of every job (empty job_id) needs the admin token (zenflowd "
          "--admin_token_file); name your job to checkpoint it");
    }
    audit_->Record("denied", "Checkpoint", "", who.peer, who.identity, who.caller, s);
  }
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
  absl::StatusOr<std::shared_ptr<Job>> job = Authorize(Identify(ctx), req->job_id(), "GetState");
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
  absl::StatusOr<std::shared_ptr<Job>> job = Authorize(Identify(ctx), req->job_id(), "SetState");
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
  const Who who = Identify(ctx);
  absl::Status s;
  if (!req->job_id().empty()) {
    // One job: its token's. The daemon-wide figures only for the admin.
    s = Authorize(who, req->job_id(), "GetStats").status();
    if (s.ok() && who.caller.admin) {
      absl::StatusOr<v1::GetStatsResponse> r = registry_->Stats(req->job_id());
      s = r.status();
      if (r.ok()) *resp = *std::move(r);
    } else if (s.ok()) {
      *resp = registry_->StatsOf(who.caller.digest, req->job_id());
    }
  } else if (who.caller.admin) {
    absl::StatusOr<v1::GetStatsResponse> r = registry_->Stats("");
    s = r.status();
    if (r.ok()) *resp = *std::move(r);
  } else {
    // No job named: the caller's token's jobs, nothing of anyone else's.
    s = RequireToken(who, "GetStats");
    if (s.ok()) {
      *resp = registry_->StatsOf(who.caller.digest);
    } else {
      audit_->Record("denied", "GetStats", "", who.peer, who.identity, who.caller, s);
    }
  }
  if (s.ok() && who.caller.admin && ucx_ != nullptr) ucx_->FillStats(resp->mutable_ucx());
  Finish(reactor, s, nullptr, "get_stats");
  return reactor;
}


// ---- Rendezvous calls (SubmitImportance, AllReduce) -------------------------

template <typename Request>
grpc::ServerUnaryReactor* ZenFlowService::LookUp(grpc::CallbackServerContext* ctx,
                                                 const Request& req, std::shared_ptr<Job>* job) {
  absl::StatusOr<std::shared_ptr<Job>> found = Authorize(Identify(ctx), req.job_id(),
                                                         RpcCall(req));
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

// An up message read from gRPC's slices. A shard's payload stays in them
// (no copy, no allocation of its size): `*payload` views `*slices`, which
// keep them, and `*split` is set; everything else is parsed as protobuf
// would. Any other message, or a shard in another form, is parsed by
// protobuf (ParseRaw) with its payload in the message.
absl::Status ParseUpRaw(grpc::ByteBuffer* buf, int64_t index, v1::UpMessage* out,
                        std::vector<grpc::Slice>* slices, ShardPayload* payload, bool* split,
                        JobRegistry* registry) {
  *split = false;
  ZF_RETURN_IF_ERROR(registry->CheckMessageSize(buf->Length()));
  slices->clear();
  if (buf->Dump(slices).ok()) {
    std::vector<absl::string_view> pieces;
    pieces.reserve(slices->size());
    for (const grpc::Slice& s : *slices) {
      pieces.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    *split = ParseUpSplit(pieces, out, payload);
    if (*split) return absl::OkStatus();
  }
  slices->clear();
  payload->Clear();
  return ParseRaw(buf, index, out, registry);
}

// ---- UploadParameters ---------------------------------------------------------

class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer>, public IdleCall {
 public:
  // Owned by itself until OnDone (and briefly by the idle sweep).
  // `refused`: the call is over the stream limit and ends at once with it.
  static UploadReactor* Start(ZenFlowService* service, JobRegistry* registry,
                              grpc::ByteBuffer* resp, Who who, absl::Status refused) {
    auto r = std::shared_ptr<UploadReactor>(
        new UploadReactor(service, registry, resp, std::move(who), refused.ok()));
    r->self_ = r;
    if (!refused.ok()) {
      r->Done(refused);
      return r.get();
    }
    r->watch_ = service->Watch(std::weak_ptr<IdleCall>(r));
    r->StartRead(&r->in_);
    return r.get();
  }

  void Expire(absl::Duration waited) override { Done(NoFirstMessage("upload chunk", waited)); }

  void OnReadDone(bool ok) override {
    // The first chunk, unless the idle sweep ended the call already.
    if (upload_ == nullptr && !FirstMessage()) return;
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
      absl::StatusOr<std::shared_ptr<Job>> job =
          service_->Authorize(who_, chunk_.job_id(), "UploadParameters");
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
  void OnDone() override {
    service_->Unwatch(watch_);
    if (holds_slot_) service_->ReleaseStream();
    std::shared_ptr<UploadReactor> last = std::move(self_);  // may delete this
  }

 private:
  UploadReactor(ZenFlowService* service, JobRegistry* registry, grpc::ByteBuffer* resp, Who who,
                bool holds_slot)
      : service_(service), registry_(registry), resp_(resp), who_(std::move(who)),
        holds_slot_(holds_slot) {}

  void Done(const absl::Status& s) {
    if (!s.ok()) {
      registry_->CountRejection(s.code(), "upload_parameters");
      if (job_ != nullptr) job_->CountRejection(s.code());
    }
    upload_.reset();  // an upload that did not commit clears its staging now
    Finish(ToGrpcStatus(s));
  }

  ZenFlowService* const service_;
  JobRegistry* const registry_;
  grpc::ByteBuffer* const resp_;
  const Who who_;
  const bool holds_slot_;
  std::shared_ptr<UploadReactor> self_;  // until OnDone
  uint64_t watch_ = 0;                   // ZenFlowService::Watch's
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
                            public Lifeline,
                            public IdleCall {
 public:
  // Owned by itself until OnDone, and by the UCX data plane while it ends
  // the stream (Abort).
  // `refused`: the call is over the stream limit and ends at once with it.
  static StreamReactor* Start(ZenFlowService* service, JobRegistry* registry, UcxDataPlane* ucx,
                              const std::string* no_ucx_reason, Who who, absl::Status refused) {
    auto r = std::shared_ptr<StreamReactor>(
        new StreamReactor(service, registry, ucx, no_ucx_reason, std::move(who), refused.ok()));
    r->self_ = r;
    if (!refused.ok()) {
      registry->CountRejection(refused.code(), "stream");
      r->RequestFinish(std::move(refused));
      return r.get();
    }
    r->watch_ = service->Watch(std::weak_ptr<IdleCall>(r));
    r->StartRead(&r->in_);
    return r.get();
  }

  void Expire(absl::Duration waited) override {
    const absl::Status why = NoFirstMessage("attach", waited);
    registry_->CountRejection(why.code(), "stream");
    RequestFinish(why);
  }

  // The data plane closed the rank's UCX connection: end the stream.
  void Abort(absl::Status why) override {
    {
      MutexLock lock(&mu_);
      if (done_) return;
    }
    RequestFinish(std::move(why));
  }

  // The first message (the attach) is handled here before anything else is
  // read. After it, the stream reads one message ahead: while one message is
  // handled (parsed, checked, added), the next one is received, on whichever
  // thread gRPC calls back on; messages are handled one at a time, in order
  // (`handling_`). At most one read message waits (`queued_`), so a stream
  // holds at most three messages: the one handled, the one waiting and the
  // read in flight.
  void OnReadDone(bool ok) override {
    if (job_ == nullptr) {
      if (!ok) return RequestFinish(absl::OkStatus());  // the client half-closed
      // The first message, unless the idle sweep ended the call already.
      if (!FirstMessage()) return;
      absl::Status s = ParseRaw(&in_, ++index_, &up_, registry_);
      if (s.ok()) s = Attach();
      up_.Clear();
      if (!s.ok()) {
        registry_->CountRejection(s.code(), "stream");
        if (job_ != nullptr) job_->CountRejection(s.code());
        job_ = nullptr;
        return RequestFinish(s);
      }
      {
        MutexLock lock(&mu_);
        if (!ReadMoreLocked()) return;
      }
      StartRead(&in_);
      return;
    }
    bool read = false, handle = false;
    {
      MutexLock lock(&mu_);
      read_in_flight_ = false;
      if (ok) {
        queued_.push_back(std::move(in_));
      } else {
        read_ended_ = true;  // the client half-closed: finish once handled
      }
      read = ReadMoreLocked();
      handle = !handling_;
      handling_ = true;
    }
    if (read) StartRead(&in_);
    if (handle) HandleQueued();
  }

  void Resume() override {
    {
      MutexLock lock(&mu_);
      if (!read_paused_ || finish_requested_) return;
      read_paused_ = false;
      if (!ReadMoreLocked()) return;
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
    service_->Unwatch(watch_);
    if (holds_slot_) service_->ReleaseStream();
    std::shared_ptr<StreamReactor> last = std::move(self_);  // may delete this
  }

 private:
  StreamReactor(ZenFlowService* service, JobRegistry* registry, UcxDataPlane* ucx,
                const std::string* no_ucx_reason, Who who, bool holds_slot)
      : service_(service), registry_(registry), ucx_plane_(ucx), no_ucx_reason_(no_ucx_reason),
        who_(std::move(who)), holds_slot_(holds_slot) {}

  // True when a read should start now (and marks it in flight): none is,
  // the queue has room, and nothing holds reading back.
  bool ReadMoreLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_requested_ || read_ended_ || read_in_flight_ || read_paused_ ||
        queued_.size() >= kReadAhead) {
      return false;
    }
    read_in_flight_ = true;
    return true;
  }

  // Handles the queued messages in order until none is left; the one thread
  // doing so (`handling_`).
  void HandleQueued() {
    for (;;) {
      grpc::ByteBuffer buf;
      bool read = false;
      {
        MutexLock lock(&mu_);
        if (queued_.empty() || finish_requested_) {
          handling_ = false;
          queued_.clear();
          if (!read_ended_) return;
          break;
        }
        buf = std::move(queued_.front());
        queued_.pop_front();
        read = ReadMoreLocked();
      }
      if (read) StartRead(&in_);
      bool split = false;
      absl::Status s = ParseUpRaw(&buf, ++index_, &up_, &slices_, &payload_, &split, registry_);
      (void)IngestUp(registry_, job_.get(), rank_, Wire::kGrpc, mailbox_.get(), std::move(s), up_,
                     split ? &payload_ : nullptr);
      up_.Clear();
      payload_.Clear();
      slices_.clear();
      if (ucx_ == nullptr) {
        // Replies back up (the rank does not read its stream): stop reading
        // until the mailbox drains (Resume).
        {
          MutexLock lock(&mu_);
          read_paused_ = true;
        }
        if (!mailbox_->Full(this)) {
          MutexLock lock(&mu_);
          read_paused_ = false;
          read = ReadMoreLocked();
        } else {
          read = false;
        }
        if (read) StartRead(&in_);
      }
    }
    RequestFinish(absl::OkStatus());  // the client half-closed; all handled
  }

  absl::Status Attach() {
    if (up_.kind_case() != v1::UpMessage::kAttach) {
      return absl::FailedPreconditionError(
          "the first message of a stream must be attach{job_id, rank}");
    }
    absl::StatusOr<std::shared_ptr<Job>> job =
        service_->Authorize(who_, up_.attach().job_id(), "Stream");
    if (!job.ok()) return job.status();
    job_ = *job;
    absl::Status s = AttachAuthorized();
    service_->Audit(who_, "attach", up_.attach().job_id(), s);
    return s;
  }

  // Attach() once the caller may touch the job.
  absl::Status AttachAuthorized() {
    absl::StatusOr<std::shared_ptr<Mailbox>> box = job_->MailboxFor(up_.attach().rank());
    if (!box.ok()) return box.status();
    rank_ = up_.attach().rank();
    // A round the rank lost in a daemon restart goes again, after the greeting.
    std::vector<Mailbox::Message> missed;
    if (up_.attach().has_rounds_done()) {
      absl::StatusOr<std::vector<Mailbox::Message>> m =
          job_->MissedRound(rank_, up_.attach().rounds_done());
      if (!m.ok()) return m.status();
      missed = *std::move(m);
    }
    if (!up_.attach().ucx_address().empty()) return AttachUcx(*box, missed);
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
    for (const Mailbox::Message& m : missed) mailbox_->Push(m);
    return absl::OkStatus();
  }

  // The rank asked for the UCX data plane: connect to its worker, make the
  // connection the mailbox's writer and greet over gRPC with our address.
  absl::Status AttachUcx(const std::shared_ptr<Mailbox>& box,
                         const std::vector<Mailbox::Message>& missed) {
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
    hello.mutable_attached()->set_ucx_address((*conn)->worker_address());
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
    for (const Mailbox::Message& m : missed) box->Push(m);
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

  ZenFlowService* const service_;
  JobRegistry* const registry_;
  UcxDataPlane* const ucx_plane_;
  const std::string* const no_ucx_reason_;
  const Who who_;
  const bool holds_slot_;  // of the service's max_streams
  uint64_t watch_ = 0;             // ZenFlowService::Watch's
  static constexpr size_t kReadAhead = 1;  // read messages waiting to be handled
  grpc::ByteBuffer in_;   // the read in flight
  // The read message's slices and its shard's payload in them (ParseUpRaw).
  std::vector<grpc::Slice> slices_;
  ShardPayload payload_;
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
  bool read_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ended_ ABSL_GUARDED_BY(mu_) = false;   // the client half-closed
  bool handling_ ABSL_GUARDED_BY(mu_) = false;     // a thread runs HandleQueued
  std::deque<grpc::ByteBuffer> queued_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;         // OnDone ran
  std::shared_ptr<StreamReactor> self_;            // until OnDone
  uint64_t stream_number_ = 0;                     // Job::StreamAttached's
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);  // a fatal error was written
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

namespace {

absl::Status TooManyStreams(int limit) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "zenflowd has ", limit, " streams open, its limit (--max_streams): close one, or retry "
      "later"));
}

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* ZenFlowService::UploadParameters(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  const absl::Status slot = AcquireStream() ? absl::OkStatus() : TooManyStreams(max_streams_);
  return UploadReactor::Start(this, registry_, resp, Identify(ctx), slot);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ZenFlowService::Stream(
    grpc::CallbackServerContext* ctx) {
  const absl::Status slot = AcquireStream() ? absl::OkStatus() : TooManyStreams(max_streams_);
  return StreamReactor::Start(this, registry_, ucx_, &no_ucx_reason_, Identify(ctx), slot);
}

// ---- Server -----------------------------------------------------------------

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
                            options.ucx_dispatch_threads);
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
  // gRPC sets SO_REUSEPORT by default on Linux, and then a second daemon on
  // the same port also "serves" and the kernel splits connections between
  // the two. Without it, binding a port another process listens on fails.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Keepalive: a rank whose host or link went away without a FIN (a cut
  // cable, a frozen VM) is noticed in ~20 s instead of at TCP's hours-long
  // timeout, and the pings the clients send (client.cc) are welcome.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
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
  health_probe_.reset();  // forwards to server_
  server_.reset();
  if (!local_dir_.empty()) {
    unlink(absl::StrCat(local_dir_, "/", kLocalSocketName).c_str());
    rmdir(local_dir_.c_str());
  }
  service_.reset();
  ucx_.reset();
  registry_.reset();
}

}  // namespace zenflow
