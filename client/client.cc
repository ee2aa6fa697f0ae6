// The worker client library; see client.h.
#include "client/client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include <random>

#include "absl/strings/str_cat.h"
#include "common/dtype_proto.h"
#include "common/geometry.h"
#include "common/status_macros.h"
#include "common/stream_error.h"
#include "common/ucx_frame.h"

namespace zenflow {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

absl::StatusOr<Transport> ParseTransport(const std::string& name) {
  if (name == "grpc") return Transport::kGrpc;
  if (name == "ucx") return Transport::kUcx;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "' (want grpc or ucx)"));
}

Client::Client(const ClientOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::unique_ptr<Client> c(new Client(options));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  c->channel_ = grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args);
  absl::Duration backoff = absl::Milliseconds(100);
  const int attempts = std::max(1, options.connect_attempts);
  for (int i = 0; i < attempts; ++i) {
    const auto deadline = std::chrono::system_clock::now() +
                          absl::ToChronoMilliseconds(options.connect_timeout);
    if (c->channel_->WaitForConnected(deadline)) {
      c->stub_ = v1::ZenFlow::NewStub(c->channel_);
      return c;
    }
    if (i + 1 < attempts) {
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(5));
    }
  }
  return absl::UnavailableError(absl::StrCat("cannot connect to zenflowd at ", options.target,
                                             " after ", attempts, " attempts of ",
                                             absl::FormatDuration(options.connect_timeout)));
}

Client::~Client() {
  CloseStream();
  ucx_ready_.store(nullptr, std::memory_order_release);
  ucx_.reset();  // its callbacks use this client: stop them first
}

std::unique_ptr<grpc::ClientContext> Client::UnaryContext(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  return ctx;
}

// ---- Control ------------------------------------------------------------------

absl::StatusOr<v1::JobSpec> Client::CreateJob(const v1::JobSpec& spec) {
  v1::CreateJobRequest req;
  *req.mutable_spec() = spec;
  v1::CreateJobResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpc(stub_->CreateJob(ctx.get(), req, &resp)));
  return resp.spec();
}

absl::StatusOr<v1::UploadParametersResponse> Client::UploadParameters(
    const std::string& job_id, const std::vector<TensorValues>& tensors) {
  auto ctx = UnaryContext(options_.rpc_timeout);
  v1::UploadParametersResponse resp;
  auto writer = stub_->UploadParameters(ctx.get(), &resp);
  const int64_t per_chunk = std::max<int64_t>(1, options_.max_shard_bytes / 4);
  for (const TensorValues& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    for (int64_t off = 0; off < numel || (numel == 0 && off == 0); off += per_chunk) {
      v1::UploadParametersRequest chunk;
      chunk.set_job_id(job_id);
      chunk.set_tensor(t.name);
      if (off == 0) chunk.mutable_shape()->Add(t.shape.begin(), t.shape.end());
      chunk.set_offset(off);
      chunk.set_dtype(v1::DTYPE_FP32);
      const int64_t n = std::min(per_chunk, numel - off);
      chunk.set_payload(reinterpret_cast<const char*>(t.data + off), n * sizeof(float));
      if (!writer->Write(chunk)) break;  // the server ended the call: Finish says why
      if (numel == 0) break;
    }
  }
  writer->WritesDone();
  ZF_RETURN_IF_ERROR(FromGrpc(writer->Finish()));
  return resp;
}

absl::StatusOr<v1::JoinJobResponse> Client::JoinJob(const std::string& job_id, int32_t rank) {
  v1::JoinJobRequest req;
  req.set_job_id(job_id);
  req.set_rank(rank);
  v1::JoinJobResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpc(stub_->JoinJob(ctx.get(), req, &resp)));
  ZF_RETURN_IF_ERROR(Attach(job_id, rank));
  return resp;
}

absl::StatusOr<v1::GetJobResponse> Client::GetJob(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::GetJobResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpc(stub_->GetJob(ctx.get(), req, &resp)));
  return resp;
}

absl::Status Client::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest req;
  req.set_job_id(job_id);
  v1::DeleteJobResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  return FromGrpc(stub_->DeleteJob(ctx.get(), req, &resp));
}

absl::StatusOr<v1::GetStatsResponse> Client::GetStats(const std::string& job_id) {
  v1::GetStatsRequest req;
  req.set_job_id(job_id);
  v1::GetStatsResponse resp;
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpc(stub_->GetStats(ctx.get(), req, &resp)));
  return resp;
}

