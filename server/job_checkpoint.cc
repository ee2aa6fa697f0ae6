// A job's checkpoint: its whole state at a round boundary as named sections
// (common/checkpoint_file.h writes and verifies them), and a job made from
// them. Part of Job (see job.h "Checkpoints").
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/job.h"

namespace zenflow {
namespace {

// The "meta" section: little-endian int64s (lr and flags too), in the order
// Job::Snapshot writes them. Its layout is versioned by kMetaVersion.
constexpr int64_t kMetaVersion = 1;

class MetaWriter {
 public:
  void Put(int64_t x) { out_.append(reinterpret_cast<const char*>(&x), sizeof(x)); }
  template <typename T>
  void PutAll(const std::vector<T>& xs) {
    Put(static_cast<int64_t>(xs.size()));
    for (T x : xs) Put(static_cast<int64_t>(x));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class MetaReader {
 public:
  explicit MetaReader(const std::string& in) : in_(in) {}
  bool Get(int64_t* x) {
    if (at_ + sizeof(*x) > in_.size()) return ok_ = false;
    std::memcpy(x, in_.data() + at_, sizeof(*x));
    at_ += sizeof(*x);
    return true;
  }
  int64_t Next() {
    int64_t x = 0;
    Get(&x);
    return x;
  }
  // A vector of at most `max` elements.
  template <typename T>
  std::vector<T> All(int64_t max) {
    const int64_t n = Next();
    if (n < 0 || n > max) {
      ok_ = false;
      return {};
    }
    std::vector<T> xs(static_cast<size_t>(n));
    for (T& x : xs) x = static_cast<T>(Next());
    return xs;
  }
  bool ok() const { return ok_ && at_ == in_.size(); }

 private:
  const std::string& in_;
  size_t at_ = 0;
  bool ok_ = true;
};

// Rank 0's (or the only) sums are "sum0" and "sum1"; rank r's, with
// rank-ordered sums, "sum0.r<r>" and "sum1.r<r>".
std::string SumSectionName(int rank, int parity) {
  return rank == 0 ? absl::StrCat("sum", parity) : absl::StrCat("sum", parity, ".r", rank);
}

// A tensor's fp32 sections, in the order Snapshot copies them.
std::vector<std::string> SectionNamesOfFloats(int sum_ranks) {
  std::vector<std::string> names = {"master", "m", "v"};
  for (int r = 0; r < sum_ranks; ++r) {
    names.push_back(SumSectionName(r, 0));
    names.push_back(SumSectionName(r, 1));
  }
  return names;
}

}  // namespace

absl::StatusOr<JobSnapshot> Job::Snapshot() {
  // The large sections are allocated and faulted in before the lock is
  // taken (their sizes follow from the immutable shapes), so that the pause
  // under the lock is a plain copy: fresh memory's page faults cost more
  // than the copy itself.
  struct Big {
    std::string name;
    std::string bytes;
  };
  std::vector<Big> big;
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const size_t elements = static_cast<size_t>(tensors_[ti].rows * tensors_[ti].cols);
    const size_t cols = static_cast<size_t>(tensors_[ti].cols);
    const std::string p = absl::StrCat("t", ti, ".");
    for (const std::string& n : SectionNamesOfFloats(acc_->sum_ranks())) {
      big.push_back({p + n, std::string(elements * sizeof(float), '\0')});
    }
    big.push_back({p + "count", std::string(cols * sizeof(int64_t), '\0')});
    big.push_back({p + "last", std::string(world_ * cols * sizeof(int64_t), '\0')});
    big.push_back({p + "hits", std::string(world_ * cols * sizeof(int32_t), '\0')});
  }
  MutexLock lock(&mu_);
  ZF_RETURN_IF_ERROR(CheckLive());
  // A round boundary: no update owns the store or a round's sums now.
  mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return rounds_updated_ == rounds_closed_ || deleted_;
  });
  ZF_RETURN_IF_ERROR(CheckLive());
  const auto t0 = std::chrono::steady_clock::now();
  JobSnapshot snap;
  snap.job_id = spec_.job_id();
  snap.rounds_updated = rounds_updated_;
  snap.sections.push_back({"spec", spec_.SerializeAsString()});
  MetaWriter meta;
  meta.Put(kMetaVersion);
  meta.Put(uploaded_ ? 1 : 0);
  meta.Put(selection_version_);
  meta.Put(selection_step_);
  meta.Put(rounds_closed_);
  meta.Put(rounds_updated_);
  for (const RankState& r : ranks_) {
    meta.Put(r.joined ? 1 : 0);
    meta.Put(r.next_round);
  }
  meta.Put(static_cast<int64_t>(rounds_.size()));
  for (const auto& [round, rs] : rounds_) {
    int32_t lr_bits = 0;
    std::memcpy(&lr_bits, &rs.lr, sizeof(lr_bits));
    meta.Put(round);
    meta.Put(rs.closed);
    meta.Put(rs.steps_sum);
    meta.Put(lr_bits);
    meta.Put(rs.nonfinite ? 1 : 0);
  }
  meta.PutAll(hand_off_.Save());
  for (const TensorState& t : tensors_) {
    meta.PutAll(t.important);
    meta.PutAll(t.prev_important_cols);
  }
  snap.sections.push_back({"meta", meta.Take()});
  size_t at = 0;
  auto copy = [&](const void* src) {
    Big& b = big[at++];
    if (!b.bytes.empty()) std::memcpy(b.bytes.data(), src, b.bytes.size());
  };
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const int t = static_cast<int>(ti);
    const TensorStore::Raw raw = store_->raw(t);
    copy(raw.master);
    copy(raw.m);
    copy(raw.v);
    for (int r = 0; r < acc_->sum_ranks(); ++r) {
      copy(acc_->sum_buffer(t, r, 0).data());
      copy(acc_->sum_buffer(t, r, 1).data());
    }
    copy(raw.count);
    const size_t cols = raw.cols;
    Big& last = big[at++];
    Big& hits = big[at++];
    for (int r = 0; r < world_; ++r) {
      std::memcpy(last.bytes.data() + r * cols * sizeof(int64_t), acc_->last_steps(t, r).data(),
                  cols * sizeof(int64_t));
      std::memcpy(hits.bytes.data() + r * cols * sizeof(int32_t), acc_->hits_of(t, r).data(),
                  cols * sizeof(int32_t));
    }
  }
  snap.pause_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (Big& b : big) snap.sections.push_back({std::move(b.name), std::move(b.bytes)});
  return snap;
}

