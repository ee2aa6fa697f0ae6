// The gRPC keepalive settings the client (client/) and zenflowd (server/)
// agree on, in one place: a peer whose host or link went away without
// closing the connection (a cut cable, a frozen VM) is noticed in about
// kKeepaliveTimeMs + kKeepaliveTimeoutMs instead of at TCP's hours-long
// timeout. The daemon accepts pings down to kMinPingIntervalMs apart, below
// the client's interval, so a client is never told it pings too often.
#ifndef ZENFLOW_COMMON_GRPC_KEEPALIVE_H_
#define ZENFLOW_COMMON_GRPC_KEEPALIVE_H_

namespace zenflow {

inline constexpr int kKeepaliveTimeMs = 10000;     // ping after this long idle
inline constexpr int kKeepaliveTimeoutMs = 10000;  // no ack this long: the link is dead
inline constexpr int kMinPingIntervalMs = 5000;    // the daemon's floor on a client's pings
static_assert(kMinPingIntervalMs < kKeepaliveTimeMs, "the daemon must accept the client's pings");

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_GRPC_KEEPALIVE_H_
