// zenflowd: the ZenFlow optimizer daemon. Hosts the zenflow.v1 gRPC service
// (jobs, gradient shards in, parameter deltas out) until SIGTERM or SIGINT.
//
//   zenflowd --listen=127.0.0.1:50051 --update_threads=2
//   zenflowd --flagfile=/etc/zenflowd/zenflowd.flags   (one --flag=value a line)
//
// Under systemd (deploy/systemd/zenflowd.service) it tells the service
// manager READY=1 once it serves, WATCHDOG=1 while it answers its own health
// check (see WatchdogLoop), and STOPPING=1 on SIGTERM.
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/adamw.h"
#include "common/flags_usage.h"
#include "common/malloc_tuning.h"
#include "common/tls_files.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "server/admin_socket.h"
#include "server/auth.h"
#include "server/checkpointer.h"
#include "server/exposure.h"
#include "server/service.h"
#include "server/ucx_plane.h"
#include "server/version.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port to serve gRPC on; port 0 picks a free port (see --port_file). Without "
          "--tls_cert only a loopback address (127.0.0.0/8, ::1, localhost), unless "
          "--allow_insecure");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of the server's certificate chain (its own certificate first): gRPC is "
          "served with TLS. Needs --tls_key. Read once at start");
ABSL_FLAG(std::string, tls_key, "",
          "PEM file of --tls_cert's private key (unencrypted; keep it readable only by the "
          "daemon's user)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA(s) that sign client certificates: every gRPC client must then "
          "present a certificate one of them signed (mutual TLS). Needs --tls_cert");
ABSL_FLAG(bool, allow_insecure, false,
          "allow plaintext beyond this host: gRPC without TLS on a non-loopback --listen, the "
          "UCX data plane (never encrypted) over a network transport on devices other than "
          "\"lo\", and /metrics on a non-loopback --metrics_listen. Without it zenflowd "
          "refuses to start in those cases (docs/security.md)");
ABSL_FLAG(std::string, health_listen, "",
          "host:port of a plaintext listener that answers only grpc.health.v1.Health/Check, by "
          "asking the daemon's own server over a local unix socket; for probes that cannot "
          "speak TLS (the kubelet's gRPC probes). Empty: none");
ABSL_FLAG(std::string, health_port_file, "",
          "if set, the bound --health_listen port is written to this file once serving");
ABSL_FLAG(int, update_threads, 2, "threads that run AdamW updates (including the update thread)");
ABSL_FLAG(int, update_drivers, 2,
          "jobs whose round updates run at the same time (each job's own rounds run in order); "
          "a large job's update occupies one driver and does not delay other jobs");
ABSL_FLAG(int, update_nice, -5,
          "added to the update threads' nice value (zf-update: the AdamW pool's and the "
          "drivers'), in [-20, 19]: a negative value runs a round's update ahead of the daemon's "
          "ingest and gRPC threads and of other processes when cores are short (the update is "
          "what the ranks wait for). Needs CAP_SYS_NICE; without it the update threads keep the "
          "daemon's priority and zenflowd says so. 0: off");
ABSL_FLAG(std::string, simd, "auto",
          "vector level of the round update's kernels: auto (the host's best), avx512, avx2 or "
          "scalar. Levels differ in the last bits of a result, so daemons that must give a job "
          "the same bits on hosts of different CPUs (a restart on another host, several daemons "
          "of one job) pin the level all of them support; an unsupported level is refused");
ABSL_FLAG(uint32_t, adam8_draw_seed, 0,
          "a diagnostic: another set of the draws with which jobs with 8-bit optimizer state "
          "round v stochastically (0, the default, is the one set every daemon uses). How far "
          "one set of draws moves a training against another is what the fidelity bench's "
          "8-bit rows are compared with (docs/benchmarks.md, Fidelity)");
ABSL_FLAG(double, emulate_round_ms, 0,
          "every round update takes at least this many milliseconds: after the real work the "
          "daemon waits out the rest before sending the deltas, standing in for a model whose "
          "CPU update is that slow (benchmarks; like zf_train --emulate_device_ms). 0: off");
ABSL_FLAG(double, emulate_ucx_frame_ms, 0,
          "every frame that arrives over UCX waits this many milliseconds before it is handled, "
          "standing in for dispatchers slower than the link (tests: a rank that sends faster "
          "than the daemon adds is slowed, not cut off). 0: off");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{512} << 20,
          "largest message the service accepts or sends, bytes (selection hand-off and all-reduce "
          "are single messages: about 12 B x k x params for the first hand-off)");
