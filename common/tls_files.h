// TLS key material for gRPC, read from PEM files and checked before gRPC
// sees it. gRPC takes PEM text and only finds a wrong file at bind time or
// at the first handshake, with a log line that does not name the file; these
// checks fail at once with a message that names the flag and the path.
// Used by zenflowd (--tls_cert, --tls_key, --tls_ca) and by the client
// (ClientOptions.tls_ca, tls_cert, tls_key).
//
//   ZF_ASSIGN_OR_RETURN(TlsPem pem, ReadTlsFiles({.cert = "server.crt", .key = "server.key",
//                                                 .ca = "ca.crt"},
//                                                {"--tls_cert", "--tls_key", "--tls_ca"}));
//   opts.pem_key_cert_pairs.push_back({pem.key, pem.cert});
#ifndef ZENFLOW_COMMON_TLS_FILES_H_
#define ZENFLOW_COMMON_TLS_FILES_H_

#include <string>

#include "absl/status/statusor.h"

namespace zenflow {

// Paths of PEM files; an empty path means "none".
struct TlsPaths {
  std::string cert;  // a certificate chain, the end-entity certificate first
  std::string key;   // the private key of `cert`'s first certificate (unencrypted)
  std::string ca;    // one or more CA certificates to verify the peer with
};

// How messages name each path (a flag, or an option field).
struct TlsNames {
  std::string cert = "tls_cert";
  std::string key = "tls_key";
  std::string ca = "tls_ca";
};

// The PEM text of each file, as read (empty where the path was empty).
struct TlsPem {
  std::string cert;
  std::string key;
  std::string ca;
};

// Reads the files and checks that each holds what it should: `cert` and `ca`
// one or more parseable certificates, `key` a private key that is not
// passphrase-protected and that belongs to the first certificate of `cert`.
// `cert` and `key` go together (both or neither). INVALID_ARGUMENT naming
// the option and the path otherwise, e.g.
//   --tls_key /etc/zenflowd/tls/server.key: cannot read it: No such file or directory
//   --tls_key /a.key does not belong to the certificate in --tls_cert /b.crt
// Thread-safe. Certificates' dates are not checked.
absl::StatusOr<TlsPem> ReadTlsFiles(const TlsPaths& paths, const TlsNames& names);

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_TLS_FILES_H_
