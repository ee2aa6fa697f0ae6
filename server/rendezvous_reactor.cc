// Rendezvous calls' reactor; see rendezvous_reactor.h.
#include "server/rendezvous_reactor.h"

#include <atomic>

namespace zenflow {

uint64_t RendezvousReactor::NextCallId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

}  // namespace zenflow
