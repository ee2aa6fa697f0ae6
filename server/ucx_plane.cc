// zenflowd's UCX data plane; see ucx_plane.h.
#include "server/ucx_plane.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/ucx_frame.h"
#include "server/exposure.h"
#include "server/ingest.h"

namespace zenflow {

void UcxDataPlane::Conn::Write(const v1::DownMessage* msg) {
  // The mailbox keeps *msg alive until WriteDone.
  const absl::string_view payload = SplitFrameShared(*msg, &header_);
  std::shared_ptr<Conn> self = shared_from_this();
  worker_->Send(ep_, down_tag_, {payload, header_}, [self](absl::Status s) {
    self->box_->WriteDone(self.get(), s.ok());
  });
}

void UcxDataPlane::Conn::Resume() { plane_->Resume(shared_from_this()); }

absl::StatusOr<std::unique_ptr<UcxDataPlane>> UcxDataPlane::Start(const UcxOptions& options,
                                                                   JobRegistry* registry,
                                                                   int64_t max_outbox_bytes,
                                                                   int dispatch_threads,
                                                                   double emulate_frame_seconds) {
  // No CMA: a client must not be able to make the daemon read memory it
  // freed (fatal in UCX 1.13; see UcxOptions::without_cma).
  UcxOptions daemon_options = options;
  daemon_options.without_cma = true;
  // Bodies (shard payloads) are copied out of UCX through a scan for NaN
  // and Inf: a bf16 / fp16 / fp32 payload proven finite is not read again
  // to be checked before its add (Job::AddShard). Shared memory only: its
  // fragments are copied out anyway, and the scan rides on that copy. Over
  // TCP UCX receives a contiguous message straight from the socket, and the
  // generic datatype would add a copy (measured slower than the check's
  // read: docs/scale-benchmark.md#the-check-on-the-receive-copy).
  daemon_options.scan_nonfinite = NetworkTransportIn(daemon_options.tls).empty();
  std::unique_ptr<UcxDataPlane> p(new UcxDataPlane(
      daemon_options, registry, UcxTransports(daemon_options),
      max_outbox_bytes + std::max<int64_t>(options.max_message_bytes, 0)));
  p->emulate_frame_seconds_ = emulate_frame_seconds;
  UcxDataPlane* raw = p.get();
  // The first worker now: a UCX that cannot start is reported at start-up.
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> first, p->NewWorker());
  {
    MutexLock lock(&p->mu_);
    p->slots_.push_back(std::make_unique<Slot>());
    p->slots_.back()->worker = std::move(first);
    p->current_ = p->slots_.back().get();
    p->queues_.resize(static_cast<size_t>(std::max(1, dispatch_threads)));
  }
  for (size_t q = 0; q < static_cast<size_t>(std::max(1, dispatch_threads)); ++q) {
    p->dispatchers_.emplace_back([raw, q] { raw->DispatchLoop(q); });
  }
  return p;
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxDataPlane::NewWorker() {
  UcxDataPlane* raw = this;
  ZF_ASSIGN_OR_RETURN(
      std::unique_ptr<UcxWorker> w,
      UcxWorker::Create(
          options_,
          [raw](uint64_t tag, std::string frame, const NonFiniteScan& scan) {
            raw->OnFrame(tag, std::move(frame), scan);
          },
          [raw](uint64_t tag, int64_t bytes) { raw->OnOversize(tag, bytes); }));
  return w;
}

void UcxDataPlane::AddStats(const UcxWorker::Stats& w) {
  gone_.messages_received += w.messages_received;
  gone_.bytes_received += w.bytes_received;
  gone_.messages_sent += w.messages_sent;
  gone_.bytes_sent += w.bytes_sent;
  gone_.send_errors += w.send_errors;
}

std::unique_ptr<UcxWorker> UcxDataPlane::Release(Slot* slot, bool had_endpoint) {
  --slot->live;
  if (had_endpoint) ++slot->closed;
  if (slot == current_ && slot->closed >= kRotateAfter) current_ = nullptr;  // the next Open makes one
  if (slot->live > 0) return nullptr;
  if (slot == current_) current_ = nullptr;
  std::unique_ptr<UcxWorker> w = std::move(slot->worker);
  AddStats(w->stats());
  slots_.erase(std::remove_if(slots_.begin(), slots_.end(),
                              [slot](const std::unique_ptr<Slot>& x) { return x.get() == slot; }),
               slots_.end());
  return w;
}

UcxDataPlane::~UcxDataPlane() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    stopping_ = true;
  }
  for (std::thread& t : dispatchers_) t.join();
  std::map<uint64_t, std::shared_ptr<Conn>> conns;
  {
    MutexLock lock(&mu_);
    conns.swap(conns_);
  }
  for (auto& [tag, c] : conns) c->box()->Detach(c.get());
  // Closes every endpoint; sends in flight fail and go back to their mailbox.
  std::vector<std::unique_ptr<Slot>> slots;
  {
    MutexLock lock(&mu_);
    slots.swap(slots_);
    current_ = nullptr;
  }
  slots.clear();
}