ABSL_FLAG(int64_t, max_params, int64_t{1} << 34,
          "most parameters held over all jobs; larger CreateJob calls get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, memory_budget_bytes, 0,
          "bytes all jobs together may hold: state (20 B/param), bookkeeping (per column, and "
          "per rank and step of its open round) and two rounds of deltas; see docs/operating.md#memory-of-a-job. A CreateJob "
          "over it gets RESOURCE_EXHAUSTED before anything is allocated. 0: 3/4 of physical "
          "memory (or of the cgroup's memory.max)");
ABSL_FLAG(int64_t, max_outbox_bytes, int64_t{256} << 20,
          "per rank: once this many bytes wait to be sent to a rank (it does not read its "
          "stream), the daemon stops reading from that rank until half of them are sent");
ABSL_FLAG(bool, ucx, true,
          "offer the UCX data plane: ranks that attach with a UCX address send shards and get "
          "deltas over UCX (gRPC stays the control channel)");
ABSL_FLAG(std::string, ucx_tls, "sm,self",
          "UCX transports for the data plane (UCX_TLS syntax); the default keeps data on this "
          "host (shared memory); e.g. \"tcp,sm,self\" serves ranks on other hosts. The data "
          "plane is never encrypted: a network transport needs --ucx_net_devices=lo or "
          "--allow_insecure");
ABSL_FLAG(std::string, ucx_net_devices, "",
          "network devices for UCX's network transports (UCX_NET_DEVICES syntax, e.g. \"lo\" or "
          "\"eth0\"); empty: all");
ABSL_FLAG(int, ucx_dispatch_threads, 2,
          "threads that handle frames arriving over UCX, 1..64: each connection is handled by "
          "one of them, in order; different ranks' shards are accumulated in parallel");
ABSL_FLAG(std::string, state_dir, "",
          "directory for checkpoints (docs/checkpoints.md): every job found there is "
          "restored at start (health says NOT_SERVING until done), a Checkpoint call and "
          "SIGTERM write them; empty: no checkpoints");
ABSL_FLAG(int32_t, checkpoint_keep, 2, "checkpoints kept per job (the newest)");
ABSL_FLAG(int32_t, dead_rank_timeout_s, 300,
          "a joined rank without a data stream for this many seconds fails what waits on it "
          "(the others' selection, all-reduce and rounds) with ABORTED; 0 = never");
ABSL_FLAG(double, job_idle_ttl_s, 3600,
          "a job no rank has been attached to for this many seconds (fractions allowed) is "
          "checkpointed (with --state_dir; it then comes back at the next start) and deleted, "
          "with an audit line (event=expire); 0 = never. Ranks that finish delete their job "
          "themselves; this ends the jobs of runs that crashed or kept theirs "
          "(docs/operating.md#job-lifecycle)");
ABSL_FLAG(int32_t, checkpoint_every_rounds, 0,
          "also checkpoint each job every this many rounds, in the background (rounds do not "
          "wait for the disk); 0: only on request and at SIGTERM");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on (/metrics, plaintext HTTP), e.g. "
          "127.0.0.1:9464; a non-loopback address needs --allow_insecure; empty: none. See "
          "docs/operating.md#metrics");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, the bound metrics port is written to this file once serving (with "
          "--metrics_listen=HOST:0, for scripts and tests)");
ABSL_FLAG(int32_t, max_jobs, 64,
          "most jobs held at once; a CreateJob beyond gets RESOURCE_EXHAUSTED (this also bounds "
          "the label cardinality of the metrics)");
ABSL_FLAG(std::string, admin_token_file, "",
          "file holding the admin token (first line; 16-256 characters of A-Z a-z 0-9 - . _ ~ + / "
          "=): a call carrying it as \"authorization: Bearer <token>\" reaches every job, "
          "GetStats and Checkpoint without job_id included. Empty: no admin (docs/security.md)");
ABSL_FLAG(std::string, admin_socket, "auto",
          "unix socket where a peer that is root or this daemon's user (the kernel's word, "
          "SO_PEERCRED) is the admin without a token (zfctl uses it); other peers get "
          "PERMISSION_DENIED. auto: $ZENFLOW_ADMIN_SOCKET if set, else $RUNTIME_DIRECTORY/"
          "admin.sock, /run/zenflowd/admin.sock (when the daemon may write there), "
          "$XDG_RUNTIME_DIR/zenflowd/admin.sock, STATE_DIR/admin.sock, in that order; with auto "
          "a path another daemon holds is left to it. Empty: none (docs/operating.md)");
