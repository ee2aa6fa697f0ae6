// How an attached rank's data travels: the interface the stream drives,
// with one implementation per transport.
//
//   GrpcDataStream  shards and deltas on the gRPC stream itself
//   UcxDataStream   shards and deltas as UCX messages (ucx_data_stream.h);
//                   the gRPC stream stays open as the lifeline
//
// The gRPC stream (attach, greeting, in-band errors, the final status) is
// AttachedStream's (stream.h) whatever the transport.
#ifndef ZENFLOW_CLIENT_DATA_STREAM_H_
#define ZENFLOW_CLIENT_DATA_STREAM_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "client/send_window.h"
#include "grpcpp/grpcpp.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// gRPC's status as absl's; the codes are the same numbers.
inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// What a data stream reports to the stream that owns it. Called on the
// transport's threads.
class DataStreamSink {
 public:
  virtual ~DataStreamSink() = default;
  // A down message that arrived on the data path.
  virtual void OnDown(v1::DownMessage msg, int64_t bytes) = 0;
  // A down message that could not be read (the stream goes on).
  virtual void OnUnreadable(absl::Status error) = 0;
  // The data path failed: the stream must end with `error`.
  virtual void OnFailure(absl::Status error) = 0;
};

// Driven by one stream: PrepareAttach and Connect from the attaching
// thread, Send and Flush from its writer thread, Abort from its reader;
// `done` callbacks may run on any thread.
class DataStream {
 public:
  // Runs once when the transport no longer needs a message (`sent`: it left).
  using DoneFn = std::function<void(bool sent)>;
  virtual ~DataStream() = default;

  // Adds to the attach message what the daemon needs to reach this path.
  virtual void PrepareAttach(v1::Attach* attach) = 0;
  // The daemon greeted the rank: connects to what it offered.
  virtual absl::Status Connect(const v1::Attached& greeting) = 0;
  // Sends one message; `done` may run before this returns. False when the
  // path is broken and nothing more can be sent.
  virtual bool Send(Outgoing out, DoneFn done) = 0;
  // Before the lifeline's half-close: everything sent has reached the
  // daemon (or the path broke).
  virtual void Flush() = 0;
  // The lifeline ended: drops the connection; sends in flight fail.
  virtual void Abort() = 0;
};

// The Stream call as this library drives it: up messages leave as raw
// bytes (a shard's payload as its own slice, see common/up_wire.h), down
// messages arrive parsed.
using StreamCall = grpc::ClientReaderWriter<grpc::ByteBuffer, v1::DownMessage>;

// Serializes `msg` for the Stream call (no payload slice).
grpc::ByteBuffer UpBytes(const v1::UpMessage& msg);

// Up messages written on the gRPC stream itself (the writer thread's
// Write; gRPC keeps one write outstanding). A shard's payload is not
// copied: it goes to gRPC as a slice of the caller's memory (borrowed) or
// of the message's own string, released when gRPC has sent it.
class GrpcDataStream final : public DataStream {
 public:
  explicit GrpcDataStream(StreamCall* stream) : stream_(stream) {}
  void PrepareAttach(v1::Attach*) override {}
  absl::Status Connect(const v1::Attached&) override { return absl::OkStatus(); }
  bool Send(Outgoing out, DoneFn done) override;
  void Flush() override {}  // a Write returns once gRPC took the message
  void Abort() override {}  // the stream's own end ends this path

 private:
  StreamCall* const stream_;
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_DATA_STREAM_H_