void UcxDataPlane::OnFrame(uint64_t tag, std::string frame, const NonFiniteScan& scan) {
  Item item;
  item.tag = tag;
  item.scan = scan;
  item.bytes = static_cast<int64_t>(frame.size());
  item.frame = std::move(frame);
  Enqueue(tag, std::move(item));
}

void UcxDataPlane::OnOversize(uint64_t tag, int64_t bytes) {
  Item item;
  item.kind = Item::kOversize;
  item.tag = tag;
  item.wire_bytes = bytes;
  Enqueue(tag, std::move(item));
}

namespace {

// How long a worker's progress thread waits, per frame, for a connection
// past half its held limit to be handled below it (Enqueue).
constexpr absl::Duration kBackpressureWait = absl::Milliseconds(100);

}  // namespace

void UcxDataPlane::Enqueue(uint64_t tag, Item item) {
  MutexLock lock(&mu_);
  auto it = conns_.find(tag);
  if (it == conns_.end() || it->second->cut_) {
    ++stats_.dropped;  // another (or an old, or a cut) connection's tag
    return;
  }
  Conn* c = it->second.get();
  // An oversize report holds no payload; it counts as 1 KiB, so a rank
  // that floods oversized frames is cut off like one that floods frames.
  if (item.kind == Item::kOversize) item.bytes = 1024;
  c->held_ += item.bytes;
  if (c->held_ > held_limit_) {
    c->cut_ = true;
    ++stats_.dropped;
    Item cut;
    cut.kind = Item::kCutOff;
    cut.conn = it->second;
    PushLocked(std::move(cut));
    return;
  }
  queues_[c->queue_].push_back(std::move(item));
  // Backpressure: past half its limit, a connection's frames are taken in
  // no faster than its dispatcher handles them. This UCX worker's progress
  // thread (the caller) waits, receiving nothing more meanwhile, so the
  // rank's sends stop completing and its send window fills: a rank that
  // sends faster than the daemon adds is slowed, not cut off. (Its window
  // counts bytes until UCX completes a send, which on shared memory is
  // when they are in the daemon's receive buffers: without this a fast
  // link outran the dispatchers and cut off ranks that did nothing wrong,
  // e.g. ./zf bench transport's ucx_sm at 64 KiB to 4 MiB.) A rank whose
  // frames are parked (its outbox full: it does not read) is not waited
  // for; it reaches the limit and is cut off as before. The wait is
  // bounded, so a dispatcher busy elsewhere (a close's drain) only slows
  // this worker, and other connections on it, for a while.
  if (c->held_ > held_limit_ / 2) {
    const std::shared_ptr<Conn> keep = it->second;
    mu_.AwaitWithTimeout(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return stop_ || keep->cut_ || keep->held_ <= held_limit_ / 2 ||
                 keep->parked_any_.load(std::memory_order_relaxed);
        },
        kBackpressureWait);
  }
}

void UcxDataPlane::Resume(std::shared_ptr<Conn> conn) {
  MutexLock lock(&mu_);
  Item item;
  item.kind = Item::kResume;
  item.conn = std::move(conn);
  PushLocked(std::move(item));
}

