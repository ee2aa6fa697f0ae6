// health_check: asks a gRPC server for grpc.health.v1.Health/Check (service
// "") over plaintext and exits 0 when it answers SERVING. deb_test.sh runs
// it against the zenflowd that the Debian package installed in a fresh
// Debian 12 root.
//
//   health_check --target=HOST:PORT [--timeout_s=10]
//
// Prints the answer ("SERVING", "NOT_SERVING", ...) or the call's error.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, target, "", "HOST:PORT of the gRPC server to ask");
ABSL_FLAG(int, timeout_s, 10, "how long to wait for the answer, connecting included");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Checks grpc.health.v1.Health/Check: health_check --target=HOST:PORT");
  absl::ParseCommandLine(argc, argv);
  const std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) {
    std::fprintf(stderr, "health_check: --target=HOST:PORT is required\n");
    return 2;
  }
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(channel);
  grpc::ClientContext ctx;
  // Waits for the server to come up within the deadline rather than failing
  // at the first refused connection.
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s)));
  grpc::Slice empty("", 0);  // HealthCheckRequest{service: ""}: zero bytes
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || !ok) {
    std::fprintf(stderr, "health_check: %s: the call did not complete\n", target.c_str());
    return 1;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "health_check: %s: %d %s\n", target.c_str(),
                 static_cast<int>(status.error_code()), status.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // HealthCheckResponse{status = 1}: field 1, varint. Other values:
  // 0 UNKNOWN, 2 NOT_SERVING, 3 SERVICE_UNKNOWN; an empty message is UNKNOWN.
  const int code = bytes.size() == 2 && bytes[0] == '\x08' ? bytes[1] : 0;
  static const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  std::printf("%s\n", code >= 0 && code <= 3 ? kNames[code] : "UNKNOWN");
  return code == 1 ? 0 : 1;
}
