// The client of one zenflowd; see one_daemon_client.h.
#include "client/one_daemon_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/backoff.h"
#include "client/connect_diagnosis.h"
#include "client/data_stream.h"
#include "client/releaser.h"
#include "client/stream.h"
#include "client/ucx_data_stream.h"
#include "common/dtype_proto.h"
#include "common/geometry.h"
#include "common/grpc_keepalive.h"
#include "common/status_macros.h"
#include "common/tls_files.h"

namespace zenflow {

namespace {

// How long Connect waits for the resolver before it lets gRPC try on its
// own (a name that does not exist is answered far sooner).
constexpr absl::Duration kResolveTimeout = absl::Seconds(3);

}  // namespace

OneDaemonClient::OneDaemonClient(const ClientOptions& options)
    : options_(options), window_(options.max_inflight_bytes), log_(options.max_replay_bytes) {
  MutexLock lock(&mu_);
  token_ = options.token;
}

absl::StatusOr<std::unique_ptr<OneDaemonClient>> OneDaemonClient::Connect(
    const ClientOptions& options, const std::string& target) {
  std::unique_ptr<OneDaemonClient> c(new OneDaemonClient(options));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // gRPC's reconnect backoff does the retrying while Connect waits (its
  // defaults start at 1 s, long for a daemon that is still starting). Not
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also takes it as the deadline
  // of each connection attempt, and a handshake on a loaded host can take
  // longer than a short backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Keepalive pings (common/grpc_keepalive.h; zenflowd accepts them at this
  // rate): a daemon whose host or link went away without closing the
  // connection fails the rank's calls and stream in ~20 s (then daemon_wait
  // applies) instead of never.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  const bool tls = !options.tls_ca.empty();
  if (tls) {
    ZF_ASSIGN_OR_RETURN(TlsPem pem, ReadTlsFiles({options.tls_cert, options.tls_key, options.tls_ca},
                                                 {"tls_cert", "tls_key", "tls_ca"}));
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = std::move(pem.ca);
    ssl.pem_cert_chain = std::move(pem.cert);
    ssl.pem_private_key = std::move(pem.key);
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  } else if (!options.tls_cert.empty() || !options.tls_key.empty() ||
             !options.tls_server_name.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert, tls_key and tls_server_name need tls_ca (the CA that signed zenflowd's "
        "certificate): without it the connection is plaintext");
  }
  // The target's form and its name first: neither gets better by waiting.
  ZF_ASSIGN_OR_RETURN(ParsedTarget parsed, ParseTarget(target));
  ConnectHints hints;
  hints.target = target;
  hints.tls = tls;
  hints.tls_ca = options.tls_ca;
  hints.tls_server_name = options.tls_server_name;
  hints.client_cert = !options.tls_cert.empty();
  hints.wait = options.connect_timeout;
  hints.progress = options.on_progress;
  std::vector<Endpoint> endpoints;
  absl::StatusOr<std::vector<Endpoint>> resolved = ResolveHost(parsed, kResolveTimeout);
  if (resolved.ok()) {
    endpoints = *std::move(resolved);
  } else if (resolved.status().code() == absl::StatusCode::kNotFound ||
             resolved.status().code() == absl::StatusCode::kInvalidArgument) {
    return resolved.status();
  } else {
    // A slow or failing resolver: gRPC resolves again while Connect waits.
    ReportProgress(hints, absl::StrCat(resolved.status().message(), "; trying on for up to ",
                                       absl::FormatDuration(hints.wait)));
  }
  c->channel_ = grpc::CreateCustomChannel(target, credentials, args);
  ZF_RETURN_IF_ERROR(WaitForZenflowd(c->channel_, parsed, endpoints, hints));
  c->stub_ = v1::ZenFlow::NewStub(c->channel_);
  return c;
}

OneDaemonClient::~OneDaemonClient() {
  CloseStream();
  std::shared_ptr<AttachedStream> stream;
  {
    MutexLock lock(&mu_);
    stream = std::move(stream_);
  }
  stream.reset();  // its data path uses the UCX link: gone first
  ucx_ready_.store(nullptr, std::memory_order_release);
  MutexLock lock(&attach_mu_);
  ucx_.reset();
}

std::unique_ptr<grpc::ClientContext> OneDaemonClient::UnaryContext(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  const std::string token = this->token();
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

// ---- Control ------------------------------------------------------------------

absl::StatusOr<v1::JobSpec> OneDaemonClient::CreateJob(const v1::JobSpec& spec) {
  return CreateJobTokened(spec, nullptr);
}

void OneDaemonClient::SetToken(const std::string& token) {
  MutexLock lock(&mu_);
  token_ = token;
}

absl::StatusOr<v1::JobSpec> OneDaemonClient::CreateJobTokened(const v1::JobSpec& spec,
                                                              std::string* new_token) {
  v1::CreateJobRequest req;
  *req.mutable_spec() = spec;
  v1::CreateJobResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpcStatus(stub_->CreateJob(ctx.get(), req, &resp)));
  {
    // The daemon's new token, when we sent none. A client that sent one
    // (the admin's, say) keeps sending it.
    MutexLock lock(&mu_);
    if (token_.empty()) token_ = resp.token();
  }
  if (new_token != nullptr) *new_token = resp.token();
  return resp.spec();
}

absl::StatusOr<v1::UploadParametersResponse> OneDaemonClient::UploadParameters(
    const std::string& job_id, const std::vector<TensorValues>& tensors) {
  auto ctx = UnaryContext(options_.rpc_timeout);
  v1::UploadParametersResponse resp;
  auto writer = stub_->UploadParameters(ctx.get(), &resp);
  for (const TensorValues& t : tensors) {
    const int64_t esize = static_cast<int64_t>(DTypeSize(t.dtype));
    const int64_t per_chunk = std::max<int64_t>(1, options_.max_shard_bytes / esize);
    const char* data = static_cast<const char*>(t.data);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    for (int64_t off = 0; off < numel || (numel == 0 && off == 0); off += per_chunk) {
      v1::UploadParametersRequest chunk;
      chunk.set_job_id(job_id);
      chunk.set_tensor(t.name);
      if (off == 0) chunk.mutable_shape()->Add(t.shape.begin(), t.shape.end());
      chunk.set_offset(off);
      chunk.set_dtype(ToProto(t.dtype));
      const int64_t n = std::min(per_chunk, numel - off);
      chunk.set_payload(data + off * esize, n * esize);
      if (!writer->Write(chunk)) break;  // the server ended the call: Finish says why
      if (numel == 0) break;
    }
  }
  writer->WritesDone();
  ZF_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return resp;
}

absl::StatusOr<v1::JoinJobResponse> OneDaemonClient::JoinJob(const std::string& job_id,
                                                             int32_t rank) {
  v1::JoinJobRequest req;
  req.set_job_id(job_id);
  req.set_rank(rank);
  v1::JoinJobResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpcStatus(stub_->JoinJob(ctx.get(), req, &resp)));
  interval_.store(std::max(1, resp.spec().zenflow().update_interval()));
  auto_interval_.store(resp.spec().zenflow().auto_update_interval());
  ZF_RETURN_IF_ERROR(Attach(job_id, rank));
  return resp;
}

