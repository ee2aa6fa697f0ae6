// zf_stats: `zfctl stats` under its former name (tools/zfctl/stats.cc), for
// scripts and tests that call it; same flags and output.
#include "tools/zfctl/cli.h"

int main(int argc, char** argv) { return zenflow::ctl::CtlMain(argc, argv, "stats"); }
