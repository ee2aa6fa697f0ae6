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

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/round_update.h"
#include "common/codec.h"
#include "common/token.h"
#include "common/ucx.h"
#include "grpcpp/grpcpp.h"
#include "zenflow/v1/zenflow.grpc.pb.h"

namespace zenflow {

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

// How long the workers (zf_train --daemon_wait, zenflow.torch daemon_wait)
// wait for a daemon that went away by default: five minutes covers a
// systemd or Kubernetes restart of zenflowd with --state_dir (stop with its
// SIGTERM checkpoint, start, restore; docs/operating.md), and a daemon
// gone for good still ends the run within minutes, naming it.
inline constexpr absl::Duration kDefaultDaemonWait = absl::Minutes(5);

struct ClientOptions {
  // zenflowd's host:port, or several, comma-separated: the job is spread
  // over those daemons, each hosting some of its tensors
  // (docs/several-daemons.md). List them in the same order on every rank and every time.
  std::string target = "127.0.0.1:50051";
  // The job's token, sent with every call and stream as gRPC metadata
  // "authorization: Bearer <token>" (docs/security.md). Empty: CreateJob
  // asks the daemon for a new one, and the client then uses that one
  // (token()); other ranks are given it. An admin token works too (the
  // client keeps sending it; a job it creates gets a new token).
  std::string token;
  // TLS (docs/security.md). tls_ca: PEM file of the CA that signed
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
  // own reconnect backoff (100 ms doubling up to 2 s). Only a daemon that
  // may still come is waited for (nothing listens yet, no route): a target
  // that cannot be parsed, a name that does not resolve, a TLS mismatch and
  // a server that is not zenflowd fail at once (client/connect_diagnosis.h).
  absl::Duration connect_timeout = absl::Seconds(20);
  // Progress lines while Connect waits ("nothing listens at HOST:PORT yet
  // (connection refused); waiting up to 20s ..."), within about a second of
  // the first failure. Null: stderr, prefixed "zenflow client: ".
  std::function<void(const std::string&)> on_progress;
  absl::Duration rpc_timeout = absl::Seconds(60);     // unary deadline
  absl::Duration selection_timeout = absl::Minutes(10);  // SubmitImportance waits for all ranks
  int64_t max_message_bytes = int64_t{1} << 30;  // hand-off and all-reduce are single messages
  int64_t max_shard_bytes = 4 << 20;     // PushColumns splits payloads at this size
  int64_t max_inflight_bytes = 64 << 20;  // pushes block beyond this many unsent bytes
  Transport transport = Transport::kGrpc;
  UcxOptions ucx;  // with Transport::kUcx
  // Riding through a daemon restart (docs/checkpoints.md): when the daemon goes away,
  // reconnect and re-attach for up to this long, then resend what the
  // daemon may have lost (the replay log). Zero: fail at once. The
  // library's default stays zero, since ride-through asks that a rank's
  // calls come from one thread (below) and tools (zfctl) should fail fast;
  // the workers, zf_train and zenflow.torch, default to kDefaultDaemonWait.
  absl::Duration daemon_wait = absl::ZeroDuration();
  // The replay log's limit. Past it the oldest entries go, and a daemon
  // that restarts from a checkpoint older than what is left cannot be
  // ridden through (a clear error).
  int64_t max_replay_bytes = int64_t{1} << 30;
  // With several daemons (docs/several-daemons.md): a hosted 2-D tensor of
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
// An interface with two implementations, which Connect chooses by the
// target: the client of one daemon (one_daemon_client.h), and, for a target
// that lists several, the partitioned client (partitioned_client.h), which
// holds one single-daemon client per daemon and fans every call out to them.
//
// Inside the one-daemon client: the control calls are plain unary RPCs on
// one stub; the data stream is an AttachedStream (stream.h) over a gRPC or
// UCX DataStream (data_stream.h); up messages wait in a SendWindow and
// rounds come together in a RoundAssembler. Each part has its own lock.
class Client {
 public:
  // The client of the daemon in options.target, or, when it lists several
  // (comma-separated), of a job spread over them.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  virtual ~Client() = default;  // closes the stream (without waiting for deltas)
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  virtual Transport transport() const = 0;