absl::StatusOr<v1::Selection> Client::SubmitImportance(
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
  auto ctx = UnaryContext(options_.selection_timeout);
  ZF_RETURN_IF_ERROR(FromGrpc(stub_->SubmitImportance(ctx.get(), req, &resp)));
  return resp.selection();
}

absl::StatusOr<v1::HandOffResponse> Client::HandOff(int64_t version,
                                                    const std::vector<v1::ColumnState>& leaving,
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
  auto ctx = UnaryContext(options_.rpc_timeout);
  ZF_RETURN_IF_ERROR(FromGrpc(stub_->HandOff(ctx.get(), req, &resp)));
  return resp;
}

// ---- Stream -------------------------------------------------------------------

absl::Status Client::Attach(const std::string& job_id, int32_t rank) {
  MutexLock attach_lock(&attach_mu_);
  {
    MutexLock lock(&mu_);
    if (stream_open_) {
      return absl::FailedPreconditionError(
          absl::StrCat("this client's stream is attached to job '", job_id_, "' rank ", rank_));
    }
  }
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
  {
    // Sends of the previous stream end quickly once its endpoint is closed.
    // Its late UCX frames are dropped from here on.
    MutexLock lock(&mu_);
    ucx_tag_ = 0;
    mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return ucx_sending_ == 0; },
                         absl::Seconds(30));
  }
  const bool use_ucx = options_.transport == Transport::kUcx;
  if (use_ucx && ucx_ == nullptr) {
    absl::StatusOr<std::unique_ptr<UcxWorker>> w =
        UcxWorker::Create(options_.ucx, [this](uint64_t tag, std::string frame) {
          OnUcxFrame(tag, std::move(frame));
        });
    if (!w.ok()) {
      return absl::Status(w.status().code(),
                          absl::StrCat("transport ucx: ", w.status().message()));
    }
    ucx_ = *std::move(w);
    ucx_ready_.store(ucx_.get(), std::memory_order_release);
  }
  stream_ctx_ = std::make_unique<grpc::ClientContext>();
  stream_ = stub_->Stream(stream_ctx_.get());
  v1::UpMessage hello;
  hello.mutable_attach()->set_job_id(job_id);
  hello.mutable_attach()->set_rank(rank);
  uint64_t tag = 0;
  if (use_ucx) {
    static Mutex rng_mu;
    static std::mt19937_64 rng{std::random_device{}()};
    MutexLock rng_lock(&rng_mu);
    while (tag == 0) tag = rng();
    hello.mutable_attach()->set_ucx_address(ucx_->address());
    hello.mutable_attach()->set_ucx_tag(tag);
  }
  {
    MutexLock lock(&mu_);
    job_id_ = job_id;
    rank_ = rank;
    attached_ = false;
    stream_open_ = true;
    closing_ = false;
    stream_status_ = absl::OkStatus();
    stream_finished_ = false;
    outq_.clear();
    inflight_bytes_ = 0;
    partial_.clear();
    ucx_tag_ = tag;
    ucx_ep_ = 0;
    ucx_peer_.clear();
    ucx_sending_ = 0;
    cancel_reason_ = absl::OkStatus();
  }
  const bool wrote = stream_->Write(hello);
  reader_ = std::thread([this] { ReaderLoop(); });
  // Wait for the daemon's greeting or the end of the stream.
  std::string peer;
  {
    MutexLock lock(&mu_);
    mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return attached_ || stream_finished_; });
    if (!attached_) {
      if (!wrote && stream_status_.ok()) {
        return absl::UnavailableError("stream closed before attach");
      }
      return stream_status_;
    }
    peer = ucx_peer_;
  }
  if (use_ucx) {
    absl::Status s;
    if (peer.empty()) {
      s = absl::FailedPreconditionError(
          "transport ucx: the daemon's greeting carries no UCX address (an older zenflowd?)");
    } else {
      absl::StatusOr<uint64_t> ep = ucx_->Connect(peer);
      if (ep.ok()) {
        MutexLock lock(&mu_);
        ucx_ep_ = *ep;
      } else {
        s = absl::Status(ep.status().code(),
                         absl::StrCat("transport ucx: cannot reach the daemon's UCX worker: ",
                                      ep.status().message()));
      }
    }
    if (!s.ok()) {
      stream_ctx_->TryCancel();
      if (reader_.joinable()) reader_.join();
      return s;
    }
  }
  MutexLock lock(&mu_);
  ucx_tag_for_writer_ = tag;
  writer_running_ = true;
  writer_ = std::thread([this] { WriterLoop(); });
  return absl::OkStatus();
}

