// The worker client library: a training process's connection to zenflowd.
// It owns the gRPC channel, the rank's data stream (gradient shards up,
// parameter deltas down), a bounded send window and the accounting of time
// spent blocked. It knows nothing about models.
//
//   ZF_ASSIGN_OR_RETURN(auto client, zenflow::Client::Connect({.target = "127.0.0.1:50051"}));
//   ZF_RETURN_IF_ERROR(client->JoinJob("job", /*rank=*/0).status());
//   ZF_RETURN_IF_ERROR(client->PushColumns(step, "w", version, cols, grad_colmajor, rows));
//   ZF_RETURN_IF_ERROR(client->CloseRound(round, lr));
//   ZF_ASSIGN_OR_RETURN(zenflow::RoundUpdate u, client->WaitRound(round, absl::Seconds(30)));
#ifndef ZENFLOW_CLIENT_CLIENT_H_
#define ZENFLOW_CLIENT_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/replay_log.h"
#include "client/round_assembler.h"
#include "client/send_window.h"
#include "common/codec.h"
#include "common/mutex.h"
#include "common/token.h"
#include "common/ucx.h"
#include "grpcpp/grpcpp.h"
#include "zenflow/v1/zenflow.grpc.pb.h"

namespace zenflow {

class AttachedStream;
class UcxLink;

// How the rank's data stream travels. Control calls always use gRPC.
enum class Transport {
  kGrpc,  // shards and deltas on the gRPC stream
  kUcx,   // shards and deltas as UCX messages; the gRPC stream is the lifeline
};
// "grpc" or "ucx"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Transport> ParseTransport(const std::string& name);

// A job's token for ClientOptions.token: the token in `token_file`
// (common/token.h ReadTokenFile) when one is named, else the environment's
// ZENFLOW_TOKEN, else empty. Errors name the file. (A new one for a job
// whose ranks are started together: common/token.h NewToken.)
absl::StatusOr<std::string> LoadToken(const std::string& token_file);

struct ClientOptions {
  // zenflowd's host:port, or several, comma-separated: the job is spread
  // over those daemons, each hosting some of its tensors (README "Several
  // daemons"). List them in the same order on every rank and every time.
  std::string target = "127.0.0.1:50051";
  // The job's token, sent with every call and stream as gRPC metadata
  // "authorization: Bearer <token>" (README "Security"). Empty: CreateJob
  // asks the daemon for a new one, and the client then uses that one
  // (token()); other ranks are given it. An admin token works too (the
  // client keeps sending it; a job it creates gets a new token).
  std::string token;
  // TLS (README "Security"). tls_ca: PEM file of the CA that signed
  // zenflowd's certificate (its --tls_cert); non-empty: the channel uses TLS
  // and checks the daemon's certificate against it. Empty: plaintext, which
  // a daemon only serves on loopback unless started with --allow_insecure.
  std::string tls_ca;
  // PEM files of this client's certificate (chain) and its unencrypted
  // private key, for a daemon started with --tls_ca; both or neither, and
  // only with tls_ca.
  std::string tls_cert;
  std::string tls_key;
  // The name the daemon's certificate must carry when it is not the host
  // in `target` (e.g. a target by IP address or through a tunnel); empty:
  // the target's host.
  std::string tls_server_name;
  // How long Connect waits for the daemon; gRPC retries within it with its
  // own reconnect backoff (100 ms doubling up to 2 s).
  absl::Duration connect_timeout = absl::Seconds(20);
  absl::Duration rpc_timeout = absl::Seconds(60);     // unary deadline
  absl::Duration selection_timeout = absl::Minutes(10);  // SubmitImportance waits for all ranks
  int64_t max_message_bytes = int64_t{1} << 30;  // hand-off and all-reduce are single messages
  int64_t max_shard_bytes = 4 << 20;     // PushColumns splits payloads at this size
  int64_t max_inflight_bytes = 64 << 20;  // pushes block beyond this many unsent bytes
  Transport transport = Transport::kGrpc;
  UcxOptions ucx;  // with Transport::kUcx
  // Riding through a daemon restart (README): when the daemon goes away,
  // reconnect and re-attach for up to this long, then resend what the
  // daemon may have lost (the replay log). Zero: fail at once.
  absl::Duration daemon_wait = absl::ZeroDuration();
  // The replay log's limit. Past it the oldest entries go, and a daemon
  // that restarts from a checkpoint older than what is left cannot be
  // ridden through (a clear error).
  int64_t max_replay_bytes = int64_t{1} << 30;
  // With several daemons (README "Several daemons"): a hosted 2-D tensor of
  // more parameters than this is split by columns into ceil(params / this)
  // blocks (at most one per daemon) when the job is created. 0: twice a
  // daemon's even share of the job's hosted parameters.
  int64_t split_tensor_params = 0;
};

struct ClientStats {
  int64_t messages_sent = 0;
  int64_t bytes_sent = 0;          // serialized up messages
  int64_t bytes_received = 0;      // serialized down messages
  int64_t rounds_received = 0;
  double send_blocked_seconds = 0;  // PushShard waiting for window space
  double wait_seconds = 0;          // WaitRound waiting for deltas (the stall)
  int64_t stream_errors = 0;        // rejected up messages
  int64_t ucx_frames_dropped = 0;   // UCX messages of an older connection
  // For checks against the daemon's figures (zenflow_job_received_bytes_total
  // and zenflow_job_sent_bytes_total count the same things): gradient
  // payload bytes of the shards sent, and the deltas received with their
  // serialized sizes (whatever the transport's framing).
  int64_t shard_bytes_sent = 0;
  int64_t deltas_received = 0;
  int64_t delta_bytes_received = 0;
  // Riding through daemon restarts: successful reconnects, rounds the
  // restarted daemon sent again (dropped), the replay log's size.
  int64_t reconnects = 0;
  int64_t rounds_dropped_duplicate = 0;
  int64_t replay_log_bytes = 0;
  int64_t replay_log_entries = 0;
};

// Thread-safe: any method may be called from any thread. Deltas arrive on an
// internal thread; with a round callback set, it runs there (and must not
// attach or close streams). With daemon_wait set, a rank's pushes, closes
// and control calls should come from one thread: the replay log resends
// them in the order they were made.
//
// Inside: the control calls are plain unary RPCs on one stub; the data
// stream is an AttachedStream (stream.h) over a gRPC or UCX DataStream
// (data_stream.h); up messages wait in a SendWindow and rounds come
// together in a RoundAssembler. Each part has its own lock.
class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();  // closes the stream (without waiting for deltas)
  Transport transport() const { return options_.transport; }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // ---- Control ----
  absl::StatusOr<v1::JobSpec> CreateJob(const v1::JobSpec& spec);
  // Uploads row-major fp32 values of every tensor, chunked at max_shard_bytes.
  struct TensorValues {
    std::string name;
    std::vector<int64_t> shape;
    const void* data = nullptr;  // row-major, product(shape) values of `dtype`
    // The values' encoding on the wire (bf16 / fp16 parameters go as they
    // are: the daemon's fp32 master starts as their exact value).
    DType dtype = DType::kF32;
  };
  absl::StatusOr<v1::UploadParametersResponse> UploadParameters(
      const std::string& job_id, const std::vector<TensorValues>& tensors);
  // Joins the job as `rank` and attaches this client's data stream to it.
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const std::string& job_id, int32_t rank);
  // Attaches the data stream to an already joined rank (after a reconnect).
  absl::Status Attach(const std::string& job_id, int32_t rank);
  absl::StatusOr<v1::GetJobResponse> GetJob(const std::string& job_id);
  // Waits until the job exists and its parameters are uploaded (by another
  // rank); polls GetJob with a backoff. DEADLINE_EXCEEDED after `timeout`.
  absl::StatusOr<v1::GetJobResponse> WaitForUpload(const std::string& job_id,
                                                   absl::Duration timeout);
  absl::Status DeleteJob(const std::string& job_id);
  // The daemon-side state (values, m, v, counts) of every column of
  // `tensor` that zenflowd updates now, in column order, read in
  // GetState calls of at most 32 MiB each; `selection_version` gets the
  // column sets it is for.
  absl::StatusOr<v1::ColumnState> GetState(const std::string& job_id, const std::string& tensor,
                                           int64_t* selection_version = nullptr);
  // Writes `state` (daemon-side columns of one tensor) into a job before
  // its first selection and round, in SetState calls of at most 32 MiB.
  absl::Status SetState(const std::string& job_id, const v1::ColumnState& state);
  absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& job_id = "");
  // Blocks until every rank submitted importance for `step`.
  absl::StatusOr<v1::Selection> SubmitImportance(int64_t step,
                                                 const std::vector<v1::TensorImportance>& tensors);
  // Hands off `leaving` for the named tensors (empty: all of the job's);
  // large jobs call it several times with disjoint tensor sets.
  absl::StatusOr<v1::HandOffResponse> HandOff(int64_t version,
                                              const std::vector<v1::ColumnState>& leaving,
                                              const std::vector<std::string>& tensors = {});

  // Mean over ranks of each named fp32 vector (blocks until every rank sent
  // the same step). `parts` are (name, values) pairs; results in the same order.
  absl::StatusOr<std::vector<std::vector<float>>> AllReduce(
      int64_t step, const std::vector<std::pair<std::string, const std::vector<float>*>>& parts);

  // ---- Data (after JoinJob or Attach) ----
  // Queues an up message; blocks only while the send window is full. Fails
  // if the stream is broken (see stream_status()).
  absl::Status PushShard(v1::GradientShard shard);
  // Queues an up message as it is (a shard or a close; tests and tools that
  // need fields the calls above do not set, such as `replay`).
  absl::Status PushUp(v1::UpMessage msg);
  // Encodes columns (column-major fp32, rows values per column) in `dtype`
  // and pushes them as shards of at most max_shard_bytes.
  absl::Status PushColumns(int64_t step, const std::string& tensor, int64_t version,
                           const std::vector<int32_t>& columns, const float* col_major,
                           int64_t rows, DType dtype);
  // Pushes already encoded columns (column-major, `dtype`), split into
  // shards of at most max_shard_bytes.
  absl::Status PushEncoded(int64_t step, const std::string& tensor, int64_t version,
                           const int32_t* columns, int64_t ncols, const char* payload,
                           int64_t rows, DType dtype);
  // The same for int8 columns (rows bytes each) with one scale per column.
  absl::Status PushInt8(int64_t step, const std::string& tensor, int64_t version,
                        const int32_t* columns, int64_t ncols, const int8_t* payload,
                        const float* scales, int64_t rows);
  // The same two without copying the payload (UCX and gRPC alike): the
  // client sends straight from `payload` and runs `release` once (on any
  // thread, possibly before returning) when it no longer reads it — after
  // the last shard's send completed (gRPC: gRPC let go of the bytes), or
  // failed, or the stream broke. With ride-through (daemon_wait) the replay
  // log keeps its own copy.
  absl::Status PushEncodedBorrowed(int64_t step, const std::string& tensor, int64_t version,
                                   const int32_t* columns, int64_t ncols, const char* payload,
                                   int64_t rows, DType dtype, std::function<void()> release);
  absl::Status PushInt8Borrowed(int64_t step, const std::string& tensor, int64_t version,
                                const int32_t* columns, int64_t ncols, const int8_t* payload,
                                const float* scales, int64_t rows, std::function<void()> release);
  absl::Status CloseRound(int64_t round, float lr, int32_t steps = 0);
  // The same, carrying the worker's figures for its steps since the last
  // close (README "Metrics"): at most `steps` (the round's steps) of them.
  struct WorkerReport {
    std::vector<v1::StepReport> steps;
    int32_t apply_delay_steps = 0;
    int32_t staleness_steps = 0;
  };
  absl::Status CloseRound(int64_t round, float lr, int32_t steps, const WorkerReport& report);
  // Blocks until everything queued was handed to the transport.
  absl::Status Flush(absl::Duration timeout);

  // Deltas: either a callback (runs on the receive thread; rounds then do
  // not queue) or WaitRound/PollRound.
  void SetRoundCallback(std::function<void(RoundUpdate)> cb);
  absl::StatusOr<RoundUpdate> WaitRound(int64_t round, absl::Duration timeout);
  std::optional<RoundUpdate> PollRound();
  // Gives a delta's payload buffer back once it has been applied; with the
  // UCX transport later receives reuse it (no allocation or zero-fill).
  void Recycle(std::string buffer);
  // Errors the daemon reported for rejected up messages, oldest first
  // (each carries the daemon's status code and message); clears them.
  std::vector<absl::Status> TakeErrors();
  // Waits until at least `n` errors are pending (for tests and tools).
  bool WaitForErrors(size_t n, absl::Duration timeout);

  // OK while the stream is healthy (or none was attached); once it ended,
  // its final status (waiting at most a few seconds for the call to finish).
  absl::Status stream_status();
  ClientStats stats();
  // The channel, for calls of a caller's own (health checks, tests).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  int32_t rank();
  std::string job_id();
  // The token this client sends (options.token, or the one CreateJob got).
  std::string token();
  // The daemons this client talks to (1, or more for a partitioned job).
  int daemons() const;

 private:
  class Parts;  // client/parts.h
  // CreateJob; `new_token` gets the token the daemon made for the job
  // (empty when the call carried the caller's own).
  absl::StatusOr<v1::JobSpec> CreateJobTokened(const v1::JobSpec& spec, std::string* new_token);
  void SetToken(const std::string& token);
  explicit Client(const ClientOptions& options);
  std::shared_ptr<AttachedStream> current_stream();
  // Closes the attached stream, if any (sends what is queued first).
  void CloseStream();
  // Pushes `ncols` encoded columns (col_bytes each) as shards of at most
  // max_shard_bytes: copied into the messages, or, with `hold`, borrowed
  // (UCX; `hold` is released when the last shard lets go).
  absl::Status PushSplit(int64_t step, const std::string& tensor, int64_t version,
                         const int32_t* columns, int64_t ncols, const char* payload,
                         int64_t col_bytes, v1::DType dtype, const float* scales,
                         std::shared_ptr<void> hold);
  // PushSplit borrowing `payload` until `release`.
  absl::Status PushMaybeBorrowed(int64_t step, const std::string& tensor, int64_t version,
                                 const int32_t* columns, int64_t ncols, const char* payload,
                                 int64_t col_bytes, v1::DType dtype, const float* scales,
                                 std::function<void()> release);
  // With several daemons: `push(daemon's client, its columns, first, n)` for
  // each daemon's run of the columns (first and n index `columns`).
  absl::Status PushToParts(
      const std::string& tensor, const int32_t* columns, int64_t ncols,
      const std::function<absl::Status(Client*, const int32_t*, int64_t, int64_t)>& push);
  std::unique_ptr<grpc::ClientContext> UnaryContext(absl::Duration timeout);
  // ---- Riding through a daemon restart ----
  bool ride_through() const { return options_.daemon_wait > absl::ZeroDuration(); }
  // A failure the daemon's going away explains.
  static bool Recoverable(const absl::Status& s);
  // Reconnects, re-attaches and replays the log, unless another thread did
  // since generation `seen`. Past daemon_wait: UNAVAILABLE saying so.
  absl::Status Recover(uint64_t seen);
  absl::Status ReattachAndReplay(const std::string& job_id, int32_t rank);
  // After a re-attach: waits until `round` is updated (every rank's close
  // of it reached the daemon), as the greeting or a RoundDone says.
  // UNAVAILABLE when the stream ends first.
  absl::Status WaitRoundUpdated(int64_t round);
  // Runs `call` (a unary call's status), recovering and retrying when the
  // daemon went away.
  absl::Status RideThrough(const std::function<absl::Status()>& call);
  int64_t RoundOfStep(int64_t step) const;
  // A rendezvous call (SubmitImportance, HandOff, AllReduce) that
  // AbandonCalls can end early (ABORTED, not ridden through).
  absl::Status Rendezvous(absl::Duration timeout,
                          const std::function<grpc::Status(grpc::ClientContext*)>& call);
  // Cancels the rendezvous calls in flight (a partitioned job's other daemon
  // failed the same operation: these would wait for ranks that cannot come).
  void AbandonCalls();
  absl::Status RawSubmitImportance(const v1::SubmitImportanceRequest& req,
                                   v1::SubmitImportanceResponse* resp);
  absl::Status RawHandOff(const v1::HandOffRequest& req, v1::HandOffResponse* resp);
  absl::Status RawAllReduce(const v1::AllReduceRequest& req, v1::AllReduceResponse* resp);
  absl::Status Enqueue(v1::UpMessage msg, absl::string_view borrowed = {},
                       std::shared_ptr<void> hold = nullptr);

  const ClientOptions options_;
  // Set when the target lists several daemons: every call goes through it
  // to one Client per daemon, and the members below are unused.
  std::unique_ptr<Parts> parts_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ZenFlow::Stub> stub_;
  SendWindow window_;
  RoundAssembler rounds_;
  ReplayLog log_;
  std::atomic<int64_t> interval_{0};  // the job's update_interval, for the log's rounds
  // auto_update_interval: rounds of changing length, so the log's round of
  // a step is the rank's open round, the one after its last close.
  std::atomic<bool> auto_interval_{false};
  std::atomic<int64_t> open_round_{0};
  std::atomic<int64_t> selection_round_{0};  // of the last selection, for hand-offs
  // One recovery at a time; generation_ counts those that succeeded.
  Mutex recover_mu_;
  std::atomic<uint64_t> generation_{0};

  // Rendezvous calls in flight, each with its abandoned flag.
  Mutex calls_mu_;
  std::map<grpc::ClientContext*, bool*> calls_ ABSL_GUARDED_BY(calls_mu_);

  // Serializes attaching and closing streams.
  Mutex attach_mu_;
  std::unique_ptr<UcxLink> ucx_ ABSL_GUARDED_BY(attach_mu_);  // by the first UCX attach
  // ucx_, for Recycle and stats: published once it exists (it then lives as
  // long as the client), read without a lock.
  std::atomic<UcxLink*> ucx_ready_{nullptr};

  Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  std::string token_ ABSL_GUARDED_BY(mu_);
  int32_t rank_ ABSL_GUARDED_BY(mu_) = -1;
  std::shared_ptr<AttachedStream> stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_CLIENT_H_
