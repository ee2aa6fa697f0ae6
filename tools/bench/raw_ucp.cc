#include "tools/bench/raw_ucp.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {

absl::StatusOr<std::unique_ptr<RawUcp>> RawUcp::Create(const UcxOptions& options) {
  std::unique_ptr<RawUcp> r(new RawUcp());
  RawUcp* p = r.get();
  ZF_ASSIGN_OR_RETURN(r->rx_, UcxWorker::Create(options, [p](uint64_t, std::string m) {
                        // On the receiving worker's progress thread.
                        const int64_t n = static_cast<int64_t>(m.size());
                        p->rx_->Recycle(std::move(m));
                        std::lock_guard<std::mutex> lock(p->mu_);
                        if (!p->have_rx_clock_ &&
                            pthread_getcpuclockid(pthread_self(), &p->rx_clock_) == 0) {
                          p->have_rx_clock_ = true;
                        }
                        p->received_ += n;
                        p->cv_.notify_all();
                      }));
  ZF_ASSIGN_OR_RETURN(r->tx_, UcxWorker::Create(options, [](uint64_t, std::string) {}));
  ZF_ASSIGN_OR_RETURN(r->ep_, r->tx_->Connect(r->rx_->address()));
  return r;
}

RawUcp::~RawUcp() {
  if (tx_ != nullptr) tx_->Disconnect(ep_, /*force=*/false);
}

double RawUcp::ReceiverCpuSeconds() {
  clockid_t clock;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!have_rx_clock_) return -1;
    clock = rx_clock_;
  }
  // The progress thread lives as long as rx_, which outlives every Run().
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return -1;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

absl::StatusOr<RawUcpSample> RawUcp::Run(const std::string& payload, int64_t count,
                                         int64_t window, const EnoughFn& enough) {
  const int64_t size = static_cast<int64_t>(payload.size());
  int64_t base = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    base = received_;
    failed_ = absl::OkStatus();
  }
  const double cpu0 = ReceiverCpuSeconds();
  const Clock::time_point t0 = Clock::now();
  int64_t sent = 0, messages = 0;
  while (count >= 0 ? messages < count : !enough(t0, sent)) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return inflight_ == 0 || inflight_ + size <= window || !failed_.ok(); });
      if (!failed_.ok()) return failed_;
      inflight_ += size;
    }
    tx_->Send(ep_, /*tag=*/1, {payload}, [this, size](absl::Status s) {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_ -= size;
      if (!s.ok() && failed_.ok()) failed_ = s;
      cv_.notify_all();
    });
    sent += size;
    ++messages;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(120),
                      [&] { return received_ - base >= sent || !failed_.ok(); })) {
      return absl::DeadlineExceededError(absl::StrCat("raw UCP: ", received_ - base, " of ", sent,
                                                      " bytes arrived within 120 s"));
    }
    if (!failed_.ok()) return failed_;
  }
  RawUcpSample out;
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.bytes = sent;
  const double cpu1 = ReceiverCpuSeconds();
  // Only when the clock was known at the start (a warm-up run took it).
  if (cpu0 >= 0 && cpu1 >= cpu0) out.receiver_cpu_s = cpu1 - cpu0;
  return out;
}

}  // namespace zenflow
