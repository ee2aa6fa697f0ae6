// The client's send window; see send_window.h.
#include "client/send_window.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace zenflow {

SendWindow::SendWindow(int64_t max_bytes) : max_bytes_(max_bytes) {}

namespace {
// What a message counts against the window: a shard its payload (the bulk
// the window bounds; its header is a few bytes per column), anything else
// its size. Counting a shard's header too let only one shard of half the
// window be in flight (2 x (32 MiB + header) > 64 MiB), which halved the
// pipelining of 32 MiB shards.
int64_t Charge(int64_t size, int64_t payload_bytes) {
  return payload_bytes > 0 ? payload_bytes : size;
}
}  // namespace

void SendWindow::Open() {
  MutexLock lock(&mu_);
  state_ = State::kOpen;
  ended_ = false;
  end_status_ = absl::OkStatus();
  queue_.clear();
  bytes_ = 0;
  sending_ = 0;
  WakeProducersLocked();
}

absl::Status SendWindow::EndStatusLocked() {
  if (state_ == State::kDraining) {
    return absl::FailedPreconditionError("the stream is closing: nothing more can be sent on it");
  }
  // A broken stream's status follows shortly (the reader finishes the
  // call); the wait is bounded in case it never does.
  mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return ended_; },
                       absl::Seconds(10));
  if (!ended_) return absl::UnavailableError("the stream ended; its final status is not known yet");
  if (end_status_.ok()) {
    return absl::FailedPreconditionError("no stream attached: JoinJob or Attach first");
  }
  return end_status_;
}

void SendWindow::WakeProducersLocked() {
  wait_size_ = 0;
  {
    std::lock_guard<std::mutex> l(space_mu_);
    ++space_epoch_;
  }
  space_cv_.notify_all();
}

absl::Status SendWindow::Push(Outgoing out) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  MutexLock lock(&mu_);
  if (state_ != State::kOpen) return EndStatusLocked();
  const auto t0 = std::chrono::steady_clock::now();
  // A full window: wait off mu_ (whose every unlock wakes its Await-ers)
  // until Complete has freed an eighth of the window beyond this message
  // (a message of an eighth or more: until it fits), so a producer that
  // keeps the window full wakes once per eighth instead of once per message
  // (at 64 KiB, a wake and two context switches per message on the sending
  // side).
  bool waited = false;
  const int64_t charge = Charge(out.size, out.payload_bytes);
  while (state_ == State::kOpen && bytes_ != 0 && bytes_ + charge > max_bytes_) {
    waited = true;
    wait_size_ = std::max(wait_size_, charge);
    uint64_t epoch;
    {
      std::lock_guard<std::mutex> l(space_mu_);
      epoch = space_epoch_;
    }
    mu_.Unlock();
    {
      std::unique_lock<std::mutex> l(space_mu_);
      space_cv_.wait(l, [&] { return space_epoch_ != epoch; });
    }
    mu_.Lock();
  }
  if (waited) {
    stats_.blocked_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (state_ != State::kOpen) return EndStatusLocked();
  out.msg.set_seq(next_seq_++);
  bytes_ += charge;
  queue_.push_back(std::move(out));
  return absl::OkStatus();
}

std::optional<Outgoing> SendWindow::Next() {
  MutexLock lock(&mu_);
  mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !queue_.empty() || state_ != State::kOpen;
  });
  if (queue_.empty() || state_ == State::kBroken || state_ == State::kClosed) return std::nullopt;
  Outgoing out = std::move(queue_.front());
  queue_.pop_front();
  ++sending_;
  return out;
}

void SendWindow::Complete(int64_t size, bool sent, int64_t payload_bytes) {
  MutexLock lock(&mu_);
  --sending_;
  bytes_ -= Charge(size, payload_bytes);
  // The waiting producer goes on once its message fits with an eighth of
  // the window to spare; a message of an eighth or more is that eighth
  // itself, so it goes on as soon as it fits (requiring more left half-
  // window shards waiting for both in flight to complete, and a waiter
  // whose last in-flight message never completed stuck).
  const int64_t spare = wait_size_ >= max_bytes_ / 8 ? 0 : max_bytes_ / 8;
  if (wait_size_ > 0 && (bytes_ == 0 || bytes_ + wait_size_ <= max_bytes_ - spare)) {
    WakeProducersLocked();
  }
  if (sent) {
    ++stats_.messages_sent;
    stats_.bytes_sent += size;
    stats_.payload_bytes_sent += payload_bytes;
  }
}

void SendWindow::Break() {
  std::deque<Outgoing> dropped;  // released outside the lock
  MutexLock lock(&mu_);
  if (state_ == State::kClosed) return;
  state_ = State::kBroken;
  for (const Outgoing& o : queue_) bytes_ -= Charge(o.size, o.payload_bytes);
  dropped.swap(queue_);
  WakeProducersLocked();
}

void SendWindow::Drain() {
  MutexLock lock(&mu_);
  if (state_ == State::kOpen) state_ = State::kDraining;
  WakeProducersLocked();
}

void SendWindow::Close(absl::Status status) {
  std::deque<Outgoing> dropped;
  MutexLock lock(&mu_);
  state_ = State::kClosed;
  ended_ = true;
  end_status_ = std::move(status);
  for (const Outgoing& o : queue_) bytes_ -= Charge(o.size, o.payload_bytes);
  dropped.swap(queue_);
  WakeProducersLocked();
}

absl::Status SendWindow::WaitIdle(absl::Duration timeout) {
  MutexLock lock(&mu_);
  const bool idle = mu_.AwaitWithTimeout(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return state_ == State::kBroken || state_ == State::kClosed ||
               (queue_.empty() && sending_ == 0);
      },
      timeout);
  // Nothing attached, or a clean end: nothing is left to send.
  if (state_ == State::kClosed && end_status_.ok()) return absl::OkStatus();
  if (state_ == State::kBroken || state_ == State::kClosed) return EndStatusLocked();
  if (!idle) return absl::DeadlineExceededError("flush timed out");
  return absl::OkStatus();
}

bool SendWindow::WaitSendsEnded(absl::Duration timeout) {
  MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return sending_ == 0; },
                              timeout);
}

SendWindow::Stats SendWindow::stats() {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace zenflow
