// The TLS flags of the command-line tools that connect to zenflowd
// (zf_train, zf_stats, zf_demo, stall_bench), defined once:
//   --tls_ca=FILE            CA that signed zenflowd's certificate (enables TLS)
//   --tls_cert=FILE          this client's certificate, for a daemon with --tls_ca
//   --tls_key=FILE           its private key
//   --tls_server_name=NAME   the name the daemon's certificate carries, if not the target's host
//
//   ClientOptions co;
//   co.target = absl::GetFlag(FLAGS_target);
//   ApplyTlsFlags(&co);
#ifndef ZENFLOW_CLIENT_TLS_FLAGS_H_
#define ZENFLOW_CLIENT_TLS_FLAGS_H_

#include "client/client.h"

namespace zenflow {

// Copies the four flags into `options` (tls_ca, tls_cert, tls_key,
// tls_server_name). Client::Connect checks the files. Thread-safe once
// flags are parsed.
void ApplyTlsFlags(ClientOptions* options);

}  // namespace zenflow

#endif  // ZENFLOW_CLIENT_TLS_FLAGS_H_
