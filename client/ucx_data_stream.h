// The UCX data path of a rank (transport kUcx): up messages as tagged UCX
// messages to the daemon's worker, down messages from it, and the client's
// one UCX worker that all of its streams share (UcxLink).
#ifndef ZENFLOW_CLIENT_UCX_DATA_STREAM_H_
#define ZENFLOW_CLIENT_UCX_DATA_STREAM_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "client/data_stream.h"
#include "common/mutex.h"
#include "common/ucx.h"

namespace zenflow {

// The client's UCX worker, created by its first UCX attach and kept for the
// client's life, and the routing of arriving messages to the stream whose
// tag they carry. Thread-safe.
class UcxLink {
 public:
  // Receives the messages of one tag, on the worker's progress thread.
  using FrameFn = std::function<void(std::string frame)>;

  static absl::StatusOr<std::unique_ptr<UcxLink>> Create(const UcxOptions& options);
  ~UcxLink();  // stops the worker first: its callbacks use the routes

  UcxWorker* worker() { return worker_.get(); }
  // Routes messages with `tag` to `fn` until Unregister(tag) returns (which
  // waits for a delivery in progress). Messages of unknown tags (an older
  // stream's) are dropped and counted.
  void Register(uint64_t tag, FrameFn fn);
  void Unregister(uint64_t tag);
  // A random tag, never 0: the daemon tells its ranks' messages apart by
  // tag, across every client process.
  static uint64_t NewTag();
  int64_t frames_dropped();

 private:
  UcxLink() = default;
  void Route(uint64_t tag, std::string frame);

  std::unique_ptr<UcxWorker> worker_;
  // Held while a message is delivered, so that Unregister waits for it.
  Mutex mu_;
  std::map<uint64_t, FrameFn> routes_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// One stream's UCX data path. Thread-safe as DataStream requires.
class UcxDataStream final : public DataStream {
 public:
  UcxDataStream(UcxLink* link, DataStreamSink* sink);
  // Stops routing this stream's tag and waits (bounded) for its sends to
  // end, so their callbacks never outlive it.
  ~UcxDataStream() override;

  void PrepareAttach(v1::Attach* attach) override;
  absl::Status Connect(const v1::Attached& greeting) override;
  bool Send(Outgoing out, DoneFn done) override;
  void Flush() override;
  void Abort() override;

 private:
  void OnFrame(std::string frame);

  UcxLink* const link_;
  DataStreamSink* const sink_;
  uint64_t tag_ = 0;  // set by PrepareAttach, before any traffic
  Mutex mu_;
  uint64_t ep_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t send_tag_ ABSL_GUARDED_BY(mu_) = 0;  // the daemon's tag for our frames (Connect)
  int64_t sending_ ABSL_GUARDED_BY(mu_) = 0;  // sends not yet ended
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  // Sends UCX has not completed: what ends each (its done callback and the
  // borrowed payload's owner). A force-closed endpoint to a peer that died
  // does not always complete them; Abort then ends them itself.
  struct InFlight {
    std::function<void()> end;
  };
  std::map<uint64_t, InFlight> in_flight_ ABSL_GUARDED_BY(mu_);
  uint64_t next_send_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_UCX_DATA_STREAM_H_