void UcxDataPlane::PushLocked(Item item) {
  const size_t q = item.conn->queue_;
  queues_[q].push_back(std::move(item));
}

namespace {

// A connection's key for the frames it sends: 64 bits from the kernel's
// random source, so that only the rank that was told it (over its
// authenticated gRPC stream) can send frames the daemon takes as its own.
uint64_t NewUpTag() {
  uint64_t tag = 0;
  while (tag == 0) {
    if (getrandom(&tag, sizeof(tag), 0) != sizeof(tag) && errno != EINTR) {
      std::fprintf(stderr, "zenflowd: getrandom failed\n");
      std::abort();
    }
    tag &= ~UcxWorker::kReservedTagBit;
  }
  return tag;
}

}  // namespace

absl::StatusOr<std::shared_ptr<UcxDataPlane::Conn>> UcxDataPlane::Open(
    std::shared_ptr<Job> job, int32_t rank, std::shared_ptr<Mailbox> box,
    const std::string& peer_address, uint64_t down_tag, std::weak_ptr<Lifeline> lifeline) {
  if (down_tag == 0 || (down_tag & UcxWorker::kReservedTagBit) != 0) {
    return absl::InvalidArgumentError(
        "attach.ucx_tag must be nonzero and below 2^63 (pick one at random, top bit clear)");
  }
  if (peer_address.size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attach.ucx_address of ", peer_address.size(),
        " bytes is not a UCX worker address (pass ucp_worker_get_address's bytes)"));
  }
  // The worker this connection goes on: the current one, or a new one.
  Slot* slot = nullptr;
  for (int attempt = 0; slot == nullptr; ++attempt) {
    {
      MutexLock lock(&mu_);
      if (current_ != nullptr) {
        slot = current_;
        ++slot->live;  // holds it while we connect
        break;
      }
    }
    if (attempt > 0) return absl::InternalError("no UCX worker to connect on");
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> w, NewWorker());
    MutexLock lock(&mu_);
    if (current_ == nullptr) {
      slots_.push_back(std::make_unique<Slot>());
      slots_.back()->worker = std::move(w);
      current_ = slots_.back().get();
    }
    // else another Open made one first; ours goes when `w` does (no connection).
  }
  auto release = [&] {
    std::unique_ptr<UcxWorker> gone;
    {
      MutexLock lock(&mu_);
      gone = Release(slot, /*had_endpoint=*/false);
    }
  };
  absl::StatusOr<uint64_t> ep = slot->worker->Connect(peer_address);
  if (!ep.ok()) {
    release();
    return absl::Status(ep.status().code(),
                        absl::StrCat("cannot reach the rank's UCX worker: ", ep.status().message(),
                                     " (are both on one host for shared memory, or is "
                                     "--ucx_tls set for the network?)"));
  }
  std::shared_ptr<Conn> conn;
  {
    MutexLock lock(&mu_);
    uint64_t tag = NewUpTag();
    while (conns_.count(tag) != 0) tag = NewUpTag();
    conn = std::make_shared<Conn>(this, slot, *ep, tag, down_tag, std::move(job), rank, box,
                                  std::move(lifeline));
    conn->queue_ = next_queue_;
    next_queue_ = (next_queue_ + 1) % queues_.size();
    conns_[tag] = conn;
  }
  if (!box->Attach(conn.get())) {
    {
      MutexLock lock(&mu_);
      conns_.erase(conn->tag());
    }
    slot->worker->Disconnect(*ep, /*force=*/true);
    std::unique_ptr<UcxWorker> gone;
    {
      MutexLock lock(&mu_);
      gone = Release(slot, /*had_endpoint=*/true);
    }
    return absl::AlreadyExistsError(absl::StrCat("rank ", conn->rank(), " of job '",
                                                 conn->job()->spec().job_id(),
                                                 "' already has a stream attached"));
  }
  return conn;
}

void UcxDataPlane::Close(std::shared_ptr<Conn> conn) {
  MutexLock lock(&mu_);
  Item item;
  item.kind = Item::kCloseRequest;
  item.conn = std::move(conn);
  PushLocked(std::move(item));
}

