// UCX worker with a progress thread; see ucx.h.
#include "common/ucx.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "common/buffer_pool.h"
#include "ucp/api/ucp.h"

namespace zenflow {
namespace {

absl::Status FromUcs(ucs_status_t s, absl::string_view what) {
  if (s == UCS_OK) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", ucs_status_string(s));
  switch (s) {
    case UCS_ERR_CANCELED:
      return absl::CancelledError(msg);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(msg);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::ResourceExhaustedError(msg);
    case UCS_ERR_TIMED_OUT:
      return absl::DeadlineExceededError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

// Completion of an asynchronous call that a caller waits for.
struct SyncResult {
  Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  uint64_t value ABSL_GUARDED_BY(mu) = 0;

  void Set(absl::Status s, uint64_t v = 0) {
    MutexLock lock(&mu);
    done = true;
    status = std::move(s);
    value = v;
  }
  // False on timeout.
  bool Wait(absl::Duration timeout) {
    MutexLock lock(&mu);
    return mu.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done; }, timeout);
  }
};

}  // namespace

constexpr size_t kAddressPadding = 64 << 10;

// A message of a large part and a small one (payload, header) travels as two
// contiguous UCX messages: the small one first, its tag with this bit set,
// then the large one (see DoSend). Tags of callers stay below it.
constexpr uint64_t kHeadTagBit = UcxWorker::kReservedTagBit;
constexpr size_t kSplitMinBody = 64 << 10;  // smaller bodies go as one iov message
constexpr size_t kMaxHeadBytes = 1 << 20;   // larger heads too (and are not glued)

struct UcxWorker::Impl {
  // A Flush of an endpoint: done once UCX's flush of it completed and no
  // send of it is outstanding (ucp_ep_flush leaves a tag send's rendezvous
  // to the receiver, so it alone does not say the peer has the data).
  struct FlushWait {
    std::shared_ptr<SyncResult> res;
    Impl* impl = nullptr;
    uint64_t ep_id = 0;
    bool ucp_done = false;
    absl::Status status;
  };
  struct Ep {
    uint64_t id = 0;
    ucp_ep_h ep = nullptr;
    int64_t sends_in_flight = 0;  // posted, completion not yet seen
    std::vector<std::shared_ptr<FlushWait>> flushes;
  };
  struct SendOp {
    Impl* impl = nullptr;
    uint64_t ep_id = 0;
    std::vector<ucp_dt_iov_t> iov;
    size_t bytes = 0;
    DoneFn done;
    int outstanding = 1;  // UCX sends still to complete (2 for a split message)
    ucs_status_t status = UCS_OK;  // the first failure
  };
  struct Recv {
    uint64_t tag = 0;
    std::string data;
    bool done = false;
    ucs_status_t status = UCS_OK;
    int64_t oversize = -1;  // >= 0: discarded, this many bytes long
    // A split message's head, received on its own; this receive (its body,
    // received into data's front) ends with the head's bytes appended.
    std::unique_ptr<Recv> head;
    // A scanned receive (StartRecv): its length and what the copy found.
    NonFiniteScan scan;
  };
  struct Closing {
    std::unique_ptr<Ep> ep;
    void* request = nullptr;
  };

  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int wake_fd = -1;
  // UCX's event fd (UCP_FEATURE_WAKEUP; -1 without): an idle progress
  // thread arms the worker and sleeps until it, or wake_fd, fires.
  int ucx_fd = -1;
  ScannedRecvFn on_recv;
  // UCX's generic datatype for scanned receives (0: none): its unpack is
  // the copy, CopyScanNonFinite, into the Recv passed as the "buffer".
  ucp_datatype_t scan_dt = 0;
  OversizeFn on_oversize;
  int64_t max_message_bytes = 0;
  std::atomic<bool> receive_paused{false};
  std::thread thread;

  Mutex mu;
  // Commands for the progress thread. Pass() swaps them with `running`,
  // so both vectors keep their capacity: no allocation per pass.
  std::vector<std::function<void()>> commands ABSL_GUARDED_BY(mu);
  std::vector<std::function<void()>> running;
  bool stop ABSL_GUARDED_BY(mu) = false;
  Stats stats ABSL_GUARDED_BY(mu);
  // Recycled receive buffers (UcxWorker::Recycle gives them back).
  BufferPool pool;

