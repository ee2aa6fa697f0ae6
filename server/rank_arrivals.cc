// Which rank sent which column for which step; see rank_arrivals.h.
#include "server/rank_arrivals.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace zenflow {

RankArrivals::RankArrivals(const std::vector<int64_t>& cols, int world)
    : before_(cols.size()), ranks_(static_cast<size_t>(world)) {
  for (size_t t = 0; t < cols.size(); ++t) {
    before_[t].resize(static_cast<size_t>(cols[t]) + 1);
    for (size_t c = 0; c < before_[t].size(); ++c) before_[t][c] = static_cast<int32_t>(c);
  }
  Renumber();
}

void RankArrivals::Renumber() {
  offset_.assign(before_.size() + 1, 0);
  for (size_t t = 0; t < before_.size(); ++t) offset_[t + 1] = offset_[t] + before_[t].back();
}

int64_t RankArrivals::Number(int t, int32_t c) const {
  const std::vector<int32_t>& b = before_[t];
  return b[c + 1] == b[c] ? -1 : offset_[t] + b[c];
}

std::pair<int, int32_t> RankArrivals::Column(int64_t k) const {
  const int t =
      static_cast<int>(std::upper_bound(offset_.begin(), offset_.end(), k) - offset_.begin()) - 1;
  const std::vector<int32_t>& b = before_[t];
  // The column whose count before it is k - offset and that is unimportant:
  // the last entry c with b[c] == k - offset.
  const int32_t want = static_cast<int32_t>(k - offset_[t]);
  const int32_t c = static_cast<int32_t>(std::upper_bound(b.begin(), b.end(), want) - b.begin()) - 1;
  return {t, c};
}

void RankArrivals::SetImportant(int t, const std::vector<uint8_t>& important) {
  // What is received so far, as columns, to be numbered again.
  std::vector<std::tuple<int, int64_t, int, int32_t>> kept;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (const Step& s : ranks_[r]) {
      for (const Run& run : s.runs) {
        for (int64_t k = run.first; k < run.second; ++k) {
          const auto [tk, c] = Column(k);
          kept.emplace_back(static_cast<int>(r), s.step, tk, c);
        }
      }
    }
    Release(&ranks_[r]);
  }
  std::vector<int32_t>& b = before_[t];
  for (size_t c = 0; c + 1 < b.size(); ++c) b[c + 1] = b[c] + (important[c] != 0 ? 0 : 1);
  Renumber();
  for (const auto& [r, step, tk, c] : kept) {
    if (Number(tk, c) >= 0) MarkReceived(tk, r, step, c);
  }
}

bool RankArrivals::Contains(const std::vector<Run>& runs, int64_t k) {
  // The last run that starts at or before k.
  auto it = std::upper_bound(runs.begin(), runs.end(), k,
                             [](int64_t x, const Run& run) { return x < run.first; });
  return it != runs.begin() && k < std::prev(it)->second;
}

void RankArrivals::Insert(std::vector<Run>* runs, int64_t k) {
  if (!runs->empty() && runs->back().second == k) {  // the usual case: the next column
    runs->back().second = k + 1;
    return;
  }
  auto it = std::upper_bound(runs->begin(), runs->end(), k,
                             [](int64_t x, const Run& run) { return x < run.first; });
  const bool joins_prev = it != runs->begin() && std::prev(it)->second == k;
  const bool joins_next = it != runs->end() && it->first == k + 1;
  if (joins_prev && joins_next) {
    std::prev(it)->second = it->second;
    runs->erase(it);
  } else if (joins_prev) {
    std::prev(it)->second = k + 1;
  } else if (joins_next) {
    it->first = k;
  } else {
    runs->insert(it, Run{k, k + 1});
  }
}