absl::StatusOr<v1::GetJobResponse> OneDaemonClient::GetJob(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::GetJobResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetJob(ctx.get(), req, &resp)));
  return resp;
}

absl::StatusOr<v1::ColumnState> OneDaemonClient::GetState(const std::string& job_id,
                                                          const std::string& tensor,
                                                          int64_t* selection_version) {
  v1::ColumnState out;
  out.set_tensor(tensor);
  v1::GetStateRequest req;
  req.set_job_id(job_id);
  req.set_tensor(tensor);
  int64_t version = -1;
  for (;;) {
    v1::GetStateResponse resp;
    auto ctx = UnaryContext(options_.rpc_timeout);
    ZF_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetState(ctx.get(), req, &resp)));
    if (version >= 0 && resp.selection_version() != version) {
      return absl::AbortedError(absl::StrCat(
          "job '", job_id, "' reselected its columns (version ", version, " -> ",
          resp.selection_version(), ") while its state was read; read it again"));
    }
    version = resp.selection_version();
    const v1::ColumnState& part = resp.state();
    out.mutable_columns()->MergeFrom(part.columns());
    out.mutable_values()->MergeFrom(part.values());
    out.mutable_m()->MergeFrom(part.m());
    out.mutable_v()->MergeFrom(part.v());
    out.mutable_update_counts()->MergeFrom(part.update_counts());
    if (resp.next_column() <= req.first_column() && resp.next_column() < resp.columns()) {
      return absl::InternalError("GetState made no progress");
    }
    if (resp.next_column() >= resp.columns()) break;
    req.set_first_column(resp.next_column());
  }
  if (selection_version != nullptr) *selection_version = version;
  return out;
}