  // Progress-thread state.
  std::map<uint64_t, std::unique_ptr<Ep>> eps;
  uint64_t next_ep = 1;
  // Receives in matching order (a vector: removing one from the middle
  // allocates nothing, and there are few).
  std::vector<std::unique_ptr<Recv>> recvs;
  // Heads of split messages (kHeadTagBit) waiting for their body: the next
  // message with the same tag. At most one per tag, and at most one per
  // endpoint plus kMaxPendingHeads: every peer this worker serves has an
  // endpoint (zenflowd connects back to each rank) and may have a head
  // waiting at the same moment (when many send at once, UCX can hand over
  // all their heads before any body). One more is delivered on its own (and
  // its reader then finds it incomplete).
  std::vector<std::unique_ptr<Recv>> heads;
  static constexpr size_t kMaxPendingHeads = 8;
  // Finished receives, kept for reuse (a head's buffer with them): the
  // receive path allocates nothing per message once warm.
  // Two kinds: heads' (each with the buffer it received into) and bodies'
  // (whose buffers went to RecvFn).
  std::vector<std::unique_ptr<Recv>> spare_recvs, spare_heads;
  static constexpr size_t kMaxSpareRecvs = 256;
  std::vector<uint64_t> held_tags;  // DeliverCompleted's scratch

  std::unique_ptr<Recv> NewRecv(uint64_t tag, bool head) {
    std::vector<std::unique_ptr<Recv>>& spare = head ? spare_heads : spare_recvs;
    std::unique_ptr<Recv> r;
    if (spare.empty()) {
      r = std::make_unique<Recv>();
    } else {
      r = std::move(spare.back());
      spare.pop_back();
    }
    r->tag = tag;
    return r;
  }
  // Keeps `r` (and its head) for reuse; a head keeps its buffer.
  void FreeRecv(std::unique_ptr<Recv> r) {
    if (r->head != nullptr) FreeRecv(std::move(r->head));
    const bool head = r->data.capacity() > sizeof(std::string);
    if (r->data.capacity() > kMaxHeadBytes) return;
    std::vector<std::unique_ptr<Recv>>& spare = head ? spare_heads : spare_recvs;
    if (spare.size() >= kMaxSpareRecvs) return;
    r->done = false;
    r->status = UCS_OK;
    r->oversize = -1;
    r->scan.Reset();
    spare.push_back(std::move(r));
  }
  std::vector<std::unique_ptr<Recv>>::iterator FindHead(uint64_t tag) {
    return std::find_if(heads.begin(), heads.end(),
                        [tag](const std::unique_ptr<Recv>& h) { return h->tag == tag; });
  }
  int64_t sends_pending = 0;
  std::vector<Closing> closing;
  // A Drain waits for two passes (what had arrived is then matched), then
  // for every receive posted until then to finish: other peers' traffic
  // does not hold it up.
  struct DrainWait {
    std::shared_ptr<SyncResult> res;
    int passes_left = 2;
    uint64_t target = 0;
  };
  std::vector<DrainWait> drains;
  uint64_t recvs_posted = 0, recvs_finished = 0;

  // The receive path's containers and a first set of spare receives are
  // made here, so that its allocations do not depend on how many messages a
  // worker happened to see at once while warming up: up to kWarmRecvs
  // messages (and heads of up to kWarmHeadBytes) in flight at once allocate
  // nothing from the first message on; beyond that, once each.
  static constexpr size_t kWarmRecvs = 32;
  static constexpr size_t kWarmHeadBytes = 4096;
  Impl() {
    recvs.reserve(kWarmRecvs);
    heads.reserve(kMaxPendingHeads + kWarmRecvs);
    held_tags.reserve(kWarmRecvs);
    spare_recvs.reserve(kMaxSpareRecvs);
    spare_heads.reserve(kMaxSpareRecvs);
    for (size_t i = 0; i < kWarmRecvs; ++i) {
      spare_recvs.push_back(std::make_unique<Recv>());
      auto h = std::make_unique<Recv>();
      h->data.reserve(kWarmHeadBytes);
      spare_heads.push_back(std::move(h));
    }
  }
  ~Impl() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (scan_dt != 0) ucp_dt_destroy(scan_dt);
    if (context != nullptr) ucp_cleanup(context);
    if (wake_fd >= 0) close(wake_fd);
  }

