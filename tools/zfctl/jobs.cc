// zfctl jobs (every job the caller may see, one line each) and zfctl
// describe JOB (GetJob and the job's GetStats, readably).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/zfctl/commands.h"
#include "tools/zfctl/daemon.h"
#include "tools/zfctl/stats_text.h"

namespace zenflow::ctl {

namespace {

int Attached(const v1::JobStats& j) {
  int n = 0;
  for (const v1::RankStats& r : j.ranks()) n += r.attached() ? 1 : 0;
  return n;
}

std::string Shape(const v1::TensorSpec& t) {
  std::vector<std::string> dims;
  for (int64_t d : t.shape()) dims.push_back(absl::StrCat(d));
  return absl::StrCat(t.name(), " [", absl::StrJoin(dims, " x "), "]", t.local() ? " local" : "");
}

}  // namespace

int RunJobs(const Args& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "zfctl jobs: takes no arguments (zfctl jobs --help)\n");
    return 2;
  }
  absl::StatusOr<Endpoint> e = ChooseEndpoint();
  if (!e.ok()) return FailEarly("jobs", e.status());
  absl::StatusOr<Daemon> d = Daemon::Open(*e);
  if (!d.ok()) return FailEarly("jobs", d.status());
  absl::StatusOr<v1::GetStatsResponse> s = d->GetStats("");
  if (!s.ok()) return d->Fail("jobs", s.status());
  if (s->jobs_size() == 0) {
    std::printf("no jobs%s on %s\n", s->daemon_wide_withheld() ? " of this token" : "",
                d->name().c_str());
    return 0;
  }
  std::printf("%-24s %-12s %-9s %8s %12s %10s %8s  %s\n", "JOB", "MODE", "RANKS", "ROUNDS",
              "PARAMS", "MEMORY", "AGE", "IDLE");
  for (const v1::JobStats& j : s->jobs()) {
    // The mode is the spec's: one GetJob each (a job deleted meanwhile: "-").
    absl::StatusOr<v1::GetJobResponse> g = d->GetJob(j.job_id());
    const std::string mode = g.ok() ? ModeName(g->spec().mode()) : "-";
    const int attached = Attached(j);
    std::printf("%-24s %-12s %-9s %8lld %12lld %10s %8s  %s\n", j.job_id().c_str(), mode.c_str(),
                absl::StrCat(attached, "/", j.world_size()).c_str(),
                static_cast<long long>(j.rounds_updated()), static_cast<long long>(j.params()),
                Bytes(j.memory_bytes()).c_str(), Age(j.age_seconds()).c_str(),
                attached == 0 ? "idle (no rank attached)" : "-");
  }
  return 0;
}

int RunDescribe(const Args& args) {
  const std::string job = OneJob("describe", args);
  if (job.empty()) return 2;
  absl::StatusOr<Endpoint> e = ChooseEndpoint();
  if (!e.ok()) return FailEarly("describe", e.status());
  absl::StatusOr<Daemon> d = Daemon::Open(*e);
  if (!d.ok()) return FailEarly("describe", d.status());
  absl::StatusOr<v1::GetJobResponse> g = d->GetJob(job);
  if (!g.ok()) return d->Fail("describe", g.status());
  absl::StatusOr<v1::GetStatsResponse> s = d->GetStats(job);
  if (!s.ok()) return d->Fail("describe", s.status());
  const v1::JobSpec& spec = g->spec();
  std::vector<std::string> joined;
  for (int32_t r : g->joined_ranks()) joined.push_back(absl::StrCat(r));
  std::printf("job %s on %s\n", job.c_str(), d->name().c_str());
  std::printf("  mode %s, world size %d; parameters uploaded: %s; ranks joined: %s\n",
              ModeName(spec.mode()).c_str(), spec.world_size(),
              g->parameters_uploaded() ? "yes" : "no",
              joined.empty() ? "none" : absl::StrJoin(joined, ", ").c_str());
  std::vector<std::string> tensors;
  for (const v1::TensorSpec& t : spec.tensors()) tensors.push_back(Shape(t));
  constexpr size_t kShown = 8;
  std::string list = absl::StrJoin(tensors.begin(),
                                   tensors.begin() + std::min(tensors.size(), kShown), ", ");
  if (tensors.size() > kShown) absl::StrAppend(&list, ", ... (", tensors.size() - kShown, " more)");
  std::printf("  tensors (%d): %s\n", spec.tensors_size(), list.c_str());
  if (spec.mode() != v1::MODE_ZERO_OFFLOAD) {
    std::printf("  zenflow: update interval %d, select interval %d\n",
                spec.zenflow().update_interval(), spec.zenflow().select_interval());
  }
  std::printf("  rounds updated %lld, selection version %lld\n",
              static_cast<long long>(g->rounds_updated()),
              static_cast<long long>(g->selection_version()));
  for (const v1::JobStats& j : s->jobs()) PrintJob(j);
  return 0;
}

}  // namespace zenflow::ctl
