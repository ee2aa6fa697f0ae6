// zf_soak (`./zf soak`): a bounded loopback soak of zenflowd. It starts the
// real daemon as a child process on 127.0.0.1, then per transport (gRPC,
// UCX) runs `--jobs` jobs of `--ranks` ranks each for `--rounds` rounds at
// once, every rank a zenflow::Client in its own thread on its own
// connection, with selections and exact state hand-offs along the way. It
// checks that no update was lost or applied twice (every rank received every
// round exactly once; the daemon's final state and every rank's parameters
// equal a reference AdamW computed here, bit for bit), that the daemon's
// resident memory stays flat after warm-up, and that its threads (those of
// gRPC's self-sizing pools within a bound), file descriptors and
// shared-memory mappings are back where they were once the jobs are deleted
// and the clients gone. Results go to --out (JSON) and a table with an ASCII
// RSS curve to stdout; exit status 1 when a check fails.
//
//   bazel build //server:zenflowd //tools:zf_soak
//   bazel-bin/tools/zf_soak --zenflowd=bazel-bin/server/zenflowd --out=bench-results/soak.json
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "tools/child_process.h"
#include "common/adamw.h"
#include "common/json_writer.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "tests/testing/adamw_reference.h"
#include "zenflow/v1/zenflow.pb.h"


ABSL_FLAG(std::string, zenflowd, "bazel-bin/server/zenflowd", "the daemon binary to start");
ABSL_FLAG(std::string, out, "bench-results/soak.json", "write the results as JSON here");
ABSL_FLAG(std::vector<std::string>, transports, std::vector<std::string>({"grpc", "ucx"}),
          "data transports to soak, in order (one pass each, one daemon for all)");
ABSL_FLAG(int, jobs, 2, "jobs per pass, run at once");
ABSL_FLAG(int, ranks, 8, "ranks per job (one thread and one connection each)");
ABSL_FLAG(int, rounds, 200, "rounds per job");
ABSL_FLAG(int, interval, 2, "update_interval S (steps per round)");
ABSL_FLAG(int, tensors, 3, "2-D tensors per job");
ABSL_FLAG(int, rows, 64,
          "rows of each tensor: a multiple of 16, so that every column the daemon updates goes "
          "through its vector kernel whole (no scalar tail: the comparison is bit for bit)");
ABSL_FLAG(int, cols, 256, "columns of each tensor");
ABSL_FLAG(double, topk, 0.25, "topk_ratio: the share of columns kept on the workers");
ABSL_FLAG(int, select_every, 25, "rounds between selections (0: no selection)");
ABSL_FLAG(int, sample_every, 5, "rounds between samples of the daemon's RSS, threads and fds");
ABSL_FLAG(int, warm_round, 20, "RSS growth is measured from the first sample at this round on");
ABSL_FLAG(int, warmup_rounds, 4,
          "rounds of the warm-up pass (every transport, same shape, a selection at round 2) "
          "run before the thread/fd baseline is taken");
ABSL_FLAG(int64_t, rss_bound_bytes, int64_t{8} << 20,
          "allowed RSS growth after warm-up: the larger of this and --rss_bound_ratio x the "
          "warm RSS");
ABSL_FLAG(double, rss_bound_ratio, 0.05, "see --rss_bound_bytes");
ABSL_FLAG(double, settle_s, 10,
          "how long the daemon may take to close streams and threads after the clients left");
ABSL_FLAG(int, update_threads, 2, "the daemon's --update_threads");
ABSL_FLAG(int, grpc_pool_slack, 4,
          "threads gRPC's own timer and executor pools may have gained since the baseline "
          "(they grow to the most ever busy at once and never shrink); every other thread "
          "must be back exactly");

namespace zenflow {
namespace {

using Clock = std::chrono::steady_clock;

// ---- The soak's shape ---------------------------------------------------------

struct Config {
  int jobs = 2;
  int ranks = 8;  // per job
  int rounds = 200;
  int interval = 2;
  int tensors = 3;
  int rows = 64;
  int cols = 256;
  float topk = 0.25f;
  int select_every = 25;
};

std::string TensorName(int ti) { return absl::StrCat("w", ti); }

// The columns a selection keeps on the workers: ceil(k * cols), as the
// daemon counts it (a product within 1e-6 of an integer is that integer).
int64_t ImportantCount(const Config& c) {
  const double product = static_cast<double>(c.topk) * c.cols;
  const double nearest = std::round(product);
  const double exact = std::fabs(product - nearest) <= 1e-6 ? nearest : product;
  return std::min<int64_t>(c.cols, std::max<int64_t>(0, static_cast<int64_t>(std::ceil(exact))));
}

// Selection i (1-based) happens at round i * select_every, if that is
// before the last round. 0: none at this round.
int SelectionAt(const Config& c, int64_t round) {
  if (c.select_every <= 0 || round == 0 || round % c.select_every != 0) return 0;
  return static_cast<int>(round / c.select_every);
}

// The selection in effect at `round` (0: the initial one, every column remote).
int SelectionOf(const Config& c, int64_t round) {
  return c.select_every <= 0 ? 0 : static_cast<int>(round / c.select_every);
}

// A multiplier coprime with cols, so that column -> score is a permutation
// (no ties: the top-k is unique).
int64_t ScoreStride(int64_t cols) {
  for (int64_t p : {97, 89, 83, 79, 73, 71, 67, 61, 59, 53, 47, 43, 41,
                    37, 31, 29, 23, 19, 17, 13, 11, 7,  5,  3,  1}) {
    int64_t a = p, b = cols;
    while (b != 0) std::swap(a %= b, b);
    if (a == 1) return p;
  }
  return 1;
}

// Every rank submits these scores for selection `sel` (the daemon sums them:
// integers, exact in fp32).
std::vector<float> Scores(const Config& c, int sel, int ti) {
  std::vector<float> s(c.cols);
  const int64_t stride = ScoreStride(c.cols);
  for (int64_t col = 0; col < c.cols; ++col) {
    s[col] = static_cast<float>((col * stride + sel * 31 + ti * 13) % c.cols);
  }
  return s;
}

// The important columns (ascending) after selection `sel` (0: none).
std::vector<int32_t> ExpectedImportant(const Config& c, int sel, int ti) {
  std::vector<int32_t> out;
  if (sel == 0) return out;
  const std::vector<float> s = Scores(c, sel, ti);
  const float cut = static_cast<float>(c.cols - ImportantCount(c));  // scores are a permutation
  for (int32_t col = 0; col < c.cols; ++col) {
    if (s[col] >= cut) out.push_back(col);
  }
  return out;
}

std::vector<int32_t> Complement(const std::vector<int32_t>& important, int cols) {
  std::vector<int32_t> out;
  size_t k = 0;
  for (int32_t col = 0; col < cols; ++col) {
    if (k < important.size() && important[k] == col) {
      ++k;
    } else {
      out.push_back(col);
    }
  }
  return out;
}

// Deterministic gradient of element (r, c) of tensor ti at (job, rank, step):
// a multiple of 2^-23 in [-1, 1), times 0.5, 1, 1.5 or 2 by column.
float Grad(int job, int rank, int64_t step, int ti, int64_t r, int64_t c) {
  const uint64_t a = HashRandom((static_cast<uint64_t>(job) << 32) ^ static_cast<uint64_t>(ti));
  const uint64_t b =
      HashRandom(a ^ ((static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(step)));
  const uint64_t h = HashRandom(b ^ ((static_cast<uint64_t>(r) << 32) ^ static_cast<uint64_t>(c)));
  const int32_t q = static_cast<int32_t>(h >> 40) - (1 << 23);
  return static_cast<float>(q) * (1.0f / (1 << 23)) * (0.5f * static_cast<float>(1 + c % 4));
}

float Init(int job, int ti, int64_t r, int64_t c) {
  const uint64_t h = HashRandom((static_cast<uint64_t>(job) << 48) ^
                                (static_cast<uint64_t>(ti) << 40) ^
                                (static_cast<uint64_t>(r) << 20) ^ static_cast<uint64_t>(c));
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * (0.1f / (1 << 23));
}

float LearningRate(int64_t round) { return 1e-3f * (1.0f + 0.25f * static_cast<float>(round % 4)); }

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// ---- The reference optimizer ----------------------------------------------------

// One AdamW step of one element, from the tests' reference
// (tests/testing/adamw_reference.h: torch's AdamW with decoupled weight
// decay; bias corrections in double, rounded to float). `fused` evaluates m, v and the denominator the way the daemon's
// vector kernels do (AVX2/AVX-512: fused multiply-adds, sqrt(v) times
// 1/sqrt(bc2)); otherwise in plain float operations in the written order
// (the daemon's scalar kernel). The last operation, p*decay - update, is
// left to the compiler in the daemon's kernels (GCC's default
// -ffp-contract=fast fuses it into one multiply-subtract when the target has
// FMA), so both are kept: `pf` fused, `p` not. Every operation is an exactly
// rounded IEEE one, so one of the two is bit for bit what the daemon holds.
struct RefStep {
  testing::AdamWRefHyper hyper;
  bool fused = true;

  void Apply(float lr, int64_t t, float grad_scale, float grad, float* p, float* pf, float* m,
             float* v) const {
    const testing::AdamWStepFactors f = testing::AdamWFactors(hyper, lr, t);
    const float g = grad * grad_scale;
    const float update = fused ? testing::AdamWMomentsAndUpdateFused(hyper, f, g, m, v)
                               : testing::AdamWMomentsAndUpdate(hyper, f, g, m, v);
    const float decayed = *p * f.decay;
    *p = decayed - update;
    *pf = std::fma(*pf, f.decay, -update);
  }
};

// A job's exact expected state: row-major values (both ways, see RefStep),
// m, v and per-column counts.
struct RefTensor {
  std::vector<float> p, pf, m, v;
  std::vector<int64_t> count;
};

// Counts the parameter values that differ from each of the reference's two
// ways of rounding the last operation; the daemon must match one of them
// everywhere.
struct ValueTally {
  int64_t compared = 0, off_plain = 0, off_fused = 0;
  std::string first_plain, first_fused;  // the first value off, each way

  // `where` is only evaluated when a value is off.
  template <typename Where>
  void Compare(float got, const RefTensor& t, size_t e, Where where) {
    ++compared;
    if (Bits(got) != Bits(t.p[e]) && off_plain++ == 0) {
      first_plain = absl::StrFormat("%s is %.9g, want %.9g", where(), got, t.p[e]);
    }
    if (Bits(got) != Bits(t.pf[e]) && off_fused++ == 0) {
      first_fused = absl::StrFormat("%s is %.9g, want %.9g", where(), got, t.pf[e]);
    }
  }
  bool exact() const { return off_plain == 0 || off_fused == 0; }
  const char* model() const { return off_fused == 0 ? "fused" : off_plain == 0 ? "plain" : "none"; }
};

// ---- The daemon process and /proc -----------------------------------------------

struct ProcSample {
  int64_t rss = -1;  // bytes
  int threads = -1;
  int fds = -1;
};

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      out.push_back(e->d_name);
    }
  }
  closedir(d);
  return out;
}