  void Post(std::function<void()> cmd) {
    {
      MutexLock lock(&mu);
      commands.push_back(std::move(cmd));
    }
    const uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof(one));
    (void)n;
  }

  static void OnSend(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SendOp*>(user_data);
    op->impl->FinishSend(op, status);
    ucp_request_free(request);
  }

  void FinishSend(SendOp* op, ucs_status_t status) {
    if (op->status == UCS_OK) op->status = status;
    if (--op->outstanding > 0) return;
    status = op->status;
    --sends_pending;
    {
      MutexLock lock(&mu);
      if (status == UCS_OK) {
        ++stats.messages_sent;
        stats.bytes_sent += static_cast<int64_t>(op->bytes);
      } else {
        ++stats.send_errors;
      }
    }
    DoneFn done = std::move(op->done);
    const uint64_t ep_id = op->ep_id;
    delete op;
    if (done) done(FromUcs(status, "UCX send"));
    // Then a flush waiting for this send may return: its caller sees every
    // earlier send's callback run.
    auto ep = eps.find(ep_id);
    if (ep != eps.end() && --ep->second->sends_in_flight == 0) CheckFlushes(ep->second.get());
  }

  static void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t*,
                     void* user_data) {
    auto* r = static_cast<Recv*>(user_data);
    r->done = true;
    r->status = status;
    ucp_request_free(request);
  }

  void DoConnect(const std::string& address, std::shared_ptr<SyncResult> res) {
    auto e = std::make_unique<Ep>();
    e->id = next_ep++;
    // No peer-failure mode: shared-memory transports cannot detect a dead
    // peer (UCX refuses them in that mode), and the owner learns of one from
    // the control channel (the gRPC stream) anyway, then closes with force.
    // The address comes from a peer. UCX parses it without a length, so a
    // malformed one can make it read past the end: give it a copy followed
    // by zeros, which end every field it could be reading, so that what it
    // reads is ours and the same every time.
    std::string padded = address;
    padded.resize(address.size() + kAddressPadding, '\0');
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    p.address = reinterpret_cast<const ucp_address_t*>(padded.data());
    ucs_status_t s = ucp_ep_create(worker, &p, &e->ep);
    if (s != UCS_OK) {
      res->Set(FromUcs(s, "cannot create a UCX endpoint to the peer's address"));
      return;
    }
    const uint64_t id = e->id;
    eps[id] = std::move(e);
    res->Set(absl::OkStatus(), id);
  }

  void DoSend(uint64_t ep_id, uint64_t tag, const std::vector<absl::string_view>& parts,
              DoneFn done) {
    if ((tag & kHeadTagBit) != 0) {
      if (done) done(absl::InvalidArgumentError("UCX tags must be below 2^63 (the top bit is reserved)"));
      return;
    }
    auto it = eps.find(ep_id);
    if (it == eps.end()) {
      {
        MutexLock lock(&mu);
        ++stats.send_errors;
      }
      if (done) {
        done(absl::UnavailableError("UCX endpoint is closed"));
      }
      return;
    }
    auto* op = new SendOp();
    ++sends_pending;
    ++it->second->sends_in_flight;
    op->impl = this;
    op->ep_id = ep_id;
    op->done = std::move(done);
    for (absl::string_view part : parts) {
      if (part.empty()) continue;
      op->iov.push_back(ucp_dt_iov_t{const_cast<char*>(part.data()), part.size()});
      op->bytes += part.size();
    }
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
    p.cb.send = &Impl::OnSend;
    p.user_data = op;
    ucs_status_ptr_t r;
    if (op->iov.size() == 2 && op->iov[0].length >= kSplitMinBody &&
        op->iov[1].length <= kMaxHeadBytes) {
      // A large first part and a small second (a frame: payload, header):
      // two contiguous messages, the head first, instead of one iov
      // message, which UCX moves through bounce buffers (over TCP at about
      // a quarter of the speed). The receiver glues them back together.
      op->outstanding = 2;
      p.datatype = ucp_dt_make_contig(1);
      ucs_status_ptr_t h = ucp_tag_send_nbx(it->second->ep, op->iov[1].buffer, op->iov[1].length,
                                            tag | kHeadTagBit, &p);
      if (h == nullptr) {
        FinishSend(op, UCS_OK);
      } else if (UCS_PTR_IS_ERR(h)) {
        FinishSend(op, UCS_PTR_STATUS(h));
      }
      r = ucp_tag_send_nbx(it->second->ep, op->iov[0].buffer, op->iov[0].length, tag, &p);
    } else if (op->iov.size() == 1) {  // contiguous: the common case, and UCX's fastest
      p.datatype = ucp_dt_make_contig(1);
      r = ucp_tag_send_nbx(it->second->ep, op->iov[0].buffer, op->iov[0].length, tag, &p);
    } else if (op->iov.empty()) {
      p.datatype = ucp_dt_make_contig(1);
      r = ucp_tag_send_nbx(it->second->ep, nullptr, 0, tag, &p);
    } else {
      p.datatype = ucp_dt_make_iov();
      r = ucp_tag_send_nbx(it->second->ep, op->iov.data(), op->iov.size(), tag, &p);
    }
    if (r == nullptr) {
      FinishSend(op, UCS_OK);
    } else if (UCS_PTR_IS_ERR(r)) {
      FinishSend(op, UCS_PTR_STATUS(r));
    }
    // else: OnSend runs later.
  }

  void DoFlush(uint64_t ep_id, std::shared_ptr<SyncResult> res) {
    auto it = eps.find(ep_id);
    if (it == eps.end()) {
      res->Set(absl::UnavailableError("UCX endpoint is closed"));
      return;
    }
    auto fw = std::make_shared<FlushWait>();
    fw->res = std::move(res);
    fw->impl = this;
    fw->ep_id = ep_id;
    it->second->flushes.push_back(fw);
    auto* holder = new std::shared_ptr<FlushWait>(fw);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = [](void* request, ucs_status_t status, void* user_data) {
      auto* h = static_cast<std::shared_ptr<FlushWait>*>(user_data);
      (*h)->impl->FlushDone(h->get(), status);
      delete h;
      ucp_request_free(request);
    };
    p.user_data = holder;
    ucs_status_ptr_t r = ucp_ep_flush_nbx(it->second->ep, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      FlushDone(fw.get(), r == nullptr ? UCS_OK : UCS_PTR_STATUS(r));
      delete holder;
    }
  }

  // UCX's flush of fw's endpoint ended with `status`.
  void FlushDone(FlushWait* fw, ucs_status_t status) {
    fw->ucp_done = true;
    fw->status = FromUcs(status, "UCX flush");
    auto it = eps.find(fw->ep_id);
    if (it != eps.end()) CheckFlushes(it->second.get());  // (closed: already answered)
  }

  // Answers e's flushes whose UCX flush completed, once no send of e is
  // outstanding (or the UCX flush failed).
  void CheckFlushes(Ep* e) {
    for (size_t i = 0; i < e->flushes.size();) {
      FlushWait& fw = *e->flushes[i];
      if (fw.ucp_done && (!fw.status.ok() || e->sends_in_flight == 0)) {
        fw.res->Set(fw.status);
        e->flushes[i] = std::move(e->flushes.back());
        e->flushes.pop_back();
      } else {
        ++i;
      }
    }
  }

  void DoDisconnect(uint64_t ep_id, bool force) {
    auto it = eps.find(ep_id);
    if (it == eps.end()) return;
    std::unique_ptr<Ep> e = std::move(it->second);
    eps.erase(it);
    for (auto& fw : e->flushes) {
      fw->res->Set(absl::UnavailableError("UCX endpoint was closed before its flush completed"));
    }
    e->flushes.clear();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(e->ep, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.push_back(Closing{std::move(e), r});
  }

  void ReapClosing() {
    for (size_t i = 0; i < closing.size();) {
      if (ucp_request_check_status(closing[i].request) != UCS_INPROGRESS) {
        ucp_request_free(closing[i].request);
        closing[i] = std::move(closing.back());
        closing.pop_back();
      } else {
        ++i;
      }
    }
  }

  // The generic datatype's operations. A receive passes its Recv as the
  // buffer (UCX hands it to start_unpack and reads nothing else of it);
  // UCX calls unpack for each piece as it arrives, in any order.
  static void* ScanStartUnpack(void*, void* buffer, size_t) { return buffer; }
  static size_t ScanPackedSize(void* state) { return static_cast<Recv*>(state)->scan.total(); }
  static ucs_status_t ScanUnpack(void* state, size_t offset, const void* src, size_t n) {
    Recv* r = static_cast<Recv*>(state);
    const size_t total = r->scan.total();
    if (offset > total || n > total - offset) {
      r->scan.Reset();
      return UCS_ERR_MESSAGE_TRUNCATED;
    }
    r->scan.Add(offset, CopyScanNonFinite(r->data.data() + offset, src, n), n);
    return UCS_OK;
  }
  static void ScanFinish(void*) {}
  // Receives are all this datatype does; packing is never asked of it.
  static void* ScanStartPack(void*, const void*, size_t) { return nullptr; }
  static size_t ScanPack(void*, size_t, void*, size_t) { return 0; }
  static constexpr ucp_generic_dt_ops_t kScanOps = {&ScanStartPack, &ScanStartUnpack,
                                                    &ScanPackedSize, &ScanPack,
                                                    &ScanUnpack,     &ScanFinish};

  // Starts receiving `msg` into r->data's first `n` bytes; through the
  // scanning copy when this worker scans and the message is long enough.
  void StartRecv(ucp_tag_message_h msg, Recv* r, size_t n) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv = &Impl::OnRecv;
    p.user_data = r;
    void* buffer = r->data.data();
    if (scan_dt != 0 && n >= kScanMinBytes) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      p.datatype = scan_dt;
      r->scan.Begin(n);
      buffer = r;
    }
    ucs_status_ptr_t q = ucp_tag_msg_recv_nbx(worker, buffer, n, msg, &p);
    if (q == nullptr) {
      r->done = true;
    } else if (UCS_PTR_IS_ERR(q)) {
      r->done = true;
      r->status = UCS_PTR_STATUS(q);
    }
  }

  void PostRecv(ucp_tag_message_h msg, const ucp_tag_recv_info_t& info) {
    const uint64_t tag = info.sender_tag & ~kHeadTagBit;
    const auto pending = FindHead(tag);
    if ((info.sender_tag & kHeadTagBit) != 0 && info.length <= kMaxHeadBytes &&
        (heads.size() < kMaxPendingHeads + eps.size() || pending != heads.end())) {
      std::unique_ptr<Recv> r = NewRecv(tag, /*head=*/true);
      // A split message's head: held until its body, the tag's next message.
      r->data.resize(info.length);
      StartRecv(msg, r.get(), info.length);
      if (pending != heads.end()) {  // two heads in a row: the first goes alone
        recvs.push_back(std::move(*pending));
        ++recvs_posted;
        *pending = std::move(r);
      } else {
        heads.push_back(std::move(r));
      }
      return;
    }
    std::unique_ptr<Recv> r = NewRecv(tag, /*head=*/false);
    std::unique_ptr<Recv> head;
    if (pending != heads.end()) {
      head = std::move(*pending);
      heads.erase(pending);
    }
    const size_t total = info.length + (head != nullptr ? head->data.size() : 0);
    if (max_message_bytes > 0 && static_cast<int64_t>(total) > max_message_bytes) {
      // Received into a tiny buffer: UCX truncates (and completes with an
      // error); nothing of the size the peer chose is allocated.
      r->oversize = static_cast<int64_t>(total);
      r->data.assign(8, '\0');
      StartRecv(msg, r.get(), r->data.size());
      r->head = std::move(head);  // (its bytes are dropped)
    } else {
      r->data = pool.Take(total);
      StartRecv(msg, r.get(), info.length);
      r->head = std::move(head);
    }
    recvs.push_back(std::move(r));
    ++recvs_posted;
  }

  bool DeliverCompleted() {
    bool any = false;
    // In arrival order per tag: one connection's messages stay in order. A
    // receive that never completes (its sender died mid-message: shared
    // memory tells nobody) holds back only its own tag's later messages,
    // never another connection's (a restarted peer's, another rank's).
    std::vector<uint64_t>& held = held_tags;
    held.clear();
    for (auto it = recvs.begin(); it != recvs.end();) {
      Recv* front = it->get();
      const bool ready = front->done && (front->head == nullptr || front->head->done);
      const bool tag_held = std::find(held.begin(), held.end(), front->tag) != held.end();
      if (!ready || tag_held) {
        if (!tag_held) held.push_back(front->tag);  // once per tag
        ++it;
        continue;
      }
      std::unique_ptr<Recv> r = std::move(*it);
      it = recvs.erase(it);
      ++recvs_finished;
      any = true;
      if (r->oversize >= 0) {
        if (on_oversize) on_oversize(r->tag, r->oversize);
        FreeRecv(std::move(r));
        continue;
      }
      // The peer failed mid-message?
      bool ok = r->status == UCS_OK && (r->head == nullptr || r->head->status == UCS_OK);
      if (ok && r->head != nullptr) {
        const std::string& h = r->head->data;
        std::memcpy(r->data.data() + (r->data.size() - h.size()), h.data(), h.size());
      }
      if (ok) {
        {
          MutexLock lock(&mu);
          ++stats.messages_received;
          stats.bytes_received += static_cast<int64_t>(r->data.size());
        }
        on_recv(r->tag, std::move(r->data), r->scan);
        r->data = std::string();
      }
      FreeRecv(std::move(r));
    }
    return any;
  }

  // One pass: commands, progress, new messages, completions. True if
  // anything happened.
  bool Pass() {
    {
      MutexLock lock(&mu);
      running.swap(commands);
    }
    bool busy = !running.empty();
    for (auto& c : running) c();
    running.clear();
    while (ucp_worker_progress(worker) != 0) busy = true;
    for (;;) {
      if (receive_paused.load(std::memory_order_relaxed)) break;
      ucp_tag_recv_info_t info;
      ucp_tag_message_h m = ucp_tag_probe_nb(worker, 0, 0, /*remove=*/1, &info);
      if (m == nullptr) break;
      busy = true;
      PostRecv(m, info);
    }
    while (ucp_worker_progress(worker) != 0) busy = true;
    busy |= DeliverCompleted();
    ReapClosing();
    return busy;
  }

  void Loop() {
    auto last_activity = std::chrono::steady_clock::now();
    for (;;) {
      const bool busy = Pass();
      {
        MutexLock lock(&mu);
        if (stop) break;
      }
      for (size_t i = 0; i < drains.size();) {
        DrainWait& d = drains[i];
        if (d.passes_left > 0 && --d.passes_left == 0) d.target = recvs_posted;
        if (d.passes_left == 0 && recvs_finished >= d.target) {
          d.res->Set(absl::OkStatus());
          drains[i] = std::move(drains.back());
          drains.pop_back();
        } else {
          ++i;
        }
      }
      if (busy) {
        last_activity = std::chrono::steady_clock::now();
        continue;
      }
      if (!drains.empty()) continue;
      // Nothing happened. Right after activity keep polling (a transfer's
      // next step is usually microseconds away); then sleep in short naps,
      // woken early by a command. The nap bounds the latency of a message
      // that arrives while idle.
      const auto now = std::chrono::steady_clock::now();
      if (now - last_activity < std::chrono::microseconds(20)) {
        sched_yield();
        continue;
      }
      const bool ops = !recvs.empty() || !closing.empty() || sends_pending > 0;
      pollfd fds[2] = {{wake_fd, POLLIN, 0}, {ucx_fd, POLLIN, 0}};
      timespec nap = {0, ops ? 100'000 : 1'000'000};
      nfds_t n_fds = 1;
      if (ucx_fd >= 0 && !ops && now - last_activity > std::chrono::milliseconds(2)) {
        // Idle for a while with nothing in flight: sleep until UCX has an
        // event (a message arrives) or a command comes, instead of waking
        // every millisecond; the timeout is a safety net. BUSY: events are
        // pending, so progress again at once. (Not sooner: between a
        // transfer's messages the naps cost less than arming.)
        const ucs_status_t armed = ucp_worker_arm(worker);
        if (armed == UCS_ERR_BUSY) continue;
        if (armed == UCS_OK) {
          n_fds = 2;
          nap = {0, 100'000'000};
        }
      }
      if (ppoll(fds, n_fds, &nap, nullptr) > 0 && (fds[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t n = read(wake_fd, &v, sizeof(v));
        (void)n;
      }
    }
    Shutdown();
  }

  void Shutdown() {
    // Run what is queued (sends fail once their endpoint is gone).
    for (int i = 0; i < 2; ++i) Pass();
    std::vector<uint64_t> ids;
    for (auto& [id, e] : eps) ids.push_back(id);
    for (uint64_t id : ids) DoDisconnect(id, /*force=*/true);
    // Receives still in progress end with the worker (ucp_worker_destroy).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while ((!closing.empty()) && std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker);
      ReapClosing();
    }
    for (auto& d : drains) d.res->Set(absl::CancelledError("UCX worker stopped"));
    drains.clear();
    {
      MutexLock lock(&mu);
      running.swap(commands);
    }
    for (auto& c : running) c();
    running.clear();
  }
};

UcxWorker::UcxWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::string UcxTransports(const UcxOptions& options) {
  if (!options.without_cma) return options.tls;
  std::vector<std::string> out;
  for (absl::string_view t : absl::StrSplit(options.tls, ',', absl::SkipEmpty())) {
    if (t == "all") return "^cma";
    if (t == "cma") continue;
    if (t == "sm" || t == "shm") {
      out.push_back("posix");
      out.push_back("sysv");
    } else {
      out.emplace_back(t);
    }
  }
  return absl::StrJoin(out, ",");
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxOptions& options,
                                                             RecvFn on_recv,
                                                             OversizeFn on_oversize) {
  return Create(
      options,
      [fn = std::move(on_recv)](uint64_t tag, std::string message, const NonFiniteScan&) {
        fn(tag, std::move(message));
      },
      std::move(on_oversize));
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxOptions& options,
                                                             ScannedRecvFn on_recv,
                                                             OversizeFn on_oversize) {
  auto impl = std::make_unique<Impl>();
  impl->on_recv = std::move(on_recv);
  impl->on_oversize = std::move(on_oversize);
  impl->max_message_bytes = options.max_message_bytes;
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return FromUcs(s, "cannot read the UCX configuration");
  const std::string tls = UcxTransports(options);
  if (!tls.empty()) {
    s = ucp_config_modify(config, "TLS", tls.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("UCX transports '", tls, "': ", ucs_status_string(s)));
    }
  }
  if (!options.net_devices.empty()) {
    s = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(absl::StrCat(
          "UCX network devices '", options.net_devices, "': ", ucs_status_string(s)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  // UCP_FEATURE_WAKEUP restricts UCX to transports with event support,
  // which excludes CMA (large messages would be copied twice through the
  // shared-memory FIFO): with CMA the progress thread polls in short naps
  // when idle; without it (zenflowd's data plane) it sleeps on UCX's event
  // fd, so an idle worker costs no CPU.
  params.features = UCP_FEATURE_TAG | (options.without_cma ? UCP_FEATURE_WAKEUP : 0);
  s = ucp_init(&params, config, &impl->context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    return FromUcs(s, absl::StrCat("cannot initialize UCX with transports '", options.tls, "'"));
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(impl->context, &wp, &impl->worker);
  if (s != UCS_OK) return FromUcs(s, "cannot create a UCX worker");
  if (options.scan_nonfinite) {
    s = ucp_dt_create_generic(&Impl::kScanOps, nullptr, &impl->scan_dt);
    if (s != UCS_OK) return FromUcs(s, "cannot create the UCX receive scan's datatype");
  }
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0) return absl::InternalError("eventfd failed");
  if (options.without_cma) {
    s = ucp_worker_get_efd(impl->worker, &impl->ucx_fd);
    if (s != UCS_OK) impl->ucx_fd = -1;  // polls in naps, as with CMA
  }
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  s = ucp_worker_get_address(impl->worker, &addr, &len);
  if (s != UCS_OK) return FromUcs(s, "cannot get the UCX worker's address");
  std::unique_ptr<UcxWorker> w(new UcxWorker(std::move(impl)));
  w->address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(w->impl_->worker, addr);
  Impl* raw = w->impl_.get();
  raw->thread = std::thread([raw] { raw->Loop(); });
  return w;
}

UcxWorker::~UcxWorker() {
  {
    MutexLock lock(&impl_->mu);
    impl_->stop = true;
  }
  impl_->Post([] {});
  if (impl_->thread.joinable()) impl_->thread.join();
}

absl::StatusOr<uint64_t> UcxWorker::Connect(const std::string& peer_address) {
  // UCX trusts an address to be well-formed, and some malformed ones crash
  // it. Every address this UCX build and configuration packs starts with the
  // same header byte (format version and flags), so one that does not was
  // not made by a compatible peer: refuse it before UCX parses it.
  if (peer_address.size() < 9 || peer_address.size() > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a UCX worker address of ", peer_address.size(), " bytes is not plausible"));
  }
  if (peer_address[0] != address_[0]) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "not a UCX worker address of this UCX version and configuration (header byte 0x%02x, "
        "expected 0x%02x)",
        static_cast<unsigned char>(peer_address[0]), static_cast<unsigned char>(address_[0])));
  }
  auto res = std::make_shared<SyncResult>();
  Impl* impl = impl_.get();
  impl->Post([impl, peer_address, res] { impl->DoConnect(peer_address, res); });
  if (!res->Wait(absl::Seconds(30))) return absl::DeadlineExceededError("UCX connect timed out");
  MutexLock lock(&res->mu);
  if (!res->status.ok()) return res->status;
  return res->value;
}