absl::Status Job::LoadSnapshot(const std::map<std::string, const std::string*>& sections) {
  MutexLock lock(&mu_);
  auto section = [&](const std::string& name) -> const std::string* {
    auto it = sections.find(name);
    return it == sections.end() ? nullptr : it->second;
  };
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("job '", spec_.job_id(), "': ", why));
  };
  const std::string* meta_bytes = section("meta");
  if (meta_bytes == nullptr) return bad("no meta section");
  MetaReader meta(*meta_bytes);
  if (meta.Next() != kMetaVersion) return bad("unknown meta version");
  uploaded_ = meta.Next() != 0;
  selection_version_ = meta.Next();
  selection_step_ = meta.Next();
  rounds_closed_ = meta.Next();
  rounds_updated_ = meta.Next();
  durable_rounds_ = rounds_updated_;  // it came from a durable file
  for (RankState& r : ranks_) {
    r.joined = meta.Next() != 0;
    r.next_round = meta.Next();
  }
  const int64_t nrounds = meta.Next();
  if (nrounds < 0 || nrounds > 4) return bad("implausible number of open rounds");
  rounds_.clear();
  for (int64_t i = 0; i < nrounds; ++i) {
    const int64_t round = meta.Next();
    RoundState& rs = rounds_[round];
    rs.closed = static_cast<int32_t>(meta.Next());
    rs.steps_sum = meta.Next();
    const int32_t lr_bits = static_cast<int32_t>(meta.Next());
    std::memcpy(&rs.lr, &lr_bits, sizeof(lr_bits));
    rs.nonfinite = meta.Next() != 0;
    rs.last_close = std::chrono::steady_clock::now();
  }
  if (!hand_off_.Restore(meta.All<int64_t>(int64_t{1} << 40))) return bad("hand-off ledger size");
  for (TensorState& t : tensors_) {
    std::vector<uint8_t> important = meta.All<uint8_t>(t.cols);
    if (static_cast<int64_t>(important.size()) != t.cols) return bad("column set size");
    t.important = std::move(important);
    t.important_cols.clear();
    for (int64_t c = 0; c < t.cols; ++c) {
      if (t.important[c]) t.important_cols.push_back(static_cast<int32_t>(c));
    }
    t.prev_important_cols = meta.All<int32_t>(t.cols);
  }
  if (!meta.ok()) return bad("meta section malformed");
  auto load = [&](const std::string& name, void* dst, size_t bytes) -> absl::Status {
    const std::string* s = section(name);
    if (s == nullptr) return bad(absl::StrCat("no section ", name));
    if (s->size() != bytes) {
      return bad(absl::StrCat("section ", name, " has ", s->size(), " bytes, want ", bytes));
    }
    if (bytes > 0) std::memcpy(dst, s->data(), bytes);
    return absl::OkStatus();
  };
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const int t = static_cast<int>(ti);
    const std::string p = absl::StrCat("t", ti, ".");
    const TensorStore::Raw raw = store_->raw(t);
    ZF_RETURN_IF_ERROR(load(p + "master", raw.master, raw.elements * sizeof(float)));
    ZF_RETURN_IF_ERROR(load(p + "m", raw.m, raw.elements * sizeof(float)));
    ZF_RETURN_IF_ERROR(load(p + "v", raw.v, raw.elements * sizeof(float)));
    ZF_RETURN_IF_ERROR(load(p + "count", raw.count, raw.cols * sizeof(int64_t)));
    for (int r = 0; r < acc_->sum_ranks(); ++r) {
      for (int parity = 0; parity < 2; ++parity) {
        std::vector<float>& sum = acc_->sum_buffer(t, r, parity);
        ZF_RETURN_IF_ERROR(
            load(p + SumSectionName(r, parity), sum.data(), sum.size() * sizeof(float)));
      }
    }
    const std::string* last = section(p + "last");
    const std::string* hits = section(p + "hits");
    const size_t cols = raw.cols;
    if (last == nullptr || hits == nullptr ||
        last->size() != static_cast<size_t>(world_) * cols * sizeof(int64_t) ||
        hits->size() != static_cast<size_t>(world_) * cols * sizeof(int32_t)) {
      return bad(absl::StrCat("arrival sections of tensor ", ti, " do not fit the job"));
    }
    for (int r = 0; r < world_; ++r) {
      std::memcpy(acc_->last_steps(t, r).data(), last->data() + r * cols * sizeof(int64_t),
                  cols * sizeof(int64_t));
      std::memcpy(acc_->hits_of(t, r).data(), hits->data() + r * cols * sizeof(int32_t),
                  cols * sizeof(int32_t));
    }
  }
  last_full_close_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

}  // namespace zenflow
