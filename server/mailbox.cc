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
  Push(std::make_shared<const v1::DownMessage>(std::move(msg)));
}

void Mailbox::Push(Message msg) {
  Item item;
  item.bytes = static_cast<int64_t>(msg->ByteSizeLong());
  item.msg = std::move(msg);
  Writer* w = nullptr;
  const v1::DownMessage* m = nullptr;
  {
    MutexLock lock(&mu_);
    bytes_ += item.bytes;
    queue_.push_back(std::move(item));
    w = NextWriteLocked();
    if (w != nullptr) m = current_.msg.get();
  }
  // The writer cannot go away here: it is in flight, so its stream will not
  // finish before WriteDone.
  if (w != nullptr) w->Write(m);
}

bool Mailbox::Attach(Writer* w) {
  Writer* start = nullptr;
  const v1::DownMessage* m = nullptr;
  {
    MutexLock lock(&mu_);
    if (writer_ != nullptr) return false;
    writer_ = w;
    start = NextWriteLocked();
    if (start != nullptr) m = current_.msg.get();
  }
  if (start != nullptr) start->Write(m);
  return true;
}

bool Mailbox::Detach(Writer* w) {
  MutexLock lock(&mu_);
  if (writer_ == w) writer_ = nullptr;
  if (paused_ == w) paused_ = nullptr;
  return in_flight_on_ == w;
}

bool Mailbox::WriteDone(Writer* w, bool ok) {
  Writer* next = nullptr;
  Writer* resume = nullptr;
  const v1::DownMessage* m = nullptr;
  bool finished = false;
  {
    MutexLock lock(&mu_);
    if (in_flight_on_ == w) {
      in_flight_on_ = nullptr;
      if (!ok) {
        queue_.push_front(std::move(current_));
      } else {
        bytes_ -= current_.bytes;
        if (current_.msg->kind_case() == v1::DownMessage::kDelta) {
          Sent& sent = sent_[static_cast<int>(w->wire())];
          ++sent.deltas;
          sent.bytes += current_.bytes;
        }
        current_ = Item();
      }
    }
    if (writer_ == w && ok) {
      next = NextWriteLocked();
      if (next != nullptr) m = current_.msg.get();
    } else if (writer_ == w) {
      writer_ = nullptr;  // a failed write: the stream is broken
      finished = true;
    } else {
      finished = true;
    }
    if (paused_ != nullptr && paused_ == writer_ && bytes_ < limit_ / 2) {
      resume = paused_;
      paused_ = nullptr;
    }
  }
  if (next != nullptr) next->Write(m);
  if (resume != nullptr) resume->Resume();
  return finished;
}

bool Mailbox::Full(Writer* w) {
  MutexLock lock(&mu_);
  if (limit_ <= 0 || bytes_ < limit_) return false;
  paused_ = w;
  return true;
}

size_t Mailbox::queued() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

bool Mailbox::paused() const {
  MutexLock lock(&mu_);
  return paused_ != nullptr;
}

int64_t Mailbox::bytes() const {
  MutexLock lock(&mu_);
  return bytes_;
}

bool Mailbox::attached(Wire* wire) const {
  MutexLock lock(&mu_);
  if (writer_ == nullptr) return false;
  *wire = writer_->wire();
  return true;
}

Mailbox::Sent Mailbox::sent(Wire wire) const {
  MutexLock lock(&mu_);
  return sent_[static_cast<int>(wire)];
}

}  // namespace zenflow