ABSL_FLAG(std::string, audit_log, "",
          "file the audit lines go to (appended): each job created, deleted, joined, attached "
          "to, and each call refused for its credential, with the peer's address. Empty: "
          "standard error");
ABSL_FLAG(int32_t, max_streams, 1024,
          "most Stream and UploadParameters calls open at once (all clients); one more gets "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, attach_timeout_s, 30,
          "a Stream call that sends no attach, or an UploadParameters call no chunk, this many "
          "seconds after it starts is ended with DEADLINE_EXCEEDED (an idle call holds one of "
          "--max_streams); 0: never");
ABSL_FLAG(int32_t, max_jobs_per_credential, 16,
          "most jobs one token holds at once; a CreateJob beyond gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_params_per_credential, int64_t{1} << 34,
          "most parameters the jobs of one token hold together");
ABSL_FLAG(int32_t, max_world_size, 4096,
          "most ranks of one job (JobSpec.world_size); a larger CreateJob gets RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written to this file once serving (for scripts and tests)");

namespace {

// gRPC's standard health check (grpc.health.v1.Health/Check for the whole
// server), as raw bytes: the request {service: ""} encodes as no bytes and
// the answer SERVING as {status: 1}.
absl::Status CheckHealth(grpc::GenericStub& stub, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),  // same numbers
                        absl::StrCat("health check: ", status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  if (bytes != std::string("\x08\x01", 2)) {
    return absl::UnavailableError("health check: the server does not report SERVING");
  }
  return absl::OkStatus();
}

// systemd's watchdog: every `interval`, dials `target` (the server's local
// unix socket, ZenFlowServer::local_target(), with gRPC local credentials)
// and sends WATCHDOG=1 if the health check answers SERVING within the
// interval. The socket belongs to the same gRPC server as --listen, so this
// works whatever TLS and client certificates --listen requires. A ping
// proves that the gRPC server accepts connections and dispatches and
// answers a call (it is not shut down, and its call handlers run); it does
// not dial the --listen address itself.
// It does not prove that jobs make progress: no job state is looked at.
void WatchdogLoop(const std::string& target, absl::Duration interval, absl::Notification* stop) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  // A failed check must not leave the channel backing off past the watchdog.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel(target, grpc::experimental::LocalCredentials(UDS), args));
  bool healthy = true;
  while (!stop->WaitForNotificationWithTimeout(interval)) {
    const absl::Status s = CheckHealth(stub, interval);
    if (stop->HasBeenNotified()) break;
    if (s.ok()) sd_notify(0, "WATCHDOG=1");
    if (s.ok() != healthy) {
      std::fprintf(stderr, "zenflowd: watchdog: %s\n",
                   s.ok() ? "health check answers again; pinging systemd"
                          : absl::StrCat(s.ToString(), " (", target, "); not pinging systemd").c_str());
    }
    healthy = s.ok();
  }
}

}  // namespace