void UcxDataPlane::FillStats(v1::UcxStats* out) {
  MutexLock lock(&mu_);
  UcxWorker::Stats w = gone_;
  for (const std::unique_ptr<Slot>& slot : slots_) {
    const UcxWorker::Stats s = slot->worker->stats();
    w.bytes_received += s.bytes_received;
    w.messages_sent += s.messages_sent;
    w.bytes_sent += s.bytes_sent;
  }
  out->set_enabled(true);
  out->set_transports(tls_.empty() ? "(UCX default)" : tls_);
  out->set_connections(static_cast<int64_t>(conns_.size()));
  out->set_frames_received(stats_.frames);
  out->set_frames_dropped(stats_.dropped);
  out->set_bytes_received(w.bytes_received);
  out->set_messages_sent(w.messages_sent);
  out->set_bytes_sent(w.bytes_sent);
  out->set_connections_cut(stats_.cut);
  out->set_workers(static_cast<int64_t>(slots_.size()));
}

void UcxDataPlane::DispatchLoop(size_t q) {
  // Takes everything queued at once: the queue and the batch swap, so both
  // keep their capacity (no allocation per frame; the std::deque this was
  // allocated a block every few frames) and the lock is taken once a batch.
  std::vector<Item> batch;
  for (;;) {
    {
      MutexLock lock(&mu_);
      mu_.Await([this, q]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stop_ || !queues_[q].empty();
      });
      if (stop_) return;
      batch.swap(queues_[q]);
    }
    for (Item& item : batch) {
      if (stopping_.load(std::memory_order_relaxed)) return;  // the rest is dropped
      Dispatch(std::move(item));
    }
    batch.clear();
  }
}

void UcxDataPlane::Dispatch(Item item) {
  switch (item.kind) {
    case Item::kFrame:
    case Item::kOversize: {
      std::shared_ptr<Conn> c;
      {
        MutexLock lock(&mu_);
        auto it = conns_.find(item.tag);
        if (it == conns_.end() || it->second->cut_) {
          ++stats_.dropped;
          break;
        }
        c = it->second;
      }
      Deliver(c, std::move(item));
      break;
    }
    case Item::kResume:
      HandleParked(item.conn, /*while_room=*/true);
      break;
    case Item::kCutOff:
      CutOff(item.conn);
      break;
    case Item::kCloseRequest: {
      // Whatever the rank sent before its stream ended has arrived once
      // its last sends completed; take it in, then close behind it.
      bool open = false;
      {
        MutexLock lock(&mu_);
        auto it = conns_.find(item.conn->tag());
        open = it != conns_.end() && it->second == item.conn;
      }
      // (A connection cut off meanwhile may have taken its worker along.)
      if (open) (void)item.conn->worker_->Drain(absl::Seconds(5));
      MutexLock lock(&mu_);
      item.kind = Item::kCloseFinal;
      PushLocked(std::move(item));
      break;
    }
    case Item::kCloseFinal: {
      const std::shared_ptr<Conn>& c = item.conn;
      bool open = false, live = false;
      {
        MutexLock lock(&mu_);
        auto it = conns_.find(c->tag());
        if (it != conns_.end() && it->second == c) {
          conns_.erase(it);
          open = true;
          live = !c->cut_;
        }
      }
      // What the rank sent is handled even if its outbox is full (bounded
      // by the held limit); replies stay queued for its next stream.
      if (live) HandleParked(c, /*while_room=*/false);
      c->parked_.clear();
      c->box()->Detach(c.get());
      // A connection cut off already closed its endpoint and let go of its
      // worker (CutOff); only one still registered holds its worker.
      if (open) {
        c->worker_->Disconnect(c->ep(), /*force=*/true);
        std::unique_ptr<UcxWorker> gone;
        MutexLock lock(&mu_);
        gone = Release(c->slot_, /*had_endpoint=*/true);
      }
      break;
    }
  }
}

void UcxDataPlane::Deliver(const std::shared_ptr<Conn>& c, Item item) {
  if (!c->parked_.empty() || c->box()->Full(c.get())) {
    c->parked_.push_back(std::move(item));  // Resume() hands it on
    c->parked_any_.store(true, std::memory_order_relaxed);
    return;
  }
  Handle(c, std::move(item));
}

