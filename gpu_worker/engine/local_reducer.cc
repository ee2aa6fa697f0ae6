// In-process gradient reducer; see local_reducer.h.
#include "gpu_worker/engine/local_reducer.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace zenflow {

LocalReducer::LocalReducer(int world, Arithmetic arithmetic, absl::Duration timeout)
    : world_(world), arithmetic_(arithmetic), timeout_(timeout) {
  MutexLock lock(&mu_);
  parts_.assign(static_cast<size_t>(world_), nullptr);
}

GradientReducer LocalReducer::ForRank(int rank) {
  return [this, rank](int64_t step, const std::vector<ReducePart>& parts) {
    return Reduce(rank, step, parts);
  };
}

int64_t LocalReducer::completed() {
  MutexLock lock(&mu_);
  return generation_;
}

absl::Status LocalReducer::Reduce(int rank, int64_t step, const std::vector<ReducePart>& parts) {
  if (rank < 0 || rank >= world_) {
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " of a ", world_, "-rank reducer"));
  }
  MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  if (parts_[rank] != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " called the reducer again before step ", step_,
                     "'s rendezvous completed (one thread per rank)"));
  }
  if (arrived_ == 0) step_ = step;
  if (step != step_) {
    result_ = absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " reduces step ", step, " while other ranks reduce step ", step_));
    broken_ = result_;
    return broken_;
  }
  parts_[rank] = &parts;
  const int64_t gen = generation_;
  if (++arrived_ == world_) {
    result_ = CombineLocked();
    arrived_ = 0;
    parts_.assign(static_cast<size_t>(world_), nullptr);
    ++generation_;
    return result_;
  }
  const bool done = mu_.AwaitWithTimeout(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generation_ != gen || !broken_.ok(); },
      timeout_);
  if (generation_ != gen) return result_;
  if (broken_.ok() && !done) {
    std::string missing;
    for (int r = 0; r < world_; ++r) {
      if (parts_[r] == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", r);
    }
    broken_ = absl::DeadlineExceededError(absl::StrCat(
        "gradient reduce of step ", step, ": rank(s) ", missing, " did not arrive within ",
        absl::FormatDuration(timeout_)));
  }
  return broken_;
}

absl::Status LocalReducer::CombineLocked() {
  const std::vector<ReducePart>& first = *parts_[0];
  for (int r = 1; r < world_; ++r) {
    const std::vector<ReducePart>& p = *parts_[r];
    bool same = p.size() == first.size();
    for (size_t i = 0; same && i < p.size(); ++i) {
      same = p[i].tensor == first[i].tensor && p[i].n == first[i].n;
    }
    if (!same) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step_, ": rank ", r, " reduces other parts than rank 0"));
    }
  }
  if (arithmetic_ == Arithmetic::kNone) return absl::OkStatus();
  const float inv = 1.0f / static_cast<float>(world_);
  for (size_t i = 0; i < first.size(); ++i) {
    for (int64_t j = 0; j < first[i].n; ++j) {
      float sum = 0.0f;  // in rank order, as the daemon's AllReduce
      for (int r = 0; r < world_; ++r) sum += (*parts_[r])[i].device[j];
      sum *= inv;
      for (int r = 0; r < world_; ++r) (*parts_[r])[i].device[j] = sum;
    }
  }
  return absl::OkStatus();
}

}  // namespace zenflow
