// zfctl's subcommands. Each takes its positional arguments (after the
// subcommand's name; flags are parsed already) and returns the exit status:
// 0 done, 1 the daemon refused or could not be reached, 2 a usage error.
#ifndef ZENFLOW_TOOLS_ZFCTL_COMMANDS_H_
#define ZENFLOW_TOOLS_ZFCTL_COMMANDS_H_

#include <string>
#include <vector>

namespace zenflow::ctl {

using Args = std::vector<std::string>;

int RunJobs(const Args& args);        // jobs.cc
int RunDescribe(const Args& args);    // jobs.cc
int RunDelete(const Args& args);      // job_actions.cc
int RunCheckpoint(const Args& args);  // job_actions.cc
int RunStats(const Args& args);       // stats.cc

struct Command {
  const char* name;
  const char* synopsis;  // one line for `zfctl --help`
  const char* usage;     // `zfctl NAME --help`, before the common flags
  int (*run)(const Args&);
};
// Every subcommand, in the order `zfctl --help` lists them.
const std::vector<Command>& Commands();

// The one JOB argument of describe, delete and checkpoint: its value, or
// empty after printing a usage error.
std::string OneJob(const char* sub, const Args& args);

}  // namespace zenflow::ctl

#endif  // ZENFLOW_TOOLS_ZFCTL_COMMANDS_H_
