// zfctl's entry; see cli.h.
#include "tools/zfctl/cli.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "server/version.h"
#include "tools/zfctl/commands.h"
#include "tools/zfctl/flags.h"

namespace zenflow::ctl {

namespace {

constexpr char kIntro[] =
    "zfctl: look at and manage the jobs of a zenflowd (docs/operating.md#zfctl).\n"
    "\n"
    "  zfctl SUBCOMMAND [ARGS] [FLAGS]     zfctl SUBCOMMAND --help for its flags\n"
    "\n"
    "On the daemon's host, as root or as the daemon's user, zfctl talks to the daemon's admin\n"
    "socket and needs no token; elsewhere give --target=HOST:PORT and --token_file.\n"
    "\n"
    "Subcommands:\n";

bool IsHelp(const char* a) {
  return std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0 ||
         std::strcmp(a, "-help") == 0 || std::strcmp(a, "--helpfull") == 0 ||
         std::strcmp(a, "--helpshort") == 0;
}

void PrintIntro(FILE* out) {
  std::fputs(kIntro, out);
  for (const Command& c : Commands()) std::fprintf(out, "  %-12s %s\n", c.name, c.synopsis);
}

const Command* Find(const std::string& name) {
  for (const Command& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

}  // namespace

const std::vector<Command>& Commands() {
  static const std::vector<Command> kCommands = {
      {"jobs", "every job you may see: id, mode, ranks attached/world, rounds, params, memory, age",
       "zfctl jobs [FLAGS]\n"
       "  Every job the caller may see (all of them over the admin socket or with the admin\n"
       "  token; a job token's own otherwise), one line each: id, mode, ranks attached of the\n"
       "  world size, rounds updated, parameters, memory, age, and whether no rank is attached.\n",
       RunJobs},
      {"describe", "one job: its spec, ranks, rounds and figures (GetJob and GetStats)",
       "zfctl describe JOB [FLAGS]\n"
       "  The job's spec (mode, world size, tensors), its joined ranks, rounds and selection,\n"
       "  and its figures as `zfctl stats` prints them.\n",
       RunDescribe},
      {"delete", "delete a job (DeleteJob): its memory is freed, its checkpoints not restored",
       "zfctl delete JOB [FLAGS]\n"
       "  Deletes the job (DeleteJob). Its memory is freed at once and the daemon does not\n"
       "  restore it from its checkpoints after a restart. Its ranks' next calls fail.\n",
       RunDelete},
      {"checkpoint", "write a job's state to the daemon's --state_dir now (Checkpoint)",
       "zfctl checkpoint JOB [FLAGS]\n"
       "  Writes the job's state (as of its last finished round) to the daemon's --state_dir\n"
       "  now and prints the file (the Checkpoint RPC). FAILED_PRECONDITION without\n"
       "  --state_dir.\n",
       RunCheckpoint},
      {"stats", "the daemon's figures and each job's (GetStats); --json for scripts",
       "zfctl stats [JOB] [--job=ID] [--json] [FLAGS]\n"
       "  What GetStats says: the daemon (memory, budget, jobs, rejections) and each job you may\n"
       "  see (ranks, rounds, update times, transports, each rank's worker figures). A job\n"
       "  token does not see the daemon-wide figures: they print as \"hidden\".\n"
       "  --target may list several daemons, comma-separated (one job over several daemons).\n"
       "  --job=ID, or JOB    one job's figures\n"
       "  --json              GetStatsResponse as JSON: numbers as numbers, every field (rank 0's\n"
       "                      `rank` too), figures withheld from a job token as null\n",
       RunStats},
  };
  return kCommands;
}

std::string OneJob(const char* sub, const Args& args) {
  if (args.size() != 1 || args[0].empty()) {
    std::fprintf(stderr, "zfctl %s: give one job id: zfctl %s JOB (zfctl jobs lists them)\n", sub,
                 sub);
    return "";
  }
  return args[0];
}

int CtlMain(int argc, char** argv, const char* sub) {
  // --version anywhere before "--": "PROGRAM VERSION" on stdout, exit 0, as
  // the other programs (common/flags_usage.h) and man-page generators expect.
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strcmp(argv[i], "--version") == 0) {
      const char* slash = std::strrchr(argv[0], '/');
      std::printf("%s %s\n", slash == nullptr ? argv[0] : slash + 1, kZenflowVersion);
      return 0;
    }
  }
  std::vector<char*> rest = {argv[0]};
  int first = 1;
  std::string name = sub == nullptr ? "" : sub;
  if (sub == nullptr) {
    if (argc < 2 || IsHelp(argv[1]) || std::strcmp(argv[1], "help") == 0) {
      // `zfctl help SUB` is `zfctl SUB --help`.
      const Command* c = argc >= 3 ? Find(argv[2]) : nullptr;
      if (c != nullptr) {
        std::printf("%s\nFlags:\n%s", c->usage, kCommonFlagsHelp);
        return 0;
      }
      PrintIntro(argc < 2 ? stderr : stdout);
      return argc < 2 ? 2 : 0;
    }
    name = argv[1];
    first = 2;
  }
  const Command* c = Find(name);
  if (c == nullptr) {
    std::fprintf(stderr, "zfctl: unknown subcommand '%s'\n\n", name.c_str());
    PrintIntro(stderr);
    return 2;
  }
  for (int i = first; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (IsHelp(argv[i])) {
      std::printf("%s\nFlags:\n%s", c->usage, kCommonFlagsHelp);
      return 0;
    }
  }
  for (int i = first; i < argc; ++i) rest.push_back(argv[i]);
  absl::SetProgramUsageMessage(c->usage);
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(rest.size()), rest.data());
  Args args(positional.begin() + 1, positional.end());
  return c->run(args);
}

}  // namespace zenflow::ctl