ProcSample Sample(pid_t pid) {
  ProcSample s;
  s.rss = ResidentBytes(pid);
  s.threads = static_cast<int>(ListDir(absl::StrCat("/proc/", pid, "/task")).size());
  s.fds = static_cast<int>(ListDir(absl::StrCat("/proc/", pid, "/fd")).size());
  return s;
}

// The daemon's resident memory by kind (/proc/<pid>/status) and its
// mappings by what backs them (/proc/<pid>/smaps: the path with digits as
// '#', "[anon]" for none), with their resident bytes: where RSS went.
struct MemDetail {
  int64_t anon = -1, file = -1, shmem = -1;             // RssAnon, RssFile, RssShmem, bytes
  std::map<std::string, std::pair<int, int64_t>> maps;  // kind -> (mappings, resident bytes)
};

MemDetail ReadMemDetail(pid_t pid) {
  MemDetail d;
  {
    std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
    std::string key;
    while (in >> key) {
      int64_t* field = key == "RssAnon:"    ? &d.anon
                       : key == "RssFile:"  ? &d.file
                       : key == "RssShmem:" ? &d.shmem
                                            : nullptr;
      if (field != nullptr) {
        in >> *field;
        *field *= 1024;
      }
      std::getline(in, key);
    }
  }
  std::ifstream in(absl::StrCat("/proc/", pid, "/smaps"));
  std::string line, kind;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // A mapping's header starts with its address range ("7f...-7f... ").
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      std::istringstream h(line);
      std::string range, perms, offset, dev, inode, path;
      h >> range >> perms >> offset >> dev >> inode;
      std::getline(h, path);
      path.erase(0, path.find_first_not_of(' '));
      kind.clear();
      for (char c : path.empty() ? std::string("[anon]") : path) {
        if (c >= '0' && c <= '9') {
          if (kind.empty() || kind.back() != '#') kind += '#';
        } else {
          kind += c;
        }
      }
      ++d.maps[kind].first;
    } else if (line.rfind("Rss:", 0) == 0 && !kind.empty()) {
      d.maps[kind].second += std::atoll(line.c_str() + 4) * 1024;
    }
  }
  return d;
}

// Mappings of shared memory (what UCX's shared-memory transports attach:
// SysV segments, POSIX shm, memfds): one connection's must go when it closes.
int SharedMappings(const MemDetail& d) {
  int n = 0;
  for (const auto& [kind, v] : d.maps) {
    if (kind.rfind("/SYSV", 0) == 0 || kind.rfind("/dev/shm/", 0) == 0 ||
        kind.rfind("/memfd:", 0) == 0) {
      n += v.first;
    }
  }
  return n;
}

