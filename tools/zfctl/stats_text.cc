// GetStats, readably; see stats_text.h.
#include "tools/zfctl/stats_text.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace zenflow::ctl {

const char kHiddenHint[] =
    "hidden: a job token sees its jobs only; run zfctl on the daemon's host as root or its "
    "user (the admin socket), or with the admin token";

std::string Bytes(int64_t b) {
  if (b >= int64_t{1} << 30) return absl::StrFormat("%.2f GiB", b / double(int64_t{1} << 30));
  if (b >= 1 << 20) return absl::StrFormat("%.2f MiB", b / double(1 << 20));
  if (b >= 1 << 10) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

std::string Age(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  if (s >= 86400) return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrCat(s, "s");
}

std::string ModeName(v1::Mode mode) {
  return mode == v1::MODE_ZERO_OFFLOAD ? "zero_offload" : "zenflow";
}

namespace {

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

}  // namespace

void PrintStats(const v1::GetStatsResponse& s, const std::string& where) {
  std::printf("zenflowd %s at %s (commit %s, simd %s, %d update threads)\n", s.version().c_str(),
              where.c_str(), s.commit().c_str(), s.simd().c_str(), s.update_threads());
  if (s.daemon_wide_withheld()) {
    // A job token's view: these figures are the daemon's, not zero.
    std::printf("  memory: hidden (resident, budget and what jobs hold); cpu: hidden\n");
    std::printf("  jobs: %d of yours; the daemon's count and --max_jobs: hidden\n", s.jobs_size());
    std::printf("  (%s)\n", kHiddenHint);
  } else {
    std::printf("  memory: %s resident; jobs hold %s of the %s budget\n",
                Bytes(s.resident_bytes()).c_str(), Bytes(s.memory_reserved_bytes()).c_str(),
                Bytes(s.memory_budget_bytes()).c_str());
    std::printf("  cpu: %.1f s; jobs: %d of at most %d\n", s.cpu_seconds(), s.jobs_size(),
                s.max_jobs());
  }
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
    std::printf("\n");
    PrintJob(j);
  }
}

void PrintJob(const v1::JobStats& j) {
  int attached = 0;
  for (const v1::RankStats& r : j.ranks()) attached += r.attached() ? 1 : 0;
  std::printf("job %s: %lld params, %d of %d ranks attached, state %s, age %s\n",
              j.job_id().c_str(), static_cast<long long>(j.params()), attached, j.world_size(),
              Bytes(j.state_bytes()).c_str(), Age(j.age_seconds()).c_str());
  std::printf("  rounds: %lld done (%lld skipped), %lld queued; update p50 %s p99 %s\n",
              static_cast<long long>(j.rounds_updated()),
              static_cast<long long>(j.rounds_skipped_nonfinite()),
              static_cast<long long>(j.update_queue_depth()),
              Quantile(j.round_update_seconds(), 0.5).c_str(),
              Quantile(j.round_update_seconds(), 0.99).c_str());
  // How far the last measured round's update was from per-step AdamW
  // (docs/design.md rule 14).
  if (j.has_update_divergence()) {
    std::printf("  update divergence: %.3f (last measured round; S %d)\n", j.update_divergence(),
                j.last_round_steps());
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
    std::printf(
        "  partition (map v%lld): daemon %d of %d; here: %s; elsewhere (tensor@daemon): %s\n",
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

}  // namespace zenflow::ctl
