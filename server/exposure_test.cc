// The plaintext-beyond-loopback rule (exposure.h), without a network.
#include "server/exposure.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

TEST(IsLoopbackListenTest, LoopbackAddressesAndUnixSockets) {
  for (const char* a : {"127.0.0.1:50051", "127.0.0.1:0", "127.4.5.6:1", "[::1]:50051",
                        "localhost:50051", "LOCALHOST:1", "[::ffff:127.0.0.1]:1",
                        "ipv4:127.0.0.1:50051", "unix:/run/zenflowd/x.sock",
                        "unix-abstract:zenflowd"}) {
    EXPECT_TRUE(IsLoopbackListen(a)) << a;
  }
}

TEST(IsLoopbackListenTest, EverythingElseReachesBeyondThisHost) {
  for (const char* a : {"0.0.0.0:50051", "[::]:50051", ":50051", "192.0.2.10:50051",
                        "128.0.0.1:1", "[2001:db8::1]:1", "[::ffff:192.0.2.1]:1",
                        "no-such-host.invalid:50051", "50051", ""}) {
    EXPECT_FALSE(IsLoopbackListen(a)) << a;
  }
}

TEST(NetworkTransportInTest, HostLocalTransports) {
  for (const char* t : {"sm,self", "shm", "posix,sysv,self", "cma,knem,xpmem", "self",
                        " sm , self ", "SM,Self", "cuda_copy,cuda_ipc,sm", "sm:aux,self"}) {
    EXPECT_EQ(NetworkTransportIn(t), "") << t;
  }
}

TEST(NetworkTransportInTest, NetworkTransportsAndOpenLists) {
  EXPECT_EQ(NetworkTransportIn("tcp,self"), "tcp");
  EXPECT_EQ(NetworkTransportIn("sm,self,rc"), "rc");
  EXPECT_EQ(NetworkTransportIn("sm,ud:aux"), "ud");
  EXPECT_EQ(NetworkTransportIn("all"), "all");
  EXPECT_EQ(NetworkTransportIn(""), "all");
  EXPECT_EQ(NetworkTransportIn("^cma"), "^cma");
  EXPECT_EQ(NetworkTransportIn("dc_x,sm"), "dc_x");
}

ExposureConfig Loopback() {
  ExposureConfig c;
  c.listen = "127.0.0.1:50051";
  c.ucx = true;
  c.ucx_tls = "sm,self";
  return c;
}

TEST(CheckExposureTest, LoopbackPlaintextIsAllowed) {
  ExposureConfig c = Loopback();
  c.metrics_listen = "127.0.0.1:9464";
  EXPECT_TRUE(CheckExposure(c).ok());
  c.ucx_tls = "tcp,self";
  c.ucx_net_devices = "lo";
  EXPECT_TRUE(CheckExposure(c).ok());
}

TEST(CheckExposureTest, PlaintextGrpcBeyondLoopbackNeedsTlsOrAllowInsecure) {
  ExposureConfig c = Loopback();
  c.listen = "0.0.0.0:50051";
  const absl::Status s = CheckExposure(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--listen=0.0.0.0:50051 reaches beyond this host"))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "give --tls_cert and --tls_key")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--allow_insecure")) << s;
  c.tls = true;
  EXPECT_TRUE(CheckExposure(c).ok());
  c.tls = false;
  c.allow_insecure = true;
  EXPECT_TRUE(CheckExposure(c).ok());
}

TEST(CheckExposureTest, UcxNetworkTransportNeedsLoopbackDeviceOrAllowInsecure) {
  ExposureConfig c = Loopback();
  c.tls = true;
  c.ucx_tls = "tcp,self";
  for (const char* devices : {"", "eth0", "lo,eth0", "all"}) {
    c.ucx_net_devices = devices;
    const absl::Status s = CheckExposure(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << devices;
    EXPECT_TRUE(absl::StrContains(s.message(), "network transport (tcp)")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "never encrypted")) << s;
  }
  c.ucx_net_devices = "eth0";
  c.ucx = false;  // no data plane, nothing exposed
  EXPECT_TRUE(CheckExposure(c).ok());
  c.ucx = true;
  c.allow_insecure = true;
  EXPECT_TRUE(CheckExposure(c).ok());
}

TEST(CheckExposureTest, MetricsBeyondLoopbackNeedsAllowInsecureEvenWithTls) {
  ExposureConfig c = Loopback();
  c.tls = true;
  c.metrics_listen = "0.0.0.0:9464";
  const absl::Status s = CheckExposure(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--metrics_listen=0.0.0.0:9464")) << s;
  c.allow_insecure = true;
  EXPECT_TRUE(CheckExposure(c).ok());
}

TEST(CheckExposureTest, EveryProblemIsNamedAtOnce) {
  ExposureConfig c = Loopback();
  c.listen = "[::]:1";
  c.ucx_tls = "all";
  c.metrics_listen = ":9464";
  const absl::Status s = CheckExposure(c);
  EXPECT_TRUE(absl::StrContains(s.message(), "--listen=[::]:1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--ucx_tls=all")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--metrics_listen=:9464")) << s;
}

TEST(DescribeExposureTest, SaysHowEachListenerServes) {
  ExposureConfig c = Loopback();
  EXPECT_TRUE(absl::StrContains(DescribeExposure(c), "plaintext, loopback only")) << DescribeExposure(c);
  EXPECT_TRUE(absl::StrContains(DescribeExposure(c), "shared memory only")) << DescribeExposure(c);
  c.tls = true;
  EXPECT_TRUE(absl::StrContains(DescribeExposure(c), "TLS, no client certificates"));
  c.client_certs = true;
  EXPECT_TRUE(absl::StrContains(DescribeExposure(c), "TLS, client certificates required"));
  c.tls = c.client_certs = false;
  c.listen = "0.0.0.0:1";
  c.allow_insecure = true;
  c.ucx_tls = "tcp";
  c.ucx_net_devices = "eth0";
  const std::string d = DescribeExposure(c);
  EXPECT_TRUE(absl::StrContains(d, "gRPC on 0.0.0.0:1: PLAINTEXT beyond this host")) << d;
  EXPECT_TRUE(absl::StrContains(d, "PLAINTEXT on --ucx_net_devices=eth0")) << d;
}

TEST(WithBoundPortTest, PortZeroBecomesTheBoundPort) {
  EXPECT_EQ(WithBoundPort("127.0.0.1:0", 43123), "127.0.0.1:43123");
  EXPECT_EQ(WithBoundPort("[::1]:0", 8), "[::1]:8");
  EXPECT_EQ(WithBoundPort("0.0.0.0:50051", 50051), "0.0.0.0:50051");
  EXPECT_EQ(WithBoundPort("127.0.0.1:10", 43123), "127.0.0.1:10");  // not asked for port 0
  EXPECT_EQ(WithBoundPort("", 0), "");
}

}  // namespace
}  // namespace zenflow
