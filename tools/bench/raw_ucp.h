// The raw UCP baseline of the benches: two UcxWorkers of this process (each
// with its own progress thread), one sending tagged messages of one
// contiguous buffer with at most `window` bytes in flight, the other
// counting them. Besides the goodput it measures the CPU the receiving
// worker's progress thread spent (its per-thread CPU clock): bytes received
// per receiving-thread CPU second, what scale_bench takes as the receive
// half of its ingest ceiling.
//
//   ZF_ASSIGN_OR_RETURN(std::unique_ptr<RawUcp> r, RawUcp::Create(options));
//   ZF_ASSIGN_OR_RETURN(RawUcpSample s, r->Run(payload, /*count=*/-1, window, enough));
#ifndef ZENFLOW_TOOLS_BENCH_RAW_UCP_H_
#define ZENFLOW_TOOLS_BENCH_RAW_UCP_H_

#include <pthread.h>
#include <time.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ucx.h"

namespace zenflow {

struct RawUcpSample {
  double seconds = 0;            // wall, first send until every byte was counted
  int64_t bytes = 0;             // payload bytes sent (and received)
  double receiver_cpu_s = -1;    // the receiving progress thread's CPU; -1: unknown
  double rate() const { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }
  double bytes_per_receiver_cpu_s() const {
    return receiver_cpu_s > 0 ? static_cast<double>(bytes) / receiver_cpu_s : -1;
  }
};

class RawUcp {
 public:
  using Clock = std::chrono::steady_clock;
  // Whether a run with no fixed count has sent enough (from its start, bytes sent).
  using EnoughFn = std::function<bool(Clock::time_point t0, int64_t sent)>;

  static absl::StatusOr<std::unique_ptr<RawUcp>> Create(const UcxOptions& options);
  ~RawUcp();
  RawUcp(const RawUcp&) = delete;
  RawUcp& operator=(const RawUcp&) = delete;

  // Sends `count` messages of `payload` (count < 0: until enough()), then
  // waits (at most 120 s) until the receiver counted every byte.
  absl::StatusOr<RawUcpSample> Run(const std::string& payload, int64_t count, int64_t window,
                                   const EnoughFn& enough);

 private:
  RawUcp() = default;
  // CPU seconds of the receiving progress thread so far; -1 before its
  // first message (its clock is taken there).
  double ReceiverCpuSeconds();

  std::unique_ptr<UcxWorker> rx_;
  std::unique_ptr<UcxWorker> tx_;
  uint64_t ep_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t received_ = 0;
  int64_t inflight_ = 0;
  bool have_rx_clock_ = false;
  clockid_t rx_clock_{};
  absl::Status failed_;
};

}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_BENCH_RAW_UCP_H_