// "+16 /dev/shm/x# (+8.3 MiB resident)": the mapping kinds whose number or
// resident size changed by at least 64 KiB.
std::string MapsDiff(const MemDetail& base, const MemDetail& now) {
  std::vector<std::string> parts;
  std::map<std::string, std::pair<int, int64_t>> all = base.maps;
  for (const auto& [k, v] : now.maps) all.emplace(k, std::make_pair(0, int64_t{0}));
  for (const auto& [k, unused] : all) {
    const auto b = base.maps.find(k);
    const auto c = now.maps.find(k);
    const int dn =
        (c == now.maps.end() ? 0 : c->second.first) - (b == base.maps.end() ? 0 : b->second.first);
    const int64_t dr = (c == now.maps.end() ? 0 : c->second.second) -
                       (b == base.maps.end() ? 0 : b->second.second);
    if (dn != 0 || std::llabs(dr) >= (64 << 10)) {
      parts.push_back(absl::StrFormat("%+d %s (%+.2f MiB resident)", dn, k,
                                      static_cast<double>(dr) / (1 << 20)));
    }
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

// What the daemon's fds point at and what its threads are called, counted
// by kind ("socket", "anon_inode:[eventfd]", a path; thread names), to say
// what leaked when a count differs from the baseline.
std::map<std::string, int> FdKinds(pid_t pid) {
  std::map<std::string, int> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd/");
  for (const std::string& fd : ListDir(dir)) {
    char buf[512];
    const ssize_t n = readlink((dir + fd).c_str(), buf, sizeof(buf) - 1);
    if (n < 0) continue;
    std::string target(buf, static_cast<size_t>(n));
    const size_t bracket = target.find(":[");
    if (bracket != std::string::npos && target.back() == ']' &&
        target.find_first_not_of("0123456789", bracket + 2) == target.size() - 1) {
      target = target.substr(0, bracket);  // socket:[12345] -> socket
    }
    ++out[target];
  }
  return out;
}

std::map<std::string, int> ThreadNames(pid_t pid) {
  std::map<std::string, int> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/task/");
  for (const std::string& tid : ListDir(dir)) {
    std::ifstream in(dir + tid + "/comm");
    std::string name;
    std::getline(in, name);
    ++out[name];
  }
  return out;
}

// gRPC's own thread pools (names as /proc shows them, cut to 15
// characters): its timer manager starts another "grpc_global_timer" thread
// whenever every one it has is running timer callbacks, and its executor
// another "default-executor" thread when all are busy; neither pool ever
// retires a thread before the process ends (grpc's timer_manager.cc,
// executor.cc). Their size is the most that were ever busy at once, a
// high-water mark of load, not a resource of a job or a connection; the
// soak bounds their growth (--grpc_pool_slack) instead of asking for exact
// equality.
bool IsGrpcPoolThread(const std::string& name) {
  return name == "grpc_global_tim" || name == "default-executo";
}

// Threads in (pool = true) or outside gRPC's pools.
int CountThreads(const std::map<std::string, int>& names, bool pool) {
  int n = 0;
  for (const auto& [name, count] : names) {
    if (IsGrpcPoolThread(name) == pool) n += count;
  }
  return n;
}

// "+2 socket, -1 ucx-progress": what `now` has more or fewer of than `base`.
std::string Diff(const std::map<std::string, int>& base, const std::map<std::string, int>& now) {
  std::vector<std::string> parts;
  std::map<std::string, int> all = base;
  for (const auto& [k, n] : now) all.emplace(k, 0);
  for (const auto& [k, unused] : all) {
    const auto b = base.find(k);
    const auto c = now.find(k);
    const int d = (c == now.end() ? 0 : c->second) - (b == base.end() ? 0 : b->second);
    if (d != 0) parts.push_back(absl::StrFormat("%+d %s", d, k));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}


// ---- One rank ---------------------------------------------------------------------

// What a rank saw, for the checks after the pass.
struct RankResult {
  std::string error;                         // the first failure; empty: none
  std::vector<int> round_count;              // deliveries of each round
  std::vector<uint64_t> round_digest;        // of each round's deltas
  std::vector<uint64_t> selection_digest;    // per selection: the Selection
  std::vector<uint64_t> joining_digest;      // per selection: the HandOffResponse
  std::vector<v1::Selection> selections;     // rank 0 only
  std::vector<v1::HandOffResponse> joining;  // rank 0 only
  std::vector<v1::ColumnState> final_state;  // rank 0 only: GetState per tensor
  std::vector<std::vector<float>> params;    // the rank's values: init, then every delta applied
  ClientStats stats;
  int64_t deltas_applied = 0;
};

// What the ranks of one job share.
struct JobShared {
  int index = 0;
  std::string id;
  std::string token;
  v1::JobSpec spec;
  bool delete_while_attached = false;  // odd jobs: DeleteJob before the other ranks close
  std::mutex mu;
  std::condition_variable cv;
  bool uploaded = false;  // rank 0 created the job and uploaded (or failed: upload_failed)
  bool upload_failed = false;
  int finished = 0;      // ranks other than 0 done with their rounds
  bool deleted = false;  // rank 0 deleted the job (or gave up)
};

class Rank {
 public:
  Rank(const Config& cfg, JobShared* job, int rank, Transport transport, const std::string& target,
       int global_index, std::atomic<int>* progress, RankResult* out)
      : cfg_(cfg),
        job_(job),
        rank_(rank),
        transport_(transport),
        target_(target),
        global_index_(global_index),
        progress_(progress),
        out_(out) {}

  void Run() {
    out_->round_count.assign(cfg_.rounds, 0);
    out_->round_digest.assign(cfg_.rounds, 0);
    out_->params.resize(cfg_.tensors);
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      std::vector<float>& p = out_->params[ti];
      p.resize(static_cast<size_t>(cfg_.rows) * cfg_.cols);
      for (int r = 0; r < cfg_.rows; ++r) {
        for (int c = 0; c < cfg_.cols; ++c) p[r * cfg_.cols + c] = Init(job_->index, ti, r, c);
      }
    }
    absl::Status s = Drive();
    if (!s.ok()) Fail(s);
    if (client_ != nullptr) out_->stats = client_->stats();
    Finish();
    std::lock_guard<std::mutex> lock(mu_);
    if (out_->error.empty() && !error_.empty()) out_->error = error_;
  }

 private:
  void Fail(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty())
      error_ = absl::StrCat("job ", job_->id, " rank ", rank_, ": ", s.ToString());
    cv_.notify_all();
  }

  absl::Status Drive() {
    ClientOptions co;
    co.target = target_;
    co.token = job_->token;
    co.transport = transport_;
    // gRPC pools channels with identical arguments onto one connection:
    // a different (and harmless) size limit per rank gives each its own.
    co.max_message_bytes = (int64_t{1} << 30) - global_index_;
    co.max_shard_bytes = 16 << 10;  // several shards per tensor and step
    co.rpc_timeout = absl::Seconds(120);
    co.selection_timeout = absl::Seconds(120);
    ZF_ASSIGN_OR_RETURN(client_, Client::Connect(co));
    // The callback runs on the client's receive thread, which the client's
    // destructor ends: it may still run while client_ is being reset, so it
    // is given the client itself.
    Client* client = client_.get();
    client_->SetRoundCallback([this, client](RoundUpdate u) { OnRound(client, std::move(u)); });
    if (rank_ == 0) {
      absl::Status s = CreateAndUpload();
      {
        std::lock_guard<std::mutex> lock(job_->mu);
        job_->uploaded = true;
        job_->upload_failed = !s.ok();
      }
      job_->cv.notify_all();
      ZF_RETURN_IF_ERROR(s);
    } else {
      std::unique_lock<std::mutex> lock(job_->mu);
      if (!job_->cv.wait_for(lock, std::chrono::seconds(120), [&] { return job_->uploaded; })) {
        return absl::DeadlineExceededError("rank 0 did not create the job within 120 s");
      }
      if (job_->upload_failed) return absl::AbortedError("rank 0 failed to create the job");
    }
    ZF_ASSIGN_OR_RETURN(v1::JoinJobResponse joined, client_->JoinJob(job_->id, rank_));
    if (joined.selection().version() != 0) {
      return absl::InternalError(
          absl::StrCat("joined at selection ", joined.selection().version(), ", want 0"));
    }
    important_.assign(cfg_.tensors, {});
    held_.assign(cfg_.tensors, v1::ColumnState());
    std::vector<std::vector<int32_t>> remote(cfg_.tensors);
    for (int ti = 0; ti < cfg_.tensors; ++ti) remote[ti] = Complement({}, cfg_.cols);
    int64_t version = 0;
    std::vector<float> colmajor;
    for (int64_t round = 0; round < cfg_.rounds; ++round) {
      if (const int sel = SelectionAt(cfg_, round); sel > 0) {
        ZF_ASSIGN_OR_RETURN(version, Select(round, sel));
        for (int ti = 0; ti < cfg_.tensors; ++ti)
          remote[ti] = Complement(important_[ti], cfg_.cols);
      }
      for (int s = 0; s < cfg_.interval; ++s) {
        const int64_t step = round * cfg_.interval + s;
        for (int ti = 0; ti < cfg_.tensors; ++ti) {
          const std::vector<int32_t>& cols = remote[ti];
          colmajor.resize(cols.size() * cfg_.rows);
          for (size_t i = 0; i < cols.size(); ++i) {
            for (int r = 0; r < cfg_.rows; ++r) {
              colmajor[i * cfg_.rows + r] = Grad(job_->index, rank_, step, ti, r, cols[i]);
            }
          }
          ZF_RETURN_IF_ERROR(client_->PushColumns(step, TensorName(ti), version, cols,
                                                  colmajor.data(), cfg_.rows, DType::kF32));
        }
      }
      ZF_RETURN_IF_ERROR(client_->CloseRound(round, LearningRate(round)));
      if (round >= 1) ZF_RETURN_IF_ERROR(WaitDelivered(round - 1));
      ZF_RETURN_IF_ERROR(CheckNoErrors());
    }
    ZF_RETURN_IF_ERROR(WaitDelivered(cfg_.rounds - 1));
    ZF_RETURN_IF_ERROR(CheckNoErrors());
    if (std::optional<RoundUpdate> extra = client_->PollRound()) {
      return absl::InternalError(absl::StrCat("round ", extra->round, " queued after the last"));
    }
    ZF_RETURN_IF_ERROR(client_->stream_status());
    if (rank_ == 0) {
      for (int ti = 0; ti < cfg_.tensors; ++ti) {
        ZF_ASSIGN_OR_RETURN(v1::ColumnState st, client_->GetState(job_->id, TensorName(ti)));
        out_->final_state.push_back(std::move(st));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CreateAndUpload() {
    ZF_ASSIGN_OR_RETURN(v1::JobSpec spec, client_->CreateJob(job_->spec));
    if (spec.wire_dtype() != v1::DTYPE_FP32 || !spec.rank_ordered_sums()) {
      return absl::InternalError("the daemon changed the job's wire dtype or summation");
    }
    if (client_->token() != job_->token) {
      return absl::InternalError("the daemon answered CreateJob with a token other than ours");
    }
    std::vector<Client::TensorValues> values;
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      values.push_back({TensorName(ti), {cfg_.rows, cfg_.cols}, out_->params[ti].data()});
    }
    return client_->UploadParameters(job_->id, values).status();
  }

  // Selection `sel` at `round`: importance, then the exact hand-off of the
  // columns leaving and joining this rank's important set. Returns the
  // selection's version.
  absl::StatusOr<int64_t> Select(int64_t round, int sel) {
    std::vector<v1::TensorImportance> imp(cfg_.tensors);
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      imp[ti].set_tensor(TensorName(ti));
      for (float s : Scores(cfg_, sel, ti)) imp[ti].add_scores(s);
    }
    ZF_ASSIGN_OR_RETURN(v1::Selection selection,
                        client_->SubmitImportance(round * cfg_.interval, imp));
    out_->selection_digest.push_back(
        Fnv(kFnvBasis, selection.SerializeAsString().data(), selection.ByteSizeLong()));
    if (rank_ == 0) out_->selections.push_back(selection);
    std::vector<std::vector<int32_t>> next(cfg_.tensors);
    for (const v1::ColumnSet& cs : selection.important()) {
      for (int ti = 0; ti < cfg_.tensors; ++ti) {
        if (cs.tensor() == TensorName(ti))
          next[ti].assign(cs.columns().begin(), cs.columns().end());
      }
    }
    // Leaving: the state this rank holds for columns it kept (unchanged
    // since they joined: the soak's workers do not update them).
    std::vector<v1::ColumnState> leaving;
    std::vector<v1::ColumnState> kept(cfg_.tensors);
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      const v1::ColumnState& h = held_[ti];
      v1::ColumnState out, stay;
      out.set_tensor(TensorName(ti));
      stay.set_tensor(TensorName(ti));
      for (int i = 0; i < h.columns_size(); ++i) {
        const bool stays = std::binary_search(next[ti].begin(), next[ti].end(), h.columns(i));
        v1::ColumnState& dst = stays ? stay : out;
        dst.add_columns(h.columns(i));
        for (int r = 0; r < cfg_.rows; ++r) {
          dst.add_values(h.values(i * cfg_.rows + r));
          dst.add_m(h.m(i * cfg_.rows + r));
          dst.add_v(h.v(i * cfg_.rows + r));
        }
        dst.add_update_counts(h.update_counts(i));
      }
      if (out.columns_size() > 0) leaving.push_back(std::move(out));
      kept[ti] = std::move(stay);
    }
    ZF_ASSIGN_OR_RETURN(v1::HandOffResponse resp, client_->HandOff(selection.version(), leaving));
    out_->joining_digest.push_back(
        Fnv(kFnvBasis, resp.SerializeAsString().data(), resp.ByteSizeLong()));
    // The joining columns' values must be what this rank's deltas left,
    // once the last round's deltas are here (the selection waited for its
    // update on the daemon, not for its deltas to reach this rank).
    ZF_RETURN_IF_ERROR(WaitDelivered(round - 1));
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const v1::ColumnState& cs : resp.joining()) {
        const int ti = TensorIndex(cs.tensor());
        if (ti < 0 || cs.values_size() != cs.columns_size() * cfg_.rows) {
          return absl::InternalError("a malformed joining state");
        }
        for (int i = 0; i < cs.columns_size(); ++i) {
          for (int r = 0; r < cfg_.rows; ++r) {
            const float want = out_->params[ti][r * cfg_.cols + cs.columns(i)];
            if (Bits(cs.values(i * cfg_.rows + r)) != Bits(want)) {
              return absl::InternalError(absl::StrCat("selection ", sel, ": joining value of ",
                                                      cs.tensor(), "[", r, ", ", cs.columns(i),
                                                      "] is ", cs.values(i * cfg_.rows + r),
                                                      ", the rank's deltas left ", want));
            }
          }
        }
      }
    }
    // Held from now on: kept plus joining, by column.
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      std::map<int32_t, std::pair<const v1::ColumnState*, int>> by_col;
      for (int i = 0; i < kept[ti].columns_size(); ++i)
        by_col[kept[ti].columns(i)] = {&kept[ti], i};
      for (const v1::ColumnState& cs : resp.joining()) {
        if (cs.tensor() != TensorName(ti)) continue;
        for (int i = 0; i < cs.columns_size(); ++i) by_col[cs.columns(i)] = {&cs, i};
      }
      v1::ColumnState h;
      h.set_tensor(TensorName(ti));
      std::vector<int32_t> cols;
      for (const auto& [col, src] : by_col) {
        cols.push_back(col);
        h.add_columns(col);
        for (int r = 0; r < cfg_.rows; ++r) {
          h.add_values(src.first->values(src.second * cfg_.rows + r));
          h.add_m(src.first->m(src.second * cfg_.rows + r));
          h.add_v(src.first->v(src.second * cfg_.rows + r));
        }
        h.add_update_counts(src.first->update_counts(src.second));
      }
      if (cols != next[ti]) {
        return absl::InternalError(absl::StrCat("selection ", sel, ", tensor ", TensorName(ti),
                                                ": kept + joining columns differ from the "
                                                "selection's important set"));
      }
      held_[ti] = std::move(h);
      important_[ti] = std::move(next[ti]);
    }
    if (rank_ == 0) out_->joining.push_back(std::move(resp));
    return selection.version();
  }

  int TensorIndex(const std::string& name) const {
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      if (name == TensorName(ti)) return ti;
    }
    return -1;
  }

  // Runs on the client's receive thread: counts, checks and applies a round.
  void OnRound(Client* client, RoundUpdate u) {
    std::lock_guard<std::mutex> lock(mu_);
    auto fail = [&](const std::string& why) {
      if (error_.empty()) error_ = absl::StrCat("job ", job_->id, " rank ", rank_, ": ", why);
      cv_.notify_all();
    };
    if (u.round < 0 || u.round >= cfg_.rounds)
      return fail(absl::StrCat("round ", u.round, " received"));
    if (++out_->round_count[u.round] > 1)
      return fail(absl::StrCat("round ", u.round, " received twice"));
    if (u.round != next_round_) {
      return fail(
          absl::StrCat("round ", u.round, " received while round ", next_round_, " was due"));
    }
    if (u.done.skipped_nonfinite()) return fail(absl::StrCat("round ", u.round, " was skipped"));
    if (u.done.delta_messages() != static_cast<int>(u.deltas.size())) {
      return fail(absl::StrCat("round ", u.round, ": ", u.deltas.size(), " deltas, RoundDone says ",
                               u.done.delta_messages()));
    }
    const int sel = SelectionOf(cfg_, u.round);
    if (u.done.selection_version() != sel) {
      return fail(absl::StrCat("round ", u.round, " at selection ", u.done.selection_version(),
                               ", want ", sel));
    }
    std::vector<std::vector<char>> seen(cfg_.tensors, std::vector<char>(cfg_.cols, 0));
    uint64_t digest = kFnvBasis;
    for (v1::ParameterDelta& d : u.deltas) {
      const int ti = TensorIndex(d.tensor());
      const size_t want_bytes = static_cast<size_t>(d.columns_size()) * cfg_.rows * 4;
      if (ti < 0 || d.round() != u.round || d.dtype() != v1::DTYPE_FP32 ||
          (d.kind() != v1::DELTA_VALUES && d.kind() != v1::DELTA_UNSPECIFIED) ||
          d.payload().size() != want_bytes) {
        return fail(absl::StrCat("round ", u.round, ": an unexpected delta (tensor '", d.tensor(),
                                 "', ", d.columns_size(), " columns, ", d.payload().size(),
                                 " bytes)"));
      }
      digest = Fnv(digest, d.tensor().data(), d.tensor().size());
      digest = Fnv(digest, d.columns().data(), d.columns_size() * sizeof(int32_t));
      digest = Fnv(digest, d.payload().data(), d.payload().size());
      std::vector<float>& p = out_->params[ti];
      for (int i = 0; i < d.columns_size(); ++i) {
        const int32_t c = d.columns(i);
        if (c < 0 || c >= cfg_.cols || seen[ti][c]++ != 0) {
          return fail(absl::StrCat("round ", u.round, ": column ", c, " of ", d.tensor(),
                                   " out of range or sent twice"));
        }
        for (int r = 0; r < cfg_.rows; ++r) {
          float x;
          std::memcpy(&x, d.payload().data() + (static_cast<size_t>(i) * cfg_.rows + r) * 4, 4);
          p[static_cast<size_t>(r) * cfg_.cols + c] = x;
        }
      }
      ++out_->deltas_applied;
      if (transport_ == Transport::kUcx) client->Recycle(std::move(*d.mutable_payload()));
    }
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      const std::vector<int32_t> important = ExpectedImportant(cfg_, sel, ti);
      for (int c = 0; c < cfg_.cols; ++c) {
        const bool remote = !std::binary_search(important.begin(), important.end(), c);
        if (seen[ti][c] != (remote ? 1 : 0)) {
          return fail(absl::StrCat("round ", u.round, ": column ", c, " of ", TensorName(ti),
                                   remote ? " (remote) missing" : " (important) sent"));
        }
      }
    }
    out_->round_digest[u.round] = digest;
    next_round_ = u.round + 1;
    progress_->store(static_cast<int>(next_round_), std::memory_order_relaxed);
    cv_.notify_all();
  }

  absl::Status WaitDelivered(int64_t round) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool ok = cv_.wait_for(lock, std::chrono::seconds(120),
                                 [&] { return next_round_ > round || !error_.empty(); });
    if (!error_.empty()) return absl::InternalError(error_);
    if (!ok) {
      lock.unlock();
      return absl::DeadlineExceededError(absl::StrCat(
          "round ", round,
          " not received within 120 s (stream: ", client_->stream_status().ToString(), ")"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckNoErrors() {
    std::vector<absl::Status> errors = client_->TakeErrors();
    if (errors.empty()) return absl::OkStatus();
    return absl::Status(errors[0].code(),
                        absl::StrCat("the daemon rejected ", errors.size(),
                                     " message(s), first: ", errors[0].message()));
  }

  // The end: rank 0 deletes the job; the clients go. Even jobs close their
  // other ranks first, odd ones delete while those are still attached.
  void Finish() {
    if (rank_ != 0) {
      if (!job_->delete_while_attached) client_.reset();
      std::unique_lock<std::mutex> lock(job_->mu);
      ++job_->finished;
      job_->cv.notify_all();
      if (job_->delete_while_attached) {
        job_->cv.wait_for(lock, std::chrono::seconds(240), [&] { return job_->deleted; });
        lock.unlock();
        client_.reset();
      }
      return;
    }
    {
      std::unique_lock<std::mutex> lock(job_->mu);
      if (!job_->cv.wait_for(lock, std::chrono::seconds(240),
                             [&] { return job_->finished == cfg_.ranks - 1; })) {
        lock.unlock();
        Fail(absl::DeadlineExceededError("the other ranks did not finish within 240 s"));
      }
    }
    if (client_ != nullptr) {
      absl::Status s = client_->DeleteJob(job_->id);
      if (!s.ok()) Fail(s);
    }
    {
      std::lock_guard<std::mutex> lock(job_->mu);
      job_->deleted = true;
    }
    job_->cv.notify_all();
    client_.reset();
  }

  const Config& cfg_;
  JobShared* const job_;
  const int rank_;
  const Transport transport_;
  const std::string target_;
  const int global_index_;
  std::atomic<int>* const progress_;
  RankResult* const out_;
  std::unique_ptr<Client> client_;
  std::vector<std::vector<int32_t>> important_;  // per tensor, ascending
  std::vector<v1::ColumnState> held_;            // their state, as handed to this rank

  std::mutex mu_;  // guards what OnRound touches: out_'s rounds and params, error_
  std::condition_variable cv_;
  int64_t next_round_ = 0;
  std::string error_;
};

// ---- Checks against the reference ----------------------------------------------------

// What CheckJob found.
struct JobCheck {
  std::vector<std::string> failures;  // empty: every check held
  std::string model;  // the rounding of p*decay - update the daemon matched: fused or plain
  int64_t values_compared = 0;  // parameter values compared bit for bit
};

// Replays job `job`'s rounds on the reference and compares every rank's
// record with it.
JobCheck CheckJob(const Config& cfg, int job, const std::vector<RankResult>& ranks,
                  const RefStep& adam) {
  JobCheck out;
  std::vector<std::string>& bad = out.failures;
  auto note = [&](std::string s) {
    if (bad.size() < 20) bad.push_back(std::move(s));
  };
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].error.empty()) note(ranks[r].error);
  }
  if (!bad.empty()) return out;
  const RankResult& r0 = ranks[0];
  // Every round delivered once to every rank, the same deltas everywhere.
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (int i = 0; i < cfg.rounds; ++i) {
      if (ranks[r].round_count[i] != 1) {
        note(absl::StrCat("rank ", r, " received round ", i, " ", ranks[r].round_count[i],
                          " times"));
      }
    }
    if (ranks[r].round_digest != r0.round_digest) {
      note(absl::StrCat("rank ", r, "'s deltas differ from rank 0's"));
    }
    if (ranks[r].selection_digest != r0.selection_digest ||
        ranks[r].joining_digest != r0.joining_digest) {
      note(absl::StrCat("rank ", r, "'s selections or joining states differ from rank 0's"));
    }
    const ClientStats& s = ranks[r].stats;
    if (s.rounds_received != cfg.rounds || s.rounds_dropped_duplicate != 0 ||
        s.deltas_received != ranks[r].deltas_applied || s.reconnects != 0) {
      note(absl::StrCat("rank ", r, ": client counted ", s.rounds_received, " rounds, ",
                        s.rounds_dropped_duplicate, " duplicates, ", s.deltas_received, " deltas (",
                        ranks[r].deltas_applied, " applied), ", s.reconnects, " reconnects"));
    }
  }
  // The reference: each round's gradient summed rank by rank (each rank's
  // steps first), as the job's rank_ordered_sums makes the daemon do.
  std::vector<RefTensor> ref(cfg.tensors);
  for (int ti = 0; ti < cfg.tensors; ++ti) {
    RefTensor& t = ref[ti];
    const size_t n = static_cast<size_t>(cfg.rows) * cfg.cols;
    t.p.resize(n);
    t.m.assign(n, 0.0f);
    t.v.assign(n, 0.0f);
    t.count.assign(cfg.cols, 0);
    for (int r = 0; r < cfg.rows; ++r) {
      for (int c = 0; c < cfg.cols; ++c) t.p[r * cfg.cols + c] = Init(job, ti, r, c);
    }
    t.pf = t.p;
  }
  ValueTally values;
  // m, v and counts do not depend on how p's last operation rounds: exact.
  auto check_state = [&](const std::string& what, const RefTensor& t, const v1::ColumnState& cs,
                         int i, int32_t c) {
    if (cs.update_counts(i) != t.count[c]) {
      note(absl::StrCat(what, ": count of ", cs.tensor(), " column ", c, " is ",
                        cs.update_counts(i), ", want ", t.count[c]));
    }
    for (int r = 0; r < cfg.rows; ++r) {
      const size_t e = static_cast<size_t>(r) * cfg.cols + c;
      const int k = i * cfg.rows + r;
      values.Compare(cs.values(k), t, e,
                     [&] { return absl::StrCat(what, ": ", cs.tensor(), "[", r, ", ", c, "]"); });
      if (Bits(cs.m(k)) != Bits(t.m[e]) || Bits(cs.v(k)) != Bits(t.v[e])) {
        note(absl::StrFormat("%s: m, v of %s[%d, %d] are (%.9g, %.9g), want (%.9g, %.9g)", what,
                             cs.tensor(), r, c, cs.m(k), cs.v(k), t.m[e], t.v[e]));
        return;
      }
    }
  };
  const float grad_scale =
      static_cast<float>(1.0 / (static_cast<double>(cfg.ranks) * cfg.interval));
  std::vector<std::vector<int32_t>> important(cfg.tensors);
  size_t sel_seen = 0;
  for (int64_t round = 0; round < cfg.rounds; ++round) {
    if (const int sel = SelectionAt(cfg, round); sel > 0) {
      if (sel_seen >= r0.selections.size() || sel_seen >= r0.joining.size()) {
        note(absl::StrCat("selection ", sel, " missing from rank 0's record"));
        return out;
      }
      const v1::Selection& got = r0.selections[sel_seen];
      const v1::HandOffResponse& joining = r0.joining[sel_seen];
      ++sel_seen;
      if (got.version() != sel) {
        note(absl::StrCat("selection ", sel, " has version ", got.version()));
      }
      std::vector<std::vector<int32_t>> next(cfg.tensors);
      for (int ti = 0; ti < cfg.tensors; ++ti) next[ti] = ExpectedImportant(cfg, sel, ti);
      for (const v1::ColumnSet& cs : got.important()) {
        for (int ti = 0; ti < cfg.tensors; ++ti) {
          if (cs.tensor() == TensorName(ti) && !std::equal(cs.columns().begin(), cs.columns().end(),
                                                           next[ti].begin(), next[ti].end())) {
            note(absl::StrCat("selection ", sel, ", ", cs.tensor(),
                              ": not the top-k of the summed scores"));
          }
        }
      }
      // Joining columns carry the reference's state exactly.
      int64_t joined = 0;
      const std::string what = absl::StrCat("selection ", sel, " joining state");
      for (const v1::ColumnState& cs : joining.joining()) {
        int ti = 0;
        while (ti < cfg.tensors && cs.tensor() != TensorName(ti)) ++ti;
        if (ti == cfg.tensors) {
          note("joining state of an unknown tensor");
          continue;
        }
        for (int i = 0; i < cs.columns_size(); ++i) {
          const int32_t c = cs.columns(i);
          ++joined;
          if (std::binary_search(important[ti].begin(), important[ti].end(), c) ||
              !std::binary_search(next[ti].begin(), next[ti].end(), c)) {
            note(absl::StrCat("selection ", sel, ": column ", c, " of ", cs.tensor(),
                              " is not joining"));
            continue;
          }
          check_state(what, ref[ti], cs, i, c);
        }
      }
      int64_t want_joined = 0;
      for (int ti = 0; ti < cfg.tensors; ++ti) {
        for (int32_t c : next[ti]) {
          want_joined += std::binary_search(important[ti].begin(), important[ti].end(), c) ? 0 : 1;
        }
      }
      if (joined != want_joined) {
        note(absl::StrCat("selection ", sel, ": ", joined, " joining columns, want ", want_joined));
      }
      important = std::move(next);
    }
    const float lr = LearningRate(round);
    for (int ti = 0; ti < cfg.tensors; ++ti) {
      RefTensor& t = ref[ti];
      for (int32_t c : Complement(important[ti], cfg.cols)) {
        const int64_t count = ++t.count[c];
        for (int r = 0; r < cfg.rows; ++r) {
          float total = 0.0f;
          for (int rank = 0; rank < cfg.ranks; ++rank) {
            float s = 0.0f;
            for (int st = 0; st < cfg.interval; ++st) {
              s += Grad(job, rank, round * cfg.interval + st, ti, r, c);
            }
            total = rank == 0 ? s : total + s;
          }
          const size_t e = static_cast<size_t>(r) * cfg.cols + c;
          adam.Apply(lr, count, grad_scale, total, &t.p[e], &t.pf[e], &t.m[e], &t.v[e]);
        }
      }
    }
  }
  // The daemon's final state of its columns.
  if (static_cast<int>(r0.final_state.size()) != cfg.tensors) {
    note("rank 0 read no final state");
  } else {
    for (int ti = 0; ti < cfg.tensors; ++ti) {
      const v1::ColumnState& cs = r0.final_state[ti];
      const std::vector<int32_t> remote = Complement(important[ti], cfg.cols);
      if (cs.tensor() != TensorName(ti) ||
          !std::equal(cs.columns().begin(), cs.columns().end(), remote.begin(), remote.end()) ||
          cs.values_size() != cs.columns_size() * cfg.rows || cs.m_size() != cs.values_size() ||
          cs.v_size() != cs.values_size() || cs.update_counts_size() != cs.columns_size()) {
        note(absl::StrCat("final state of ", cs.tensor(), ": not the remote columns"));
        continue;
      }
      for (int i = 0; i < cs.columns_size(); ++i) {
        check_state("final daemon state", ref[ti], cs, i, cs.columns(i));
      }
    }
  }
  // Every rank's parameters (every delta applied; the important columns as
  // they were when they joined) equal the reference's.
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (int ti = 0; ti < cfg.tensors; ++ti) {
      const std::vector<float>& p = ranks[r].params[ti];
      for (size_t e = 0; e < p.size(); ++e) {
        values.Compare(p[e], ref[ti], e, [&] {
          return absl::StrCat("rank ", r, "'s ", TensorName(ti), "[", e / cfg.cols, ", ",
                              e % cfg.cols, "]");
        });
      }
    }
  }
  out.model = values.model();
  out.values_compared = values.compared;
  if (!values.exact()) {
    note(absl::StrCat(values.off_fused, " of ", values.compared,
                      " parameter values differ from the reference with p*decay - update fused "
                      "(first: ",
                      values.first_fused, "), ", values.off_plain,
                      " without (first: ", values.first_plain, ")"));
  }
  return out;
}

