// zenflowd's UCX data plane. A rank that attaches with a UCX worker address
// gets a connection here: its shards and round closes arrive as UCX frames
// (common/ucx_frame.h) with the connection's tag, and its mailbox (deltas,
// RoundDone, errors) drains into UCX sends. The gRPC stream that carried the
// attach stays the rank's lifeline: when it ends, Close() handles what has
// already arrived, then detaches the mailbox and closes the endpoint.
//
// Frames are handled on dispatch threads (zenflowd --ucx_dispatch_threads):
// each connection is given to one of them when it opens, which handles its
// frames in arrival order, so a rank's messages reach Job::HandleUp in the
// order it sent them, while different ranks' shards are handled (and
// accumulated, see Job::HandleShard) in parallel.
//
// Flow control: while a rank's outbox is full (it does not take what the
// daemon sends), its frames are parked, not handled, so it cannot make the
// daemon produce more for it; handling resumes when the outbox drains. What
// a rank can make the daemon hold is bounded: a frame longer than the
// message limit is never received into memory, and a rank whose waiting
// frames exceed max_outbox_bytes + max_message_bytes is cut off (its
// connection closed, its gRPC lifeline ended with RESOURCE_EXHAUSTED).
#ifndef ZENFLOW_SERVER_UCX_PLANE_H_
#define ZENFLOW_SERVER_UCX_PLANE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/ucx.h"
#include "server/job.h"
#include "server/mailbox.h"
#include "server/registry.h"

namespace zenflow {

// The gRPC stream that carried a connection's attach. The data plane ends
// it when it closes the connection on its own. Held by weak_ptr; Abort must
// be safe from any thread while the object lives.
class Lifeline {
 public:
  virtual ~Lifeline() = default;
  virtual void Abort(absl::Status why) = 0;
};

// Thread-safe.
class UcxDataPlane {
 public:
  class Conn;

  // `options.max_message_bytes` bounds a received frame; `max_outbox_bytes`
  // is the registry's per-rank outbox limit.
  // `dispatch_threads` (>= 1) handle the connections' frames; each frame
  // first waits `emulate_frame_seconds` (tests: slow dispatchers; 0: none).
  static absl::StatusOr<std::unique_ptr<UcxDataPlane>> Start(const UcxOptions& options,
                                                             JobRegistry* registry,
                                                             int64_t max_outbox_bytes,
                                                             int dispatch_threads = 1,
                                                             double emulate_frame_seconds = 0);
  ~UcxDataPlane();


  // Connects to the rank's worker and makes the connection the writer of
  // `box`. What the daemon sends the rank carries `down_tag` (the rank's
  // choice); what the rank sends must carry the connection's tag(), which
  // the daemon draws at random and tells the rank only in its greeting on
  // the (authenticated) gRPC stream: no other process can send as this
  // rank. ALREADY_EXISTS if the rank has a writer attached.
  absl::StatusOr<std::shared_ptr<Conn>> Open(std::shared_ptr<Job> job, int32_t rank,
                                             std::shared_ptr<Mailbox> box,
                                             const std::string& peer_address, uint64_t down_tag,
                                             std::weak_ptr<Lifeline> lifeline);
  // The rank's control stream ended. Asynchronous; safe to call twice.
  void Close(std::shared_ptr<Conn> conn);

  void FillStats(v1::UcxStats* out);

 private:
  struct Item {
    enum Kind { kFrame, kOversize, kResume, kCutOff, kCloseRequest, kCloseFinal } kind = kFrame;
    uint64_t tag = 0;
    std::string frame;
    NonFiniteScan scan;      // what the receive copy proved of the frame's front
    int64_t bytes = 0;       // held against the connection
    int64_t wire_bytes = 0;  // kOversize: the discarded frame's size
    std::shared_ptr<Conn> conn;
  };

  struct Stats {
    int64_t frames = 0;
    int64_t dropped = 0;  // frames with an unknown tag, or of a cut connection
    int64_t cut = 0;      // connections cut off
  };

  // A UCX worker and the connections it serves. UCX 1.13 frees a closed
  // endpoint (and about 0.5 MiB of shared memory with it) only when its
  // worker is destroyed: the daemon's endpoints cannot be force-closed (no
  // peer-failure mode over shared memory) and a flushed close of an endpoint
  // the peer connected back to is kept until then. So workers rotate: new
  // connections go to the current one until kRotateAfter of its
  // connections have closed, and a worker is destroyed once its last
  // connection closed. (tools/zf_soak checks the daemon's shared memory.)
  struct Slot {
    std::unique_ptr<UcxWorker> worker;
    int live = 0;    // connections open on it
    int closed = 0;  // connections it served that closed
  };
  static constexpr int kRotateAfter = 16;

