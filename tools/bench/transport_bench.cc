// transport_bench (`./zf bench transport`): the client library's shard push
// goodput into a real zenflowd, per data transport (gRPC; UCX over shared
// memory; UCX over TCP on loopback) and shard size, beside a raw baseline of
// the same transport measured in the same run:
//
//   ours      Client::PushEncodedBorrowed of fp32 shards of exactly `size`
//             payload bytes (one shard per step, max_shard_bytes = size)
//             into a zenflowd job, from the first push until the daemon's
//             GetStats counts every shard as received, i.e. parsed, checked
//             (finite, columns) and added into the round's fp32 accumulation
//             buffer (DecodeAdd). Round closes and AdamW updates are not part
//             of it: every measured step lies in one open round.
//   raw gRPC  a client stream of grpc::ByteBuffer messages of `size` bytes
//             (one reused slice, no copy on the sender) to a generic callback
//             server in a child process that only counts them; the same
//             channel arguments as the client library; from the first write
//             until the server answered with the byte count after the
//             client's half-close.
//   raw UCP   UcxWorker::Send of one contiguous `size`-byte buffer per tagged
//             message between two UcxWorkers of this process (each with its
//             own progress thread), with the same transports as the daemon
//             (shared memory without CMA, or tcp on lo) and the client
//             library's 64 MiB of sends in flight; until the receiver
//             counted every byte.
//
// and a fair ceiling: the raw transport and the daemon's accumulate kernel
// in series, 1 / (1/raw + 1/a), with a = DecodeAdd of fp32 shards into an
// fp32 buffer of the shard's size on one thread (the daemon adds a stream's
// shards on one thread), measured at the start of the same run.
//
// Results go to --out as {"grpc": {"4MiB": {"ours_bytes_per_s",
// "raw_bytes_per_s", "fraction", "accumulate_bytes_per_s_1thread",
// "ceiling_bytes_per_s", "fraction_of_ceiling", ...}, ...}, "ucx_sm": {...},
// "ucx_tcp": {...}, "goals": {NAME: {"min", "worst", "met"}}} (the best of
// --reps interleaved repetitions, each side's; every repetition is listed). A subset for
// a quick check: --transports=ucx_sm --sizes=4MiB --reps=1 --min_seconds=0.5.
//
//   bazel build -c opt //tools/bench:transport_bench //server:zenflowd
//   ZENFLOWD=bazel-bin/server/zenflowd bazel-bin/tools/bench/transport_bench --out=bench-results/transport.json
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/json_writer.h"
#include "common/malloc_tuning.h"
#include "common/status_macros.h"
#include "common/ucx.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tools/bench/kernel_rates.h"
#include "tools/bench/raw_ucp.h"
#include "tools/child_process.h"
#include "zenflow/v1/zenflow.pb.h"


ABSL_FLAG(std::string, zenflowd, "",
          "the daemon binary to start; empty: $ZENFLOWD, else bazel-bin/server/zenflowd");
ABSL_FLAG(std::string, out, "bench-results/transport.json", "write the results as JSON here");
ABSL_FLAG(std::vector<std::string>, transports,
          std::vector<std::string>({"grpc", "ucx_sm", "ucx_tcp"}),
          "transports to measure: grpc, ucx_sm (shared memory), ucx_tcp (tcp on lo)");
ABSL_FLAG(std::vector<std::string>, sizes, std::vector<std::string>({"64KiB", "1MiB", "4MiB", "32MiB"}),
          "shard (message) sizes, each NKiB or NMiB");
ABSL_FLAG(double, min_seconds, 2.0, "each measurement pushes for at least this long ...");
ABSL_FLAG(int64_t, min_bytes, int64_t{256} << 20, "... and at least this many payload bytes");
ABSL_FLAG(int64_t, warmup_bytes, int64_t{128} << 20,
          "payload bytes sent (and taken in) before each measurement (at least 4 messages)");
ABSL_FLAG(int, reps, 5,
          "repetitions of each (ours, raw) pair, interleaved; each side's best reported");
