// Per-rank outbox; see mailbox.h.
#include "server/mailbox.h"

#include <utility>

namespace zenflow {

Mailbox::Writer* Mailbox::NextWriteLocked() {
  if (writer_ == nullptr || in_flight_on_ != nullptr || queue_.empty()) {
    return nullptr;
  }
  current_ = std::move(queue_.front());
  queue_.pop_front();
  in_flight_on_ = writer_;
  return writer_;
}

void Mailbox::Push(v1::DownMessage msg) {
  Writer* w = nullptr;
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(msg));
    w = NextWriteLocked();
  }
  // The writer cannot go away here: it is in flight, so its stream will not
  // finish before WriteDone.
  if (w != nullptr) w->Write(&current_);
}

bool Mailbox::Attach(Writer* w) {
  Writer* start = nullptr;
  {
    MutexLock lock(&mu_);
    if (writer_ != nullptr) return false;
    writer_ = w;
    start = NextWriteLocked();
  }
  if (start != nullptr) start->Write(&current_);
  return true;
}

bool Mailbox::Detach(Writer* w) {
  MutexLock lock(&mu_);
  if (writer_ == w) writer_ = nullptr;
  return in_flight_on_ == w;
}

bool Mailbox::WriteDone(Writer* w, bool ok) {
  Writer* next = nullptr;
  bool finished = false;
  {
    MutexLock lock(&mu_);
    if (in_flight_on_ == w) {
      in_flight_on_ = nullptr;
      if (!ok) queue_.push_front(std::move(current_));
    }
    if (writer_ == w && ok) {
      next = NextWriteLocked();
    } else if (writer_ == w) {
      writer_ = nullptr;  // a failed write: the stream is broken
      finished = true;
    } else {
      finished = true;
    }
  }
  if (next != nullptr) next->Write(&current_);
  return finished;
}

size_t Mailbox::queued() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

}  // namespace zenflow
