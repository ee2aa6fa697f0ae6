// Per-rank outbox of down-stream messages, and the single-writer protocol that
// drains it into whichever stream (gRPC or UCX) the rank currently has
// attached. The outbox is bounded in bytes by flow control, not by dropping:
// while it holds more than its limit, the rank's stream stops reading (see
// Full() and Writer::Resume), so a rank that does not read what the daemon
// sends cannot make it send, or hold, more.
//
//   auto box = std::make_shared<Mailbox>(/*limit_bytes=*/64 << 20);
//   box->Push(msg);                 // from any thread; queued while no stream
//   if (box->Attach(&writer)) ...   // the stream's reactor starts draining it
#ifndef ZENFLOW_SERVER_MAILBOX_H_
#define ZENFLOW_SERVER_MAILBOX_H_

#include <cstdint>
#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// The transport a rank's data stream uses.
enum class Wire { kGrpc = 0, kUcx = 1 };
inline const char* WireName(Wire w) { return w == Wire::kUcx ? "ucx" : "grpc"; }

// Thread-safe. Messages stay queued while no writer is attached, so deltas
// computed while a rank reconnects are delivered on its next stream. At most
// one write is in flight at a time; a message whose write failed goes back to
// the front of the queue. Messages are shared and immutable: one round's
// deltas are held once however many ranks they go to.
class Mailbox {
 public:
  using Message = std::shared_ptr<const v1::DownMessage>;

  // Implemented by a stream. Write() starts an asynchronous write of *msg
  // (which stays valid until the writer calls WriteDone) and must not call
  // back into the Mailbox synchronously.
  class Writer {
   public:
    virtual ~Writer() = default;
    virtual void Write(const v1::DownMessage* msg) = 0;
    // The transport this writer writes on.
    virtual Wire wire() const = 0;
    // The outbox went from full to below half its limit: a stream that
    // paused reading because of Full() may read again. Called without the
    // mailbox's lock, on the thread that completed a write.
    virtual void Resume() {}
  };

  // `limit_bytes` <= 0: unlimited (Full() is never true).
  explicit Mailbox(int64_t limit_bytes = 0) : limit_(limit_bytes) {}
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Queues a message and starts writing it if a writer is idle.
  void Push(v1::DownMessage msg) ABSL_LOCKS_EXCLUDED(mu_);
  void Push(Message msg) ABSL_LOCKS_EXCLUDED(mu_);

  // Makes `w` the writer. False if another writer is attached.
  bool Attach(Writer* w) ABSL_LOCKS_EXCLUDED(mu_);

  // Stops starting writes on `w` (no-op if `w` is not attached). Returns true
  // when a write on `w` is still in flight: the caller must then wait for its
  // WriteDone before finishing the stream.
  bool Detach(Writer* w) ABSL_LOCKS_EXCLUDED(mu_);

  // Reports the end of the write started on `w`. Returns true when `w` has
  // been detached and nothing more will be written on it (the stream may
  // finish now).
  bool WriteDone(Writer* w, bool ok) ABSL_LOCKS_EXCLUDED(mu_);

  // True while the queued and in-flight bytes are at or above the limit.
  // When it returns true the caller (the writer, which stops reading) will
  // get Resume() once the outbox has drained below half the limit — or at
  // once, if it already has.
  bool Full(Writer* w) ABSL_LOCKS_EXCLUDED(mu_);

  size_t queued() const ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes queued or being written (serialized sizes).
  int64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t limit_bytes() const { return limit_; }
  // True while a stream waits for Resume().
  bool paused() const ABSL_LOCKS_EXCLUDED(mu_);
  // The attached writer's transport; false when none is attached.
  bool attached(Wire* wire) const ABSL_LOCKS_EXCLUDED(mu_);
  // Parameter deltas written (completed writes) on each transport, and
  // their serialized bytes, since the mailbox was made.
  struct Sent {
    int64_t deltas = 0;
    int64_t bytes = 0;
  };
  Sent sent(Wire wire) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Item {
    Message msg;
    int64_t bytes = 0;
  };
  // Pops the next message into current_ if a write may start; returns the
  // writer to call, or null.
  Writer* NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t limit_;
  mutable Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;  // queue_ plus current_
  Writer* writer_ ABSL_GUARDED_BY(mu_) = nullptr;
  Writer* in_flight_on_ ABSL_GUARDED_BY(mu_) = nullptr;
  Writer* paused_ ABSL_GUARDED_BY(mu_) = nullptr;  // waits for Resume()
  Item current_;  // owned by the in-flight write
  Sent sent_[2] ABSL_GUARDED_BY(mu_);  // by Wire
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_MAILBOX_H_
