// The target parser, the resolver's bound and the connection probes against
// listeners of the test's own on loopback (no zenflowd: tests/
// connect_errors_test.cc runs the whole Connect against real servers).
#include "client/connect_diagnosis.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(ParseTargetTest, TakesHostPortBracketedV6AndUnix) {
  absl::StatusOr<ParsedTarget> t = ParseTarget("127.0.0.1:50051");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "127.0.0.1");
  EXPECT_EQ(t->port, 50051);
  t = ParseTarget("zenflowd.example.com:1");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "zenflowd.example.com");
  t = ParseTarget("[::1]:65535");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "::1");
  EXPECT_EQ(t->port, 65535);
  t = ParseTarget("unix:/run/zenflowd/admin.sock");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind, ParsedTarget::Kind::kUnix);
  EXPECT_EQ(t->path, "/run/zenflowd/admin.sock");
  t = ParseTarget("unix:///run/z.sock");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->path, "/run/z.sock");
  t = ParseTarget("unix:relative.sock");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->path, "relative.sock");
}

TEST(ParseTargetTest, RefusesEveryOtherFormNamingTheExpectedOne) {
  struct Case {
    const char* target;
    const char* says;
  };
  for (const Case& c : {Case{"127.0.0.1", "has no port"},
                        Case{"127.0.0.1:", "has no port"},
                        Case{"http://127.0.0.1:50051", "is a URL (http://"},
                        Case{"grpc://zenflowd:50051/", "(try zenflowd:50051)"},
                        Case{"dns:///zenflowd:50051", "gRPC resolver scheme 'dns:'"},
                        Case{":50051", "empty host"},
                        Case{"[]:50051", "empty host"},
                        Case{"127.0.0.1:0", "outside 1-65535"},
                        Case{"127.0.0.1:65536", "outside 1-65535"},
                        Case{"127.0.0.1:http", "not a number"},
                        Case{"127.0.0.1:-1", "not a number"},
                        Case{"::1:50051", "IPv6 address without brackets"},
                        Case{"[::1]", "has no port"},
                        Case{"[::1:50051", "without its ']'"},
                        Case{"unix:", "no socket path"},
                        Case{"", "is empty"}}) {
    absl::StatusOr<ParsedTarget> t = ParseTarget(c.target);
    ASSERT_FALSE(t.ok()) << c.target;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.target;
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.says)) << c.target << ": " << t.status();
    EXPECT_TRUE(absl::StrContains(t.status().message(), "HOST:PORT")) << t.status();
    EXPECT_TRUE(absl::StrContains(t.status().message(), "unix:PATH")) << t.status();
  }
}

TEST(ResolveHostTest, AddressesResolveAndAMissingNameIsNotFound) {
  absl::StatusOr<std::vector<Endpoint>> e =
      ResolveHost(*ParseTarget("127.0.0.1:50051"), absl::Seconds(10));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 1u);
  EXPECT_EQ((*e)[0].text, "127.0.0.1");
  // RFC 6761: .invalid names never resolve.
  e = ResolveHost(*ParseTarget("nosuchhost.invalid:50051"), absl::Seconds(10));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kNotFound) << e.status();
  EXPECT_TRUE(absl::StrContains(e.status().message(), "host 'nosuchhost.invalid' does not resolve"))
      << e.status();
}

// A loopback listener whose accepted connections `serve` handles, one at a
// time, on a thread of its own.
class Listener {
 public:
  explicit Listener(std::function<void(int)> serve) : serve_(std::move(serve)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    EXPECT_EQ(listen(fd_, 8), 0);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0 || stop_.load()) {
          if (c >= 0) close(c);
          return;
        }
        serve_(c);
        close(c);
      }
    });
  }
  ~Listener() {
    stop_.store(true);
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  Endpoint endpoint() const {
    return (*ResolveHost(*ParseTarget(absl::StrCat("127.0.0.1:", port_)), absl::Seconds(10)))[0];
  }

 private:
  std::function<void(int)> serve_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Reads what the client sent first, then answers `reply`.
std::function<void(int)> Answer(std::string reply) {
  return [reply](int fd) {
    char buf[64];
    (void)!read(fd, buf, sizeof(buf));
    (void)!write(fd, reply.data(), reply.size());
  };
}

TEST(ProbeEndpointTest, ToldApart) {
  {
    // A port nothing listens on: a listener's, closed.
    Endpoint e;
    {
      Listener gone([](int) {});
      e = gone.endpoint();
    }
    EXPECT_EQ(ProbeEndpoint(e, absl::Seconds(5), true).reach, ProbeResult::Reach::kRefused);
  }
  Listener closes([](int) {});
  ProbeResult r = ProbeEndpoint(closes.endpoint(), absl::Seconds(5), true);
  EXPECT_EQ(r.reach, ProbeResult::Reach::kAccepted);
  EXPECT_EQ(r.speaks, ProbeResult::Speaks::kClosed);

  Listener http(Answer("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"));
  r = ProbeEndpoint(http.endpoint(), absl::Seconds(5), true);
  EXPECT_EQ(r.speaks, ProbeResult::Speaks::kHttp1);
  EXPECT_EQ(r.answer, "HTTP/1.1 400 Bad Request");

  // A TLS alert record (fatal, protocol_version).
  Listener tls(Answer(std::string("\x15\x03\x03\x00\x02\x02\x46", 7)));
  EXPECT_EQ(ProbeEndpoint(tls.endpoint(), absl::Seconds(5), true).speaks,
            ProbeResult::Speaks::kTls);

  // An HTTP/2 SETTINGS frame, empty.
  Listener h2(Answer(std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9)));
  EXPECT_EQ(ProbeEndpoint(h2.endpoint(), absl::Seconds(5), true).speaks,
            ProbeResult::Speaks::kHttp2);

  Listener other(Answer("SSH-2.0-OpenSSH_9.2\r\n"));
  r = ProbeEndpoint(other.endpoint(), absl::Seconds(5), true);
  EXPECT_EQ(r.speaks, ProbeResult::Speaks::kOther);
  EXPECT_EQ(r.answer, "SSH-2.0-OpenSSH_9.2");

  std::atomic<bool> release{false};
  Listener silent([&release](int) {
    while (!release.load()) usleep(10000);
  });
  EXPECT_EQ(ProbeEndpoint(silent.endpoint(), absl::Milliseconds(300), true).speaks,
            ProbeResult::Speaks::kSilent);
  release.store(true);
}

TEST(ProbeEndpointTest, UnixSocketThatIsNotThere) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr);
  // Relative: the runfiles' absolute paths are longer than a socket's.
  ASSERT_EQ(chdir(tmp), 0);
  absl::StatusOr<std::vector<Endpoint>> e =
      ResolveHost(*ParseTarget("unix:no.sock"), absl::Seconds(1));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(ProbeEndpoint((*e)[0], absl::Seconds(1), true).reach, ProbeResult::Reach::kNoSocket);
}

}  // namespace
}  // namespace zenflow
