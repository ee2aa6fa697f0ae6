// A UCX (UCP tag API) worker with its own progress thread: the bulk-data
// transport between ranks and zenflowd (shared memory on one host; TCP or
// RDMA across hosts when UCX is configured for them). The endpoint exchange
// happens elsewhere (over gRPC): each side publishes address() and connects
// to the other's.
//
//   ZF_ASSIGN_OR_RETURN(auto w, UcxWorker::Create(opts, [](uint64_t tag, std::string m) {...}));
//   ZF_ASSIGN_OR_RETURN(uint64_t ep, w->Connect(peer_address));
//   w->Send(ep, tag, {payload, header}, [](absl::Status s) {...});
//
// Every UCX call runs on the progress thread: the public methods queue
// commands for it and wake it, so the UCP worker runs in single-thread mode
// and nothing here depends on UCX's internal locking.
#ifndef ZENFLOW_COMMON_UCX_H_
#define ZENFLOW_COMMON_UCX_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/copy_scan.h"
#include "common/mutex.h"

namespace zenflow {

struct UcxOptions {
  // UCX transports (UCX_TLS). The default keeps data on this host (shared
  // memory: posix/sysv/cma); "tcp,sm,self" or "all" reach other hosts.
  std::string tls = "sm,self";
  // Network devices for network transports (UCX_NET_DEVICES), e.g. "lo" or
  // "eth0"; empty: UCX's default (all).
  std::string net_devices;
  // Largest message received into memory; a longer one is received
  // truncated (nothing is allocated for it) and reported to OversizeFn.
  // 0: no limit.
  int64_t max_message_bytes = 0;
  // Leaves out CMA (cross-memory attach: UCX reads a peer's memory with
  // process_vm_readv for large messages). UCX 1.13's shared-memory
  // transports have no peer-failure handling, so a failed CMA read is fatal
  // to the reading process: a peer that frees or unmaps a buffer it is
  // sending, or dies mid-send, would abort it. zenflowd sets this (its
  // data plane must outlive any client); large messages then travel in
  // fragments through the shared-memory queues. "sm" becomes "posix,sysv",
  // "cma" is dropped, "all" becomes "^cma".
  bool without_cma = false;
  // Receives each message of kScanMinBytes or more (a split message's body:
  // a frame's payload) through CopyScanNonFinite instead of UCX's plain
  // copy, and hands what the scan found to a ScannedRecvFn with the
  // message: a payload proven finite need not be read again to be checked
  // (zenflowd's data plane). The copy is the one UCX makes anyway (out of
  // its shared-memory fragments or socket buffers), now through a UCX
  // generic datatype; messages of other sizes arrive unscanned.
  bool scan_nonfinite = false;
};

// The UCX_TLS value `options` asks for (see UcxOptions::without_cma).
std::string UcxTransports(const UcxOptions& options);

class UcxWorker {
 public:
  // Receives every message on the progress thread: the messages of one tag
  // in the order UCX matched them (messages of different tags as they
  // complete: a message whose sender died midway holds back only its tag). It must not block for long and must not call back into the
  // worker synchronously except Send/Disconnect.
  using RecvFn = std::function<void(uint64_t tag, std::string message)>;
  // The same, with what the receive copy's scan proves of the message's
  // first bytes (UcxOptions::scan_nonfinite; unproven for a message it did
  // not scan).
  using ScannedRecvFn =
      std::function<void(uint64_t tag, std::string message, const NonFiniteScan& scan)>;
  static constexpr size_t kScanMinBytes = 64 << 10;
  // Called once (on the progress thread) when a send ends.
  using DoneFn = std::function<void(absl::Status)>;
  // A message longer than max_message_bytes arrived (and was discarded), in
  // its place in its tag's order of RecvFn calls; on the progress thread.
  using OversizeFn = std::function<void(uint64_t tag, int64_t bytes)>;

  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(const UcxOptions& options,
                                                           RecvFn on_recv,
                                                           OversizeFn on_oversize = nullptr);
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(const UcxOptions& options,
                                                           ScannedRecvFn on_recv,
                                                           OversizeFn on_oversize = nullptr);
  // Stops the progress thread; open endpoints are closed (their pending
  // sends fail with CANCELLED).
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // This worker's address, to hand to peers.
  const std::string& address() const { return address_; }

  // Creates an endpoint to a peer's address; returns its id. A dead peer is
  // not detected here (shared memory cannot tell): the owner's control
  // channel notices and calls Disconnect(force), which fails pending sends.
  absl::StatusOr<uint64_t> Connect(const std::string& peer_address);

  // The top bit of a tag is the worker's own (a split message's head);
  // callers' tags stay below it.
  static constexpr uint64_t kReservedTagBit = uint64_t{1} << 63;

  // Sends the concatenation of `parts` as one tagged message. The parts must
  // stay valid until `done` runs. Sends on one endpoint are matched by the
  // peer in the order they were made. `tag` < kReservedTagBit. Two parts,
  // a large one and then a small one (a frame: payload, header), travel as
  // two contiguous UCX messages that the receiving UcxWorker joins again:
  // UCX moves a multi-part (iov) message through bounce buffers.
  void Send(uint64_t ep, uint64_t tag, std::vector<absl::string_view> parts, DoneFn done);

  // Returns once every send made so far on `ep` completed (a large one's
  // data has reached the peer: UCX's rendezvous) and UCX's flush of `ep`
  // (ucp_ep_flush) completed. Sends made meanwhile on `ep` delay it too: it
  // waits for `ep` to have no send outstanding.
  absl::Status Flush(uint64_t ep, absl::Duration timeout);

  // Closes `ep` (pending sends fail). Without `force`, outstanding sends are
  // flushed first.
  void Disconnect(uint64_t ep, bool force);

  // Handles every message that has already arrived (RecvFn has run for
  // each), then returns; traffic that keeps arriving from other peers does
  // not delay it. Gives up after `timeout` on receives still in progress.
  absl::Status Drain(absl::Duration timeout);

  // While paused, no new message is received: UCX keeps them (a large
  // message's sender waits for it). For a peer that wants to exert
  // backpressure, and for tests of a peer that does not read.
  void PauseReceiving(bool paused);

  // Gives a received message's buffer back for reuse by later receives
  // (saves the allocation, page faults and zero-fill of a fresh one).
  void Recycle(std::string buffer);

  struct Stats {
    int64_t messages_received = 0;
    int64_t bytes_received = 0;
    int64_t messages_sent = 0;
    int64_t bytes_sent = 0;
    int64_t send_errors = 0;
  };
  Stats stats();

  struct Impl;  // UCX types stay out of this header

 private:
  explicit UcxWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_UCX_H_
