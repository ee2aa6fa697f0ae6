// One attached rank's stream; see stream.h.
#include "client/stream.h"

#include <utility>

#include "common/up_wire.h"

namespace zenflow {
namespace {

// The service's Stream method (proto/zenflow/v1/zenflow.proto), called with
// raw up messages.
constexpr char kStreamMethod[] = "/zenflow.v1.ZenFlow/Stream";

// What keeps a payload slice's memory alive until gRPC lets go of it.
struct SliceHold {
  std::shared_ptr<void> hold;
};

void ReleaseSliceHold(void* p) { delete static_cast<SliceHold*>(p); }

}  // namespace

grpc::ByteBuffer UpBytes(const v1::UpMessage& msg) {
  grpc::ByteBuffer out;
  bool own = false;
  (void)grpc::SerializationTraits<v1::UpMessage>::Serialize(msg, &out, &own);
  return out;
}

bool GrpcDataStream::Send(Outgoing out, DoneFn done) {
  grpc::ByteBuffer bytes;
  if (out.msg.kind_case() != v1::UpMessage::kShard) {
    bytes = UpBytes(out.msg);
  } else {
    // The payload as its own slice: the caller's memory (borrowed, held by
    // `out.hold`) or the message's string, moved out of it.
    absl::string_view payload = out.borrowed;
    std::shared_ptr<void> hold = std::move(out.hold);
    if (payload.empty() && !out.msg.shard().payload().empty()) {
      auto owned =
          std::make_shared<std::string>(std::move(*out.msg.mutable_shard()->mutable_payload()));
      out.msg.mutable_shard()->clear_payload();
      payload = *owned;
      hold = std::move(owned);
    }
    grpc::Slice slices[2] = {grpc::Slice(UpMessageHead(&out.msg, payload.size())), grpc::Slice()};
    size_t n = 1;
    if (!payload.empty()) {
      slices[n++] = grpc::Slice(const_cast<char*>(payload.data()), payload.size(),
                                &ReleaseSliceHold, new SliceHold{std::move(hold)});
    }
    bytes = grpc::ByteBuffer(slices, n);
  }
  const bool ok = stream_->Write(bytes);
  done(ok);
  return ok;  // false: the stream broke; the reader learns why
}

AttachedStream::AttachedStream(const Deps& deps) : deps_(deps) {}

absl::StatusOr<std::unique_ptr<AttachedStream>> AttachedStream::Open(const Deps& deps,
                                                                     const std::string& job_id,
                                                                     int32_t rank) {
  std::unique_ptr<AttachedStream> s(new AttachedStream(deps));
  deps.rounds->Open();
  if (!deps.token.empty()) s->ctx_.AddMetadata("authorization", "Bearer " + deps.token);
  s->call_.reset(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, v1::DownMessage>::Create(
      deps.channel,
      grpc::internal::RpcMethod(kStreamMethod, grpc::internal::RpcMethod::BIDI_STREAMING),
      &s->ctx_));
  if (deps.ucx != nullptr) {
    s->data_ = std::make_unique<UcxDataStream>(deps.ucx, static_cast<DataStreamSink*>(s.get()));
  } else {
    s->data_ = std::make_unique<GrpcDataStream>(s->call_.get());
  }
  v1::UpMessage hello;
  hello.mutable_attach()->set_job_id(job_id);
  hello.mutable_attach()->set_rank(rank);
  if (deps.rounds_done.has_value()) hello.mutable_attach()->set_rounds_done(*deps.rounds_done);
  s->data_->PrepareAttach(hello.mutable_attach());
  const bool wrote = s->call_->Write(UpBytes(hello));
  s->reader_ = std::thread([p = s.get()] { p->ReaderLoop(); });

  v1::Attached greeting;
  {
    MutexLock lock(&s->mu_);
    s->mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->greeted_ || s->finished_; });
    if (!s->greeted_) {
      if (!wrote && s->status_.ok()) return absl::UnavailableError("stream closed before attach");
      return s->status_;
    }
    greeting = s->greeting_;
  }
  if (absl::Status c = s->data_->Connect(greeting); !c.ok()) {
    s->ctx_.TryCancel();  // no data path: the lifeline goes too
    return c;
  }
  MutexLock lock(&s->mu_);
  if (!s->reading_) {  // ended meanwhile: the window stays closed
    s->mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->finished_; });
    return s->status_.ok() ? absl::UnavailableError("stream closed right after attach")
                           : s->status_;
  }
  s->window_open_ = true;
  deps.window->Open();
  s->writing_ = true;
  s->writer_ = std::thread([p = s.get()] { p->WriterLoop(); });
  return s;
}

AttachedStream::~AttachedStream() {
  Close();
  // The data path's send callbacks use this stream: end them while it is whole.
  data_.reset();
}

