// Test support: certificates for TLS tests, made at test time with the
// openssl command-line tool (package openssl) in a directory the test owns.
//
//   absl::StatusOr<TestPki> pki = TestPki::Create(dir);
//   daemon.Start({"--tls_cert=" + pki->server.cert, "--tls_key=" + pki->server.key,
//                 "--tls_ca=" + pki->ca});
#ifndef ZENFLOW_TESTS_TESTING_TEST_CERTS_H_
#define ZENFLOW_TESTS_TESTING_TEST_CERTS_H_

#include <string>

#include "absl/status/statusor.h"

namespace zenflow::testing {

// A certificate and its key (PEM file paths).
struct CertAndKey {
  std::string cert;
  std::string key;
};

// Two unrelated CAs and certificates they signed (EC P-256, valid for two
// days from now). Not thread-safe to create; the files are plain paths.
struct TestPki {
  std::string ca;        // the CA the daemon and good clients trust
  CertAndKey server;     // signed by `ca`: serverAuth, SAN IP:127.0.0.1 and DNS:localhost
  std::string server_key_encrypted;  // server.key under a passphrase (AES-256)
  CertAndKey client;     // signed by `ca`: clientAuth
  std::string other_ca;  // a second CA, unrelated to `ca`
  CertAndKey other_client;  // signed by `other_ca`: clientAuth

  // Makes every file in `dir` (which exists). FAILED_PRECONDITION naming
  // the package when there is no openssl tool; INTERNAL with its output
  // when a command fails.
  static absl::StatusOr<TestPki> Create(const std::string& dir);
};

}  // namespace zenflow::testing

#endif  // ZENFLOW_TESTS_TESTING_TEST_CERTS_H_
