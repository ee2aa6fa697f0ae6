// The reactor of the calls that wait for every rank of a job
// (SubmitImportance, AllReduce).
#ifndef ZENFLOW_SERVER_RENDEZVOUS_REACTOR_H_
#define ZENFLOW_SERVER_RENDEZVOUS_REACTOR_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/registry.h"
#include "server/service.h"

namespace zenflow {

// A call that waits for every rank. A cancelled call (its deadline passed,
// its client went away) withdraws its contribution from the job at once, so
// it holds no memory and a retry of the same step is welcome.
class RendezvousReactor final : public grpc::ServerUnaryReactor {
 public:
  RendezvousReactor(JobRegistry* registry, const char* reason,
                    std::function<void(uint64_t)> withdraw)
      : state_(std::make_shared<State>()), withdraw_(std::move(withdraw)) {
    state_->reactor = this;
    state_->registry = registry;
    state_->reason = reason;
  }

  uint64_t call_id() const { return call_id_; }

  // The job's completion: answers the call unless it was cancelled.
  template <typename Result, typename Store>
  std::function<void(absl::StatusOr<Result>)> Completion(Store store) {
    std::shared_ptr<State> st = state_;
    return [st, store](absl::StatusOr<Result> r) {
      MutexLock lock(&st->mu);
      if (st->finished) return;
      st->finished = true;
      if (r.ok()) {
        store(*std::move(r));
      } else {
        st->registry->CountRejection(r.status().code(), st->reason);
      }
      st->reactor->Finish(ToGrpcStatus(r.status()));
    };
  }

  void OnCancel() override {
    withdraw_(call_id_);  // the job drops the call's contribution and callback
    std::shared_ptr<State> st = state_;
    MutexLock lock(&st->mu);
    if (st->finished) return;
    st->finished = true;
    st->reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                                     "call cancelled; its contribution was withdrawn"));
  }

  void OnDone() override { delete this; }

 private:
  // Unique in the process: WithdrawImportance and WithdrawAllReduce name
  // calls by it.
  static uint64_t NextCallId();

  struct State {
    Mutex mu;
    bool finished ABSL_GUARDED_BY(mu) = false;
    grpc::ServerUnaryReactor* reactor = nullptr;
    JobRegistry* registry = nullptr;
    const char* reason = "";
  };
  const std::shared_ptr<State> state_;
  const std::function<void(uint64_t)> withdraw_;
  const uint64_t call_id_ = NextCallId();
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_RENDEZVOUS_REACTOR_H_
