// UploadParameters' reactor; see upload_reactor.h.
#include "server/upload_reactor.h"

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/job.h"
#include "server/quote.h"
#include "server/raw_message.h"

namespace zenflow {
namespace {

class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer>, public IdleCall {
 public:
  // Owned by itself until OnDone (and briefly by the idle sweep).
  // `refused`: the call is over the stream limit and ends at once with it.
  static UploadReactor* Start(ZenFlowService* service, JobRegistry* registry,
                              grpc::ByteBuffer* resp, Who who, absl::Status refused) {
    auto r = std::shared_ptr<UploadReactor>(
        new UploadReactor(service, registry, resp, std::move(who), refused.ok()));
    r->self_ = r;
    if (!refused.ok()) {
      r->Done(refused);
      return r.get();
    }
    r->watch_ = service->Watch(std::weak_ptr<IdleCall>(r));
    r->StartRead(&r->in_);
    return r.get();
  }

  void Expire(absl::Duration waited) override { Done(NoFirstMessage("upload chunk", waited)); }

  void OnReadDone(bool ok) override {
    // The first chunk, unless the idle sweep ended the call already.
    if (upload_ == nullptr && !FirstMessage()) return;
    if (!ok) {
      if (cancelled_.load()) return Done(absl::CancelledError("upload cancelled"));
      if (upload_ == nullptr) {
        return Done(absl::InvalidArgumentError("upload stream carried no chunks"));
      }
      absl::StatusOr<v1::UploadParametersResponse> r = upload_->Commit();
      if (r.ok()) {
        bool own = false;
        grpc::Status g = grpc::SerializationTraits<v1::UploadParametersResponse>::Serialize(
            *r, resp_, &own);
        if (!g.ok()) return Done(absl::InternalError("cannot serialize the upload's answer"));
      }
      return Done(r.status());
    }
    absl::Status s = ParseRaw(&in_, ++index_, &chunk_, registry_);
    if (!s.ok()) return Done(s);
    if (upload_ == nullptr) {
      absl::StatusOr<std::shared_ptr<Job>> job =
          service_->Authorize(who_, chunk_.job_id(), "UploadParameters");
      if (!job.ok()) return Done(job.status());
      job_ = *std::move(job);
      job_id_ = chunk_.job_id();
      absl::StatusOr<std::unique_ptr<Job::Upload>> up = Job::Upload::Begin(job_);
      if (!up.ok()) return Done(up.status());
      upload_ = *std::move(up);
    } else if (chunk_.job_id() != job_id_ && !chunk_.job_id().empty()) {
      return Done(absl::InvalidArgumentError(absl::StrCat("chunk for job ", Quote(chunk_.job_id()),
                                                          " in an upload stream of job '",
                                                          job_id_, "'")));
    }
    s = upload_->AddChunk(chunk_);
    if (!s.ok()) return Done(s);
    StartRead(&in_);
  }

  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override {
    service_->Unwatch(watch_);
    if (holds_slot_) service_->ReleaseStream();
    std::shared_ptr<UploadReactor> last = std::move(self_);  // may delete this
  }

 private:
  UploadReactor(ZenFlowService* service, JobRegistry* registry, grpc::ByteBuffer* resp, Who who,
                bool holds_slot)
      : service_(service), registry_(registry), resp_(resp), who_(std::move(who)),
        holds_slot_(holds_slot) {}

  void Done(const absl::Status& s) {
    if (!s.ok()) {
      registry_->CountRejection(s.code(), "upload_parameters");
      if (job_ != nullptr) job_->CountRejection(s.code());
    }
    upload_.reset();  // an upload that did not commit clears its staging now
    Finish(ToGrpcStatus(s));
  }

  ZenFlowService* const service_;
  JobRegistry* const registry_;
  grpc::ByteBuffer* const resp_;
  const Who who_;
  const bool holds_slot_;
  std::shared_ptr<UploadReactor> self_;  // until OnDone
  uint64_t watch_ = 0;                   // ZenFlowService::Watch's
  grpc::ByteBuffer in_;
  int64_t index_ = 0;
  v1::UploadParametersRequest chunk_;
  std::shared_ptr<Job> job_;
  std::string job_id_;
  std::unique_ptr<Job::Upload> upload_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* StartUploadReactor(ZenFlowService* service,
                                                             JobRegistry* registry,
                                                             grpc::ByteBuffer* resp, Who who,
                                                             absl::Status refused) {
  return UploadReactor::Start(service, registry, resp, std::move(who), std::move(refused));
}

}  // namespace zenflow
