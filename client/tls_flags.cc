// The tools' TLS flags; see tls_flags.h.
#include "client/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA that signed zenflowd's certificate: connect with TLS (empty: "
          "plaintext, which zenflowd serves on loopback only unless --allow_insecure)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of this client's certificate, for a zenflowd started with --tls_ca "
          "(needs --tls_key and --tls_ca)");
ABSL_FLAG(std::string, tls_key, "", "PEM file of --tls_cert's private key (unencrypted)");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name zenflowd's certificate must carry, when it is not the host in --target "
          "(e.g. a target by IP address)");

namespace zenflow {

void ApplyTlsFlags(ClientOptions* options) {
  options->tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options->tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options->tls_key = absl::GetFlag(FLAGS_tls_key);
  options->tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
}

}  // namespace zenflow
