// Per-rank outbox of down-stream messages, and the single-writer protocol that
// drains it into whichever gRPC stream the rank currently has attached.
//
//   auto box = std::make_shared<Mailbox>();
//   box->Push(msg);                 // from any thread; queued while no stream
//   if (box->Attach(&writer)) ...   // the stream's reactor starts draining it
#ifndef ZENFLOW_SERVER_MAILBOX_H_
#define ZENFLOW_SERVER_MAILBOX_H_

#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// Thread-safe. Messages stay queued while no writer is attached, so deltas
// computed while a rank reconnects are delivered on its next stream. At most
// one write is in flight at a time; a message whose write failed goes back to
// the front of the queue.
class Mailbox {
 public:
  // Implemented by a stream. Write() starts an asynchronous write of *msg
  // (which stays valid until the writer calls WriteDone) and must not call
  // back into the Mailbox synchronously.
  class Writer {
   public:
    virtual ~Writer() = default;
    virtual void Write(v1::DownMessage* msg) = 0;
  };

  Mailbox() = default;
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Queues a message and starts writing it if a writer is idle.
  void Push(v1::DownMessage msg) ABSL_LOCKS_EXCLUDED(mu_);

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

  size_t queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Pops the next message into current_ if a write may start; returns the
  // writer to call, or null.
  Writer* NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  std::deque<v1::DownMessage> queue_ ABSL_GUARDED_BY(mu_);
  Writer* writer_ ABSL_GUARDED_BY(mu_) = nullptr;
  Writer* in_flight_on_ ABSL_GUARDED_BY(mu_) = nullptr;
  v1::DownMessage current_;  // owned by the in-flight write
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_MAILBOX_H_