void Client::Dispatch(v1::DownMessage msg, int64_t bytes) {
  std::function<void(RoundUpdate)> cb;
  std::optional<RoundUpdate> complete;
  {
    MutexLock lock(&mu_);
    stats_.bytes_received += bytes;
    switch (msg.kind_case()) {
      case v1::DownMessage::kAttached:
        attached_ = true;
        ucx_peer_ = msg.attached().ucx_address();
        break;
      case v1::DownMessage::kDelta: {
        RoundUpdate& u = partial_[msg.delta().round()];
        u.round = msg.delta().round();
        u.deltas.push_back(std::move(*msg.mutable_delta()));
        break;
      }
      case v1::DownMessage::kDone: {
        const int64_t r = msg.done().round();
        RoundUpdate u;
        auto it = partial_.find(r);
        if (it != partial_.end()) {
          u = std::move(it->second);
          partial_.erase(it);
        }
        u.round = r;
        u.done = msg.done();
        ++stats_.rounds_received;
        if (callback_) {
          cb = callback_;
          complete = std::move(u);
        } else {
          ready_.push_back(std::move(u));
        }
        break;
      }
      case v1::DownMessage::kError: {
        ++stats_.stream_errors;
        const absl::Status err = StreamErrorStatus(msg.error());
        if (msg.error().fatal()) {
          // The daemon ends this stream (the job is gone); so do we, now.
          // (Under mu_: Attach clears the tag under it before it replaces
          // the context, so this is the current stream's.)
          if (cancel_reason_.ok()) cancel_reason_ = err;
          stream_ctx_->TryCancel();
        }
        errors_.push_back(absl::Status(
            err.code(), absl::StrCat(err.message(), " (message #", msg.error().seq(), ")")));
        break;
      }
      default:
        break;
    }
  }
  if (cb && complete) cb(std::move(*complete));
}

void Client::OnUcxFrame(uint64_t tag, std::string frame) {
  {
    MutexLock lock(&mu_);
    if (tag != ucx_tag_ || ucx_tag_ == 0) {
      ++stats_.ucx_frames_dropped;  // from an older connection
      return;
    }
  }
  const int64_t bytes = static_cast<int64_t>(frame.size());
  v1::DownMessage msg;
  absl::Status s = ParseFrame(std::move(frame), &msg);
  if (!s.ok()) {
    MutexLock lock(&mu_);
    ++stats_.stream_errors;
    errors_.push_back(absl::InternalError(
        absl::StrCat("the daemon sent a UCX frame this client cannot read: ", s.message())));
    return;
  }
  Dispatch(std::move(msg), bytes);
}

void Client::ReaderLoop() {
  v1::DownMessage msg;
  while (stream_->Read(&msg)) {
    const int64_t bytes = static_cast<int64_t>(msg.ByteSizeLong());
    Dispatch(std::move(msg), bytes);
    msg.Clear();
  }
  {
    // Finish() may only run once the writer no longer uses the stream.
    MutexLock lock(&mu_);
    stream_open_ = false;
    // A write into a stream the daemon ended may stay blocked on flow
    // control; cancelling then releases it (the daemon's status, already
    // received, is kept).
    if (!mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !writer_running_; },
                              absl::Seconds(1))) {
      stream_ctx_->TryCancel();
      mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !writer_running_; });
    }
  }
  grpc::Status st = stream_->Finish();
  uint64_t ep = 0;
  {
    MutexLock lock(&mu_);
    ep = ucx_ep_;
    ucx_ep_ = 0;
  }
  // The lifeline ended: so does the UCX connection (sends still pending fail).
  if (ep != 0) ucx_->Disconnect(ep, /*force=*/true);
  MutexLock lock(&mu_);
  stream_status_ = st.ok() ? absl::CancelledError("stream closed by the daemon") : FromGrpc(st);
  if (st.ok() && closing_) stream_status_ = absl::OkStatus();
  if (!cancel_reason_.ok()) stream_status_ = cancel_reason_;  // why we cancelled
  stream_finished_ = true;
}

