// zfctl's entry: the subcommand, --help, the flags.
#ifndef ZENFLOW_TOOLS_ZFCTL_CLI_H_
#define ZENFLOW_TOOLS_ZFCTL_CLI_H_

namespace zenflow::ctl {

// Runs `zfctl SUB ARGS...`; with `sub` set, argv holds that subcommand's
// arguments only (zf_stats: "stats"). --help anywhere prints the usage and
// returns 0.
int CtlMain(int argc, char** argv, const char* sub);

}  // namespace zenflow::ctl

#endif  // ZENFLOW_TOOLS_ZFCTL_CLI_H_