  // ---- Control ----
  virtual absl::StatusOr<v1::JobSpec> CreateJob(const v1::JobSpec& spec) = 0;
  // Uploads row-major fp32 values of every tensor, chunked at max_shard_bytes.
  struct TensorValues {
    std::string name;
    std::vector<int64_t> shape;
    const void* data = nullptr;  // row-major, product(shape) values of `dtype`
    // The values' encoding on the wire (bf16 / fp16 parameters go as they
    // are: the daemon's fp32 master starts as their exact value).
    DType dtype = DType::kF32;
  };
  virtual absl::StatusOr<v1::UploadParametersResponse> UploadParameters(
      const std::string& job_id, const std::vector<TensorValues>& tensors) = 0;
  // Joins the job as `rank` and attaches this client's data stream to it.
  virtual absl::StatusOr<v1::JoinJobResponse> JoinJob(const std::string& job_id,
                                                      int32_t rank) = 0;
  // Attaches the data stream to an already joined rank (after a reconnect).
  virtual absl::Status Attach(const std::string& job_id, int32_t rank) = 0;
  virtual absl::StatusOr<v1::GetJobResponse> GetJob(const std::string& job_id) = 0;
  // Waits until the job exists and its parameters are uploaded (by another
  // rank); polls GetJob with a backoff. DEADLINE_EXCEEDED after `timeout`.
  virtual absl::StatusOr<v1::GetJobResponse> WaitForUpload(const std::string& job_id,
                                                           absl::Duration timeout) = 0;
  virtual absl::Status DeleteJob(const std::string& job_id) = 0;
  // This rank is done with the job (zenflow.torch's close(), zf_train's
  // end): the daemon deletes the job once every rank has said so and none
  // asked to `keep` it (docs/protocol.md, "When a job ends"). The answer says
  // how many ranks have finished and whether this call deleted or kept the
  // job; with several daemons, whether every part was.
  virtual absl::StatusOr<v1::DeleteJobResponse> FinishJob(const std::string& job_id,
                                                          int32_t rank, bool keep) = 0;
  // The daemon-side state (values, m, v, counts) of every column of
  // `tensor` that zenflowd updates now, in column order, read in
  // GetState calls of at most 32 MiB each; `selection_version` (when not
  // null) gets the column sets it is for.
  virtual absl::StatusOr<v1::ColumnState> GetState(const std::string& job_id,
                                                   const std::string& tensor,
                                                   int64_t* selection_version) = 0;
  absl::StatusOr<v1::ColumnState> GetState(const std::string& job_id, const std::string& tensor) {
    return GetState(job_id, tensor, nullptr);
  }
  // Writes `state` (daemon-side columns of one tensor) into a job before
  // its first selection and round, in SetState calls of at most 32 MiB.
  virtual absl::Status SetState(const std::string& job_id, const v1::ColumnState& state) = 0;
  // The statistics of `job_id`, or of every job the token may see.
  virtual absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& job_id) = 0;
  absl::StatusOr<v1::GetStatsResponse> GetStats() { return GetStats(""); }
  // Blocks until every rank submitted importance for `step`.
  virtual absl::StatusOr<v1::Selection> SubmitImportance(
      int64_t step, const std::vector<v1::TensorImportance>& tensors) = 0;
  // Hands off `leaving` for the named tensors (empty: all of the job's);
  // large jobs call it several times with disjoint tensor sets.
  virtual absl::StatusOr<v1::HandOffResponse> HandOff(
      int64_t version, const std::vector<v1::ColumnState>& leaving,
      const std::vector<std::string>& tensors) = 0;
  absl::StatusOr<v1::HandOffResponse> HandOff(int64_t version,
                                              const std::vector<v1::ColumnState>& leaving) {
    return HandOff(version, leaving, {});
  }

  // Mean over ranks of each named fp32 vector (blocks until every rank sent
  // the same step). `parts` are (name, values) pairs; results in the same order.
  virtual absl::StatusOr<std::vector<std::vector<float>>> AllReduce(
      int64_t step,
      const std::vector<std::pair<std::string, const std::vector<float>*>>& parts) = 0;

