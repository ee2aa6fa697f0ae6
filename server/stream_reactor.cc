// Stream's reactor; see stream_reactor.h.
#include "server/stream_reactor.h"

#include <array>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/stream_error.h"
#include "common/up_wire.h"
#include "server/ingest.h"
#include "server/job.h"
#include "server/mailbox.h"
#include "server/raw_message.h"

namespace zenflow {
namespace {

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
  // read. After it, the stream reads ahead: while one message is
  // handled (parsed, checked, added), the next one is received, on whichever
  // thread gRPC calls back on; messages are handled one at a time, in order
  // (`handling_`). Read messages wait in `queued_`: up to kReadAhead of them
  // while they hold less than kReadAheadBytes, so a stream holds the message
  // handled, the waiting ones (one large message, or up to 16 small ones
  // of 2 MiB in all) and the read in flight.
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
        queued_bytes_ += in_.Length();
        queued_[(queued_first_ + queued_count_++) % kReadAhead] = std::move(in_);
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
        queued_count_ >= kReadAhead || queued_bytes_ >= kReadAheadBytes) {
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
        if (queued_count_ == 0 || finish_requested_) {
          handling_ = false;
          for (grpc::ByteBuffer& b : queued_) b.Clear();
          queued_count_ = 0;
          queued_bytes_ = 0;
          if (!read_ended_) return;
          break;
        }
        buf = std::move(queued_[queued_first_]);
        queued_first_ = (queued_first_ + 1) % kReadAhead;
        --queued_count_;
        queued_bytes_ -= buf.Length();
        read = ReadMoreLocked();
      }
      if (read) StartRead(&in_);
      bool split = false;
      absl::Status s = ParseUpRaw(&buf, ++index_, &up_, &slices_, &payload_, &split, registry_);
      (void)IngestUp(registry_, job_.get(), rank_, Wire::kGrpc, mailbox_.get(), std::move(s), up_,
                     split ? &payload_ : nullptr);
      ClearUpKeepingRoom(&up_);  // the next shard parses into the same room
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
  // Read messages waiting to be handled: at most this many, and no more
  // once they hold kReadAheadBytes (so one large message at a time, as
  // before, but small ones keep gRPC's stream window open: with one 64 KiB
  // message read ahead the sender waited on each message's handling).
  static constexpr size_t kReadAhead = 16;
  static constexpr size_t kReadAheadBytes = size_t{2} << 20;
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
  // The read messages waiting, oldest first (a fixed array: no allocation
  // per message, as a deque's would be every few).
  std::array<grpc::ByteBuffer, kReadAhead> queued_ ABSL_GUARDED_BY(mu_);  // a ring
  size_t queued_first_ ABSL_GUARDED_BY(mu_) = 0;
  size_t queued_count_ ABSL_GUARDED_BY(mu_) = 0;
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;         // OnDone ran
  std::shared_ptr<StreamReactor> self_;            // until OnDone
  uint64_t stream_number_ = 0;                     // Job::StreamAttached's
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);  // a fatal error was written
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartStreamReactor(
    ZenFlowService* service, JobRegistry* registry, UcxDataPlane* ucx,
    const std::string* no_ucx_reason, Who who, absl::Status refused) {
  return StreamReactor::Start(service, registry, ucx, no_ucx_reason, std::move(who),
                              std::move(refused));
}

}  // namespace zenflow
