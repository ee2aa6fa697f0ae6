// The UCX data path; see ucx_data_stream.h.
#include "client/ucx_data_stream.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ucx_frame.h"

namespace zenflow {

namespace {
// How long closing a stream waits for its UCX sends to complete.
constexpr absl::Duration kFlushTimeout = absl::Seconds(5);
}  // namespace

absl::StatusOr<std::unique_ptr<UcxLink>> UcxLink::Create(const UcxOptions& options) {
  std::unique_ptr<UcxLink> link(new UcxLink());
  UcxLink* raw = link.get();
  absl::StatusOr<std::unique_ptr<UcxWorker>> w = UcxWorker::Create(
      options, [raw](uint64_t tag, std::string frame) { raw->Route(tag, std::move(frame)); });
  if (!w.ok()) {
    return absl::Status(w.status().code(), absl::StrCat("transport ucx: ", w.status().message()));
  }
  link->worker_ = *std::move(w);
  return link;
}

UcxLink::~UcxLink() { worker_.reset(); }

void UcxLink::Register(uint64_t tag, FrameFn fn) {
  MutexLock lock(&mu_);
  routes_[tag] = std::move(fn);
}

void UcxLink::Unregister(uint64_t tag) {
  MutexLock lock(&mu_);
  routes_.erase(tag);
}

void UcxLink::Route(uint64_t tag, std::string frame) {
  MutexLock lock(&mu_);
  auto it = routes_.find(tag);
  if (it == routes_.end()) {
    ++dropped_;  // from an older connection
    return;
  }
  it->second(std::move(frame));
}

uint64_t UcxLink::NewTag() {
  static Mutex rng_mu;
  static std::mt19937_64 rng{std::random_device{}()};
  MutexLock lock(&rng_mu);
  uint64_t tag = 0;
  while (tag == 0) tag = rng() & ~UcxWorker::kReservedTagBit;
  return tag;
}

int64_t UcxLink::frames_dropped() {
  MutexLock lock(&mu_);
  return dropped_;
}

UcxDataStream::UcxDataStream(UcxLink* link, DataStreamSink* sink) : link_(link), sink_(sink) {}

UcxDataStream::~UcxDataStream() {
  if (tag_ != 0) link_->Unregister(tag_);
  Abort();
  MutexLock lock(&mu_);
  // Sends end quickly once the endpoint is closed.
  mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return sending_ == 0; },
                       absl::Seconds(30));
}

void UcxDataStream::PrepareAttach(v1::Attach* attach) {
  tag_ = UcxLink::NewTag();
  link_->Register(tag_, [this](std::string frame) { OnFrame(std::move(frame)); });
  attach->set_ucx_address(link_->worker()->address());
  attach->set_ucx_tag(tag_);
}

absl::Status UcxDataStream::Connect(const v1::Attached& greeting) {
  if (greeting.ucx_address().empty()) {
    return absl::FailedPreconditionError(
        "transport ucx: the daemon's greeting carries no UCX address (an older zenflowd?)");
  }
  absl::StatusOr<uint64_t> ep = link_->worker()->Connect(greeting.ucx_address());
  if (!ep.ok()) {
    return absl::Status(ep.status().code(),
                        absl::StrCat("transport ucx: cannot reach the daemon's UCX worker: ",
                                     ep.status().message()));
  }
  MutexLock lock(&mu_);
  ep_ = *ep;
  // What we send carries the daemon's tag for this connection.
  send_tag_ = greeting.ucx_tag() != 0 ? greeting.ucx_tag() : tag_;
  return absl::OkStatus();
}

void UcxDataStream::OnFrame(std::string frame) {
  const int64_t bytes = static_cast<int64_t>(frame.size());
  v1::DownMessage msg;
  absl::Status s = ParseFrame(std::move(frame), &msg);
  if (!s.ok()) {
    sink_->OnUnreadable(absl::InternalError(
        absl::StrCat("the daemon sent a UCX frame this client cannot read: ", s.message())));
    return;
  }
  sink_->OnDown(std::move(msg), bytes);
}

bool UcxDataStream::Send(Outgoing out, DoneFn done) {
  // The message, its split payload and header, and the borrowed payload's
  // owner live until UCX is done with them.
  struct Frame {
    v1::UpMessage msg;
    std::string payload, header;
    absl::string_view borrowed;
    std::shared_ptr<void> hold;
  };
  auto f = std::make_shared<Frame>();
  f->msg = std::move(out.msg);
  f->borrowed = out.borrowed;
  f->hold = std::move(out.hold);
  SplitFrame(&f->msg, &f->payload, &f->header);
  const absl::string_view body = f->borrowed.empty() ? absl::string_view(f->payload) : f->borrowed;
  uint64_t ep = 0, id = 0, send_tag = 0;
  {
    MutexLock lock(&mu_);
    ++sending_;
    ep = ep_;
    send_tag = send_tag_;
    id = ++next_send_;
    // Abort's way to end this send if UCX never does: fail it and let go of
    // the borrowed payload (the peer is gone; nothing reads it any more).
    in_flight_[id].end = [f, done] {
      f->hold.reset();
      done(false);
    };
  }
  link_->worker()->Send(ep, send_tag, {body, f->header}, [this, f, done, id](absl::Status s) {
    bool report = false;
    {
      MutexLock lock(&mu_);
      if (in_flight_.erase(id) == 0) return;  // Abort ended it already
      report = !s.ok() && !aborted_;
    }
    // The lifeline goes down with the data path; the stream reports why.
    if (report) {
      sink_->OnFailure(absl::Status(s.code(), absl::StrCat("transport ucx: ", s.message())));
    }
    done(s.ok());
    MutexLock lock(&mu_);
    --sending_;
  });
  return true;
}

void UcxDataStream::Flush() {
  // Bounded: a rank closes its stream after the last round came back (its
  // sends are long done), or while it fails, when the daemon may never take
  // them (it stopped reading a rank that no longer reads, or it is gone) and
  // the process should end promptly.
  const absl::Time deadline = absl::Now() + kFlushTimeout;
  uint64_t ep = 0;
  {
    MutexLock lock(&mu_);
    mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return sending_ == 0 || aborted_; },
                         kFlushTimeout);
    if (aborted_ || sending_ != 0) return;
    ep = ep_;
  }
  // An Abort meanwhile closes the endpoint, which ends the flush.
  if (ep != 0) {
    (void)link_->worker()->Flush(ep, std::max(deadline - absl::Now(), absl::Milliseconds(100)));
  }
}

void UcxDataStream::Abort() {
  uint64_t ep = 0;
  {
    MutexLock lock(&mu_);
    aborted_ = true;
    ep = ep_;
    ep_ = 0;
  }
  if (ep != 0) link_->worker()->Disconnect(ep, /*force=*/true);
  // The force close fails the sends in flight, as a rule; a peer that died
  // mid-transfer (shared memory) can leave some that never end. Give UCX a
  // moment, then end them here.
  std::map<uint64_t, InFlight> stuck;
  {
    MutexLock lock(&mu_);
    mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return in_flight_.empty(); },
                         absl::Seconds(2));
    stuck.swap(in_flight_);
  }
  for (auto& [id, s] : stuck) {
    s.end();
    MutexLock lock(&mu_);
    --sending_;
  }
}

}  // namespace zenflow
