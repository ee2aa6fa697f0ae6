// The client's send window: up messages queued for the transport, bounded
// in bytes, numbered in order, and the account of time producers spent
// blocked on it. It knows nothing about the transport: one writer thread
// takes messages with Next() and reports each one's end with Complete().
//
//   SendWindow w(/*max_bytes=*/64 << 20);
//   w.Open();
//   ZF_RETURN_IF_ERROR(w.Push(std::move(out)));        // producer; blocks while full
//   while (std::optional<Outgoing> m = w.Next()) { send(*m); w.Complete(m->size, ok); }
#ifndef ZENFLOW_CLIENT_SEND_WINDOW_H_
#define ZENFLOW_CLIENT_SEND_WINDOW_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// An up message waiting to be sent. A shard may borrow its payload
// (`borrowed`, kept valid by `hold` until the message is dropped) instead of
// carrying it in `msg`; `size` is its bytes on the wire. A shard counts its
// `payload_bytes` against the window, any other message its `size`.
struct Outgoing {
  v1::UpMessage msg;
  absl::string_view borrowed;
  std::shared_ptr<void> hold;
  int64_t size = 0;
  int64_t payload_bytes = 0;  // a shard's gradient payload (counted once sent)
};

// Thread-safe. States: closed (the start) -> open (Open) -> broken (Break:
// the stream failed, nothing more is sent) or draining (Drain: what is
// queued is still sent) -> closed again (Close, with the stream's final
// status). Producers see the final status; the writer sees the end of the
// queue.
class SendWindow {
 public:
  explicit SendWindow(int64_t max_bytes);

  // A new stream: empties the queue and accepts pushes again.
  void Open();
  // Queues `out` and gives it the next sequence number; blocks while the
  // window is full (a message larger than the window goes alone). Fails
  // with the stream's status if it is not open (FAILED_PRECONDITION when no
  // stream was attached or it ended cleanly).
  absl::Status Push(Outgoing out);

  // The writer: the next message, or nullopt once the window is broken or
  // drained empty. A message returned stays counted until Complete().
  std::optional<Outgoing> Next();
  // The transport is done with a message of `size` bytes (`sent`: it left).
  void Complete(int64_t size, bool sent, int64_t payload_bytes = 0);

  // No more sends: queued messages are dropped (their borrowed payloads
  // released). Producers wait for Close() to learn the status.
  void Break();
  // No more pushes; the writer still takes what is queued.
  void Drain();
  // The stream ended with `status` (OK: a clean close).
  void Close(absl::Status status);

  // Waits until everything pushed has completed; DEADLINE_EXCEEDED on
  // timeout, the stream's status if it ended first.
  absl::Status WaitIdle(absl::Duration timeout);
  // Waits until no message taken by the writer is still with the transport.
  bool WaitSendsEnded(absl::Duration timeout);

  struct Stats {
    int64_t messages_sent = 0;
    int64_t bytes_sent = 0;
    int64_t payload_bytes_sent = 0;  // shards' gradient payloads
    double blocked_seconds = 0;      // Push waiting for space
  };
  Stats stats();

 private:
  enum class State { kClosed, kOpen, kDraining, kBroken };
  // The status a producer gets once the window is not open.
  absl::Status EndStatusLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the producers waiting for room (Push).
  void WakeProducersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_bytes_;
  Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kClosed;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = true;  // Close() ran since the last Open()
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;    // queued + with the transport (charged)
  int64_t sending_ ABSL_GUARDED_BY(mu_) = 0;  // taken by Next(), not completed
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Producers waiting for room: the largest message one waits to push (0:
  // none waits), and what they wait on (space_epoch_ moves when they may
  // go on; taken after mu_ where both are held).
  int64_t wait_size_ ABSL_GUARDED_BY(mu_) = 0;
  std::mutex space_mu_;
  std::condition_variable space_cv_;
  uint64_t space_epoch_ = 0;  // guarded by space_mu_
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_SEND_WINDOW_H_