absl::Status OneDaemonClient::SetState(const std::string& job_id, const v1::ColumnState& state) {
  const int n = state.columns_size();
  const int rows = n == 0 ? 0 : state.values_size() / n;
  if (static_cast<int64_t>(rows) * n != state.values_size() || state.m_size() != state.values_size() ||
      state.v_size() != state.values_size() || state.update_counts_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", state.tensor(), "': the state of ", n, " columns has ", state.values_size(),
        " values, ", state.m_size(), " m, ", state.v_size(), " v and ",
        state.update_counts_size(), " counts"));
  }
  // Columns per call: at most 32 MiB of values, m and v.
  const int per = static_cast<int>(std::max<int64_t>(1, (int64_t{32} << 20) / (12 * std::max(rows, 1) + 8)));
  int first = 0;
  do {
    const int end = std::min(n, first + per);
    v1::SetStateRequest req;
    req.set_job_id(job_id);
    v1::ColumnState* part = req.mutable_state();
    part->set_tensor(state.tensor());
    part->mutable_columns()->Add(state.columns().begin() + first, state.columns().begin() + end);
    const auto from = static_cast<int64_t>(first) * rows, to = static_cast<int64_t>(end) * rows;
    part->mutable_values()->Add(state.values().begin() + from, state.values().begin() + to);
    part->mutable_m()->Add(state.m().begin() + from, state.m().begin() + to);
    part->mutable_v()->Add(state.v().begin() + from, state.v().begin() + to);
    part->mutable_update_counts()->Add(state.update_counts().begin() + first,
                                       state.update_counts().begin() + end);
    v1::SetStateResponse resp;
    auto ctx = UnaryContext(options_.rpc_timeout);
    ZF_RETURN_IF_ERROR(FromGrpcStatus(stub_->SetState(ctx.get(), req, &resp)));
    first = end;
  } while (first < n);
  return absl::OkStatus();
}

absl::StatusOr<v1::GetJobResponse> OneDaemonClient::WaitForUpload(const std::string& job_id,
                                                                  absl::Duration timeout) {
  // A job that does not exist yet answers as one of another token would
  // (PERMISSION_DENIED): both are waited out, and reported at the end.
  auto not_yet = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kNotFound ||
           s.code() == absl::StatusCode::kPermissionDenied;
  };
  absl::StatusOr<v1::GetJobResponse> job;
  const bool ready = RetryWithBackoff(timeout, absl::Milliseconds(10), absl::Milliseconds(500), [&] {
    job = GetJob(job_id);
    if (job.ok()) return job->parameters_uploaded();
    return !not_yet(job.status());  // other errors end the wait
  });
  if (!job.ok() && !not_yet(job.status())) return job.status();
  if (!ready) {
    return absl::DeadlineExceededError(absl::StrCat(
        "job '", job_id, "' was not created and uploaded within ", absl::FormatDuration(timeout),
        job.ok() ? std::string()
                 : absl::StrCat(" (the last answer: ", job.status().ToString(),
                                "; do all ranks have the job's token?)")));
  }
  return job;
}

absl::Status OneDaemonClient::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest req;
  req.set_job_id(job_id);
  v1::DeleteJobResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  return FromGrpcStatus(stub_->DeleteJob(ctx.get(), req, &resp));
}

absl::StatusOr<v1::DeleteJobResponse> OneDaemonClient::FinishJob(const std::string& job_id,
                                                                 int32_t rank, bool keep) {
  v1::DeleteJobRequest req;
  req.set_job_id(job_id);
  req.set_finished_rank(rank);
  req.set_keep(keep);
  v1::DeleteJobResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpcStatus(stub_->DeleteJob(ctx.get(), req, &resp)));
  return resp;
}

absl::StatusOr<v1::GetStatsResponse> OneDaemonClient::GetStats(const std::string& job_id) {
  v1::GetStatsRequest req;
  req.set_job_id(job_id);
  v1::GetStatsResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetStats(ctx.get(), req, &resp)));
  return resp;
}

