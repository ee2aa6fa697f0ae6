// zf_stats: what zenflowd's GetStats says, readably (./zf stats).
//
//   zf_stats --target=127.0.0.1:50051 [--job=ID] [--json]
//   zf_stats --target=zenflowd-0:50051,zenflowd-1:50051 --job=ID   (a job over several daemons)
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/parts.h"
#include "client/tls_flags.h"
#include "common/flags_usage.h"
#include "server/version.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "zenflowd's gRPC address, or several, comma-separated (each is printed in turn)");
ABSL_FLAG(std::string, job, "", "one job's figures (default: every job the token reaches)");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the token to send: a job's (its jobs only) or the admin's "
          "(every job and the daemon-wide figures). Empty: $ZENFLOW_TOKEN");
ABSL_FLAG(bool, json, false, "print GetStatsResponse as JSON (protobuf's mapping) instead");
ABSL_FLAG(int, timeout_s, 10, "how long to wait for the daemon");

namespace zenflow {
namespace {

std::string Bytes(int64_t b) {
  if (b >= int64_t{1} << 30) return absl::StrFormat("%.2f GiB", b / double(int64_t{1} << 30));
  if (b >= 1 << 20) return absl::StrFormat("%.2f MiB", b / double(1 << 20));
  if (b >= 1 << 10) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

// The q-quantile of a histogram (upper bound of the bucket it falls in).
std::string Quantile(const v1::Histogram& h, double q) {
  if (h.count() == 0) return "-";
  const double want = q * static_cast<double>(h.count());
  int64_t seen = 0;
  for (int i = 0; i < h.counts_size(); ++i) {
    seen += h.counts(i);
    if (static_cast<double>(seen) >= want) {
      return i < h.upper_bounds_size() ? absl::StrFormat("<= %gs", h.upper_bounds(i))
                                       : absl::StrFormat("> %gs", h.upper_bounds(i - 1));
    }
  }
  return "-";
}

void Print(const v1::GetStatsResponse& s, const std::string& target) {
  std::printf("zenflowd %s at %s (commit %s, simd %s, %d update threads)\n", s.version().c_str(),
              target.c_str(), s.commit().c_str(), s.simd().c_str(), s.update_threads());
  std::printf("  memory: %s resident; jobs hold %s of the %s budget\n",
              Bytes(s.resident_bytes()).c_str(), Bytes(s.memory_reserved_bytes()).c_str(),
              Bytes(s.memory_budget_bytes()).c_str());
  std::printf("  cpu: %.1f s; jobs: %d of at most %d\n", s.cpu_seconds(), s.jobs_size(),
              s.max_jobs());
  if (s.ucx().enabled()) {
    std::printf("  ucx (%s): %lld connections on %lld workers, %lld cut\n",
                s.ucx().transports().c_str(), static_cast<long long>(s.ucx().connections()),
                static_cast<long long>(s.ucx().workers()),
                static_cast<long long>(s.ucx().connections_cut()));
  }
  for (const v1::RejectionCount& r : s.rejections()) {
    std::printf("  rejected: %lld x %s in %s\n", static_cast<long long>(r.count()),
                r.code().c_str(), r.reason().c_str());
  }
  for (const v1::JobStats& j : s.jobs()) {
    int attached = 0;
    for (const v1::RankStats& r : j.ranks()) attached += r.attached() ? 1 : 0;
    std::printf("\njob %s: %lld params, %d of %d ranks attached, state %s\n", j.job_id().c_str(),
                static_cast<long long>(j.params()), attached, j.world_size(),
                Bytes(j.state_bytes()).c_str());
    std::printf("  rounds: %lld done (%lld skipped), %lld queued; update p50 %s p99 %s\n",
                static_cast<long long>(j.rounds_updated()),
                static_cast<long long>(j.rounds_skipped_nonfinite()),
                static_cast<long long>(j.update_queue_depth()),
                Quantile(j.round_update_seconds(), 0.5).c_str(),
                Quantile(j.round_update_seconds(), 0.99).c_str());
    // How far the last measured round's update was from per-step AdamW
    // (docs/design.md rule 14).
    if (j.has_update_divergence()) {
      std::printf("  update divergence: %.3f (last measured round; S %d)\n",
                  j.update_divergence(), j.last_round_steps());
    } else {
      std::printf("  update divergence: not measured yet\n");
    }
    if (j.has_partition()) {
      // Where the job's tensors are: this daemon's part, then the rest.
      const v1::Partition& p = j.partition();
      std::vector<std::string> here, elsewhere;
      for (const v1::PartitionEntry& e : p.tensors()) {
        // A column block of a split tensor: name[columns first..end).
        const std::string name =
            e.columns() > 0 ? absl::StrCat(e.tensor(), "[columns ", e.first_column(), "..",
                                           e.first_column() + e.columns(), ")")
                            : e.tensor();
        if (e.part() == p.part()) {
          here.push_back(name);
        } else {
          elsewhere.push_back(absl::StrCat(name, "@", e.part()));
        }
      }
      auto list = [](const std::vector<std::string>& v) {
        constexpr size_t kShown = 8;
        std::string out = absl::StrJoin(v.begin(), v.begin() + std::min(v.size(), kShown), ", ");
        if (v.size() > kShown) absl::StrAppend(&out, ", ... (", v.size() - kShown, " more)");
        return out.empty() ? std::string("-") : out;
      };
      std::printf("  partition (map v%lld): daemon %d of %d; here: %s; elsewhere (tensor@daemon): %s\n",
                  static_cast<long long>(p.version()), p.part(), p.parts(), list(here).c_str(),
                  list(elsewhere).c_str());
    }
    for (const v1::TransportStats& t : j.transports()) {
      if (t.shards_received() == 0 && t.deltas_sent() == 0) continue;
      std::printf("  %s: %lld shards in (%s), %lld deltas out (%s)\n", t.transport().c_str(),
                  static_cast<long long>(t.shards_received()),
                  Bytes(t.shard_bytes_received()).c_str(),
                  static_cast<long long>(t.deltas_sent()), Bytes(t.delta_bytes_sent()).c_str());
    }
    for (const v1::RankStats& r : j.ranks()) {
      const v1::WorkerStats& w = r.worker();
      const double stall = w.step_seconds() > 0 ? w.stall_seconds() / w.step_seconds() : 0;
      std::printf(
          "  rank %d: %s, next round %lld, outbox %s%s; worker: %lld steps, stall %.1f%% "
          "(%.3f of %.3f s), delay %d, staleness %d\n",
          r.rank(), r.attached() ? r.transport().c_str() : "detached",
          static_cast<long long>(r.next_round()), Bytes(r.outbox_bytes()).c_str(),
          r.reading_paused() ? " (reading paused)" : "", static_cast<long long>(w.steps()),
          100 * stall, w.stall_seconds(), w.step_seconds(), w.apply_delay_steps(),
          w.staleness_steps());
    }
  }
}

int Main() {
  ClientOptions co;
  absl::StatusOr<std::string> token = LoadToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    std::fprintf(stderr, "zf_stats: %s\n", std::string(token.status().message()).c_str());
    return 2;
  }
  co.token = *token;
  ApplyTlsFlags(&co);
  co.connect_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  // Several daemons (one partitioned job's): each one's figures in turn.
  absl::StatusOr<std::vector<std::string>> targets = SplitTargets(absl::GetFlag(FLAGS_target));
  if (!targets.ok()) {
    std::fprintf(stderr, "zf stats: %s\n", targets.status().ToString().c_str());
    return 2;
  }
  std::vector<std::string> json;
  for (const std::string& target : *targets) {
    co.target = target;
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(co);
    if (!c.ok()) {
      std::fprintf(stderr, "zf stats: %s\n", c.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<v1::GetStatsResponse> s = (*c)->GetStats(absl::GetFlag(FLAGS_job));
    if (!s.ok()) {
      std::fprintf(stderr, "zf stats: zenflowd %s: %s\n", target.c_str(),
                   s.status().ToString().c_str());
      return 1;
    }
    if (absl::GetFlag(FLAGS_json)) {
      std::string out;
      google::protobuf::util::JsonPrintOptions o;
      o.add_whitespace = true;
      o.preserve_proto_field_names = true;
      (void)google::protobuf::util::MessageToJsonString(*s, &out, o);
      json.push_back(std::move(out));
      continue;
    }
    if (&target != &targets->front()) std::printf("\n");
    Print(*s, target);
  }
  if (json.size() == 1) {
    std::printf("%s", json[0].c_str());
  } else if (!json.empty()) {
    // {"daemons": [GetStatsResponse, ...]} in the order listed.
    std::printf("{\"daemons\": [\n%s]}\n", absl::StrJoin(json, ",\n").c_str());
  }
  return 0;
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Prints zenflowd's GetStats: zf_stats [--target=HOST:PORT[,HOST:PORT...]] [--job=ID] [--json]");
  zenflow::ParseFlags(argc, argv,
                      {"zf_stats", zenflow::kZenflowVersion, {"zf_stats.cc", "client/tls_flags.cc"}});
  return zenflow::Main();
}
