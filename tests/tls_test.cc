// TLS for zenflowd's gRPC and the rule that nothing goes beyond this host in
// plaintext without --allow_insecure, against real zenflowd processes.
// Certificates are made at test time with the openssl tool
// (tests/testing/test_certs.h): a CA, a server certificate for 127.0.0.1
// and localhost, a client certificate, and a second, unrelated CA with a
// client certificate of its own.
//
// - rounds over TLS (and over mutual TLS, one job's data on UCX) match the
//   reference optimizer;
// - a plaintext client, a client trusting another CA, a client checking
//   another name, and with --tls_ca a client without a certificate or with
//   one from another CA, are refused, and the next good client still works;
// - unreadable or wrong PEM files stop zenflowd with exit status 2 and a
//   message naming the file;
// - plaintext gRPC, the UCX data plane over a network transport off "lo" and
//   /metrics beyond loopback stop it with status 2 unless --allow_insecure,
//   and the start-up log says how each is served;
// - the plaintext health listener (--health_listen) answers what the mutual
//   TLS server's own health service answers, and nothing else.
#include <signal.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/harness.h"
#include "tests/testing/status_macros.h"
#include "tests/testing/test_certs.h"

namespace zenflow::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory under TEST_TMPDIR, removed on destruction.
class TempDir {
 public:
  TempDir() {
    const char* tmp = getenv("TEST_TMPDIR");
    std::string templ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/zf_tls.XXXXXX");
    if (mkdtemp(templ.data()) != nullptr) path_ = templ;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A zenflowd child with its standard error in a file. Killed (SIGKILL) and
// reaped on destruction unless it already exited.
class Zenflowd {
 public:
  // Runs `zenflowd --port_file=... <flags>` (no --listen: the flags give it).
  explicit Zenflowd(const std::vector<std::string>& flags) {
    std::vector<std::string> args = {DaemonProcess::BinaryPath(), "--port_file=" + PortFile(),
                                     "--health_port_file=" + dir_.path() + "/health_port"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int err =
        open(LogFile().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    pid_ = fork();
    if (pid_ == 0) {
      if (err >= 0) dup2(err, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (err >= 0) close(err);
  }
  ~Zenflowd() {
    if (running()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Zenflowd(const Zenflowd&) = delete;
  Zenflowd& operator=(const Zenflowd&) = delete;

  // The bound gRPC port once zenflowd serves (it writes --port_file), or 0
  // if it exits first or does not serve within 30 s.
  int WaitServing() {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (running() && Clock::now() < deadline) {
      std::ifstream in(PortFile());
      if (in >> port_ && port_ > 0) return port_;
      Poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }
  // The exit status once zenflowd exits (within 30 s), or -1.
  int WaitExit() {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (running() && Clock::now() < deadline) {
      Poll();
      if (running()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return (!running() && WIFEXITED(status_)) ? WEXITSTATUS(status_) : -1;
  }
  // SIGTERM; OK when it then exits 0.
  absl::Status Stop() {
    if (running()) kill(pid_, SIGTERM);
    const int code = WaitExit();
    if (code != 0) return absl::InternalError(absl::StrCat("zenflowd exited with ", code, ": ", Log()));
    return absl::OkStatus();
  }
  std::string Log() const { return ReadFile(LogFile()); }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  int health_port() const {
    std::ifstream in(dir_.path() + "/health_port");
    int port = 0;
    in >> port;
    return port;
  }

 private:
  bool running() const { return pid_ > 0 && !exited_; }
  void Poll() {
    if (waitpid(pid_, &status_, WNOHANG) == pid_) exited_ = true;
  }
  std::string PortFile() const { return dir_.path() + "/port"; }
  std::string LogFile() const { return dir_.path() + "/stderr"; }

  TempDir dir_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
  int port_ = 0;
};

// The certificates, made once for all tests.
class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    absl::StatusOr<TestPki> pki = TestPki::Create(dir_->path());
    if (pki.ok()) {
      pki_ = new TestPki(*std::move(pki));
    } else {
      pki_error_ = new std::string(pki.status().ToString());
    }
  }
  static void TearDownTestSuite() {
    delete pki_;
    delete pki_error_;
    delete dir_;
    pki_ = nullptr;
    pki_error_ = nullptr;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(pki_, nullptr) << *pki_error_; }

  // zenflowd's TLS flags: the server certificate, and with `client_certs`
  // the CA that must have signed every client's.
  static std::vector<std::string> ServerTls(bool client_certs) {
    std::vector<std::string> f = {"--tls_cert=" + pki_->server.cert,
                                  "--tls_key=" + pki_->server.key};
    if (client_certs) f.push_back("--tls_ca=" + pki_->ca);
    return f;
  }
  // Starts zenflowd on a loopback port with `flags`; the port, or 0 (with
  // the daemon's log in a test failure).
  static int Serve(Zenflowd& d) {
    const int port = d.WaitServing();
    EXPECT_GT(port, 0) << "zenflowd did not serve: " << d.Log();
    return port;
  }
  // Job options for a rank set whose clients use TLS with `ca` (and, when
  // given, a client certificate).
  static JobOptions Job(const std::string& id, const std::string& ca,
                        const CertAndKey* client = nullptr) {
    JobOptions o;
    o.job_id = id;
    o.world = 2;
    o.tls_ca = ca;
    if (client != nullptr) {
      o.tls_cert = client->cert;
      o.tls_key = client->key;
    }
    return o;
  }

  static TempDir* dir_;
  static TestPki* pki_;
  static std::string* pki_error_;
};

TempDir* TlsTest::dir_ = nullptr;
TestPki* TlsTest::pki_ = nullptr;
std::string* TlsTest::pki_error_ = nullptr;

// One client with `co` creating a small job: its Connect or its CreateJob
// fails when the daemon refuses the connection. A client that should be
// refused waits `connect_timeout` at most.
absl::Status CreateJobWith(ClientOptions co, const std::string& job_id) {
  JobOptions o;
  o.job_id = job_id;
  o.world = 1;
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(co));
  return c->CreateJob(Harness(co.target, o).spec()).status();
}

ClientOptions Options(const std::string& target, absl::Duration connect_timeout) {
  ClientOptions co;
  co.target = target;
  co.token = kTestToken;
  co.connect_timeout = connect_timeout;
  return co;
}

// A refused connection: no TLS session, so gRPC reports UNAVAILABLE (at
// Connect, or at the first call when the server refuses after the
// client's side of the handshake).
void ExpectRefused(const absl::Status& s, const std::string& what) {
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << what << ": " << s;
}

TEST_F(TlsTest, RoundsOverTlsMatchTheReference) {
  std::vector<std::string> flags = {"--listen=127.0.0.1:0", "--ucx=false"};
  for (const std::string& f : ServerTls(false)) flags.push_back(f);
  Zenflowd d(flags);
  ASSERT_GT(Serve(d), 0);
  // The start-up line names the bound port, not the asked-for 0.
  EXPECT_TRUE(absl::StrContains(d.Log(), "zenflowd: security: gRPC on " + d.target() +
                                             ": TLS, no client certificates"))
      << d.Log();
  Harness h(d.target(), Job("tls", pki_->ca));
  ASSERT_OK(h.Setup());
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.GoodRound(1e-2f));
  ASSERT_OK(h.client(0).GetJob("tls").status());
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

TEST_F(TlsTest, PlaintextClientIsRefusedAndTheNextTlsClientWorks) {
  std::vector<std::string> flags = {"--listen=127.0.0.1:0", "--ucx=false"};
  for (const std::string& f : ServerTls(false)) flags.push_back(f);
  Zenflowd d(flags);
  ASSERT_GT(Serve(d), 0);
  ExpectRefused(CreateJobWith(Options(d.target(), absl::Seconds(3)), "plain"), "plaintext");
  ClientOptions good = Options(d.target(), absl::Seconds(30));
  good.tls_ca = pki_->ca;
  EXPECT_EQ(CreateJobWith(good, "after-plain"), absl::OkStatus());
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

TEST_F(TlsTest, ClientTrustingAnotherCaOrCheckingAnotherNameIsRefused) {
  std::vector<std::string> flags = {"--listen=127.0.0.1:0", "--ucx=false"};
  for (const std::string& f : ServerTls(false)) flags.push_back(f);
  Zenflowd d(flags);
  ASSERT_GT(Serve(d), 0);
  ClientOptions wrong_ca = Options(d.target(), absl::Seconds(3));
  wrong_ca.tls_ca = pki_->other_ca;
  ExpectRefused(CreateJobWith(wrong_ca, "wrong-ca"), "a client trusting another CA");
  ClientOptions wrong_name = Options(d.target(), absl::Seconds(3));
  wrong_name.tls_ca = pki_->ca;
  wrong_name.tls_server_name = "zenflowd.example.invalid";
  ExpectRefused(CreateJobWith(wrong_name, "wrong-name"), "a client checking another name");
  // The certificate's DNS name, with the target by address.
  ClientOptions by_name = Options(d.target(), absl::Seconds(30));
  by_name.tls_ca = pki_->ca;
  by_name.tls_server_name = "localhost";
  EXPECT_EQ(CreateJobWith(by_name, "by-name"), absl::OkStatus());
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

TEST_F(TlsTest, MutualTlsRoundsOverGrpcAndUcxMatchTheReference) {
  std::vector<std::string> flags = {"--listen=127.0.0.1:0"};
  for (const std::string& f : ServerTls(true)) flags.push_back(f);
  Zenflowd d(flags);
  ASSERT_GT(Serve(d), 0);
  EXPECT_TRUE(absl::StrContains(d.Log(), "TLS, client certificates required")) << d.Log();
  Harness grpc_job(d.target(), Job("mtls-grpc", pki_->ca, &pki_->client));
  ASSERT_OK(grpc_job.Setup());
  ASSERT_OK(grpc_job.GoodRound(1e-2f));
  // Control calls under mutual TLS, shards and deltas over UCX (shared
  // memory, as the daemon's default --ucx_tls).
  JobOptions ucx = Job("mtls-ucx", pki_->ca, &pki_->client);
  ucx.ucx = UcxOptions();
  Harness ucx_job(d.target(), ucx);
  ASSERT_OK(ucx_job.Setup());
  ASSERT_OK(ucx_job.GoodRound(1e-2f));
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

TEST_F(TlsTest, MutualTlsRefusesClientsWithoutACertificateOfItsCa) {
  std::vector<std::string> flags = {"--listen=127.0.0.1:0", "--ucx=false"};
  for (const std::string& f : ServerTls(true)) flags.push_back(f);
  Zenflowd d(flags);
  ASSERT_GT(Serve(d), 0);
  ClientOptions no_cert = Options(d.target(), absl::Seconds(3));
  no_cert.tls_ca = pki_->ca;
  ExpectRefused(CreateJobWith(no_cert, "no-cert"), "a client without a certificate");
  ClientOptions stranger = no_cert;
  stranger.tls_cert = pki_->other_client.cert;
  stranger.tls_key = pki_->other_client.key;
  ExpectRefused(CreateJobWith(stranger, "stranger"), "a client certificate of another CA");
  // A server certificate is not a client certificate (extendedKeyUsage).
  ClientOptions server_as_client = no_cert;
  server_as_client.tls_cert = pki_->server.cert;
  server_as_client.tls_key = pki_->server.key;
  ExpectRefused(CreateJobWith(server_as_client, "server-cert"),
                "the server's certificate as a client's");
  ClientOptions good = Options(d.target(), absl::Seconds(30));
  good.tls_ca = pki_->ca;
  good.tls_cert = pki_->client.cert;
  good.tls_key = pki_->client.key;
  EXPECT_EQ(CreateJobWith(good, "good"), absl::OkStatus());
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

TEST_F(TlsTest, ClientRefusesUnusableFilesBeforeConnecting) {
  ClientOptions co = Options("127.0.0.1:1", absl::Seconds(3));
  co.tls_ca = dir_->path() + "/absent.crt";
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(co);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "tls_ca " + co.tls_ca + ": cannot read it"))
      << c.status();
  co.tls_ca = pki_->ca;
  co.tls_cert = pki_->client.cert;  // no key
  c = Client::Connect(co);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  co.tls_key = pki_->server.key;  // another certificate's
  c = Client::Connect(co);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "does not belong to the certificate"))
      << c.status();
  co = Options("127.0.0.1:1", absl::Seconds(3));
  co.tls_cert = pki_->client.cert;
  co.tls_key = pki_->client.key;  // but no tls_ca: would be plaintext
  c = Client::Connect(co);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
}

// zenflowd with `flags` must exit 2 and say `message`.
void ExpectExit2(const std::vector<std::string>& flags, const std::string& message) {
  Zenflowd d(flags);
  EXPECT_EQ(d.WaitExit(), 2) << d.Log();
  EXPECT_TRUE(absl::StrContains(d.Log(), message)) << "want \"" << message << "\" in: " << d.Log();
}

TEST_F(TlsTest, UnreadableOrInvalidFilesStopTheDaemonNamingTheFile) {
  const std::string absent = dir_->path() + "/absent.key";
  const std::string listen = "--listen=127.0.0.1:0";
  ExpectExit2({listen, "--tls_cert=" + pki_->server.cert, "--tls_key=" + absent},
              "--tls_key " + absent + ": cannot read it: No such file or directory");
  ExpectExit2({listen, "--tls_cert=" + pki_->server.key, "--tls_key=" + pki_->server.key},
              "--tls_cert " + pki_->server.key + ": no PEM certificate in it");
  ExpectExit2({listen, "--tls_cert=" + pki_->server.cert, "--tls_key=" + pki_->server.cert},
              "--tls_key " + pki_->server.cert + ": no PEM private key in it");
  ExpectExit2({listen, "--tls_cert=" + pki_->server.cert,
               "--tls_key=" + pki_->server_key_encrypted},
              "--tls_key " + pki_->server_key_encrypted +
                  ": the private key in it cannot be loaded (it is passphrase-protected");
  ExpectExit2({listen, "--tls_cert=" + pki_->server.cert, "--tls_key=" + pki_->client.key},
              "--tls_key " + pki_->client.key + " does not belong to the certificate in --tls_cert " +
                  pki_->server.cert);
  ExpectExit2({listen, "--tls_cert=" + pki_->server.cert, "--tls_key=" + pki_->server.key,
               "--tls_ca=" + pki_->client.key},
              "--tls_ca " + pki_->client.key + ": no PEM certificate in it");
  ExpectExit2({listen, "--tls_ca=" + pki_->ca, "--tls_cert=" + dir_->path()},
              "--tls_cert and --tls_key go together");
  ExpectExit2({listen, "--tls_ca=" + pki_->ca}, "--tls_ca (client certificates) needs TLS");
  const std::string garbage = dir_->path() + "/garbage.crt";
  {
    std::ofstream out(garbage);
    out << "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
  }
  ExpectExit2({listen, "--tls_cert=" + garbage, "--tls_key=" + pki_->server.key},
              "--tls_cert " + garbage + ": certificate 1 in it is not valid");
}

TEST_F(TlsTest, PlaintextGrpcBeyondLoopbackNeedsTlsOrAllowInsecure) {
  ExpectExit2({"--listen=0.0.0.0:0", "--ucx=false"},
              "--listen=0.0.0.0:0 reaches beyond this host and gRPC has no TLS: give --tls_cert "
              "and --tls_key (and --tls_ca to require client certificates), or --allow_insecure");
  {
    Zenflowd d({"--listen=0.0.0.0:0", "--ucx=false", "--allow_insecure"});
    ASSERT_GT(Serve(d), 0);
    EXPECT_TRUE(absl::StrContains(d.Log(), absl::StrCat("gRPC on 0.0.0.0:", Serve(d),
                                                        ": PLAINTEXT beyond this host "
                                                        "(--allow_insecure)")))
        << d.Log();
    EXPECT_EQ(CreateJobWith(Options(d.target(), absl::Seconds(30)), "insecure"), absl::OkStatus());
    EXPECT_EQ(d.Stop(), absl::OkStatus());
  }
  {
    Zenflowd d({"--listen=127.0.0.1:0", "--ucx=false"});
    ASSERT_GT(Serve(d), 0);
    EXPECT_TRUE(absl::StrContains(d.Log(), "gRPC on " + d.target() + ": plaintext, loopback only"))
        << d.Log();
    EXPECT_EQ(d.Stop(), absl::OkStatus());
  }
  // TLS needs no --allow_insecure beyond loopback.
  std::vector<std::string> flags = {"--listen=0.0.0.0:0", "--ucx=false"};
  for (const std::string& f : ServerTls(true)) flags.push_back(f);
  Zenflowd d(flags);
  ASSERT_GT(Serve(d), 0);
  ClientOptions good = Options(d.target(), absl::Seconds(30));
  good.tls_ca = pki_->ca;
  good.tls_cert = pki_->client.cert;
  good.tls_key = pki_->client.key;
  EXPECT_EQ(CreateJobWith(good, "tls-everywhere"), absl::OkStatus());
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

// The UCX data plane is never encrypted: a network transport needs
// --ucx_net_devices=lo or --allow_insecure, even when gRPC has TLS.
TEST_F(TlsTest, UcxNetworkTransportNeedsLoopbackDeviceOrAllowInsecure) {
  std::vector<std::string> tls = ServerTls(true);
  std::vector<std::string> flags = {"--listen=127.0.0.1:0", "--ucx_tls=tcp,self"};
  flags.insert(flags.end(), tls.begin(), tls.end());
  ExpectExit2(flags,
              "--ucx_tls=tcp,self has a network transport (tcp) on all devices, and the UCX data "
              "plane is never encrypted");
  std::vector<std::string> eth = flags;
  eth.push_back("--ucx_net_devices=lo,eth0");
  ExpectExit2(eth, "(tcp) on --ucx_net_devices=lo,eth0");
  {
    std::vector<std::string> lo = flags;
    lo.push_back("--ucx_net_devices=lo");
    Zenflowd d(lo);
    ASSERT_GT(Serve(d), 0);
    EXPECT_TRUE(absl::StrContains(d.Log(), "UCX data plane (never encrypted) over tcp,self: "
                                           "loopback only"))
        << d.Log();
    EXPECT_EQ(d.Stop(), absl::OkStatus());
  }
  std::vector<std::string> insecure = flags;
  insecure.push_back("--allow_insecure");
  Zenflowd d(insecure);
  ASSERT_GT(Serve(d), 0);
  EXPECT_TRUE(absl::StrContains(d.Log(), "PLAINTEXT on all devices (--allow_insecure)")) << d.Log();
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

TEST_F(TlsTest, MetricsBeyondLoopbackNeedAllowInsecure) {
  std::vector<std::string> flags = {"--listen=127.0.0.1:0", "--ucx=false",
                                    "--metrics_listen=0.0.0.0:0"};
  for (const std::string& f : ServerTls(true)) flags.push_back(f);
  ExpectExit2(flags, "--metrics_listen=0.0.0.0:0 reaches beyond this host and /metrics is "
                     "plaintext HTTP");
  flags.push_back("--allow_insecure");
  Zenflowd d(flags);
  ASSERT_GT(Serve(d), 0);
  EXPECT_TRUE(absl::StrContains(d.Log(), ": plaintext HTTP, beyond this host (--allow_insecure)"))
      << d.Log();
  EXPECT_TRUE(absl::StrContains(d.Log(), "/metrics on 0.0.0.0:")) << d.Log();
  EXPECT_FALSE(absl::StrContains(d.Log(), "/metrics on 0.0.0.0:0:")) << d.Log();
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

// grpc.health.v1.Health/Check (or `method`) for `service` over plaintext:
// the status, and the answer's bytes in *answer.
grpc::Status RawCall(const std::string& target, const std::string& method,
                     const std::string& request_bytes, std::string* answer) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  answer->clear();
  std::vector<grpc::Slice> slices;
  if (status.ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      answer->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

constexpr char kCheck[] = "/grpc.health.v1.Health/Check";

TEST_F(TlsTest, HealthListenerForwardsChecksToTheMutualTlsServerAndNothingElse) {
  std::vector<std::string> flags = {"--listen=127.0.0.1:0", "--ucx=false",
                                    "--health_listen=127.0.0.1:0"};
  for (const std::string& f : ServerTls(true)) flags.push_back(f);
  Zenflowd d(flags);
  ASSERT_GT(Serve(d), 0);
  const int health = d.health_port();
  ASSERT_GT(health, 0) << d.Log();
  const std::string probe = absl::StrCat("127.0.0.1:", health);
  std::string answer;
  // HealthCheckRequest{service: ""} is no bytes; SERVING is {status: 1}.
  grpc::Status s = RawCall(probe, kCheck, "", &answer);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_EQ(answer, std::string("\x08\x01", 2));
  // A service the daemon's health service does not know: its NOT_FOUND
  // comes back, so the answer is the server's and not the listener's own.
  s = RawCall(probe, kCheck, std::string("\x0a\x04nope", 6), &answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  // The API and reflection are not served there.
  s = RawCall(probe, "/zenflow.v1.ZenFlow/GetStats", "", &answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
  s = RawCall(probe, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "",
              &answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
  // And the main port still refuses plaintext.
  s = RawCall(d.target(), kCheck, "", &answer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // A second daemon cannot take the same health port.
  flags.push_back(absl::StrCat("--health_listen=", probe));
  Zenflowd second(flags);
  EXPECT_EQ(second.WaitExit(), 1) << second.Log();
  EXPECT_TRUE(absl::StrContains(second.Log(), absl::StrCat("cannot listen on ", probe,
                                                           " (health checks): the address is "
                                                           "already in use")))
      << second.Log();
  EXPECT_EQ(d.Stop(), absl::OkStatus());
}

}  // namespace
}  // namespace zenflow::testing