absl::Status OneDaemonClient::Rendezvous(
    absl::Duration timeout, const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  auto ctx = UnaryContext(timeout);
  bool abandoned = false;
  {
    MutexLock lock(&calls_mu_);
    calls_[ctx.get()] = &abandoned;
  }
  const grpc::Status st = call(ctx.get());
  MutexLock lock(&calls_mu_);
  calls_.erase(ctx.get());
  if (abandoned) {
    // Not the daemon's going away: no ride-through for it.
    return absl::AbortedError(
        "the call was abandoned: another daemon of the job failed the same operation");
  }
  return FromGrpcStatus(st);
}

void OneDaemonClient::AbandonCalls() {
  MutexLock lock(&calls_mu_);
  for (auto& [ctx, abandoned] : calls_) {
    *abandoned = true;
    ctx->TryCancel();
  }
}

absl::Status OneDaemonClient::RawSubmitImportance(const v1::SubmitImportanceRequest& req,
                                                  v1::SubmitImportanceResponse* resp) {
  return Rendezvous(options_.selection_timeout, [&](grpc::ClientContext* ctx) {
    return stub_->SubmitImportance(ctx, req, resp);
  });
}

absl::Status OneDaemonClient::RawHandOff(const v1::HandOffRequest& req, v1::HandOffResponse* resp) {
  return Rendezvous(options_.rpc_timeout,
                    [&](grpc::ClientContext* ctx) { return stub_->HandOff(ctx, req, resp); });
}

absl::Status OneDaemonClient::RawAllReduce(const v1::AllReduceRequest& req,
                                           v1::AllReduceResponse* resp) {
  return Rendezvous(options_.selection_timeout,
                    [&](grpc::ClientContext* ctx) { return stub_->AllReduce(ctx, req, resp); });
}

absl::StatusOr<v1::Selection> OneDaemonClient::SubmitImportance(
    int64_t step, const std::vector<v1::TensorImportance>& tensors) {
  v1::SubmitImportanceRequest req;
  {
    MutexLock lock(&mu_);
    req.set_job_id(job_id_);
    req.set_rank(rank_);
  }
  req.set_step(step);
  for (const auto& t : tensors) *req.add_tensors() = t;
  v1::SubmitImportanceResponse resp;
  bool again = false;
  ZF_RETURN_IF_ERROR(RideThrough([&]() -> absl::Status {
    // Retried after a recovery: the replayed closes of the rounds before
    // the selection's travel on the stream, which this unary call could
    // overtake; the daemon refuses a selection before them.
    if (again) ZF_RETURN_IF_ERROR(WaitRoundUpdated(RoundOfStep(step) - 1));
    again = true;
    return RawSubmitImportance(req, &resp);
  }));
  if (ride_through()) {
    selection_round_.store(RoundOfStep(step));
    log_.AddSelection(RoundOfStep(step), std::move(req));
  }
  return resp.selection();
}

absl::StatusOr<v1::HandOffResponse> OneDaemonClient::HandOff(
    int64_t version, const std::vector<v1::ColumnState>& leaving,
    const std::vector<std::string>& tensors) {
  v1::HandOffRequest req;
  {
    MutexLock lock(&mu_);
    req.set_job_id(job_id_);
    req.set_rank(rank_);
  }
  req.set_version(version);
  for (const auto& l : leaving) *req.add_leaving() = l;
  for (const auto& t : tensors) req.add_tensors(t);
  v1::HandOffResponse resp;
  ZF_RETURN_IF_ERROR(RideThrough([&] { return RawHandOff(req, &resp); }));
  if (ride_through()) log_.AddHandOff(selection_round_.load(), std::move(req));
  return resp;
}

// ---- Stream -------------------------------------------------------------------

std::shared_ptr<AttachedStream> OneDaemonClient::current_stream() {
  MutexLock lock(&mu_);
  return stream_;
}