bool RankArrivals::Received(int t, int rank, int64_t step, int32_t c) const {
  const int64_t k = Number(t, c);
  if (k < 0) return false;
  const std::vector<Step>& steps = ranks_[rank];
  // Ascending by step (MarkReceived, Load): a rank's newest step, which
  // its next shard usually belongs to or comes after, answers at once; a
  // walk over every step of a long round did not.
  if (steps.empty() || step > steps.back().step) return false;
  const auto s = StepAt(steps, step);
  return s != steps.end() && s->step == step && Contains(s->runs, k);
}

void RankArrivals::MarkReceived(int t, int rank, int64_t step, int32_t c) {
  const int64_t k = Number(t, c);
  if (k < 0) return;  // (never received: the caller rejects it first)
  std::vector<Step>& steps = ranks_[rank];
  auto s = steps.empty() || step > steps.back().step ? steps.end() : StepAt(steps, step);
  if (s != steps.end() && s->step == step) {
    Insert(&s->runs, k);
    return;
  }
  std::vector<Run> runs;
  if (!spare_.empty()) {
    runs = std::move(spare_.back());
    spare_.pop_back();
  }
  runs.push_back(Run{k, k + 1});
  steps.insert(s, Step{step, std::move(runs)});  // keeps them ascending
}

std::vector<RankArrivals::Step>::const_iterator RankArrivals::StepAt(const std::vector<Step>& steps,
                                                                   int64_t step) {
  return std::lower_bound(steps.begin(), steps.end(), step,
                          [](const Step& s, int64_t x) { return s.step < x; });
}

std::vector<RankArrivals::Step>::iterator RankArrivals::StepAt(std::vector<Step>& steps,
                                                             int64_t step) {
  return std::lower_bound(steps.begin(), steps.end(), step,
                          [](const Step& s, int64_t x) { return s.step < x; });
}

void RankArrivals::Release(std::vector<Step>* steps) {
  for (Step& s : *steps) {
    s.runs.clear();
    spare_.push_back(std::move(s.runs));
  }
  steps->clear();
}

int32_t RankArrivals::hits(int t, int rank, int32_t c) const {
  const int64_t k = Number(t, c);
  if (k < 0) return 0;
  int32_t n = 0;
  for (const Step& s : ranks_[rank]) n += Contains(s.runs, k) ? 1 : 0;
  return n;
}

bool RankArrivals::Seen(int t, int rank, int32_t c) const {
  const int64_t k = Number(t, c);
  if (k < 0) return false;
  for (const Step& s : ranks_[rank]) {
    if (Contains(s.runs, k)) return true;
  }
  return false;
}

bool RankArrivals::FirstIncomplete(int rank, int64_t steps, Miss* miss) const {
  const int64_t total = offset_.back();
  // Every run's edges, swept in order: between two edges every number has
  // the same count of steps.
  std::vector<std::pair<int64_t, int>> edges;
  for (const Step& s : ranks_[rank]) {
    for (const Run& run : s.runs) {
      edges.emplace_back(run.first, +1);
      edges.emplace_back(run.second, -1);
    }
  }
  std::sort(edges.begin(), edges.end());
  int64_t at = 0;  // numbers below `at` are checked
  int32_t count = 0;
  auto bad = [&](int64_t k) {
    if (k >= total) return false;
    const auto [t, c] = Column(k);
    *miss = Miss{t, c, count};
    return true;
  };
  for (size_t i = 0; i < edges.size();) {
    const int64_t x = edges[i].first;
    if (x > at && count != steps && bad(at)) return true;
    at = std::max(at, x);
    for (; i < edges.size() && edges[i].first == x; ++i) count += edges[i].second;
  }
  return at < total && count != steps && bad(at);
}

void RankArrivals::ResetRank(int rank) { Release(&ranks_[rank]); }