ABSL_FLAG(std::string, raw_grpc_server, "",
          "internal: serve the raw gRPC sink on 127.0.0.1:0 and write its port to this file");

namespace zenflow {
namespace {

// The best sample (the fastest rate): what a path does undisturbed.
double Best(const std::vector<double>& rates) {
  return rates.empty() ? 0 : *std::max_element(rates.begin(), rates.end());
}

using Clock = std::chrono::steady_clock;
constexpr int64_t kRows = 1024;  // fp32 rows per column: 4 KiB columns
constexpr char kRawMethod[] = "/zenflow.bench.RawSink/Sink";

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

absl::StatusOr<int64_t> ParseSize(const std::string& s) {
  int64_t n = 0;
  for (const auto& [suffix, unit] : {std::pair<const char*, int64_t>{"KiB", 1 << 10},
                                     std::pair<const char*, int64_t>{"MiB", 1 << 20}}) {
    const size_t len = std::strlen(suffix);
    if (s.size() > len && s.compare(s.size() - len, len, suffix) == 0 &&
        absl::SimpleAtoi(s.substr(0, s.size() - len), &n) && n > 0) {
      const int64_t bytes = n * unit;
      if (bytes % (kRows * 4) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("size ", s, " is not a multiple of a ", kRows * 4, "-byte column"));
      }
      return bytes;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("size '", s, "' is not NKiB or NMiB"));
}


// ---- The raw gRPC sink (child process) ----------------------------------------

// Counts the bytes of every message of a stream; after the client's
// half-close answers with the count (decimal) and finishes.
class SinkReactor final : public grpc::ServerGenericBidiReactor {
 public:
  SinkReactor() { StartRead(&in_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      grpc::Slice count(absl::StrCat(bytes_));
      out_ = grpc::ByteBuffer(&count, 1);
      StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    }
    bytes_ += static_cast<int64_t>(in_.Length());
    in_.Clear();
    StartRead(&in_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
  int64_t bytes_ = 0;
};

class SinkService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new SinkReactor();
  }
};

int ServeRawGrpc(const std::string& port_file) {
  SinkService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(1 << 30);  // as zenflowd: sizes set explicitly
  builder.SetMaxSendMessageSize(1 << 30);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "transport_bench: the raw gRPC sink could not listen\n");
    return 1;
  }
  {
    std::ofstream out(port_file + ".tmp");
    out << port << "\n";
  }
  std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  server->Wait();  // until SIGKILL by the parent
  return 0;
}

// ---- Measurements ---------------------------------------------------------------

struct Sample {
  double seconds = 0;
  int64_t bytes = 0;
  double rate() const { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }
};

// The pusher's stop rule: at least min_seconds and min_bytes.
bool Enough(Clock::time_point t0, int64_t bytes) {
  return bytes >= absl::GetFlag(FLAGS_min_bytes) && Since(t0) >= absl::GetFlag(FLAGS_min_seconds);
}

int64_t WarmupMessages(int64_t size) {
  return std::max<int64_t>(4, absl::GetFlag(FLAGS_warmup_bytes) / size);
}

