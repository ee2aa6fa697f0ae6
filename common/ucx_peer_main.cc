// ucx_peer: a process that starts one large message to a UCX worker (as
// zenflowd sends, without CMA) and then waits to be killed, for ucx_test (a
// peer that goes mid-message).
//
//   ucx_peer <worker address, hex> <tag> <bytes>
//
// Prints "sending" on stdout once the send is posted, then sleeps.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "common/ucx.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: ucx_peer <address hex> <tag> <bytes>\n");
    return 2;
  }
  const std::string address = absl::HexStringToBytes(argv[1]);
  const uint64_t tag = std::strtoull(argv[2], nullptr, 10);
  const size_t bytes = std::strtoull(argv[3], nullptr, 10);
  // Without CMA, as zenflowd sends: a large message goes in fragments
  // through the shared-memory queues, and a receiver that started one waits
  // for the rest.
  zenflow::UcxOptions options;
  options.without_cma = true;
  auto worker = zenflow::UcxWorker::Create(options, [](uint64_t, std::string) {});
  if (!worker.ok()) {
    std::fprintf(stderr, "ucx_peer: %s\n", worker.status().ToString().c_str());
    return 1;
  }
  auto ep = (*worker)->Connect(address);
  if (!ep.ok()) {
    std::fprintf(stderr, "ucx_peer: %s\n", ep.status().ToString().c_str());
    return 1;
  }
  static const std::string message(bytes, 'x');
  (*worker)->Send(*ep, tag, {message}, nullptr);
  std::printf("sending\n");
  std::fflush(stdout);
  for (;;) pause();
}