int64_t RankArrivals::bytes() const {
  int64_t n = static_cast<int64_t>(ranks_.capacity() * sizeof(ranks_[0]) +
                                   offset_.capacity() * sizeof(int64_t));
  for (const std::vector<int32_t>& b : before_) n += static_cast<int64_t>(b.capacity() * 4);
  for (const std::vector<Step>& r : ranks_) {
    n += static_cast<int64_t>(r.capacity() * sizeof(Step));
    for (const Step& s : r) n += static_cast<int64_t>(s.runs.capacity() * sizeof(Run));
  }
  n += static_cast<int64_t>(spare_.capacity() * sizeof(spare_[0]));
  for (const std::vector<Run>& runs : spare_) n += static_cast<int64_t>(runs.capacity() * sizeof(Run));
  return n;
}

namespace {

void PutInt(std::string* out, int64_t x) {
  out->append(reinterpret_cast<const char*>(&x), sizeof(x));
}

}  // namespace

std::string RankArrivals::Save() const {
  // World, then per rank its steps; per step the step, its run count and
  // runs (int64 each).
  std::string out;
  PutInt(&out, static_cast<int64_t>(ranks_.size()));
  for (const std::vector<Step>& r : ranks_) {
    PutInt(&out, static_cast<int64_t>(r.size()));
    for (const Step& s : r) {
      PutInt(&out, s.step);
      PutInt(&out, static_cast<int64_t>(s.runs.size()));
      for (const Run& run : s.runs) {
        PutInt(&out, run.first);
        PutInt(&out, run.second);
      }
    }
  }
  return out;
}

absl::Status RankArrivals::Load(const std::string& bytes) {
  size_t at = 0;
  auto get = [&](int64_t* x) {
    if (bytes.size() - at < sizeof(*x)) return false;
    std::memcpy(x, bytes.data() + at, sizeof(*x));
    at += sizeof(*x);
    return true;
  };
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("arrivals: ", why));
  };
  const int64_t total = offset_.back();
  int64_t world = 0;
  if (!get(&world) || world != static_cast<int64_t>(ranks_.size())) {
    return bad("the rank count does not fit the job");
  }
  std::vector<std::vector<Step>> loaded(ranks_.size());
  for (std::vector<Step>& r : loaded) {
    int64_t nsteps = 0;
    if (!get(&nsteps) || nsteps < 0 || nsteps > static_cast<int64_t>(bytes.size())) {
      return bad("truncated");
    }
    for (int64_t i = 0; i < nsteps; ++i) {
      Step s{0, {}};
      int64_t nruns = 0;
      if (!get(&s.step) || !get(&nruns) || nruns < 0 ||
          nruns > static_cast<int64_t>(bytes.size() / 16)) {
        return bad("truncated");
      }
      for (const Step& o : r) {
        if (o.step == s.step) return bad(absl::StrCat("step ", s.step, " is repeated"));
      }
      int64_t last_end = -2;
      for (int64_t j = 0; j < nruns; ++j) {
        Run run;
        if (!get(&run.first) || !get(&run.second)) return bad("truncated");
        if (run.first < 0 || run.first <= last_end || run.second <= run.first ||
            run.second > total) {
          return bad(absl::StrCat("run [", run.first, ", ", run.second,
                                  ") out of order or out of range [0, ", total, ")"));
        }
        last_end = run.second;
        s.runs.push_back(run);
      }
      r.push_back(std::move(s));
    }
    // Ascending by step, as MarkReceived keeps them (Received searches).
    std::sort(r.begin(), r.end(), [](const Step& a, const Step& b) { return a.step < b.step; });
  }
  if (at != bytes.size()) return bad("trailing bytes");
  ranks_ = std::move(loaded);
  return absl::OkStatus();
}

void RankArrivals::LoadPerColumn(int t, int rank, const int64_t* last, const int32_t* hits) {
  const int32_t cols = static_cast<int32_t>(before_[t].size() - 1);
  for (int32_t c = 0; c < cols; ++c) {
    for (int32_t h = 0; h < hits[c]; ++h) {
      const int64_t step = last[c] - h;
      if (step >= 0 && Number(t, c) >= 0 && !Received(t, rank, step, c)) {
        MarkReceived(t, rank, step, c);
      }
    }
  }
}

}  // namespace zenflow
