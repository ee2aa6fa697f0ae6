// zfctl stats: what zenflowd's GetStats says, readably or as JSON (formerly
// zf_stats, ./zf stats).
//
//   zfctl stats                                    (the admin socket on the daemon's host)
//   zfctl stats --target=127.0.0.1:50051 --token_file=job.token [--job=ID] [--json]
//   zfctl stats --target=zenflowd-0:50051,zenflowd-1:50051 --job=ID   (a job over several daemons)
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "client/parts.h"
#include "tools/zfctl/commands.h"
#include "tools/zfctl/daemon.h"
#include "tools/zfctl/flags.h"
#include "tools/zfctl/stats_json.h"
#include "tools/zfctl/stats_text.h"

namespace zenflow::ctl {

int RunStats(const Args& args) {
  std::string job = absl::GetFlag(FLAGS_job);
  if (args.size() > 1 || (args.size() == 1 && !job.empty())) {
    std::fprintf(stderr, "zfctl stats: at most one job (zfctl stats [JOB] or --job=JOB)\n");
    return 2;
  }
  if (args.size() == 1) job = args[0];
  // --target may list several daemons (one partitioned job's): each one's
  // figures in turn.
  std::vector<Endpoint> endpoints;
  if (absl::GetFlag(FLAGS_target).empty()) {
    absl::StatusOr<Endpoint> e = ChooseEndpoint();
    if (!e.ok()) return FailEarly("stats", e.status());
    endpoints.push_back(*e);
  } else {
    absl::StatusOr<std::vector<std::string>> targets = SplitTargets(absl::GetFlag(FLAGS_target));
    if (!targets.ok()) return FailEarly("stats", targets.status());
    for (const std::string& t : *targets) endpoints.push_back(Endpoint{t, false});
  }
  std::vector<v1::GetStatsResponse> answers;
  std::vector<std::string> names;
  for (const Endpoint& e : endpoints) {
    absl::StatusOr<Daemon> d = Daemon::Open(e);
    if (!d.ok()) return FailEarly("stats", d.status());
    absl::StatusOr<v1::GetStatsResponse> s = d->GetStats(job);
    if (!s.ok()) return d->Fail("stats", s.status());
    answers.push_back(*std::move(s));
    names.push_back(e.target);
  }
  if (absl::GetFlag(FLAGS_json)) {
    const std::string out = answers.size() == 1 ? StatsJson(answers[0]) : StatsJson(answers);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  for (size_t i = 0; i < answers.size(); ++i) {
    if (i > 0) std::printf("\n");
    PrintStats(answers[i], names[i]);
  }
  return 0;
}

}  // namespace zenflow::ctl