void Client::WriterLoop() {
  for (;;) {
    Outgoing out;
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !outq_.empty() || closing_ || !stream_open_;
          });
      if (outq_.empty() || !stream_open_) {
        // A broken stream sends nothing more: let go of borrowed payloads now.
        if (!stream_open_) {
          outq_.clear();
          inflight_bytes_ = 0;
        }
        break;
      }
      out = std::move(outq_.front());
      outq_.pop_front();
      writing_ = true;
    }
    const int64_t size = out.size;
    if (ucx_tag_for_writer_ != 0) {
      SendUcx(std::move(out));
      continue;
    }
    if (!out.borrowed.empty()) {  // not made over gRPC; kept correct anyway
      out.msg.mutable_shard()->set_payload(out.borrowed.data(), out.borrowed.size());
      out.hold.reset();
    }
    const bool ok = stream_->Write(out.msg);
    MutexLock lock(&mu_);
    writing_ = false;
    inflight_bytes_ -= size;
    if (!ok) {
      // The stream broke; the reader records why.
      outq_.clear();
      inflight_bytes_ = 0;
      break;
    }
    ++stats_.messages_sent;
    stats_.bytes_sent += size;
  }
  if (ucx_tag_for_writer_ != 0) {
    // Everything sent over UCX must be at the daemon before the lifeline's
    // half-close tells it the rank is done.
    uint64_t ep = 0;
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return ucx_sending_ == 0 || !stream_open_;
      });
      ep = ucx_ep_;
    }
    if (ep != 0) (void)ucx_->Flush(ep, absl::Seconds(30));
  }
  MutexLock lock(&mu_);
  if (closing_ && stream_open_) stream_->WritesDone();
  writer_running_ = false;
}

void Client::SendUcx(Outgoing out) {
  struct Frame {
    v1::UpMessage msg;
    std::string payload, header;
    absl::string_view borrowed;
    std::shared_ptr<void> hold;  // released with the frame
  };
  const int64_t size = out.size;
  auto f = std::make_shared<Frame>();
  f->msg = std::move(out.msg);
  f->borrowed = out.borrowed;
  f->hold = std::move(out.hold);
  SplitFrame(&f->msg, &f->payload, &f->header);
  const absl::string_view body = f->borrowed.empty() ? absl::string_view(f->payload) : f->borrowed;
  uint64_t ep = 0;
  {
    MutexLock lock(&mu_);
    writing_ = false;
    ++ucx_sending_;
    ep = ucx_ep_;
  }
  ucx_->Send(ep, ucx_tag_for_writer_, {body, f->header}, [this, f, size](absl::Status s) {
    bool cancel = false;
    {
      MutexLock lock(&mu_);
      if (s.ok()) {
        ++stats_.messages_sent;
        stats_.bytes_sent += size;
      } else if (cancel_reason_.ok() && !closing_ && stream_open_) {
        cancel_reason_ = absl::Status(s.code(), absl::StrCat("transport ucx: ", s.message()));
        cancel = true;
      }
    }
    // The lifeline goes down with the data path; the reader reports why.
    // (Attach waits for every send to end before it replaces the context.)
    if (cancel) stream_ctx_->TryCancel();
    MutexLock lock(&mu_);
    --ucx_sending_;
    inflight_bytes_ -= size;
  });
}

absl::Status Client::Enqueue(v1::UpMessage msg, absl::string_view borrowed,
                             std::shared_ptr<void> hold) {
  const int64_t size = static_cast<int64_t>(msg.ByteSizeLong() + borrowed.size());
  if (size > options_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("message of ", size,
                                                   " bytes exceeds max_message_bytes ",
                                                   options_.max_message_bytes));
  }
  MutexLock lock(&mu_);
  if (!stream_open_ || !attached_) {
    return stream_finished_ && !stream_status_.ok()
               ? EndStatusLocked()
               : absl::FailedPreconditionError("no stream attached: JoinJob or Attach first");
  }
  const auto t0 = std::chrono::steady_clock::now();
  mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !stream_open_ || inflight_bytes_ == 0 ||
           inflight_bytes_ + size <= options_.max_inflight_bytes;
  });
  stats_.send_blocked_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!stream_open_) return EndStatusLocked();
  msg.set_seq(next_seq_++);
  inflight_bytes_ += size;
  Outgoing out;
  out.msg = std::move(msg);
  out.borrowed = borrowed;
  out.hold = std::move(hold);
  out.size = size;
  outq_.push_back(std::move(out));
  return absl::OkStatus();
}