absl::Status OneDaemonClient::Attach(const std::string& job_id, int32_t rank) {
  MutexLock attach_lock(&attach_mu_);
  std::shared_ptr<AttachedStream> old;
  {
    MutexLock lock(&mu_);
    if (stream_ != nullptr && stream_->open()) {
      return absl::FailedPreconditionError(
          absl::StrCat("this client's stream is attached to job '", job_id_, "' rank ", rank_));
    }
    old = std::move(stream_);
  }
  const bool reattach = old != nullptr;
  if (old != nullptr) {
    old->Close();
    old.reset();
    // The old stream's sends end quickly once its connection is closed; the
    // window is not reused before they have.
    window_.WaitSendsEnded(absl::Seconds(30));
  }
  if (options_.transport == Transport::kUcx && ucx_ == nullptr) {
    ZF_ASSIGN_OR_RETURN(ucx_, UcxLink::Create(options_.ucx));
    ucx_ready_.store(ucx_.get(), std::memory_order_release);
  }
  {
    MutexLock lock(&mu_);
    if (job_id_ != job_id || rank_ != rank) rounds_.Reset();  // another job's rounds
    job_id_ = job_id;
    rank_ = rank;
  }
  if (ride_through() && interval_.load() == 0) {
    // The log tags entries with their round (a restored rank attaches
    // without joining).
    ZF_ASSIGN_OR_RETURN(v1::GetJobResponse job, GetJob(job_id));
    interval_.store(std::max(1, job.spec().zenflow().update_interval()));
    auto_interval_.store(job.spec().zenflow().auto_update_interval());
  }
  AttachedStream::Deps deps;
  deps.channel = channel_.get();
  deps.window = &window_;
  deps.rounds = &rounds_;
  deps.ucx = options_.transport == Transport::kUcx ? ucx_.get() : nullptr;
  deps.token = token();
  // Riding through a restart: a round the daemon updated but whose deltas
  // the rank never got is sent again (rounds arrive in order, so the rank
  // holds rounds [0, newest complete + 1)).
  if (reattach && ride_through()) deps.rounds_done = rounds_.newest_complete() + 1;
  // The daemon lets go of a rank's stream once that call is done, which it
  // can learn a moment after this client did: right after our own stream
  // ended, the rank may still look attached (ALREADY_EXISTS). A first
  // attach tries once.
  absl::StatusOr<std::unique_ptr<AttachedStream>> stream;
  RetryWithBackoff(reattach ? absl::Seconds(10) : absl::ZeroDuration(), absl::Milliseconds(10),
                   absl::Milliseconds(200), [&] {
                     stream = AttachedStream::Open(deps, job_id, rank);
                     return stream.ok() || stream.status().code() != absl::StatusCode::kAlreadyExists;
                   });
  ZF_RETURN_IF_ERROR(stream.status());
  MutexLock lock(&mu_);
  stream_ = *std::move(stream);
  return absl::OkStatus();
}

absl::Status OneDaemonClient::Enqueue(v1::UpMessage msg, absl::string_view borrowed,
                                      std::shared_ptr<void> hold) {
  const int64_t size = static_cast<int64_t>(msg.ByteSizeLong() + borrowed.size());
  if (size > options_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("message of ", size,
                                                   " bytes exceeds max_message_bytes ",
                                                   options_.max_message_bytes));
  }
  const uint64_t seen = generation_.load();
  if (ride_through()) {
    // The log keeps its own copy (a borrowed payload goes back to its owner
    // once sent; the log may need it after that).
    v1::UpMessage copy = msg;
    if (!borrowed.empty()) copy.mutable_shard()->set_payload(borrowed.data(), borrowed.size());
    const int64_t round = copy.has_shard() ? RoundOfStep(copy.shard().step()) : copy.close().round();
    log_.Forget(rounds_.durable_rounds());
    log_.AddUp(round, std::move(copy));
  }
  Outgoing out;
  out.payload_bytes = msg.has_shard()
                          ? static_cast<int64_t>(msg.shard().payload().size() + borrowed.size())
                          : 0;
  out.msg = std::move(msg);
  out.borrowed = borrowed;
  out.hold = std::move(hold);
  out.size = size;
  absl::Status pushed = window_.Push(std::move(out));
  if (pushed.ok() || !ride_through() || !Recoverable(pushed)) return pushed;
  // The message is in the log: the replay after the reconnect sends it.
  return Recover(seen);
}

absl::Status OneDaemonClient::PushUp(v1::UpMessage msg) { return Enqueue(std::move(msg)); }

namespace {

// A shard of `n` columns without its payload.
v1::GradientShard ShardHeader(int64_t step, const std::string& tensor, int64_t version,
                              v1::DType dtype, const int32_t* columns, int64_t n) {
  v1::GradientShard shard;
  shard.set_step(step);
  shard.set_tensor(tensor);
  shard.set_selection_version(version);
  shard.set_dtype(dtype);
  shard.mutable_columns()->Add(columns, columns + n);
  return shard;
}

}  // namespace