namespace {

// Writes `port` to `path` atomically (a reader never sees a partial file);
// nothing when `path` is empty.
void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
  }
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("The ZenFlow optimizer daemon. See docs/protocol.md for the API.");
  // --help and --version on stdout, exit 0 (common/flags_usage.h).
  zenflow::ParseFlags(argc, argv,
                      {"zenflowd",
                       absl::StrCat(zenflow::kZenflowVersion, " (commit ", zenflow::ZenflowCommit(), ")"),
                       {"server/zenflowd.cc"}});
  zenflow::TuneMallocForBulkBuffers();

  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  zenflow::ServerOptions opts;
  opts.listen = absl::GetFlag(FLAGS_listen);
  opts.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  opts.registry.update_threads = absl::GetFlag(FLAGS_update_threads);
  opts.registry.update_drivers = absl::GetFlag(FLAGS_update_drivers);
  if (opts.registry.update_drivers < 1 || opts.registry.update_drivers > 256) {
    std::fprintf(stderr, "zenflowd: --update_drivers must be in [1, 256]\n");
    return 2;
  }
  opts.registry.update_nice = absl::GetFlag(FLAGS_update_nice);
  if (opts.registry.update_nice < -20 || opts.registry.update_nice > 19) {
    std::fprintf(stderr, "zenflowd: --update_nice must be in [-20, 19]\n");
    return 2;
  }
  opts.registry.adam8_draw_seed = absl::GetFlag(FLAGS_adam8_draw_seed);
  const std::string simd = absl::GetFlag(FLAGS_simd);
  if (simd != "auto") {
    bool known = false;
    for (zenflow::SimdLevel level : {zenflow::SimdLevel::kAvx512, zenflow::SimdLevel::kAvx2,
                                     zenflow::SimdLevel::kScalar}) {
      if (simd != zenflow::SimdLevelName(level)) continue;
      known = true;
      if (!zenflow::SimdLevelSupported(level)) {
        std::fprintf(stderr, "zenflowd: --simd=%s: this CPU does not support it (its best: %s)\n",
                     simd.c_str(), zenflow::SimdLevelName(zenflow::BestSimdLevel()));
        return 2;
      }
      opts.registry.simd = level;
    }
    if (!known) {
      std::fprintf(stderr, "zenflowd: --simd must be auto, avx512, avx2 or scalar (not '%s')\n",
                   simd.c_str());
      return 2;
    }
  }
  const double emulate_round_ms = absl::GetFlag(FLAGS_emulate_round_ms);
  if (!(emulate_round_ms >= 0 && emulate_round_ms <= 3600e3)) {
    std::fprintf(stderr, "zenflowd: --emulate_round_ms must be in [0, 3600000]\n");
    return 2;
  }
  opts.registry.emulate_round_seconds = emulate_round_ms / 1e3;
  opts.registry.max_params = absl::GetFlag(FLAGS_max_params);
  opts.registry.memory_budget_bytes = absl::GetFlag(FLAGS_memory_budget_bytes);
  opts.registry.max_outbox_bytes = absl::GetFlag(FLAGS_max_outbox_bytes);
  if (opts.registry.memory_budget_bytes < 0 || opts.registry.max_outbox_bytes < 1 << 16) {
    std::fprintf(stderr,
                 "zenflowd: --memory_budget_bytes must be >= 0 and --max_outbox_bytes >= 65536\n");
    return 2;
  }
  opts.registry.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  if (opts.registry.max_jobs < 1 || opts.registry.max_jobs > 4096) {
    std::fprintf(stderr, "zenflowd: --max_jobs must be in [1, 4096]\n");
    return 2;
  }
  opts.registry.max_jobs_per_credential = absl::GetFlag(FLAGS_max_jobs_per_credential);
  opts.registry.max_params_per_credential = absl::GetFlag(FLAGS_max_params_per_credential);
  opts.registry.max_world_size = absl::GetFlag(FLAGS_max_world_size);
  opts.max_streams = absl::GetFlag(FLAGS_max_streams);
  opts.attach_timeout_s = absl::GetFlag(FLAGS_attach_timeout_s);
  if (opts.attach_timeout_s < 0) {
    std::fprintf(stderr, "zenflowd: --attach_timeout_s must be >= 0\n");
    return 2;
  }
  if (opts.registry.max_jobs_per_credential < 1 || opts.registry.max_params_per_credential < 1 ||
      opts.registry.max_world_size < 1 || opts.registry.max_world_size > 4096 ||
      opts.max_streams < 1) {
    std::fprintf(stderr,
                 "zenflowd: --max_jobs_per_credential, --max_params_per_credential and "
                 "--max_streams must be >= 1, --max_world_size in [1, 4096]\n");
    return 2;
  }
  if (!absl::GetFlag(FLAGS_admin_token_file).empty()) {
    absl::StatusOr<std::string> admin = zenflow::ReadTokenFile(absl::GetFlag(FLAGS_admin_token_file));
    if (!admin.ok()) {
      std::fprintf(stderr, "zenflowd: --admin_token_file: %s\n",
                   std::string(admin.status().message()).c_str());
      return 2;
    }
    opts.admin_token = *std::move(admin);
  }
  opts.audit_log = absl::GetFlag(FLAGS_audit_log);
  opts.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  opts.state_dir = absl::GetFlag(FLAGS_state_dir);
  opts.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  opts.checkpoint_every_rounds = absl::GetFlag(FLAGS_checkpoint_every_rounds);
  opts.dead_rank_timeout_s = absl::GetFlag(FLAGS_dead_rank_timeout_s);
  if (opts.dead_rank_timeout_s < 0) {
    std::fprintf(stderr, "zenflowd: --dead_rank_timeout_s must be >= 0\n");
    return 2;
  }
  opts.job_idle_ttl_s = absl::GetFlag(FLAGS_job_idle_ttl_s);
  if (!(opts.job_idle_ttl_s >= 0) || opts.job_idle_ttl_s > 1e9) {
    std::fprintf(stderr, "zenflowd: --job_idle_ttl_s must be in [0, 1e9] seconds (0 = never)\n");
    return 2;
  }
  if (opts.checkpoint_keep < 1 || opts.checkpoint_every_rounds < 0) {
    std::fprintf(stderr, "zenflowd: --checkpoint_keep must be >= 1 and --checkpoint_every_rounds >= 0\n");
    return 2;
  }
  opts.admin_socket =
      zenflow::ResolveAdminSocketPath(absl::GetFlag(FLAGS_admin_socket), opts.state_dir);
  opts.admin_socket_optional = absl::GetFlag(FLAGS_admin_socket) == "auto";
  if (!opts.state_dir.empty()) {
    struct stat st;
    if (stat(opts.state_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      std::fprintf(stderr, "zenflowd: --state_dir %s is not a directory\n", opts.state_dir.c_str());
      return 2;
    }
  }
  opts.ucx = absl::GetFlag(FLAGS_ucx);
  opts.ucx_options.tls = absl::GetFlag(FLAGS_ucx_tls);
  opts.ucx_options.net_devices = absl::GetFlag(FLAGS_ucx_net_devices);
  const double emulate_ucx_frame_ms = absl::GetFlag(FLAGS_emulate_ucx_frame_ms);
  if (!(emulate_ucx_frame_ms >= 0 && emulate_ucx_frame_ms <= 10e3)) {
    std::fprintf(stderr, "zenflowd: --emulate_ucx_frame_ms must be in [0, 10000]\n");
    return 2;
  }
  opts.emulate_ucx_frame_seconds = emulate_ucx_frame_ms / 1e3;
  opts.ucx_dispatch_threads = absl::GetFlag(FLAGS_ucx_dispatch_threads);
  if (opts.ucx_dispatch_threads < 1 || opts.ucx_dispatch_threads > 64) {
    std::fprintf(stderr, "zenflowd: --ucx_dispatch_threads must be in [1, 64], not %d\n",
                 opts.ucx_dispatch_threads);
    return 2;
  }
  // TLS (docs/security.md): the files are read and checked once, here.
  const zenflow::TlsPaths tls_paths{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                    absl::GetFlag(FLAGS_tls_ca)};
  if (!tls_paths.ca.empty() && tls_paths.cert.empty()) {
    std::fprintf(stderr,
                 "zenflowd: --tls_ca (client certificates) needs TLS: give --tls_cert and "
                 "--tls_key too\n");
    return 2;
  }
  absl::StatusOr<zenflow::TlsPem> pem =
      zenflow::ReadTlsFiles(tls_paths, {"--tls_cert", "--tls_key", "--tls_ca"});
  if (!pem.ok()) {
    std::fprintf(stderr, "zenflowd: %s\n", std::string(pem.status().message()).c_str());
    return 2;
  }
  opts.tls_cert_pem = std::move(pem->cert);
  opts.tls_key_pem = std::move(pem->key);
  opts.tls_client_ca_pem = std::move(pem->ca);
  opts.allow_insecure = absl::GetFlag(FLAGS_allow_insecure);
  opts.health_listen = absl::GetFlag(FLAGS_health_listen);
  const absl::Status exposure = zenflow::CheckExposure(zenflow::ExposureOf(opts));
  if (!exposure.ok()) {
    std::fprintf(stderr, "zenflowd: %s\n", std::string(exposure.message()).c_str());
    return 2;
  }
  // WATCHDOG_USEC (and WATCHDOG_PID, when set, naming this process) come
  // from systemd's WatchdogSec=. The watchdog's health check dials the
  // server's local socket, made in systemd's RuntimeDirectory= when there
  // is one.
  uint64_t watchdog_usec = 0;
  const bool watchdog_on = sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0;
  opts.local_socket = watchdog_on;
  if (const char* runtime = getenv("RUNTIME_DIRECTORY")) {
    const std::string dirs = runtime;  // several are separated by ':'
    opts.local_socket_parent = dirs.substr(0, dirs.find(':'));
  }
  if (opts.max_message_bytes < (1 << 16) || opts.max_message_bytes > (int64_t{1} << 31) - 1) {
    std::fprintf(stderr, "zenflowd: --max_message_bytes must be in [65536, 2^31)\n");
    return 2;
  }
  if (opts.registry.update_threads < 1 || opts.registry.update_threads > 1024) {
    std::fprintf(stderr, "zenflowd: --update_threads must be in [1, 1024]\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<zenflow::ZenFlowServer>> server =
      zenflow::ZenFlowServer::Start(opts);
  if (!server.ok()) {
    std::fprintf(stderr, "zenflowd: %s\n", server.status().ToString().c_str());
    return 1;
  }
  if ((*server)->metrics_port() != 0) {
    std::fprintf(stderr, "zenflowd: serving metrics on port %d\n", (*server)->metrics_port());
  }
  std::fprintf(stderr,
               "zenflowd: serving zenflow.v1 on port %d (simd=%s, update_threads=%d, "
               "memory budget %.2f GiB, ucx=%s)\n",
               (*server)->port(), zenflow::SimdLevelName((*server)->registry()->simd()),
               (*server)->registry()->update_threads(),
               static_cast<double>((*server)->registry()->memory_budget_bytes()) / (1 << 30),
               (*server)->ucx() != nullptr ? opts.ucx_options.tls.c_str()
                                           : std::string((*server)->ucx_status().message()).c_str());
  zenflow::ExposureConfig served = zenflow::ExposureOf(opts);
  served.ucx = (*server)->ucx() != nullptr;
  // The ports bound, where the flags asked for any (port 0).
  served.listen = zenflow::WithBoundPort(served.listen, (*server)->port());
  served.metrics_listen = zenflow::WithBoundPort(served.metrics_listen, (*server)->metrics_port());
  if (emulate_round_ms > 0) {
    std::fprintf(stderr, "zenflowd: EMULATED round time: every round update takes at least %g ms\n",
                 emulate_round_ms);
  }
  std::fprintf(stderr, "zenflowd: security: %s\n", zenflow::DescribeExposure(served).c_str());
  if (!(*server)->admin_socket_path().empty()) {
    std::fprintf(stderr,
                 "zenflowd: admin socket %s: root and uid %d are the admin there, without a "
                 "token (zfctl)\n",
                 (*server)->admin_socket_path().c_str(), static_cast<int>(geteuid()));
  } else {
    std::fprintf(stderr, "zenflowd: no admin socket%s\n",
                 opts.admin_socket.empty() ? " (--admin_socket: none applies or empty)" : "");
  }
  if ((*server)->health_port() != 0) {
    std::fprintf(stderr,
                 "zenflowd: answering health checks only, in plaintext, on %s (port %d)\n",
                 zenflow::WithBoundPort(opts.health_listen, (*server)->health_port()).c_str(),
                 (*server)->health_port());
  }
  // The port files after the start-up lines, the gRPC port's last: a script
  // or test that waited for the gRPC port file finds the other ports and
  // every start-up line (the security line names the bound ports).
  WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), (*server)->metrics_port());
  WritePortFile(absl::GetFlag(FLAGS_health_port_file), (*server)->health_port());
  WritePortFile(absl::GetFlag(FLAGS_port_file), (*server)->port());
  sd_notify(0, "READY=1");

  absl::Notification stop_watchdog;
  std::thread watchdog;
  if (watchdog_on) {
    const absl::Duration interval = absl::Microseconds(watchdog_usec) / 3;
    const std::string target = (*server)->local_target();
    std::fprintf(stderr, "zenflowd: systemd watchdog: health check on %s every %s\n",
                 target.c_str(), absl::FormatDuration(interval).c_str());
    watchdog = std::thread(WatchdogLoop, target, interval, &stop_watchdog);
  }

  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "zenflowd: signal %d, shutting down\n", sig);
  sd_notify(0, "STOPPING=1");
  stop_watchdog.Notify();
  (*server)->Shutdown();  // a health check in flight now fails at once
  if (zenflow::Checkpointer* cp = (*server)->checkpointer()) {
    // Nothing is lost on a planned stop: every job's state, as of its last
    // finished round, goes to --state_dir before exit.
    absl::StatusOr<zenflow::v1::CheckpointResponse> saved = cp->CheckpointAllNow();
    if (saved.ok()) {
      for (const auto& c : saved->checkpoints()) {
        std::fprintf(stderr, "zenflowd: saved job '%s' (round %lld) to %s\n", c.job_id().c_str(),
                     static_cast<long long>(c.rounds_updated()), c.path().c_str());
      }
    } else {
      std::fprintf(stderr, "zenflowd: checkpoint at shutdown failed: %s\n",
                   saved.status().ToString().c_str());
    }
  }
  if (watchdog.joinable()) watchdog.join();
  server->reset();
  return 0;
}