// ---- A pass: every job of one transport ------------------------------------------------

struct PassResult {
  std::string transport;
  double seconds = 0;
  std::vector<std::pair<int, ProcSample>> samples;  // (rounds every rank has, sample)
  ProcSample peak;  // largest threads and fds seen while the jobs ran
  ProcSample end;   // after the jobs were deleted and the clients gone, settled
  double settle_seconds = 0;
  std::string thread_diff, fd_diff;   // end vs baseline, by kind
  MemDetail mem_before, mem_end;      // just before the pass, and at its end
  std::string maps_diff;              // mem_end vs mem_before
  int own_threads_end = -1;           // outside gRPC's pools
  int pool_threads_end = -1;          // in them
  std::vector<std::string> failures;  // correctness
  std::vector<std::string> models;    // per job: see JobCheck::model
  int64_t values_compared = 0;
  int64_t rss_warm = -1, rss_max_after_warm = -1, rss_growth = 0, rss_bound = 0;
  int warm_sample_round = -1;
  bool exact = false, rss_flat = false, threads_back = false, fds_back = false, connections = false,
       shm_back = false;
};

absl::StatusOr<v1::JobSpec> MakeSpec(const Config& cfg, const std::string& id) {
  v1::JobSpec spec;
  spec.set_job_id(id);
  for (int ti = 0; ti < cfg.tensors; ++ti) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(TensorName(ti));
    t->add_shape(cfg.rows);
    t->add_shape(cfg.cols);
    t->set_dtype(v1::DTYPE_FP32);
  }
  spec.set_world_size(cfg.ranks);
  spec.set_mode(v1::MODE_ZENFLOW);
  spec.set_wire_dtype(v1::DTYPE_FP32);
  spec.set_delta_kind(v1::DELTA_VALUES);
  spec.set_rank_ordered_sums(true);
  spec.set_max_shard_bytes(16 << 10);  // several deltas per tensor and round
  v1::ZenFlowConfig* z = spec.mutable_zenflow();
  z->set_update_interval(cfg.interval);
  z->set_topk_ratio(cfg.topk);
  z->set_select_interval(std::max(1, cfg.select_every) * cfg.interval);
  z->set_full_warmup_rounds(0);
  z->mutable_apply_delay()->set_steps(1);
  return spec;
}