absl::Status OneDaemonClient::PushColumns(int64_t step, const std::string& tensor, int64_t version,
                                          const std::vector<int32_t>& columns,
                                          const float* col_major, int64_t rows, DType dtype) {
  const size_t col_bytes = static_cast<size_t>(rows) * DTypeSize(dtype);
  const size_t per = static_cast<size_t>(
      ColumnsPerMessage(options_.max_shard_bytes, rows, static_cast<int64_t>(DTypeSize(dtype))));
  for (size_t i = 0; i < columns.size(); i += per) {
    const size_t n = std::min(per, columns.size() - i);
    v1::GradientShard shard = ShardHeader(step, tensor, version, ToProto(dtype),
                                          columns.data() + i, static_cast<int64_t>(n));
    std::string* payload = shard.mutable_payload();
    payload->resize(n * col_bytes);
    Encode(dtype, col_major + i * rows, n * rows, payload->data());
    ZF_RETURN_IF_ERROR(PushShard(std::move(shard)));
  }
  return absl::OkStatus();
}

absl::Status OneDaemonClient::PushEncodedBorrowed(int64_t step, const std::string& tensor,
                                                  int64_t version, const int32_t* columns,
                                                  int64_t ncols, const char* payload, int64_t rows,
                                                  DType dtype, std::function<void()> release) {
  return PushBorrowed(step, tensor, version, columns, ncols, payload,
                      rows * static_cast<int64_t>(DTypeSize(dtype)), ToProto(dtype), nullptr,
                      std::move(release));
}

absl::Status OneDaemonClient::PushInt8Borrowed(int64_t step, const std::string& tensor,
                                               int64_t version, const int32_t* columns,
                                               int64_t ncols, const int8_t* payload,
                                               const float* scales, int64_t rows,
                                               std::function<void()> release) {
  return PushBorrowed(step, tensor, version, columns, ncols,
                      reinterpret_cast<const char*>(payload), rows, v1::DTYPE_INT8, scales,
                      std::move(release));
}

absl::Status OneDaemonClient::PushBorrowed(int64_t step, const std::string& tensor, int64_t version,
                                           const int32_t* columns, int64_t ncols,
                                           const char* payload, int64_t col_bytes, v1::DType dtype,
                                           const float* scales, std::function<void()> release) {
  // Over either transport the payload leaves from the caller's memory.
  std::shared_ptr<void> hold = std::make_shared<Releaser>(std::move(release));
  const int64_t per = ColumnsPerMessage(options_.max_shard_bytes, 1, col_bytes);
  for (int64_t i = 0; i < ncols; i += per) {
    const int64_t n = std::min(per, ncols - i);
    v1::UpMessage msg;
    v1::GradientShard* shard = msg.mutable_shard();
    *shard = ShardHeader(step, tensor, version, dtype, columns + i, n);
    if (scales != nullptr) shard->mutable_scales()->Add(scales + i, scales + i + n);
    const absl::string_view bytes(payload + i * col_bytes, n * col_bytes);
    ZF_RETURN_IF_ERROR(Enqueue(std::move(msg), bytes, hold));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> OneDaemonClient::AllReduce(
    int64_t step, const std::vector<std::pair<std::string, const std::vector<float>*>>& parts) {
  v1::AllReduceRequest req;
  {
    MutexLock lock(&mu_);
    req.set_job_id(job_id_);
    req.set_rank(rank_);
  }
  req.set_step(step);
  for (const auto& [name, values] : parts) {
    v1::ReducePart* p = req.add_parts();
    p->set_name(name);
    p->set_payload(reinterpret_cast<const char*>(values->data()), values->size() * sizeof(float));
  }
  v1::AllReduceResponse resp;
  ZF_RETURN_IF_ERROR(RideThrough([&] { return RawAllReduce(req, &resp); }));
  if (ride_through()) log_.SetAllReduce(req);
  if (resp.parts_size() != static_cast<int>(parts.size())) {
    return absl::InternalError("all-reduce answer has a different number of parts");
  }
  std::vector<std::vector<float>> out(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    out[i].resize(resp.parts(static_cast<int>(i)).payload().size() / sizeof(float));
    std::memcpy(out[i].data(), resp.parts(static_cast<int>(i)).payload().data(),
                out[i].size() * sizeof(float));
  }
  return out;
}

absl::Status OneDaemonClient::CloseRound(int64_t round, float lr, int32_t steps,
                                         const WorkerReport& report) {
  v1::UpMessage msg;
  v1::RoundClose* close = msg.mutable_close();
  close->set_round(round);
  close->set_lr(lr);
  close->set_steps(steps);
  close->mutable_step_reports()->Add(report.steps.begin(), report.steps.end());
  close->set_apply_delay_steps(report.apply_delay_steps);
  close->set_staleness_steps(report.staleness_steps);
  rounds_.CloseQueued(round);  // a wait from now on is for this close's answer
  const absl::Status s = Enqueue(std::move(msg));
  open_round_.store(round + 1);  // the close is in the log even if the send failed
  return s;
}

absl::Status OneDaemonClient::Flush(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const uint64_t seen = generation_.load();
    absl::Status s = window_.WaitIdle(deadline - absl::Now());
    if (s.ok() || !ride_through() || !Recoverable(s)) return s;
    ZF_RETURN_IF_ERROR(Recover(seen));
  }
}

void OneDaemonClient::SetRoundCallback(std::function<void(RoundUpdate)> cb) {
  rounds_.SetCallback(std::move(cb));
}

absl::StatusOr<RoundUpdate> OneDaemonClient::WaitRound(int64_t round, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const uint64_t seen = generation_.load();
    absl::StatusOr<RoundUpdate> u = rounds_.Wait(round, deadline - absl::Now());
    if (u.ok() || u.status().code() != absl::StatusCode::kCancelled) return u;
    // The stream closed before the round came: say why, or come back.
    absl::Status s = stream_status();
    if (s.ok()) return u.status();
    if (!ride_through() || !Recoverable(s)) return s;
    ZF_RETURN_IF_ERROR(Recover(seen));
  }
}