// The channel arguments of Client::Connect (client/client.cc).
std::shared_ptr<grpc::Channel> LibraryLikeChannel(const std::string& target) {
  const ClientOptions defaults;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(defaults.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(defaults.max_message_bytes));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// One client stream to the sink: `count` messages (or, with count < 0, until
// Enough()), one write in flight, then the server's byte count.
class RawWriter final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawWriter(grpc::GenericStub* stub, const grpc::Slice& payload, int64_t count)
      : payload_(payload), count_(count) {
    stub->PrepareBidiStreamingCall(&ctx_, kRawMethod, grpc::StubOptions(), this);
  }

  absl::StatusOr<Sample> Run() {
    StartRead(&resp_);
    t0_ = Clock::now();
    out_ = grpc::ByteBuffer(&payload_, 1);  // a reference to the one slice: no copy
    StartWrite(&out_);
    StartCall();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (!status_.ok()) {
      return absl::UnavailableError(absl::StrCat("raw gRPC stream: ", status_.error_message()));
    }
    grpc::Slice s;
    int64_t counted = -1;
    if (!resp_.TrySingleSlice(&s).ok() ||
        !absl::SimpleAtoi(absl::string_view(reinterpret_cast<const char*>(s.begin()), s.size()),
                          &counted) ||
        counted != written_) {
      return absl::InternalError(
          absl::StrCat("raw gRPC sink counted ", counted, " bytes of ", written_));
    }
    return Sample{seconds_, written_};
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the call failed: OnDone says why
    written_ += static_cast<int64_t>(payload_.size());
    ++messages_;
    const bool more = count_ >= 0 ? messages_ < count_ : !Enough(t0_, written_);
    if (more) {
      out_ = grpc::ByteBuffer(&payload_, 1);
      StartWrite(&out_);
    } else {
      StartWritesDone();
    }
  }
  void OnDone(const grpc::Status& s) override {
    const double seconds = Since(t0_);
    std::lock_guard<std::mutex> lock(mu_);
    status_ = s;
    seconds_ = seconds;
    done_ = true;
    cv_.notify_all();
  }

 private:
  grpc::ClientContext ctx_;
  const grpc::Slice payload_;
  const int64_t count_;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer resp_;
  Clock::time_point t0_;
  int64_t written_ = 0;
  int64_t messages_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  grpc::Status status_;
  double seconds_ = 0;
};

absl::StatusOr<Sample> MeasureRawGrpc(const std::string& target, int64_t size) {
  std::shared_ptr<grpc::Channel> channel = LibraryLikeChannel(target);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20))) {
    return absl::UnavailableError(absl::StrCat("raw gRPC sink at ", target, " unreachable"));
  }
  grpc::GenericStub stub(channel);
  const grpc::Slice payload(std::string(static_cast<size_t>(size), '\x5a'));
  {
    RawWriter warm(&stub, payload, WarmupMessages(size));
    ZF_RETURN_IF_ERROR(warm.Run().status());
  }
  RawWriter run(&stub, payload, -1);
  return run.Run();
}

// The raw UCP loop (tools/bench/raw_ucp.h) with the client library's sends
// in flight.
absl::StatusOr<Sample> MeasureRawUcp(const UcxOptions& options, int64_t size) {
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<RawUcp> r, RawUcp::Create(options));
  const std::string payload(static_cast<size_t>(size), '\x5a');
  const int64_t window = ClientOptions().max_inflight_bytes;
  ZF_RETURN_IF_ERROR(r->Run(payload, WarmupMessages(size), window, Enough).status());
  ZF_ASSIGN_OR_RETURN(RawUcpSample s, r->Run(payload, -1, window, Enough));
  return Sample{s.seconds, s.bytes};
}