// Runs cfg.jobs jobs over `transport` at once; while they run, samples the
// daemon every `sample_every` rounds (rounds every rank has received).
absl::StatusOr<PassResult> RunPass(const Config& cfg, Transport transport, const std::string& tag,
                                   const ChildProcess& daemon, int sample_every, const RefStep& adam) {
  PassResult res;
  res.transport = transport == Transport::kUcx ? "ucx" : "grpc";
  std::vector<std::unique_ptr<JobShared>> jobs;
  for (int j = 0; j < cfg.jobs; ++j) {
    auto job = std::make_unique<JobShared>();
    job->index = j;
    job->id = absl::StrCat("soak-", tag, "-", res.transport, "-", j);
    job->token = NewToken();
    ZF_ASSIGN_OR_RETURN(job->spec, MakeSpec(cfg, job->id));
    job->delete_while_attached = j % 2 == 1;
    jobs.push_back(std::move(job));
  }
  const int total = cfg.jobs * cfg.ranks;
  std::vector<std::atomic<int>> progress(total);
  for (auto& p : progress) p.store(0);
  std::vector<std::vector<RankResult>> results(cfg.jobs, std::vector<RankResult>(cfg.ranks));
  std::atomic<bool> stop{false};
  std::thread sampler([&] {
    int next = sample_every;
    while (!stop.load()) {
      int least = cfg.rounds;
      for (auto& p : progress) least = std::min(least, p.load(std::memory_order_relaxed));
      const ProcSample s = Sample(daemon.pid());
      res.peak.threads = std::max(res.peak.threads, s.threads);
      res.peak.fds = std::max(res.peak.fds, s.fds);
      res.peak.rss = std::max(res.peak.rss, s.rss);
      if (sample_every > 0 && least >= next) {
        res.samples.push_back({least, s});
        next = (least / sample_every + 1) * sample_every;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<Rank>> ranks;
  std::vector<std::thread> threads;
  for (int j = 0; j < cfg.jobs; ++j) {
    for (int r = 0; r < cfg.ranks; ++r) {
      const int g = j * cfg.ranks + r;
      ranks.push_back(std::make_unique<Rank>(cfg, jobs[j].get(), r, transport, daemon.target(), g,
                                             &progress[g], &results[j][r]));
    }
  }
  for (auto& r : ranks) threads.emplace_back([rank = r.get()] { rank->Run(); });
  for (auto& t : threads) t.join();
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  stop.store(true);
  sampler.join();
  for (int j = 0; j < cfg.jobs; ++j) {
    JobCheck check = CheckJob(cfg, j, results[j], adam);
    for (std::string& f : check.failures) {
      res.failures.push_back(absl::StrCat(jobs[j]->id, ": ", f));
    }
    res.models.push_back(check.model);
    res.values_compared += check.values_compared;
  }
  res.exact = res.failures.empty();
  return res;
}

// Polls the daemon until its threads outside gRPC's pools and its fds are
// back at the baseline's, or settle_s passed; returns the last reading.
ProcSample Settle(pid_t pid, int base_own_threads, int base_fds, double settle_s, double* seconds) {
  const auto t0 = Clock::now();
  for (;;) {
    ProcSample s = Sample(pid);
    const int own = CountThreads(ThreadNames(pid), false);
    if ((own == base_own_threads && s.fds == base_fds) ||
        std::chrono::duration<double>(Clock::now() - t0).count() >= settle_s) {
      *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Waits until the daemon's thread and fd counts hold still for a second
// (start-up, or streams closing), at most `limit_s`.
ProcSample Quiet(pid_t pid, double limit_s) {
  const auto t0 = Clock::now();
  ProcSample last = Sample(pid);
  auto still_since = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < limit_s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const ProcSample s = Sample(pid);
    if (s.threads != last.threads || s.fds != last.fds) {
      still_since = Clock::now();
      last = s;
    } else if (Clock::now() - still_since >= std::chrono::seconds(1)) {
      break;
    }
  }
  return Sample(pid);
}

std::string MiB(int64_t b) { return absl::StrFormat("%.1f", static_cast<double>(b) / (1 << 20)); }

// The RSS samples as an ASCII chart: MiB up, rounds across.
void PrintCurve(const PassResult& p) {
  if (p.samples.empty()) return;
  int64_t lo = p.samples[0].second.rss, hi = lo;
  for (const auto& [round, s] : p.samples) {
    lo = std::min(lo, s.rss);
    hi = std::max(hi, s.rss);
  }
  lo = std::min(lo, p.end.rss);
  hi = std::max(hi, p.end.rss);
  constexpr int kRowsHigh = 8;
  const double span = std::max<double>(static_cast<double>(hi - lo), 1 << 20);
  std::printf(
      "  %s: daemon RSS (MiB) by round (%zu samples, then 'E' = after the jobs were deleted)\n",
      p.transport.c_str(), p.samples.size());
  std::vector<int64_t> values;
  for (const auto& [round, s] : p.samples) values.push_back(s.rss);
  values.push_back(p.end.rss);
  for (int row = kRowsHigh; row >= 0; --row) {
    const double level = static_cast<double>(lo) + span * row / kRowsHigh;
    std::string line;
    for (size_t i = 0; i < values.size(); ++i) {
      const int at =
          static_cast<int>(std::lround((static_cast<double>(values[i]) - lo) / span * kRowsHigh));
      line += at == row ? (i + 1 == values.size() ? 'E' : '*') : ' ';
    }
    std::printf("  %7.1f |%s\n", level / (1 << 20), line.c_str());
  }
  std::printf("          +%s\n", std::string(values.size(), '-').c_str());
  std::printf("           round 0 .. %d\n", p.samples.back().first);
  std::string nums;
  for (const auto& [round, s] : p.samples) absl::StrAppend(&nums, " ", round, ":", MiB(s.rss));
  std::printf("  samples (round:MiB):%s end:%s\n", nums.c_str(), MiB(p.end.rss).c_str());
}

void WriteSample(JsonWriter& w, const ProcSample& s) {
  w.BeginObject();
  w.Key("rss_bytes").Int(s.rss);
  w.Key("threads").Int(s.threads);
  w.Key("fds").Int(s.fds);
  w.EndObject();
}

int Main() {
  Config cfg;
  cfg.jobs = absl::GetFlag(FLAGS_jobs);
  cfg.ranks = absl::GetFlag(FLAGS_ranks);
  cfg.rounds = absl::GetFlag(FLAGS_rounds);
  cfg.interval = absl::GetFlag(FLAGS_interval);
  cfg.tensors = absl::GetFlag(FLAGS_tensors);
  cfg.rows = absl::GetFlag(FLAGS_rows);
  cfg.cols = absl::GetFlag(FLAGS_cols);
  cfg.topk = static_cast<float>(absl::GetFlag(FLAGS_topk));
  cfg.select_every = absl::GetFlag(FLAGS_select_every);
  if (cfg.jobs < 1 || cfg.ranks < 1 || cfg.rounds < 1 || cfg.interval < 1 || cfg.tensors < 1 ||
      cfg.rows < 1 || cfg.rows % 16 != 0 || cfg.cols < 1 || !(cfg.topk >= 0 && cfg.topk < 1)) {
    std::fprintf(stderr,
                 "zf_soak: --jobs, --ranks, --rounds, --interval, --tensors and --cols "
                 "must be >= 1, --rows a positive multiple of 16 and --topk in [0, 1)\n");
    return 2;
  }
  std::vector<Transport> transports;
  for (const std::string& name : absl::GetFlag(FLAGS_transports)) {
    absl::StatusOr<Transport> t = ParseTransport(name);
    if (!t.ok()) {
      std::fprintf(stderr, "zf_soak: %s\n", t.status().ToString().c_str());
      return 2;
    }
    transports.push_back(*t);
  }
  // The daemon updates with the best kernel this CPU has (its GetStats says
  // which); the vector kernels fuse multiply-adds, the scalar one does not.
  RefStep adam;
  const SimdLevel simd = BestSimdLevel();
  adam.fused = simd != SimdLevel::kScalar;

  const auto t0 = Clock::now();
  ChildProcess daemon;
  if (absl::Status s =
          daemon.Start(absl::GetFlag(FLAGS_zenflowd),
                       {"--listen=127.0.0.1:0",
                        absl::StrCat("--update_threads=", absl::GetFlag(FLAGS_update_threads))},
                       "--port_file", "zf_soak");
      !s.ok()) {
    std::fprintf(stderr, "zf_soak: %s\n", s.ToString().c_str());
    return 1;
  }
  const pid_t pid = daemon.pid();
  std::printf(
      "zf_soak: zenflowd pid %d at %s (log %s); %d jobs x %d ranks x %d rounds, S=%d, "
      "%d tensors of %dx%d, topk %.2f, selection every %d rounds, fp32 wire, simd %s, %s "
      "reference\n",
      static_cast<int>(pid), daemon.target().c_str(), daemon.log().c_str(), cfg.jobs, cfg.ranks,
      cfg.rounds, cfg.interval, cfg.tensors, cfg.rows, cfg.cols, cfg.topk, cfg.select_every,
      SimdLevelName(simd), adam.fused ? "fused" : "plain");
  std::fflush(stdout);
  const ProcSample cold = Quiet(pid, 10);
  const std::map<std::string, int> cold_fds = FdKinds(pid), cold_threads = ThreadNames(pid);

  // Warm-up: the same shape for a few rounds (and one selection) on every
  // transport, so that what the daemon creates once and keeps (gRPC's
  // threads, the UCX data plane's) is there before the baseline.
  Config warm_cfg = cfg;
  warm_cfg.rounds = std::max(1, absl::GetFlag(FLAGS_warmup_rounds));
  warm_cfg.select_every = cfg.select_every > 0 ? std::max(1, warm_cfg.rounds / 2) : 0;
  std::vector<std::string> warm_failures;
  for (Transport t : transports) {
    absl::StatusOr<PassResult> w = RunPass(warm_cfg, t, "warmup", daemon, 0, adam);
    if (!w.ok()) {
      std::fprintf(stderr, "zf_soak: warm-up: %s\n", w.status().ToString().c_str());
      return 1;
    }
    for (const std::string& f : w->failures) warm_failures.push_back(absl::StrCat("warm-up: ", f));
  }
  const ProcSample base = Quiet(pid, absl::GetFlag(FLAGS_settle_s));
  const std::map<std::string, int> base_fds = FdKinds(pid), base_threads = ThreadNames(pid);
  const int base_own_threads = CountThreads(base_threads, false);
  const int base_pool_threads = CountThreads(base_threads, true);
  const int grpc_pool_slack = absl::GetFlag(FLAGS_grpc_pool_slack);
  std::printf(
      "zf_soak: daemon before any job: %s MiB, %d threads, %d fds; after the warm-up "
      "(baseline): %s MiB, %d threads, %d fds (warm-up added threads: %s; fds: %s)\n",
      MiB(cold.rss).c_str(), cold.threads, cold.fds, MiB(base.rss).c_str(), base.threads, base.fds,
      Diff(cold_threads, base_threads).c_str(), Diff(cold_fds, base_fds).c_str());
  std::fflush(stdout);

  const int warm_round = absl::GetFlag(FLAGS_warm_round);
  std::vector<PassResult> passes;
  for (Transport t : transports) {
    const MemDetail mem_before = ReadMemDetail(pid);
    absl::StatusOr<PassResult> r =
        RunPass(cfg, t, "main", daemon, std::max(1, absl::GetFlag(FLAGS_sample_every)), adam);
    if (!r.ok()) {
      std::fprintf(stderr, "zf_soak: %s\n", r.status().ToString().c_str());
      return 1;
    }
    PassResult& p = *r;
    p.end =
        Settle(pid, base_own_threads, base.fds, absl::GetFlag(FLAGS_settle_s), &p.settle_seconds);
    const std::map<std::string, int> end_threads = ThreadNames(pid);
    p.thread_diff = Diff(base_threads, end_threads);
    p.fd_diff = Diff(base_fds, FdKinds(pid));
    p.mem_before = mem_before;
    p.mem_end = ReadMemDetail(pid);
    p.maps_diff = MapsDiff(p.mem_before, p.mem_end);
    // Shared memory the pass's connections attached is detached again.
    p.shm_back = SharedMappings(p.mem_end) == SharedMappings(p.mem_before);
    p.own_threads_end = CountThreads(end_threads, false);
    p.pool_threads_end = CountThreads(end_threads, true);
    p.threads_back = p.own_threads_end == base_own_threads &&
                     p.pool_threads_end - base_pool_threads <= grpc_pool_slack;
    p.fds_back = p.end.fds == base.fds;
    // Each rank on its own connection: at least one more socket per rank
    // while the jobs ran.
    p.connections = p.peak.fds - base.fds >= cfg.jobs * cfg.ranks;
    for (const auto& [round, s] : p.samples) {
      if (round >= warm_round && p.rss_warm < 0) {
        p.rss_warm = s.rss;
        p.warm_sample_round = round;
      }
      if (p.rss_warm >= 0) p.rss_max_after_warm = std::max(p.rss_max_after_warm, s.rss);
    }
    if (p.rss_warm >= 0) {
      p.rss_max_after_warm = std::max(p.rss_max_after_warm, p.end.rss);
      p.rss_growth = p.rss_max_after_warm - p.rss_warm;
      p.rss_bound = std::max<int64_t>(absl::GetFlag(FLAGS_rss_bound_bytes),
                                      static_cast<int64_t>(absl::GetFlag(FLAGS_rss_bound_ratio) *
                                                           static_cast<double>(p.rss_warm)));
      p.rss_flat = p.rss_growth <= p.rss_bound;
    }
    std::printf(
        "zf_soak: %s pass: %.1f s, %s (%lld parameter values compared bit for bit; "
        "reference rounding per job: %s)\n",
        p.transport.c_str(), p.seconds, p.exact ? "exact" : "NOT EXACT",
        static_cast<long long>(p.values_compared), absl::StrJoin(p.models, ",").c_str());
    std::fflush(stdout);
    passes.push_back(std::move(p));
  }
  const absl::Status stopped = daemon.Stop();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  bool pass = warm_failures.empty() && stopped.ok();
  for (const PassResult& p : passes) {
    pass = pass && p.exact && p.rss_flat && p.threads_back && p.fds_back && p.connections &&
           p.shm_back;
  }

  JsonWriter w;
  w.BeginObject();
  w.Key("config").BeginObject();
  w.Key("jobs").Int(cfg.jobs);
  w.Key("ranks_per_job").Int(cfg.ranks);
  w.Key("rounds").Int(cfg.rounds);
  w.Key("update_interval").Int(cfg.interval);
  w.Key("tensors").Int(cfg.tensors);
  w.Key("rows").Int(cfg.rows);
  w.Key("cols").Int(cfg.cols);
  w.Key("topk_ratio").Float(cfg.topk);
  w.Key("select_every_rounds").Int(cfg.select_every);
  w.Key("wire_dtype").String("fp32");
  w.Key("simd").String(SimdLevelName(simd));
  w.Key("warm_round").Int(warm_round);
  w.Key("warmup_rounds").Int(warm_cfg.rounds);
  w.EndObject();
  w.Key("daemon").BeginObject();
  w.Key("before_any_job");
  WriteSample(w, cold);
  w.Key("baseline");
  WriteSample(w, base);
  w.Key("exit_ok").Bool(stopped.ok());
  w.EndObject();
  w.Key("transports").BeginArray();
  for (const PassResult& p : passes) {
    w.BeginObject();
    w.Key("transport").String(p.transport);
    w.Key("jobs").Int(cfg.jobs);
    w.Key("ranks").Int(cfg.jobs * cfg.ranks);
    w.Key("rounds").Int(cfg.rounds);
    w.Key("seconds").Double(p.seconds);
    w.Key("rss_samples").BeginArray();
    for (const auto& [round, s] : p.samples) w.BeginArray().Int(round).Int(s.rss).EndArray();
    w.EndArray();
    w.Key("rss_warm_round").Int(p.warm_sample_round);
    w.Key("rss_warm_bytes").Int(p.rss_warm);
    w.Key("rss_max_after_warm_bytes").Int(p.rss_max_after_warm);
    w.Key("rss_end_bytes").Int(p.end.rss);
    w.Key("rss_growth_bytes").Int(p.rss_growth);
    w.Key("rss_bound_bytes").Int(p.rss_bound);
    w.Key("threads").BeginObject();
    w.Key("baseline")
        .Int(base.threads)
        .Key("peak")
        .Int(p.peak.threads)
        .Key("end")
        .Int(p.end.threads);
    w.Key("end_vs_baseline").String(p.thread_diff);
    w.Key("outside_grpc_pools_baseline").Int(base_own_threads);
    w.Key("outside_grpc_pools_end").Int(p.own_threads_end);
    w.Key("grpc_pools_baseline").Int(base_pool_threads);
    w.Key("grpc_pools_end").Int(p.pool_threads_end);
    w.Key("grpc_pool_slack").Int(grpc_pool_slack);
    w.EndObject();
    w.Key("fds").BeginObject();
    w.Key("baseline").Int(base.fds).Key("peak").Int(p.peak.fds).Key("end").Int(p.end.fds);
    w.Key("end_vs_baseline").String(p.fd_diff);
    w.EndObject();
    w.Key("settle_seconds").Double(p.settle_seconds);
    w.Key("rss_by_kind").BeginObject();
    w.Key("before").BeginObject();
    w.Key("anon_bytes").Int(p.mem_before.anon);
    w.Key("file_bytes").Int(p.mem_before.file);
    w.Key("shmem_bytes").Int(p.mem_before.shmem);
    w.EndObject();
    w.Key("end").BeginObject();
    w.Key("anon_bytes").Int(p.mem_end.anon);
    w.Key("file_bytes").Int(p.mem_end.file);
    w.Key("shmem_bytes").Int(p.mem_end.shmem);
    w.EndObject();
    w.Key("mappings_added").String(p.maps_diff);
    w.Key("shared_mappings_before").Int(SharedMappings(p.mem_before));
    w.Key("shared_mappings_end").Int(SharedMappings(p.mem_end));
    w.EndObject();
    w.Key("values_compared").Int(p.values_compared);
    w.Key("reference_rounding").String(absl::StrJoin(p.models, ","));
    w.Key("checks").BeginObject();
    w.Key("exact_and_once").Bool(p.exact);
    w.Key("rss_flat").Bool(p.rss_flat);
    w.Key("threads_back").Bool(p.threads_back);
    w.Key("fds_back").Bool(p.fds_back);
    w.Key("own_connections").Bool(p.connections);
    w.Key("shared_memory_back").Bool(p.shm_back);
    w.EndObject();
    w.Key("failures").BeginArray();
    for (const std::string& f : p.failures) w.String(f);
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.Key("warmup_failures").BeginArray();
  for (const std::string& f : warm_failures) w.String(f);
  w.EndArray();
  w.Key("seconds").Double(seconds);
  w.Key("pass").Bool(pass);
  w.EndObject();
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (absl::Status s = w.WriteFile(out); !s.ok()) {
      std::fprintf(stderr, "zf_soak: %s\n", s.ToString().c_str());
      pass = false;
    }
  }

  std::printf(
      "\n| transport | jobs x ranks | rounds | seconds | RSS warm (r%d) MiB | RSS max after | "
      "growth / bound MiB | threads base/peak/end | of them gRPC pools base/end | "
      "fds base/peak/end | settle s | checks |\n",
      warm_round);
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const PassResult& p : passes) {
    std::vector<std::string> bad;
    if (!p.exact) bad.push_back("EXACT");
    if (!p.rss_flat) bad.push_back("RSS");
    if (!p.threads_back) bad.push_back("THREADS");
    if (!p.fds_back) bad.push_back("FDS");
    if (!p.connections) bad.push_back("CONNECTIONS");
    if (!p.shm_back) bad.push_back("SHARED MEMORY");
    std::printf(
        "| %s | %d x %d | %d | %.1f | %s | %s | %s / %s | %d/%d/%d | %d/%d | %d/%d/%d | %.2f | "
        "%s |\n",
        p.transport.c_str(), cfg.jobs, cfg.ranks, cfg.rounds, p.seconds, MiB(p.rss_warm).c_str(),
        MiB(p.rss_max_after_warm).c_str(), MiB(p.rss_growth).c_str(), MiB(p.rss_bound).c_str(),
        base.threads, p.peak.threads, p.end.threads, base_pool_threads, p.pool_threads_end,
        base.fds, p.peak.fds, p.end.fds, p.settle_seconds,
        bad.empty() ? "ok" : ("FAILED: " + absl::StrJoin(bad, ", ")).c_str());
  }
  std::printf("\n");
  for (const PassResult& p : passes) PrintCurve(p);
  for (const PassResult& p : passes) {
    std::printf(
        "zf_soak: %s: RSS from before the pass to its end: anon %s -> %s, file %s -> %s, "
        "shmem %s -> %s MiB; mappings: %s\n",
        p.transport.c_str(), MiB(p.mem_before.anon).c_str(), MiB(p.mem_end.anon).c_str(),
        MiB(p.mem_before.file).c_str(), MiB(p.mem_end.file).c_str(),
        MiB(p.mem_before.shmem).c_str(), MiB(p.mem_end.shmem).c_str(), p.maps_diff.c_str());
    std::printf(
        "zf_soak: %s: at the end (%.2f s after the last client left) the daemon has, vs "
        "the baseline, threads: %s; fds: %s%s\n",
        p.transport.c_str(), p.settle_seconds, p.thread_diff.c_str(), p.fd_diff.c_str(),
        p.threads_back ? ""
                       : absl::StrFormat(" (FAILED: threads outside gRPC's pools must be "
                                         "back exactly, the pools within +%d)",
                                         grpc_pool_slack)
                             .c_str());
    if (!p.rss_flat && p.rss_warm < 0) {
      std::printf("zf_soak: %s: no RSS sample at or after round %d: run more rounds\n",
                  p.transport.c_str(), warm_round);
    } else if (!p.rss_flat) {
      std::printf("zf_soak: %s: RSS grew %s MiB after round %d (bound %s MiB)\n",
                  p.transport.c_str(), MiB(p.rss_growth).c_str(), p.warm_sample_round,
                  MiB(p.rss_bound).c_str());
    }
    if (!p.shm_back) {
      std::printf(
          "zf_soak: %s: the daemon maps %d shared-memory segments more than before the pass "
          "(RssShmem %s -> %s MiB), with every connection of the pass closed and its jobs "
          "deleted: they stay attached\n",
          p.transport.c_str(), SharedMappings(p.mem_end) - SharedMappings(p.mem_before),
          MiB(p.mem_before.shmem).c_str(), MiB(p.mem_end.shmem).c_str());
    }
    if (!p.connections) {
      std::printf(
          "zf_soak: %s: the daemon's fds rose by %d at most while %d ranks ran: the ranks "
          "did not have a connection each\n",
          p.transport.c_str(), p.peak.fds - base.fds, cfg.jobs * cfg.ranks);
    }
    for (const std::string& f : p.failures)
      std::printf("zf_soak: %s: %s\n", p.transport.c_str(), f.c_str());
  }
  for (const std::string& f : warm_failures) std::printf("zf_soak: %s\n", f.c_str());
  if (!stopped.ok()) {
    std::printf("zf_soak: %s\nzenflowd's log:\n%s\n", stopped.ToString().c_str(),
                daemon.LogTail().c_str());
  }
  if (pass) daemon.RemoveFiles();
  std::printf("zf_soak: %s in %.1f s%s%s\n", pass ? "PASS" : "FAIL", seconds,
              out.empty() ? "" : "; results in ", out.c_str());
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "A bounded loopback soak of zenflowd: jobs x ranks x rounds over each transport, checked "
      "exactly against a reference AdamW, with the daemon's RSS, threads and fds sampled.");
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  return zenflow::Main();
}
