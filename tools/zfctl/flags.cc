// zfctl's flags; see flags.h.
#include "tools/zfctl/flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, target, "",
          "zenflowd's gRPC address HOST:PORT (stats: several, comma-separated, each printed in "
          "turn). Empty: the admin socket when it exists, else 127.0.0.1:50051");
ABSL_FLAG(std::string, admin_socket, "",
          "zenflowd's admin socket (empty: $ZENFLOW_ADMIN_SOCKET if set, else "
          "/run/zenflowd/admin.sock, else $XDG_RUNTIME_DIR/zenflowd/admin.sock), used when "
          "--target is empty");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the token to send over --target: a job's (its jobs only) or "
          "the admin's (every job and the daemon-wide figures). Empty: $ZENFLOW_TOKEN. The admin "
          "socket needs none");
ABSL_FLAG(std::string, job, "", "stats: one job's figures (default: every job the caller may see)");
ABSL_FLAG(bool, json, false,
          "stats: print GetStatsResponse as JSON (numbers as numbers, every field, withheld "
          "figures as null)");
ABSL_FLAG(int, timeout_s, 10, "how long to wait for the daemon to answer a connection");

namespace zenflow::ctl {

const char kCommonFlagsHelp[] =
    "  --target=HOST:PORT     zenflowd's gRPC address (default: the admin socket when it\n"
    "                         exists, else 127.0.0.1:50051)\n"
    "  --admin_socket=PATH    the admin socket to use without --target (default:\n"
    "                         $ZENFLOW_ADMIN_SOCKET, /run/zenflowd/admin.sock,\n"
    "                         $XDG_RUNTIME_DIR/zenflowd/admin.sock); root and the daemon's\n"
    "                         user are the admin there, with no token\n"
    "  --token_file=FILE      the token to send over --target: your job's or the admin's\n"
    "                         (default: $ZENFLOW_TOKEN)\n"
    "  --timeout_s=N          how long to wait for the daemon (default 10)\n"
    "  --tls_ca=FILE --tls_cert=FILE --tls_key=FILE --tls_server_name=NAME\n"
    "                         TLS to a daemon started with --tls_cert (docs/security.md)\n";

}  // namespace zenflow::ctl