// Waits until the daemon counts `bytes` shard payload bytes for the job.
absl::Status WaitTakenIn(Client* client, const std::string& job_id, int64_t bytes) {
  const Clock::time_point t0 = Clock::now();
  while (true) {
    ZF_ASSIGN_OR_RETURN(v1::GetStatsResponse stats, client->GetStats(job_id));
    int64_t got = -1;
    for (const v1::JobStats& j : stats.jobs()) {
      if (j.job_id() == job_id) got = j.shard_bytes_received();
    }
    if (got >= bytes) return absl::OkStatus();
    std::vector<absl::Status> errors = client->TakeErrors();
    if (!errors.empty()) {
      return absl::InternalError(absl::StrCat("the daemon rejected a shard: ", errors[0].ToString()));
    }
    ZF_RETURN_IF_ERROR(client->stream_status());
    if (Since(t0) > 120) {
      return absl::DeadlineExceededError(
          absl::StrCat("the daemon took in ", got, " of ", bytes, " bytes within 120 s"));
    }
    // Each GetStats costs both processes CPU: polled every 2 ms (at most
    // 0.1% of a 2 s measurement), not in a tight loop.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// The client library into a zenflowd job: one [kRows, size / (4 kRows)] fp32
// tensor, every column daemon-side (topk 0), one shard of the whole tensor
// per step, all steps in round 0 (update_interval 2^20: nothing closes).
absl::StatusOr<Sample> MeasureOurs(const std::string& target, Transport transport,
                                   const UcxOptions& ucx, const std::string& token,
                                   const std::string& job_id, int64_t size) {
  ClientOptions o;
  o.target = target;
  o.token = token;
  o.transport = transport;
  o.ucx = ucx;
  o.max_shard_bytes = size;
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(o));
  const int64_t cols = size / (kRows * 4);
  v1::JobSpec spec;
  spec.set_job_id(job_id);
  v1::TensorSpec* t = spec.add_tensors();
  t->set_name("g");
  t->add_shape(kRows);
  t->add_shape(cols);
  t->set_dtype(v1::DTYPE_FP32);
  spec.set_mode(v1::MODE_ZENFLOW);
  spec.mutable_zenflow()->set_topk_ratio(0);
  spec.mutable_zenflow()->set_update_interval(1 << 20);
  spec.mutable_zenflow()->set_select_interval(1 << 20);
  spec.set_world_size(1);
  spec.set_wire_dtype(v1::DTYPE_FP32);
  spec.set_max_shard_bytes(size);
  ZF_RETURN_IF_ERROR(client->CreateJob(spec).status());
  absl::StatusOr<Sample> result = [&]() -> absl::StatusOr<Sample> {
    const std::vector<float> zeros(static_cast<size_t>(kRows * cols), 0.0f);
    ZF_RETURN_IF_ERROR(
        client->UploadParameters(job_id, {{"g", {kRows, cols}, zeros.data()}}).status());
    ZF_RETURN_IF_ERROR(client->JoinJob(job_id, 0).status());
    std::vector<int32_t> columns(static_cast<size_t>(cols));
    for (int32_t c = 0; c < cols; ++c) columns[c] = c;
    std::vector<float> grad(static_cast<size_t>(kRows * cols));
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1e-3f * static_cast<float>(i % 7);
    const char* payload = reinterpret_cast<const char*>(grad.data());
    int64_t step = 0;
    auto push = [&]() {
      return client->PushEncodedBorrowed(step++, "g", 0, columns.data(), cols, payload, kRows,
                                         DType::kF32, [] {});
    };
    const int64_t warm = WarmupMessages(size);
    for (int64_t i = 0; i < warm; ++i) ZF_RETURN_IF_ERROR(push());
    ZF_RETURN_IF_ERROR(client->Flush(absl::Seconds(120)));
    ZF_RETURN_IF_ERROR(WaitTakenIn(client.get(), job_id, warm * size));
    const Clock::time_point t0 = Clock::now();
    int64_t sent = 0;
    while (!Enough(t0, sent)) {
      ZF_RETURN_IF_ERROR(push());
      sent += size;
    }
    ZF_RETURN_IF_ERROR(client->Flush(absl::Seconds(120)));
    ZF_RETURN_IF_ERROR(WaitTakenIn(client.get(), job_id, warm * size + sent));
    return Sample{Since(t0), sent};
  }();
  absl::Status deleted = client->DeleteJob(job_id);
  if (result.ok() && !deleted.ok()) return deleted;
  return result;
}

struct Point {
  std::string size_name;
  int64_t size = 0;
  std::vector<Sample> ours, raw;
};

std::string Rate(double bytes_per_s) { return absl::StrFormat("%8.1f MB/s", bytes_per_s / 1e6); }

// The transport goals, each with its met flag: null when no
// measurement it applies to ran (a subset run), false when one it applies to
// failed. figures: transport -> size -> (fraction, fraction_of_ceiling).
using Figures = std::map<std::string, std::map<std::string, std::pair<double, double>>>;
void WriteGoal(JsonWriter* w, const char* key, double min, const char* applies,
               const std::vector<double>& values) {
  w->Key(key).BeginObject();
  w->Key("min").Double(min);
  w->Key("applies_to").String(applies);
  bool met = !values.empty();
  double worst = NAN;
  for (double v : values) {
    if (!(v >= min)) met = false;  // NaN (failed) too
    if (std::isfinite(v) && !(worst <= v)) worst = v;
  }
  w->Key("worst").Double(worst);
  w->Key("met");
  if (values.empty()) {
    w->Null();
  } else {
    w->Bool(met);
  }
  w->EndObject();
}

void WriteGoals(const Figures& figures, JsonWriter* w) {
  std::vector<double> grpc_fraction, ucx_fraction, of_ceiling;
  for (const auto& [transport, by_size] : figures) {
    for (const auto& [size_name, f] : by_size) {
      if (transport == "grpc") grpc_fraction.push_back(f.first);
      if (size_name == "4MiB" || size_name == "32MiB") {
        of_ceiling.push_back(f.second);
        if (transport != "grpc") ucx_fraction.push_back(f.first);
      }
    }
  }
  w->Key("goals").BeginObject();
  WriteGoal(w, "fraction_of_ceiling_min", 0.8, "every transport at 4MiB and 32MiB", of_ceiling);
  WriteGoal(w, "grpc_fraction_min", 0.9, "grpc at every size (fraction against raw gRPC)",
            grpc_fraction);
  WriteGoal(w, "ucx_fraction_min_at_4MiB_and_above", 0.8,
            "ucx_sm and ucx_tcp at 4MiB and 32MiB (fraction against raw UCP; the earlier goal)",
            ucx_fraction);
  w->EndObject();
}

int Main() {
  std::string zenflowd = absl::GetFlag(FLAGS_zenflowd);
  if (zenflowd.empty()) {
    const char* env = std::getenv("ZENFLOWD");
    zenflowd = env != nullptr && *env != '\0' ? env : "bazel-bin/server/zenflowd";
  }
  std::vector<std::pair<std::string, int64_t>> sizes;
  int64_t largest = 0;
  for (const std::string& s : absl::GetFlag(FLAGS_sizes)) {
    absl::StatusOr<int64_t> n = ParseSize(s);
    if (!n.ok()) {
      std::fprintf(stderr, "transport_bench: %s\n", n.status().ToString().c_str());
      return 2;
    }
    sizes.emplace_back(s, *n);
    largest = std::max(largest, *n);
  }
  const std::vector<std::string> transports = absl::GetFlag(FLAGS_transports);
  for (const std::string& t : transports) {
    if (t != "grpc" && t != "ucx_sm" && t != "ucx_tcp") {
      std::fprintf(stderr, "transport_bench: unknown transport '%s' (grpc, ucx_sm, ucx_tcp)\n",
                   t.c_str());
      return 2;
    }
  }
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  // Frames carry a header beside the payload: room for it.
  const std::string max_message = absl::StrCat("--max_message_bytes=", 2 * largest + (1 << 20));
  const std::string token = NewToken();

  // The raw gRPC sink: this binary in a child process.
  ChildProcess sink;
  if (absl::Status s = sink.Start("/proc/self/exe", {}, "--raw_grpc_server", "zf_transport_bench");
      !s.ok()) {
    std::fprintf(stderr, "transport_bench: raw gRPC sink: %s\n", s.ToString().c_str());
    return 1;
  }

  JsonWriter w;
  w.BeginObject();
  w.Key("note").String(
      "goodput in payload bytes per second. ours: zenflow::Client::PushEncodedBorrowed of fp32 "
      "shards of exactly `bytes` payload (one shard per step, max_shard_bytes = bytes) into a "
      "real zenflowd child process, timed from the first push until the daemon's GetStats counts "
      "every shard received (parsed, checked and DecodeAdd-ed into the round's fp32 accumulation "
      "buffer; no round close or AdamW update in the timed span). raw_grpc: a client stream of "
      "grpc::ByteBuffer messages of the same size (one reused slice) to a generic callback "
      "server in a child process that counts them, same channel args, until the server's reply "
      "after half-close. raw_ucp: UcxWorker::Send of one contiguous buffer per message between "
      "two UcxWorkers (own progress threads) of the bench process, same UCX transports as the "
      "daemon (sm without CMA = posix,sysv; tcp on lo), 64 MiB in flight, until the receiver "
      "counted every byte. The best of `reps` interleaved repetitions, each side's (on a shared "
      "host one raw sample in three came out at half the others, and a median of 3 then "
      "put ours above raw); fraction = ours / raw.");
  w.Key("reps").Int(reps);
  w.Key("min_seconds").Double(absl::GetFlag(FLAGS_min_seconds));
  w.Key("min_bytes").Int(absl::GetFlag(FLAGS_min_bytes));
  w.Key("ceiling_note").String(
      "ceiling_bytes_per_s = 1 / (1/raw_bytes_per_s + 1/accumulate_bytes_per_s_1thread): the "
      "raw transport and the daemon's accumulate in series, both measured in this run; "
      "accumulate_bytes_per_s_1thread: DecodeAdd of fp32 shards (this bench's wire dtype) into "
      "an fp32 buffer of the shard's size on one thread (as the daemon's one receiving thread "
      "of a stream does), payload bytes per thread CPU second, measured at the start of the run "
      "(median sample); fraction_of_ceiling = ours / ceiling; fraction = ours / raw as before");
  w.Key("accumulate_wire_dtype").String("fp32");

  // The accumulate kernel per size, before any daemon runs.
  std::map<int64_t, double> accumulate;
  for (const auto& [size_name, size] : sizes) {
    if (accumulate.count(size) == 0) {
      accumulate[size] = AccumulateBytesPerCpuSecond(DType::kF32, size / 4, 0.2);
      std::printf("transport_bench: accumulate fp32 %s: %s on 1 thread\n", size_name.c_str(),
                  Rate(accumulate[size]).c_str());
    }
  }
  std::fflush(stdout);
  // Per transport and size: fraction and fraction_of_ceiling, for the goals.
  std::map<std::string, std::map<std::string, std::pair<double, double>>> figures;

  int failures = 0;
  for (const std::string& tname : transports) {
    Transport transport = tname == "grpc" ? Transport::kGrpc : Transport::kUcx;
    UcxOptions ucx;  // the client's
    UcxOptions raw_ucx;
    std::vector<std::string> daemon_flags = {"--listen=127.0.0.1:0", "--admin_socket=", max_message};
    if (tname == "ucx_tcp") {
      ucx.tls = "tcp,self";
      ucx.net_devices = "lo";
      raw_ucx = ucx;
      daemon_flags.push_back("--ucx_tls=tcp,self");
      daemon_flags.push_back("--ucx_net_devices=lo");
    } else {
      ucx.tls = "sm,self";
      raw_ucx.tls = "sm,self";
      raw_ucx.without_cma = true;  // as zenflowd's worker (UcxDataPlane)
      daemon_flags.push_back("--ucx_tls=sm,self");
    }
    ChildProcess daemon;
    if (absl::Status s = daemon.Start(zenflowd, daemon_flags, "--port_file", "zf_transport_bench");
        !s.ok()) {
      std::fprintf(stderr, "transport_bench: zenflowd: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("transport_bench: %s: zenflowd at %s (log %s/stderr.log)\n", tname.c_str(),
                daemon.target().c_str(), daemon.dir().c_str());
    std::fflush(stdout);
    w.Key(tname).BeginObject();
    for (const auto& [size_name, size] : sizes) {
      Point p{size_name, size, {}, {}};
      std::string error;
      for (int r = 0; r < reps && error.empty(); ++r) {
        absl::StatusOr<Sample> raw = transport == Transport::kGrpc
                                         ? MeasureRawGrpc(sink.target(), size)
                                         : MeasureRawUcp(raw_ucx, size);
        if (!raw.ok()) {
          error = absl::StrCat("raw: ", raw.status().ToString());
          break;
        }
        p.raw.push_back(*raw);
        absl::StatusOr<Sample> ours =
            MeasureOurs(daemon.target(), transport, ucx, token,
                        absl::StrCat("tb-", tname, "-", size_name, "-", r), size);
        if (!ours.ok()) {
          error = absl::StrCat("ours: ", ours.status().ToString());
          break;
        }
        p.ours.push_back(*ours);
        std::printf("  %-7s %6s rep %d: ours %s (%.2f s)  raw %s (%.2f s)  %.3f\n", tname.c_str(),
                    size_name.c_str(), r, Rate(ours->rate()).c_str(), ours->seconds,
                    Rate(raw->rate()).c_str(), raw->seconds, ours->rate() / raw->rate());
        std::fflush(stdout);
      }
      std::vector<double> ours_rates, raw_rates;
      for (const Sample& s : p.ours) ours_rates.push_back(s.rate());
      for (const Sample& s : p.raw) raw_rates.push_back(s.rate());
      const double ours = Best(ours_rates), raw = Best(raw_rates);
      const double acc = accumulate[size];
      const double ceiling = raw > 0 && acc > 0 ? 1.0 / (1.0 / raw + 1.0 / acc) : 0;
      const double fraction = p.ours.empty() || raw <= 0 ? NAN : ours / raw;
      const double of_ceiling = p.ours.empty() || ceiling <= 0 ? NAN : ours / ceiling;
      figures[tname][size_name] = {fraction, of_ceiling};
      w.Key(size_name).BeginObject();
      w.Key("bytes").Int(size);
      w.Key("ours_bytes_per_s").Double(p.ours.empty() ? NAN : ours);
      w.Key("raw_bytes_per_s").Double(p.raw.empty() ? NAN : raw);
      w.Key("fraction").Double(fraction);
      w.Key("accumulate_bytes_per_s_1thread").Double(acc);
      w.Key("ceiling_bytes_per_s").Double(p.raw.empty() || ceiling <= 0 ? NAN : ceiling);
      w.Key("fraction_of_ceiling").Double(of_ceiling);
      w.Key("ours_runs_bytes_per_s").BeginArray();
      for (double v : ours_rates) w.Double(v);
      w.EndArray();
      w.Key("raw_runs_bytes_per_s").BeginArray();
      for (double v : raw_rates) w.Double(v);
      w.EndArray();
      w.Key("ours_seconds").BeginArray();
      for (const Sample& s : p.ours) w.Double(s.seconds);
      w.EndArray();
      if (!error.empty()) {
        ++failures;
        w.Key("error").String(error);
        std::fprintf(stderr, "transport_bench: %s %s: %s\n", tname.c_str(), size_name.c_str(),
                     error.c_str());
      }
      w.EndObject();
      std::printf("%-7s %6s: ours %s  raw %s  fraction %.3f  ceiling %s  of ceiling %.3f\n",
                  tname.c_str(), size_name.c_str(), Rate(ours).c_str(), Rate(raw).c_str(),
                  raw > 0 ? ours / raw : 0.0, Rate(ceiling).c_str(),
                  ceiling > 0 ? ours / ceiling : 0.0);
      std::fflush(stdout);
    }
    w.EndObject();
    // Its directory goes with it when it ran clean (a failure keeps the log).
    if (daemon.Stop().ok() && failures == 0) daemon.RemoveFiles();
  }
  (void)sink.Stop();
  sink.RemoveFiles();
  WriteGoals(figures, &w);
  w.EndObject();
  if (absl::Status s = w.WriteFile(absl::GetFlag(FLAGS_out)); !s.ok()) {
    std::fprintf(stderr, "transport_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("transport_bench: wrote %s\n", absl::GetFlag(FLAGS_out).c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  zenflow::TuneMallocForBulkBuffers();
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  if (!absl::GetFlag(FLAGS_raw_grpc_server).empty()) {
    return zenflow::ServeRawGrpc(absl::GetFlag(FLAGS_raw_grpc_server));
  }
  return zenflow::Main();
}