absl::Status Client::PushShard(v1::GradientShard shard) {
  v1::UpMessage msg;
  *msg.mutable_shard() = std::move(shard);
  return Enqueue(std::move(msg));
}

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

// Runs a function when the last shard that borrows a payload lets go.
struct Releaser {
  explicit Releaser(std::function<void()> f) : fn(std::move(f)) {}
  ~Releaser() {
    if (fn) fn();
  }
  std::function<void()> fn;
};

}  // namespace

absl::Status Client::PushColumns(int64_t step, const std::string& tensor, int64_t version,
                                 const std::vector<int32_t>& columns, const float* col_major,
                                 int64_t rows, DType dtype) {
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

absl::Status Client::PushSplit(int64_t step, const std::string& tensor, int64_t version,
                               const int32_t* columns, int64_t ncols, const char* payload,
                               int64_t col_bytes, v1::DType dtype, const float* scales,
                               std::shared_ptr<void> hold) {
  const int64_t per = ColumnsPerMessage(options_.max_shard_bytes, 1, col_bytes);
  for (int64_t i = 0; i < ncols; i += per) {
    const int64_t n = std::min(per, ncols - i);
    v1::UpMessage msg;
    v1::GradientShard* shard = msg.mutable_shard();
    *shard = ShardHeader(step, tensor, version, dtype, columns + i, n);
    if (scales != nullptr) shard->mutable_scales()->Add(scales + i, scales + i + n);
    const absl::string_view bytes(payload + i * col_bytes, n * col_bytes);
    if (hold == nullptr) {
      shard->set_payload(bytes.data(), bytes.size());
      ZF_RETURN_IF_ERROR(Enqueue(std::move(msg)));
    } else {
      ZF_RETURN_IF_ERROR(Enqueue(std::move(msg), bytes, hold));
    }
  }
  return absl::OkStatus();
}

absl::Status Client::PushEncoded(int64_t step, const std::string& tensor, int64_t version,
                                 const int32_t* columns, int64_t ncols, const char* payload,
                                 int64_t rows, DType dtype) {
  return PushSplit(step, tensor, version, columns, ncols, payload,
                   rows * static_cast<int64_t>(DTypeSize(dtype)), ToProto(dtype), nullptr, nullptr);
}

absl::Status Client::PushInt8(int64_t step, const std::string& tensor, int64_t version,
                              const int32_t* columns, int64_t ncols, const int8_t* payload,
                              const float* scales, int64_t rows) {
  return PushSplit(step, tensor, version, columns, ncols, reinterpret_cast<const char*>(payload),
                   rows, v1::DTYPE_INT8, scales, nullptr);
}

absl::Status Client::PushEncodedBorrowed(int64_t step, const std::string& tensor, int64_t version,
                                         const int32_t* columns, int64_t ncols,
                                         const char* payload, int64_t rows, DType dtype,
                                         std::function<void()> release) {
  return PushMaybeBorrowed(step, tensor, version, columns, ncols, payload,
                           rows * static_cast<int64_t>(DTypeSize(dtype)), ToProto(dtype), nullptr,
                           std::move(release));
}

absl::Status Client::PushInt8Borrowed(int64_t step, const std::string& tensor, int64_t version,
                                      const int32_t* columns, int64_t ncols, const int8_t* payload,
                                      const float* scales, int64_t rows,
                                      std::function<void()> release) {
  return PushMaybeBorrowed(step, tensor, version, columns, ncols,
                           reinterpret_cast<const char*>(payload), rows, v1::DTYPE_INT8, scales,
                           std::move(release));
}

absl::Status Client::PushMaybeBorrowed(int64_t step, const std::string& tensor, int64_t version,
                                       const int32_t* columns, int64_t ncols, const char* payload,
                                       int64_t col_bytes, v1::DType dtype, const float* scales,
                                       std::function<void()> release) {
  if (options_.transport != Transport::kUcx) {  // gRPC copies: release at once
    absl::Status s = PushSplit(step, tensor, version, columns, ncols, payload, col_bytes, dtype,
                               scales, nullptr);
    if (release) release();
    return s;
  }
  return PushSplit(step, tensor, version, columns, ncols, payload, col_bytes, dtype, scales,
                   std::make_shared<Releaser>(std::move(release)));
}

absl::StatusOr<std::vector<std::vector<float>>> Client::AllReduce(
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
  auto ctx = UnaryContext(options_.selection_timeout);
  ZF_RETURN_IF_ERROR(FromGrpc(stub_->AllReduce(ctx.get(), req, &resp)));
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

absl::Status Client::CloseRound(int64_t round, float lr, int32_t steps) {
  v1::UpMessage msg;
  msg.mutable_close()->set_round(round);
  msg.mutable_close()->set_lr(lr);
  msg.mutable_close()->set_steps(steps);
  return Enqueue(std::move(msg));
}

absl::Status Client::Flush(absl::Duration timeout) {
  MutexLock lock(&mu_);
  const bool done = mu_.AwaitWithTimeout(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !stream_open_ || (outq_.empty() && !writing_ && ucx_sending_ == 0);
          },
      timeout);
  if (!stream_open_) return EndStatusLocked();
  if (!done) return absl::DeadlineExceededError("flush timed out");
  return absl::OkStatus();
}

void Client::SetRoundCallback(std::function<void(RoundUpdate)> cb) {
  std::deque<RoundUpdate> pending;
  {
    MutexLock lock(&mu_);
    callback_ = cb;
    if (cb) pending.swap(ready_);
  }
  for (auto& u : pending) cb(std::move(u));
}

absl::StatusOr<RoundUpdate> Client::WaitRound(int64_t round, absl::Duration timeout) {
  MutexLock lock(&mu_);
  const auto t0 = std::chrono::steady_clock::now();
  auto has = [this, round]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (const auto& u : ready_) {
      if (u.round == round) return true;
    }
    return false;
  };
  mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return has() || !stream_open_; },
                       timeout);
  stats_.wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto it = ready_.begin(); it != ready_.end(); ++it) {
    if (it->round == round) {
      RoundUpdate u = std::move(*it);
      ready_.erase(it);
      return u;
    }
  }
  if (!stream_open_) {
    absl::Status s = EndStatusLocked();
    return s.ok() ? absl::CancelledError("stream closed") : s;
  }
  return absl::DeadlineExceededError(
      absl::StrCat("round ", round, "'s update did not arrive within ", absl::FormatDuration(timeout)));
}

