// zenflowd's UCX data plane. A rank that attaches with a UCX worker address
// gets a connection here: its shards and round closes arrive as UCX frames
// (common/ucx_frame.h) with the connection's tag, and its mailbox (deltas,
// RoundDone, errors) drains into UCX sends. The gRPC stream that carried the
// attach stays the rank's lifeline: when it ends, Close() handles what has
// already arrived, then detaches the mailbox and closes the endpoint.
//
// Frames are handled on one dispatch thread, in arrival order, so a rank's
// messages reach Job::HandleUp in the order it sent them.
#ifndef ZENFLOW_SERVER_UCX_PLANE_H_
#define ZENFLOW_SERVER_UCX_PLANE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/ucx.h"
#include "server/job.h"
#include "server/mailbox.h"
#include "server/registry.h"

namespace zenflow {

class UcxDataPlane {
 public:
  class Conn;

  static absl::StatusOr<std::unique_ptr<UcxDataPlane>> Start(const UcxOptions& options,
                                                             JobRegistry* registry);
  ~UcxDataPlane();

  const std::string& address() const { return worker_->address(); }

  // Connects to the rank's worker and makes the connection the writer of
  // `box`; `tag` (the rank's choice) marks its messages both ways.
  // ALREADY_EXISTS if the rank has a writer attached or the tag is in use.
  absl::StatusOr<std::shared_ptr<Conn>> Open(std::shared_ptr<Job> job, int32_t rank,
                                             std::shared_ptr<Mailbox> box,
                                             const std::string& peer_address, uint64_t tag);
  // The rank's control stream ended. Asynchronous; safe to call twice.
  void Close(std::shared_ptr<Conn> conn);

  void FillStats(v1::UcxStats* out);

 private:
  UcxDataPlane(JobRegistry* registry, std::string tls) : registry_(registry), tls_(std::move(tls)) {}
  void OnFrame(uint64_t tag, std::string frame);
  void DispatchLoop();
  void Handle(uint64_t tag, std::string frame);

  struct Item {
    enum Kind { kFrame, kCloseRequest, kCloseFinal } kind = kFrame;
    uint64_t tag = 0;
    std::string frame;
    std::shared_ptr<Conn> conn;
  };

  struct Stats {
    int64_t frames = 0;
    int64_t dropped = 0;  // frames with an unknown tag
  };

  JobRegistry* const registry_;
  const std::string tls_;
  std::unique_ptr<UcxWorker> worker_;
  std::thread dispatcher_;

  Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

// One rank's UCX connection; the writer of its mailbox while attached.
class UcxDataPlane::Conn : public Mailbox::Writer, public std::enable_shared_from_this<Conn> {
 public:
  Conn(UcxWorker* worker, uint64_t ep, uint64_t tag, std::shared_ptr<Job> job, int32_t rank,
       std::shared_ptr<Mailbox> box)
      : worker_(worker), ep_(ep), tag_(tag), job_(std::move(job)), rank_(rank),
        box_(std::move(box)) {}

  void Write(const v1::DownMessage* msg) override;

  uint64_t tag() const { return tag_; }
  uint64_t ep() const { return ep_; }
  int32_t rank() const { return rank_; }
  const std::shared_ptr<Job>& job() const { return job_; }
  const std::shared_ptr<Mailbox>& box() const { return box_; }

 private:
  UcxWorker* const worker_;
  const uint64_t ep_;
  const uint64_t tag_;
  const std::shared_ptr<Job> job_;
  const int32_t rank_;
  const std::shared_ptr<Mailbox> box_;
  // The header of the one write in flight (the mailbox allows one).
  std::string header_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_UCX_PLANE_H_