  UcxDataPlane(const UcxOptions& options, JobRegistry* registry, std::string tls,
               int64_t held_limit)
      : options_(options), registry_(registry), tls_(std::move(tls)), held_limit_(held_limit) {}
  absl::StatusOr<std::unique_ptr<UcxWorker>> NewWorker();
  // A connection of `slot` closed (`had_endpoint`: its endpoint, which UCX
  // keeps until the worker goes, counts towards rotating): the worker goes
  // when it was its last (returned, to be destroyed outside mu_).
  std::unique_ptr<UcxWorker> Release(Slot* slot, bool had_endpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddStats(const UcxWorker::Stats& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFrame(uint64_t tag, std::string frame, const NonFiniteScan& scan);
  void OnOversize(uint64_t tag, int64_t bytes);
  // Queues an item of a registered connection, unless it holds too much.
  void Enqueue(uint64_t tag, Item item) ABSL_LOCKS_EXCLUDED(mu_);
  void Resume(std::shared_ptr<Conn> conn);
  // Queues an item that names its connection, for that connection's
  // dispatcher.
  void PushLocked(Item item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DispatchLoop(size_t q);
  // One item of a dispatcher's queue.
  void Dispatch(Item item);
  // A frame (or oversize report) of a live connection: handled now, or
  // parked behind others while its outbox is full.
  void Deliver(const std::shared_ptr<Conn>& c, Item item);
  void Handle(const std::shared_ptr<Conn>& c, Item item);
  // Handles c's parked items in order; with `while_room`, only while its
  // outbox is not full.
  void HandleParked(const std::shared_ptr<Conn>& c, bool while_room);
  void CutOff(const std::shared_ptr<Conn>& c);

  const UcxOptions options_;
  JobRegistry* const registry_;
  const std::string tls_;
  const int64_t held_limit_;  // per connection: frames waiting to be handled
  double emulate_frame_seconds_ = 0;  // set by Start, before any frame
  std::vector<std::thread> dispatchers_;

  Mutex mu_;
  // One per dispatcher (a vector, swapped with the dispatcher's batch).
  std::vector<std::vector<Item>> queues_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};  // stop_, for a dispatcher mid-batch
  size_t next_queue_ ABSL_GUARDED_BY(mu_) = 0;  // the next connection's dispatcher
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Every worker with connections, and the current one (null: the next
  // Open makes one).
  std::vector<std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  Slot* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  UcxWorker::Stats gone_ ABSL_GUARDED_BY(mu_);  // of destroyed workers
};

// One rank's UCX connection; the writer of its mailbox while attached.
class UcxDataPlane::Conn : public Mailbox::Writer, public std::enable_shared_from_this<Conn> {
 public:
  Conn(UcxDataPlane* plane, Slot* slot, uint64_t ep, uint64_t tag, uint64_t down_tag,
       std::shared_ptr<Job> job, int32_t rank, std::shared_ptr<Mailbox> box,
       std::weak_ptr<Lifeline> lifeline)
      : plane_(plane), slot_(slot), worker_(slot->worker.get()), ep_(ep), tag_(tag),
        down_tag_(down_tag),
        job_(std::move(job)), rank_(rank),
        box_(std::move(box)), lifeline_(std::move(lifeline)) {}

  Wire wire() const override { return Wire::kUcx; }
  void Write(const v1::DownMessage* msg) override;
  void Resume() override;

  uint64_t tag() const { return tag_; }  // the rank's frames carry it
  // The address of the daemon's worker this connection is on (the greeting's).
  const std::string& worker_address() const { return worker_->address(); }
  uint64_t ep() const { return ep_; }
  int32_t rank() const { return rank_; }
  const std::shared_ptr<Job>& job() const { return job_; }
  const std::shared_ptr<Mailbox>& box() const { return box_; }

 private:
  friend class UcxDataPlane;
  UcxDataPlane* const plane_;
  Slot* const slot_;          // lives while this connection is open
  UcxWorker* const worker_;   // slot_'s
  const uint64_t ep_;
  const uint64_t tag_;       // up: the daemon's random key of this connection
  const uint64_t down_tag_;  // down: the rank's tag
  const std::shared_ptr<Job> job_;
  const int32_t rank_;
  const std::shared_ptr<Mailbox> box_;
  const std::weak_ptr<Lifeline> lifeline_;
  // The header of the one write in flight (the mailbox allows one).
  std::string header_;
  // Guarded by the plane's mu_: bytes of this connection's items queued for
  // the dispatcher or parked; set once it is cut off.
  int64_t held_ = 0;
  bool cut_ = false;
  // Its dispatcher (set before the connection is registered).
  size_t queue_ = 0;
  // Its dispatcher thread only: items waiting for the outbox to drain.
  std::deque<Item> parked_;
  // Whether parked_ holds any: set by its dispatcher, read by the worker's
  // progress thread (Enqueue's backpressure does not wait for a parked rank).
  std::atomic<bool> parked_any_{false};
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_UCX_PLANE_H_