void AttachedStream::Close() {
  bool window_open = false;
  {
    MutexLock lock(&mu_);
    // Once closed, the window may serve a newer stream: a later Close (the
    // last holder letting go) must not touch it.
    if (closed_) return;
    closing_ = true;
    window_open = window_open_;
  }
  if (window_open) deps_.window->Drain();
  if (writer_.joinable()) writer_.join();  // sends what is queued, then half-closes
  if (reader_.joinable()) {
    {
      // The daemon ends the call once it has what was sent.
      MutexLock lock(&mu_);
      mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !reading_; },
                           absl::Seconds(2));
    }
    ctx_.TryCancel();
    reader_.join();
  }
  MutexLock lock(&mu_);
  closed_ = true;
}

v1::Attached AttachedStream::greeting() {
  MutexLock lock(&mu_);
  return greeting_;
}

bool AttachedStream::open() {
  MutexLock lock(&mu_);
  return reading_;
}

absl::Status AttachedStream::status() {
  MutexLock lock(&mu_);
  if (reading_) return absl::OkStatus();
  mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return finished_; },
                       absl::Seconds(10));
  if (!finished_) return absl::UnavailableError("the stream ended; its final status is not known yet");
  return status_;
}

void AttachedStream::ReaderLoop() {
  v1::DownMessage msg;
  while (call_->Read(&msg)) {
    const int64_t bytes = static_cast<int64_t>(msg.ByteSizeLong());
    OnDown(std::move(msg), bytes);
    msg.Clear();
  }
  bool window_open = false;
  {
    MutexLock lock(&mu_);
    reading_ = false;
    window_open = window_open_;
  }
  // Nothing more is sent: the writer stops taking messages, and the data
  // path's sends in flight fail now rather than at their timeouts.
  if (window_open) deps_.window->Break();
  data_->Abort();
  {
    // Finish() may only run once the writer no longer uses the call. A write
    // into a call the daemon ended can stay blocked on flow control;
    // cancelling releases it (the daemon's status, already received, is kept).
    MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !writing_; },
                              absl::Seconds(1))) {
      ctx_.TryCancel();
      mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !writing_; });
    }
  }
  const grpc::Status st = call_->Finish();
  absl::Status end;
  {
    MutexLock lock(&mu_);
    if (!cancel_reason_.ok()) {
      end = cancel_reason_;  // why this side cancelled
    } else if (st.ok()) {
      end = closing_ ? absl::OkStatus() : absl::CancelledError("stream closed by the daemon");
    } else {
      end = FromGrpcStatus(st);
    }
    status_ = end;
    finished_ = true;
  }
  if (window_open) deps_.window->Close(end);
  deps_.rounds->Close();
  MutexLock lock(&mu_);
  window_open_ = false;  // closed: a newer stream may open it again
}

void AttachedStream::WriterLoop() {
  SendWindow* window = deps_.window;
  while (std::optional<Outgoing> out = window->Next()) {
    const int64_t size = out->size, payload = out->payload_bytes;
    // Before it goes: the daemon's answer to it may come at once.
    if (out->msg.has_close()) deps_.rounds->NoteClose(out->msg.seq(), out->msg.close().round());
    if (!data_->Send(std::move(*out), [window, size, payload](bool sent) {
          window->Complete(size, sent, payload);
        })) {
      break;
    }
  }
  bool closing = false;
  {
    MutexLock lock(&mu_);
    closing = closing_;
  }
  if (closing) {
    // Everything sent on the data path reaches the daemon before the
    // half-close tells it the rank is done.
    data_->Flush();
    call_->WritesDone();
  }
  MutexLock lock(&mu_);
  writing_ = false;
}

void AttachedStream::OnDown(v1::DownMessage msg, int64_t bytes) {
  if (msg.kind_case() == v1::DownMessage::kAttached) {
    MutexLock lock(&mu_);
    greeted_ = true;
    greeting_ = std::move(*msg.mutable_attached());
    return;
  }
  absl::Status fatal = deps_.rounds->Deliver(std::move(msg), bytes);
  // The daemon ends this stream (the job is gone); so do we, now.
  if (!fatal.ok()) Cancel(std::move(fatal));
}

void AttachedStream::OnUnreadable(absl::Status error) { deps_.rounds->AddError(std::move(error)); }

void AttachedStream::OnFailure(absl::Status error) {
  {
    MutexLock lock(&mu_);
    if (!cancel_reason_.ok() || closing_ || !reading_) return;
  }
  Cancel(std::move(error));
}

void AttachedStream::Cancel(absl::Status why) {
  {
    MutexLock lock(&mu_);
    if (cancel_reason_.ok()) cancel_reason_ = std::move(why);
  }
  ctx_.TryCancel();
}

}  // namespace zenflow