std::optional<RoundUpdate> OneDaemonClient::PollRound() { return rounds_.Poll(); }

void OneDaemonClient::Recycle(std::string buffer) {
  if (UcxLink* l = ucx_ready_.load(std::memory_order_acquire)) l->worker()->Recycle(std::move(buffer));
}

std::vector<absl::Status> OneDaemonClient::TakeErrors() { return rounds_.TakeErrors(); }

bool OneDaemonClient::WaitForErrors(size_t n, absl::Duration timeout) {
  return rounds_.WaitForErrors(n, timeout);
}

absl::Status OneDaemonClient::stream_status() {
  std::shared_ptr<AttachedStream> s = current_stream();
  return s == nullptr ? absl::OkStatus() : s->status();
}

ClientStats OneDaemonClient::stats() {
  const SendWindow::Stats w = window_.stats();
  const RoundAssembler::Stats r = rounds_.stats();
  ClientStats out;
  out.messages_sent = w.messages_sent;
  out.bytes_sent = w.bytes_sent;
  out.send_blocked_seconds = w.blocked_seconds;
  out.bytes_received = r.bytes_received;
  out.rounds_received = r.rounds_received;
  out.wait_seconds = r.wait_seconds;
  out.stream_errors = r.stream_errors;
  out.shard_bytes_sent = w.payload_bytes_sent;
  out.deltas_received = r.deltas_received;
  out.delta_bytes_received = r.delta_bytes_received;
  out.rounds_dropped_duplicate = r.rounds_dropped_duplicate;
  out.reconnects = static_cast<int64_t>(generation_.load());
  const ReplayLog::Stats l = log_.stats();
  out.replay_log_bytes = l.bytes;
  out.replay_log_entries = l.entries;
  if (UcxLink* l = ucx_ready_.load(std::memory_order_acquire)) {
    out.ucx_frames_dropped = l->frames_dropped();
  }
  return out;
}

int32_t OneDaemonClient::rank() {
  MutexLock lock(&mu_);
  return rank_;
}

std::string OneDaemonClient::job_id() {
  MutexLock lock(&mu_);
  return job_id_;
}

std::string OneDaemonClient::token() {
  MutexLock lock(&mu_);
  return token_;
}

void OneDaemonClient::CloseStream() {
  MutexLock attach_lock(&attach_mu_);
  if (std::shared_ptr<AttachedStream> s = current_stream()) s->Close();
}

}  // namespace zenflow
