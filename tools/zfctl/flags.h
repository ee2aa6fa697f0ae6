// zfctl's flags, shared by its subcommands (each uses those its usage
// lists). The TLS flags are client/tls_flags.h's.
#ifndef ZENFLOW_TOOLS_ZFCTL_FLAGS_H_
#define ZENFLOW_TOOLS_ZFCTL_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, target);
ABSL_DECLARE_FLAG(std::string, admin_socket);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(int, timeout_s);

namespace zenflow::ctl {

// The lines of `zfctl SUB --help` that describe the flags every subcommand
// takes (where to call, with what token, TLS).
extern const char kCommonFlagsHelp[];

}  // namespace zenflow::ctl

#endif  // ZENFLOW_TOOLS_ZFCTL_FLAGS_H_
