// A job's parameter upload (Job::Upload); see job.h.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/dtype_proto.h"
#include "common/status_macros.h"
#include "server/job.h"

namespace zenflow {

Job::Upload::Upload(std::shared_ptr<Job> job)
    : job_(std::move(job)), filled_(job_->tensors_.size(), 0) {}

absl::StatusOr<std::unique_ptr<Job::Upload>> Job::Upload::Begin(std::shared_ptr<Job> job) {
  MutexLock lock(&job->mu_);
  ZF_RETURN_IF_ERROR(job->CheckLive());
  if (job->uploaded_) {
    return absl::AlreadyExistsError(absl::StrCat(
        "parameters of job '", job->spec_.job_id(),
        "' were already uploaded; they can be uploaded once (delete and recreate the job to "
        "start over)"));
  }
  if (job->uploading_) {
    return absl::AbortedError(absl::StrCat(
        "another UploadParameters stream of job '", job->spec_.job_id(),
        "' is in progress; one upload runs at a time (retry once it has ended)"));
  }
  job->uploading_ = true;
  return std::unique_ptr<Upload>(new Upload(job));
}

Job::Upload::~Upload() {
  MutexLock lock(&job_->mu_);
  if (!committed_) {
    // Clear what was staged: the buffer accumulates odd rounds later.
    for (size_t i = 0; i < job_->tensors_.size(); ++i) {
      job_->acc_->ClearStaging(static_cast<int>(i), filled_[i]);
    }
  }
  job_->uploading_ = false;
}

absl::Status Job::Upload::AddChunk(const v1::UploadParametersRequest& chunk) {
  {
    MutexLock lock(&job_->mu_);
    ZF_RETURN_IF_ERROR(job_->CheckLive());
    if (job_->uploaded_) {
      return absl::AlreadyExistsError(absl::StrCat(
          "parameters of job '", job_->spec_.job_id(),
          "' were already uploaded; they can be uploaded once (delete and recreate the job to "
          "start over)"));
    }
  }
  ZF_ASSIGN_OR_RETURN(int ti, job_->TensorIndex(chunk.tensor()));
  const TensorState& t = job_->tensors_[ti];
  const v1::TensorSpec& ts = job_->spec_.tensors(ti);
  const int64_t numel = t.rows * t.cols;
  if (chunk.shape_size() > 0) {
    bool same = chunk.shape_size() == ts.shape_size();
    for (int i = 0; same && i < ts.shape_size(); ++i) same = chunk.shape(i) == ts.shape(i);
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': uploaded shape ", ShapeString(chunk.shape()),
          " does not match the job's shape ", ShapeString(ts.shape())));
    }
  } else if (filled_[ti] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': the first chunk must carry the shape ", ShapeString(ts.shape())));
  }
  if (chunk.offset() != filled_[ti]) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name, "': chunk at offset ", chunk.offset(),
                     " out of order; expected offset ", filled_[ti],
                     " (chunks of a tensor are sent in row-major order)"));
  }
  const v1::DType pd = chunk.dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP32 : chunk.dtype();
  ZF_ASSIGN_OR_RETURN(DType dt, FromProto(pd, "upload dtype"));
  const size_t esize = DTypeSize(dt);
  if (chunk.payload().size() % esize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': payload of ", chunk.payload().size(),
        " bytes is not a whole number of ", DTypeName(dt), " values"));
  }
  const int64_t n = static_cast<int64_t>(chunk.payload().size() / esize);
  if (chunk.offset() + n > numel) {
    return absl::OutOfRangeError(absl::StrCat("tensor '", t.name, "': chunk [", chunk.offset(),
                                              ", ", chunk.offset() + n,
                                              ") exceeds the tensor's ", numel, " elements"));
  }
  size_t bad = 0;
  if (!AllFinite(dt, chunk.payload().data(), n, &bad)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name,
                                                   "': non-finite value at element ",
                                                   chunk.offset() + static_cast<int64_t>(bad)));
  }
  // Only this upload touches the staging buffer before the parameters are in.
  float* staged = job_->acc_->staging(ti);
  Decode(dt, chunk.payload().data(), n, staged + chunk.offset());
  filled_[ti] += n;
  return absl::OkStatus();
}

absl::StatusOr<v1::UploadParametersResponse> Job::Upload::Commit() {
  MutexLock lock(&job_->mu_);
  job_->QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(job_->CheckLive());
  if (job_->uploaded_) {
    return absl::AlreadyExistsError(absl::StrCat("parameters of job '", job_->spec_.job_id(),
                                                 "' were already uploaded"));
  }
  for (size_t i = 0; i < job_->tensors_.size(); ++i) {
    const TensorState& t = job_->tensors_[i];
    if (filled_[i] != t.rows * t.cols) {
      return absl::FailedPreconditionError(
          absl::StrCat("upload incomplete: tensor '", t.name, "' has ", filled_[i], " of ",
                       t.rows * t.cols, " elements; nothing was stored"));
    }
  }
  int64_t total = 0;
  for (size_t i = 0; i < job_->tensors_.size(); ++i) {
    TensorState& t = job_->tensors_[i];
    job_->store_->LoadRowMajor(static_cast<int>(i), job_->acc_->staging(static_cast<int>(i)));
    total += t.rows * t.cols;
    job_->acc_->ClearStaging(static_cast<int>(i), t.rows * t.cols);
  }
  job_->uploaded_ = true;
  committed_ = true;
  v1::UploadParametersResponse resp;
  resp.set_elements(total);
  resp.set_tensors(static_cast<int64_t>(job_->tensors_.size()));
  return resp;
}

}  // namespace zenflow
