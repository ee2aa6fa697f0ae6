// gRPC adapter of zenflowd: the call counter, who a call is and what it
// may touch, the unary calls and the start of the streaming ones (their
// reactors: rendezvous_reactor, upload_reactor, stream_reactor); see
// service.h. The server that hosts it is zenflow_server.cc.
#include "server/service.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "server/auth.h"
#include "server/checkpointer.h"
#include "server/job_end.h"
#include "server/quote.h"
#include "server/rendezvous_reactor.h"
#include "server/stream_reactor.h"
#include "server/ucx_plane.h"
#include "server/upload_reactor.h"

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

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewCallCounterFactory(
    JobRegistry* registry) {
  return std::make_unique<CallCounterFactory>(registry);
}

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
  if (!admin_transport_.empty()) {
    // The admin socket's listener admitted only root and the daemon's own
    // user (server/admin_socket.h); whatever token the call carries, if
    // any, adds nothing.
    who.caller.admin = true;
    who.peer = admin_transport_;
    return who;
  }
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
  if (who.caller.has_token || who.caller.admin) return absl::OkStatus();
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

absl::Status IdleCall::NoFirstMessage(const char* what, absl::Duration waited) {
  return absl::DeadlineExceededError(absl::StrCat(
      "no ", what, " within ", absl::FormatDuration(waited),
      " of the call's start (zenflowd --attach_timeout_s): an idle call may not hold one of "
      "the daemon's --max_streams"));
}

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
  if (spec.status().code() == absl::StatusCode::kAlreadyExists) {
    spec = TakenIdError(who, req->spec().job_id());
  }
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
  if (req->job_id().empty()) {
    // The client library's "is this zenflowd?" call at connect
    // (client/connect_diagnosis.h): answered, but not a rejection to count.
    reactor->Finish(ToGrpcStatus(CheckJobId(req->job_id())));
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<Job>> job = Authorize(Identify(ctx), req->job_id(), "GetJob");
  if (job.ok()) (*job)->Describe(resp);
  if (job.status().code() == absl::StatusCode::kPermissionDenied &&
      !registry_->Find(req->job_id()).ok()) {
    // A job that does not exist (yet): ranks other than 0 poll GetJob until
    // rank 0 created it (Client::WaitForUpload), and are answered as a
    // caller of another's job is. That wait is no rejection: not counted in
    // zenflow_rejections_total (a long upload would set off
    // ZenflowRejectionsHigh); the audit log still records each call.
    reactor->Finish(ToGrpcStatus(job.status()));
    return reactor;
  }
  Finish(reactor, job.status(), nullptr, "get_job");
  return reactor;
}

absl::Status ZenFlowService::TakenIdError(const Who& who, const std::string& job_id) {
  absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(job_id);
  // The job's own token (or the admin's) may learn what the job does;
  // anyone else only that the id is taken (docs/security.md).
  if (job.ok() && (who.caller.admin || (who.caller.has_token &&
                                        who.caller.Grants((*job)->credential())))) {
    return absl::AlreadyExistsError(TakenIdMessage(**job, absl::Now()));
  }
  return absl::AlreadyExistsError(TakenByAnotherMessage(job_id));
}

grpc::ServerUnaryReactor* ZenFlowService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                    const v1::DeleteJobRequest* req,
                                                    v1::DeleteJobResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  const Who who = Identify(ctx);
  absl::StatusOr<std::shared_ptr<Job>> job = Authorize(who, req->job_id(), "DeleteJob");
  absl::Status s = job.status();
  if (s.ok() && req->has_finished_rank()) {
    FinishRank(reactor, who, *job, req, resp);
    return reactor;
  }
  if (s.ok()) {
    s = registry_->DeleteJob(req->job_id());
    // A deleted job is not restored after a restart.
    if (s.ok() && checkpointer_ != nullptr) checkpointer_->JobDeleted(req->job_id());
    Audit(who, "delete", req->job_id(), s);
  }
  Finish(reactor, s, nullptr, "delete_job");
  return reactor;
}

void ZenFlowService::FinishRank(grpc::ServerUnaryReactor* reactor, const Who& who,
                                const std::shared_ptr<Job>& job, const v1::DeleteJobRequest* req,
                                v1::DeleteJobResponse* resp) {
  const std::string& id = req->job_id();
  absl::StatusOr<Job::Finished> f = job->FinishRank(req->finished_rank(), req->keep());
  if (!f.ok()) {
    Finish(reactor, f.status(), job.get(), "delete_job");
    return;
  }
  resp->set_ranks_finished(f->ranks_finished);
  if (!f->all) {
    // Other ranks still train: the job stays as it is for them.
    Finish(reactor, absl::OkStatus(), nullptr, "delete_job");
    return;
  }
  if (!f->keep) {
    absl::Status s = registry_->DeleteJob(id);
    // Two last ranks' calls may race (or one be replayed): one deletes.
    if (s.code() == absl::StatusCode::kNotFound) s = absl::OkStatus();
    if (s.ok() && checkpointer_ != nullptr) checkpointer_->JobDeleted(id);
    resp->set_deleted(s.ok());
    audit_->Record("delete", "", id, who.peer, who.identity, who.caller, s,
                   "every rank finished");
    Finish(reactor, s, nullptr, "delete_job");
    return;
  }
  resp->set_kept(true);
  if (checkpointer_ == nullptr) {
    audit_->Record("keep", "", id, who.peer, who.identity, who.caller, absl::OkStatus(),
                   "every rank finished; no --state_dir: not checkpointed");
    Finish(reactor, absl::OkStatus(), nullptr, "delete_job");
    return;
  }
  // A kept job is checkpointed first; the call ends when the files are
  // durable. A failed checkpoint keeps the job all the same, and says so.
  checkpointer_->Request(id, [this, reactor, who, id](absl::StatusOr<v1::CheckpointResponse> r) {
    audit_->Record("keep", "", id, who.peer, who.identity, who.caller, r.status(),
                   "every rank finished; checkpointed");
    absl::Status s = r.status();
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat("job ", Quote(id), " is kept, but its checkpoint "
                                              "failed: ", s.message()));
    }
    Finish(reactor, s, nullptr, "delete_job");
  });
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
  return StartUploadReactor(this, registry_, resp, Identify(ctx), slot);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ZenFlowService::Stream(
    grpc::CallbackServerContext* ctx) {
  const absl::Status slot = AcquireStream() ? absl::OkStatus() : TooManyStreams(max_streams_);
  return StartStreamReactor(this, registry_, ucx_, &no_ucx_reason_, Identify(ctx), slot);
}

}  // namespace zenflow