std::optional<RoundUpdate> Client::PollRound() {
  MutexLock lock(&mu_);
  if (ready_.empty()) return std::nullopt;
  RoundUpdate u = std::move(ready_.front());
  ready_.pop_front();
  return u;
}

void Client::Recycle(std::string buffer) {
  if (UcxWorker* w = ucx_ready_.load(std::memory_order_acquire)) w->Recycle(std::move(buffer));
}

std::vector<absl::Status> Client::TakeErrors() {
  MutexLock lock(&mu_);
  std::vector<absl::Status> out;
  out.swap(errors_);
  return out;
}

bool Client::WaitForErrors(size_t n, absl::Duration timeout) {
  MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
             [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return errors_.size() >= n || !stream_open_; },
             timeout) &&
         errors_.size() >= n;
}

absl::Status Client::stream_status() {
  MutexLock lock(&mu_);
  if (!stream_open_) return EndStatusLocked();
  return absl::OkStatus();
}

absl::Status Client::EndStatusLocked() {
  mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stream_finished_; }, absl::Seconds(30));
  if (!stream_finished_) return absl::UnavailableError("stream ended; its status is not known yet");
  return stream_status_;
}

ClientStats Client::stats() {
  MutexLock lock(&mu_);
  return stats_;
}

int32_t Client::rank() {
  MutexLock lock(&mu_);
  return rank_;
}

std::string Client::job_id() {
  MutexLock lock(&mu_);
  return job_id_;
}

void Client::CloseStream() {
  MutexLock attach_lock(&attach_mu_);
  {
    MutexLock lock(&mu_);
    closing_ = true;
  }
  if (writer_.joinable()) writer_.join();  // sends what is queued, then half-closes
  if (stream_ctx_ != nullptr && reader_.joinable()) {
    // Wait briefly for the daemon to finish the stream, then cancel.
    {
      MutexLock lock(&mu_);
      mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                 return !stream_open_;
                               },
                           absl::Seconds(2));
    }
    stream_ctx_->TryCancel();
  }
  if (reader_.joinable()) reader_.join();
}

}  // namespace zenflow