  // ---- Data (after JoinJob or Attach) ----
  // Queues an up message; blocks only while the send window is full. Fails
  // if the stream is broken (see stream_status()).
  absl::Status PushShard(v1::GradientShard shard);
  // Queues an up message as it is (a shard or a close; tests and tools that
  // need fields the calls above do not set, such as `replay`).
  virtual absl::Status PushUp(v1::UpMessage msg) = 0;
  // Encodes columns (column-major fp32, rows values per column) in `dtype`
  // and pushes them as shards of at most max_shard_bytes.
  virtual absl::Status PushColumns(int64_t step, const std::string& tensor, int64_t version,
                                   const std::vector<int32_t>& columns, const float* col_major,
                                   int64_t rows, DType dtype) = 0;
  // Pushes already encoded columns (column-major, `dtype`), split into
  // shards of at most max_shard_bytes, without copying the payload (UCX and
  // gRPC alike): the client sends straight from `payload` and runs `release`
  // once (on any thread, possibly before returning) when it no longer reads
  // it — after the last shard's send completed (gRPC: gRPC let go of the
  // bytes), or failed, or the stream broke. With ride-through (daemon_wait)
  // the replay log keeps its own copy.
  virtual absl::Status PushEncodedBorrowed(int64_t step, const std::string& tensor,
                                           int64_t version, const int32_t* columns,
                                           int64_t ncols, const char* payload, int64_t rows,
                                           DType dtype, std::function<void()> release) = 0;
  // The same for int8 columns (rows bytes each) with one scale per column.
  virtual absl::Status PushInt8Borrowed(int64_t step, const std::string& tensor,
                                        int64_t version, const int32_t* columns, int64_t ncols,
                                        const int8_t* payload, const float* scales, int64_t rows,
                                        std::function<void()> release) = 0;
  absl::Status CloseRound(int64_t round, float lr, int32_t steps = 0);
  // The same, carrying the worker's figures for its steps since the last
  // close (docs/operating.md#metrics): at most `steps` (the round's steps) of them.
  struct WorkerReport {
    std::vector<v1::StepReport> steps;
    int32_t apply_delay_steps = 0;
    int32_t staleness_steps = 0;
  };
  virtual absl::Status CloseRound(int64_t round, float lr, int32_t steps,
                                  const WorkerReport& report) = 0;
  // Blocks until everything queued was handed to the transport.
  virtual absl::Status Flush(absl::Duration timeout) = 0;

  // Deltas: either a callback (runs on the receive thread; rounds then do
  // not queue) or WaitRound/PollRound.
  virtual void SetRoundCallback(std::function<void(RoundUpdate)> cb) = 0;
  virtual absl::StatusOr<RoundUpdate> WaitRound(int64_t round, absl::Duration timeout) = 0;
  virtual std::optional<RoundUpdate> PollRound() = 0;
  // Gives a delta's payload buffer back once it has been applied; with the
  // UCX transport later receives reuse it (no allocation or zero-fill).
  virtual void Recycle(std::string buffer) = 0;
  // Errors the daemon reported for rejected up messages, oldest first
  // (each carries the daemon's status code and message); clears them.
  virtual std::vector<absl::Status> TakeErrors() = 0;
  // Waits until at least `n` errors are pending (for tests and tools).
  virtual bool WaitForErrors(size_t n, absl::Duration timeout) = 0;

  // OK while the stream is healthy (or none was attached); once it ended,
  // its final status (waiting at most a few seconds for the call to finish).
  virtual absl::Status stream_status() = 0;
  virtual ClientStats stats() = 0;
  // The channel, for calls of a caller's own (health checks, tests); with
  // several daemons, the first one's.
  virtual const std::shared_ptr<grpc::Channel>& channel() const = 0;
  virtual int32_t rank() = 0;
  virtual std::string job_id() = 0;
  // The token this client sends (options.token, or the one CreateJob got).
  virtual std::string token() = 0;
  // The daemons this client talks to (1, or more for a partitioned job).
  virtual int daemons() const = 0;

 protected:
  Client() = default;
};

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_CLIENT_H_