void UcxWorker::Send(uint64_t ep, uint64_t tag, std::vector<absl::string_view> parts, DoneFn done) {
  Impl* impl = impl_.get();
  impl->Post([impl, ep, tag, parts = std::move(parts), done = std::move(done)]() mutable {
    impl->DoSend(ep, tag, parts, std::move(done));
  });
}

absl::Status UcxWorker::Flush(uint64_t ep, absl::Duration timeout) {
  auto res = std::make_shared<SyncResult>();
  Impl* impl = impl_.get();
  impl->Post([impl, ep, res] { impl->DoFlush(ep, res); });
  if (!res->Wait(timeout)) return absl::DeadlineExceededError("UCX flush timed out");
  MutexLock lock(&res->mu);
  return res->status;
}

void UcxWorker::Disconnect(uint64_t ep, bool force) {
  Impl* impl = impl_.get();
  impl->Post([impl, ep, force] { impl->DoDisconnect(ep, force); });
}

absl::Status UcxWorker::Drain(absl::Duration timeout) {
  auto res = std::make_shared<SyncResult>();
  Impl* impl = impl_.get();
  impl->Post([impl, res] { impl->drains.push_back({res}); });
  if (!res->Wait(timeout)) return absl::DeadlineExceededError("UCX drain timed out");
  MutexLock lock(&res->mu);
  return res->status;
}

void UcxWorker::PauseReceiving(bool paused) {
  impl_->receive_paused.store(paused);
  impl_->Post([] {});  // wake the progress thread
}

void UcxWorker::Recycle(std::string buffer) { impl_->pool.Give(std::move(buffer)); }

UcxWorker::Stats UcxWorker::stats() {
  MutexLock lock(&impl_->mu);
  return impl_->stats;
}

}  // namespace zenflow
