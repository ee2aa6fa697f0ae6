// zfctl: look at and manage the jobs of a zenflowd, for people
// (docs/operating.md#zfctl). ./zf ctl runs it from the tree; the Debian
// package installs it as zfctl.
//
//   zfctl jobs | describe JOB | delete JOB | checkpoint JOB | stats [--json]
#include "tools/zfctl/cli.h"

int main(int argc, char** argv) { return zenflow::ctl::CtlMain(argc, argv, nullptr); }
