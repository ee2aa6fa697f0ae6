// A job's selection rendezvous; see selection_barrier.h.
#include "server/selection_barrier.h"

#include <utility>

namespace zenflow {
namespace {

int64_t Bytes(const std::vector<std::vector<float>>& scores) {
  int64_t n = 0;
  for (const auto& s : scores) n += static_cast<int64_t>(s.size() * sizeof(float));
  return n;
}

}  // namespace

bool SelectionBarrier::all_submitted() const {
  if (step_ < 0) return false;
  for (bool s : submitted_) {
    if (!s) return false;
  }
  return true;
}

SelectionBarrier::Done SelectionBarrier::Submit(int rank, int64_t step,
                                                std::vector<std::vector<float>> scores,
                                                uint64_t call, Done done) {
  if (step_ < 0) {
    step_ = step;
    submitted_.assign(world_, false);
    scores_.assign(world_, {});
    waiters_.assign(world_, nullptr);
    calls_.assign(world_, 0);
  }
  Done replaced;
  if (submitted_[rank]) {
    replaced = std::move(waiters_[rank]);
    bytes_ -= Bytes(scores_[rank]);
  }
  submitted_[rank] = true;
  bytes_ += Bytes(scores);
  scores_[rank] = std::move(scores);
  waiters_[rank] = std::move(done);
  calls_[rank] = call;
  return replaced;
}

void SelectionBarrier::Withdraw(int rank, uint64_t call) {
  if (step_ < 0 || rank < 0 || rank >= world_ || !submitted_[rank] || calls_[rank] != call) {
    return;  // completed, replaced or never entered
  }
  bytes_ -= Bytes(scores_[rank]);
  submitted_[rank] = false;
  scores_[rank].clear();
  scores_[rank].shrink_to_fit();
  waiters_[rank] = nullptr;
  calls_[rank] = 0;
  for (bool s : submitted_) {
    if (s) return;
  }
  Reset();  // nobody waits: another step may be chosen
}

std::vector<float> SelectionBarrier::SummedScores(int t, int64_t cols) const {
  std::vector<float> sum(static_cast<size_t>(cols), 0.0f);
  for (int r = 0; r < world_; ++r) {  // fixed order: deterministic
    if (!submitted_[r] || static_cast<size_t>(t) >= scores_[r].size()) continue;
    const std::vector<float>& s = scores_[r][t];
    for (size_t c = 0; c < s.size() && c < sum.size(); ++c) sum[c] += s[c];
  }
  return sum;
}

std::vector<SelectionBarrier::Done> SelectionBarrier::Take() {
  std::vector<Done> out;
  for (Done& w : waiters_) {
    if (w) out.push_back(std::move(w));
  }
  Reset();
  return out;
}

void SelectionBarrier::Reset() {
  step_ = -1;
  submitted_.clear();
  scores_.clear();
  waiters_.clear();
  calls_.clear();
  bytes_ = 0;
}

}  // namespace zenflow
