// The admin socket's listener: the default path rule's environment steps,
// the socket file (mode, a live or stale socket at the path, not a socket,
// too long a path, removed at exit) and the bound on open connections.
#include "server/admin_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace {

// A connection to the unix socket `path`; -1 when refused.
int Dial(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

class AdminSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // $TEST_TMPDIR is longer than a socket address: work relative to it.
    ASSERT_EQ(chdir(getenv("TEST_TMPDIR")), 0);
    // As zenflowd does: every server gets these unless kept off.
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    refusing_ = NewRefusingService("no");
    grpc::ServerBuilder a, r;
    WithoutAddedServices(&a);
    WithoutAddedServices(&r);
    admin_service_ = NewRefusingService("admin");
    a.RegisterCallbackGenericService(admin_service_.get());
    r.RegisterCallbackGenericService(refusing_.get());
    admin_ = a.BuildAndStart();
    refusing_server_ = r.BuildAndStart();
    ASSERT_NE(admin_, nullptr);
    ASSERT_NE(refusing_server_, nullptr);
  }
  void TearDown() override {
    admin_->Shutdown();
    refusing_server_->Shutdown();
  }
  absl::StatusOr<std::unique_ptr<AdminSocket>> Start(const std::string& path,
                                                     AdminSocketOptions o = {}) {
    return AdminSocket::Start(path, admin_.get(), refusing_server_.get(), std::move(o));
  }

  std::unique_ptr<grpc::CallbackGenericService> admin_service_, refusing_;
  std::unique_ptr<grpc::Server> admin_, refusing_server_;
};

TEST(AdminSocketPathTest, FlagAndEnvironment) {
  EXPECT_EQ(ResolveAdminSocketPath("/x/a.sock", ""), "/x/a.sock");
  EXPECT_EQ(ResolveAdminSocketPath("", "/state"), "");
  setenv("ZENFLOW_ADMIN_SOCKET", "/y/b.sock", 1);
  EXPECT_EQ(ResolveAdminSocketPath("auto", ""), "/y/b.sock");
  EXPECT_EQ(FindAdminSocket(), "/y/b.sock");
  setenv("ZENFLOW_ADMIN_SOCKET", "", 1);
  EXPECT_EQ(ResolveAdminSocketPath("auto", "/state"), "");
  EXPECT_EQ(FindAdminSocket(), "");
  unsetenv("ZENFLOW_ADMIN_SOCKET");
  setenv("RUNTIME_DIRECTORY", "/run/zf:/run/other", 1);
  EXPECT_EQ(ResolveAdminSocketPath("auto", "/state"), "/run/zf/admin.sock");
  unsetenv("RUNTIME_DIRECTORY");
  EXPECT_TRUE(AdmitsPeer(0, 1000));
  EXPECT_TRUE(AdmitsPeer(1000, 1000));
  EXPECT_FALSE(AdmitsPeer(65534, 1000));
}

TEST_F(AdminSocketTest, FileModeLiveStaleAndRemoval) {
  absl::StatusOr<std::unique_ptr<AdminSocket>> s = Start("a.sock");
  ASSERT_TRUE(s.ok()) << s.status();
  struct stat st;
  ASSERT_EQ(stat("a.sock", &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  // A second daemon on the same path is refused, and leaves the first's file.
  absl::StatusOr<std::unique_ptr<AdminSocket>> again = Start("a.sock");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("another process"), std::string::npos);
  EXPECT_EQ(stat("a.sock", &st), 0);
  s->reset();
  EXPECT_NE(stat("a.sock", &st), 0) << "the socket file outlived its listener";

  // A socket file nobody listens on (a daemon that was killed) is replaced.
  {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, "b.sock");
    ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  absl::StatusOr<std::unique_ptr<AdminSocket>> stale = Start("b.sock");
  EXPECT_TRUE(stale.ok()) << stale.status();

  std::ofstream("c.sock") << "a file\n";
  EXPECT_EQ(Start("c.sock").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Start(std::string(200, 'x')).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AdminSocketTest, OpenConnectionsAreBounded) {
  AdminSocketOptions o;
  o.max_admitted = 2;
  absl::StatusOr<std::unique_ptr<AdminSocket>> s = Start("d.sock", o);
  ASSERT_TRUE(s.ok()) << s.status();
  // This test's user is the listener's: every connection is admitted.
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    fds.push_back(Dial("d.sock"));
    ASSERT_GE(fds.back(), 0);
    // One at a time, so that the third is the one over the bound.
    for (int k = 0; k < 200 && (*s)->admitted_open() < std::min(i + 1, 2); ++k) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  EXPECT_EQ((*s)->admitted_open(), 2);
  // The third was closed at accept: it reads end of file.
  pollfd p{fds[2], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  char c;
  EXPECT_EQ(read(fds[2], &c, 1), 0);
  for (int fd : fds) close(fd);
  EXPECT_EQ((*s)->refused_open(), 0);
}

// A peer reaches nothing but the service its connection was handed to: no
// health check or reflection that gRPC would add to every server.
TEST_F(AdminSocketTest, OnlyTheHandedService) {
  absl::StatusOr<std::unique_ptr<AdminSocket>> s = Start("e.sock");
  ASSERT_TRUE(s.ok()) << s.status();
  grpc::GenericStub stub(grpc::CreateChannel("unix:e.sock", grpc::InsecureChannelCredentials()));
  for (const char* method : {"/grpc.health.v1.Health/Check",
                             "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Slice empty;
    grpc::ByteBuffer request(&empty, 1), response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status st) {
      status = std::move(st);
      done.Notify();
    });
    done.WaitForNotification();
    // This test's user is admitted: the "admin" service answers, refusing.
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << method;
    EXPECT_EQ(status.error_message(), "admin") << method;
  }
}

}  // namespace
}  // namespace zenflow