void UcxDataPlane::HandleParked(const std::shared_ptr<Conn>& c, bool while_room) {
  while (!c->parked_.empty() && !(while_room && c->box()->Full(c.get()))) {
    Item next = std::move(c->parked_.front());
    c->parked_.pop_front();
    Handle(c, std::move(next));
  }
  if (c->parked_.empty()) c->parked_any_.store(false, std::memory_order_relaxed);
}

void UcxDataPlane::Handle(const std::shared_ptr<Conn>& c, Item item) {
  if (emulate_frame_seconds_ > 0) absl::SleepFor(absl::Seconds(emulate_frame_seconds_));
  {
    MutexLock lock(&mu_);
    c->held_ -= item.bytes;
    ++stats_.frames;
  }
  // The frame's header is parsed into this dispatcher's reused message (no
  // heap allocation per shard once warm); its payload buffer moves into the
  // message, is read in place and goes back to the worker's receive buffers.
  thread_local UpFrameParser parser;
  static const v1::UpMessage* const kUnread = new v1::UpMessage();
  absl::Status s = item.kind == Item::kOversize
                       ? registry_->CheckMessageSize(static_cast<size_t>(item.wire_bytes))
                       : registry_->CheckMessageSize(item.frame.size());
  v1::UpMessage* up = nullptr;
  if (s.ok()) {
    absl::StatusOr<v1::UpMessage*> parsed = parser.Parse(std::move(item.frame));
    if (parsed.ok()) {
      up = *parsed;
    } else {
      s = parsed.status();
    }
  }
  // A shard's payload (the frame's front, where the receive scan ran) goes
  // in with what the scan proved of it.
  thread_local std::string body;
  thread_local ShardPayload payload;
  const bool shard = up != nullptr && up->kind_case() == v1::UpMessage::kShard;
  if (shard) {
    body.swap(*up->mutable_shard()->mutable_payload());
    payload.Clear();
    payload.Append(body);
    payload.set_scan(item.scan);
  }
  (void)IngestUp(registry_, c->job().get(), c->rank(), Wire::kUcx, c->box().get(), std::move(s),
                 up != nullptr ? *up : *kUnread, shard ? &payload : nullptr);
  if (shard) {
    payload.Clear();
    c->worker_->Recycle(std::move(body));
    body = std::string();
  }
}

void UcxDataPlane::CutOff(const std::shared_ptr<Conn>& c) {
  bool was_live = false;
  {
    MutexLock lock(&mu_);
    auto it = conns_.find(c->tag());
    if (it != conns_.end() && it->second == c) {
      conns_.erase(it);
      was_live = true;
    }
    ++stats_.cut;
  }
  c->parked_.clear();
  const int64_t outbox = c->box()->bytes();
  c->box()->Detach(c.get());
  // A send stuck on the peer fails; its message goes back to the outbox,
  // which keeps everything for the rank's next stream. (A connection no
  // longer registered was closed, and let go of its worker, already.)
  if (was_live) {
    c->worker_->Disconnect(c->ep(), /*force=*/true);
    std::unique_ptr<UcxWorker> gone;
    MutexLock lock(&mu_);
    gone = Release(c->slot_, /*had_endpoint=*/true);
  }
  const absl::Status why = absl::ResourceExhaustedError(absl::StrCat(
      "rank ", c->rank(), " of job '", c->job()->spec().job_id(), "' has more than ",
      held_limit_, " bytes of messages waiting in the daemon while its outbox holds ", outbox,
      " bytes (--max_outbox_bytes ", c->box()->limit_bytes(),
      "): it does not read what the daemon sends, or sends faster than the daemon takes it in; "
      "its UCX connection was closed (attach again and read the stream; what was queued for it "
      "is kept)"));
  std::fprintf(stderr, "zenflowd: %s\n", std::string(why.message()).c_str());
  if (std::shared_ptr<Lifeline> l = c->lifeline_.lock()) l->Abort(why);
}

}  // namespace zenflow
