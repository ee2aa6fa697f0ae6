// Test support: certificates made with the openssl tool; see test_certs.h.
#include "tests/testing/test_certs.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zenflow::testing {
namespace {

// Every section the commands below name; no reliance on the system's
// openssl.cnf.
constexpr char kConfig[] = R"(# made by tests/testing/test_certs.cc
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
)";

std::string Openssl() {
  for (const char* p : {"/usr/bin/openssl", "/bin/openssl"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs openssl with `args`, its output into `log`; waits for it.
absl::Status Run(const std::string& openssl, const std::vector<std::string>& args,
                 const std::string& log) {
  std::vector<std::string> argv_s = {openssl};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0) return absl::InternalError(absl::StrCat("cannot write ", log));
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out, 1);
    dup2(out, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out);
  if (pid < 0) return absl::InternalError("fork failed");
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError("waitpid failed");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("`openssl ", absl::StrJoin(args, " "),
                                            "` failed (status ", status, "): ", ReadFile(log)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TestPki> TestPki::Create(const std::string& dir) {
  const std::string openssl = Openssl();
  if (openssl.empty()) {
    return absl::FailedPreconditionError(
        "no openssl command: install the Debian package openssl (./zf setup)");
  }
  const std::string config = dir + "/openssl.cnf";
  {
    std::ofstream out(config);
    out << kConfig;
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", config));
  }
  const std::string log = dir + "/openssl.log";
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt",
                                       "ec_paramgen_curve:prime256v1", "-nodes"};
  int serial = 1;
  auto make_ca = [&](const std::string& name, const std::string& cn) -> absl::Status {
    std::vector<std::string> args = {"req", "-config", config, "-x509"};
    args.insert(args.end(), ec.begin(), ec.end());
    args.insert(args.end(), {"-keyout", dir + "/" + name + ".key", "-out", dir + "/" + name + ".crt",
                             "-days", "2", "-subj", "/CN=" + cn, "-extensions", "ca_ext"});
    return Run(openssl, args, log);
  };
  auto make_leaf = [&](const std::string& name, const std::string& cn, const std::string& ca,
                       const std::string& ext) -> absl::Status {
    std::vector<std::string> req = {"req", "-config", config};
    req.insert(req.end(), ec.begin(), ec.end());
    req.insert(req.end(), {"-keyout", dir + "/" + name + ".key", "-out", dir + "/" + name + ".csr",
                           "-subj", "/CN=" + cn});
    absl::Status s = Run(openssl, req, log);
    if (!s.ok()) return s;
    return Run(openssl,
               {"x509", "-req", "-in", dir + "/" + name + ".csr", "-CA", dir + "/" + ca + ".crt",
                "-CAkey", dir + "/" + ca + ".key", "-set_serial", std::to_string(++serial),
                "-days", "2", "-extfile", config, "-extensions", ext, "-out",
                dir + "/" + name + ".crt"},
               log);
  };
  absl::Status s = make_ca("ca", "zenflow test CA");
  if (s.ok()) s = make_ca("other_ca", "unrelated CA");
  if (s.ok()) s = make_leaf("server", "localhost", "ca", "server_ext");
  if (s.ok()) s = make_leaf("client", "rank client", "ca", "client_ext");
  if (s.ok()) s = make_leaf("other_client", "stranger", "other_ca", "client_ext");
  if (s.ok()) {
    s = Run(openssl,
            {"pkey", "-in", dir + "/server.key", "-aes256", "-passout", "pass:zenflow-test",
             "-out", dir + "/server_encrypted.key"},
            log);
  }
  if (!s.ok()) return s;
  TestPki pki;
  pki.ca = dir + "/ca.crt";
  pki.server = {dir + "/server.crt", dir + "/server.key"};
  pki.server_key_encrypted = dir + "/server_encrypted.key";
  pki.client = {dir + "/client.crt", dir + "/client.key"};
  pki.other_ca = dir + "/other_ca.crt";
  pki.other_client = {dir + "/other_client.crt", dir + "/other_client.key"};
  return pki;
}

}  // namespace zenflow::testing
