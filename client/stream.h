// One attached rank's stream: the gRPC Stream call that attaches the rank
// and stays open as its lifeline, the writer thread that drains the send
// window into the data path, and the reader that delivers down messages to
// the round assembler and records how the stream ended.
//
//   ZF_ASSIGN_OR_RETURN(auto s, AttachedStream::Open(deps, "job", /*rank=*/0));
//   ... window.Push(...), rounds.Wait(...) ...
//   s->Close();   // sends what is queued, half-closes, waits for the daemon
#ifndef ZENFLOW_CLIENT_STREAM_H_
#define ZENFLOW_CLIENT_STREAM_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/data_stream.h"
#include "client/round_assembler.h"
#include "client/send_window.h"
#include "client/ucx_data_stream.h"
#include "common/mutex.h"
#include "grpcpp/grpcpp.h"
#include "zenflow/v1/zenflow.grpc.pb.h"

namespace zenflow {

// Thread-safe. Open and Close are called by one thread at a time (the
// client serializes attaches); status() from any.
class AttachedStream final : private DataStreamSink {
 public:
  struct Deps {
    grpc::ChannelInterface* channel = nullptr;  // the daemon's
    SendWindow* window = nullptr;     // opened once attached; closed with the stream's status
    RoundAssembler* rounds = nullptr; // opened before the attach; closed at the end
    UcxLink* ucx = nullptr;           // set: the data travels over UCX
    std::string token;                // the job's token (authorization metadata); may be empty
    // Set on a re-attach after a lost daemon: the rounds whose RoundDone the
    // rank holds (Attach.rounds_done), so that a round lost in a restart is
    // sent again.
    std::optional<int64_t> rounds_done;
  };
  // Attaches `rank` of `job_id`: sends the attach, waits for the daemon's
  // greeting (or the stream's end), connects the data path and starts
  // sending. The error of a failed attach is the daemon's or the transport's.
  static absl::StatusOr<std::unique_ptr<AttachedStream>> Open(const Deps& deps,
                                                              const std::string& job_id,
                                                              int32_t rank);
  ~AttachedStream() override;  // Close()
  AttachedStream(const AttachedStream&) = delete;
  AttachedStream& operator=(const AttachedStream&) = delete;

  // Sends what is queued, half-closes and waits up to 2 s for the daemon to
  // end the call, then cancels it. Idempotent.
  void Close();
  // The lifeline is still open.
  bool open();
  // The daemon's greeting.
  v1::Attached greeting();
  // OK while open; afterwards the final status (OK after a clean Close),
  // waiting up to 10 s for the reader to learn it.
  absl::Status status();

 private:
  explicit AttachedStream(const Deps& deps);
  void ReaderLoop();
  void WriterLoop();
  // DataStreamSink: the data path's down messages and failures.
  void OnDown(v1::DownMessage msg, int64_t bytes) override;
  void OnUnreadable(absl::Status error) override;
  void OnFailure(absl::Status error) override;
  // Ends the stream from this side, reporting `why` as its status.
  void Cancel(absl::Status why);

  const Deps deps_;
  grpc::ClientContext ctx_;
  std::unique_ptr<StreamCall> call_;
  std::unique_ptr<DataStream> data_;
  std::thread reader_, writer_;

  Mutex mu_;
  bool greeted_ ABSL_GUARDED_BY(mu_) = false;
  v1::Attached greeting_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = true;    // the reader has not seen the end
  bool writing_ ABSL_GUARDED_BY(mu_) = false;   // the writer thread runs
  bool window_open_ ABSL_GUARDED_BY(mu_) = false;  // this stream opened the window
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish() returned
  bool closed_ ABSL_GUARDED_BY(mu_) = false;    // Close() ran to its end
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Why this side cancelled (the data path failed, or the daemon's fatal
  // error); reported as the stream's status.
  absl::Status cancel_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_STREAM_H_
