// A job's checkpoint: its whole state at a round boundary as named sections
// (server/checkpoint_file.h writes and verifies them), and a job made from
// them. Part of Job (see job.h "Checkpoints").
#include <algorithm>
#include <cmath>
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
// Version 2 adds each rank's open round's first and last step and each
// open round's steps (rounds of changing length); version 1 files are
// read as fixed-interval jobs.
constexpr int64_t kMetaVersion = 2;

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
  // A vector of at most `max` elements (and no more than the bytes left
  // hold: the count is checked before anything is allocated for it).
  template <typename T>
  std::vector<T> All(int64_t max) {
    const int64_t n = Next();
    const int64_t left = static_cast<int64_t>((in_.size() - std::min(at_, in_.size())) / 8);
    if (n < 0 || n > max || n > left) {
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

// A tensor with 8-bit m and v (TensorStore::quantized) stores them in their
// 8-bit form instead of the fp32 "m" and "v": codes and block scales, in
// this order (the sections' sizes: elements bytes, scales floats).
const char* const kMoment8Sections[] = {"m8", "m8.scale", "v8", "v8.scale"};

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
    const bool eight = store_->quantized(static_cast<int>(ti));  // fixed for the job's life
    for (const std::string& n : SectionNamesOfFloats(acc_->sum_ranks())) {
      if (eight && (n == "m" || n == "v")) continue;
      big.push_back({p + n, std::string(elements * sizeof(float), '\0')});
    }
    if (eight) {
      const size_t scales = cols * static_cast<size_t>(Adam8BlocksPerColumn(tensors_[ti].rows));
      for (int k = 0; k < 4; ++k) {
        big.push_back({p + kMoment8Sections[k],
                       std::string(k % 2 == 0 ? elements : scales * sizeof(float), '\0')});
      }
    }
    big.push_back({p + "count", std::string(cols * sizeof(int64_t), '\0')});
  }
  MutexLock lock(&mu_);
  ZF_RETURN_IF_ERROR(CheckLive());
  // A round boundary: no update owns the store or a round's sums now.
  mu_.Await([&] {
    AwaitHoldsMu();
    return rounds_updated_ == rounds_closed_ || deleted_;
  });
  QuiesceAddsLocked();  // and no shard is being added to the sums
  ZF_RETURN_IF_ERROR(CheckLive());
  const auto t0 = std::chrono::steady_clock::now();
  JobSnapshot snap;
  snap.job_id = spec_.job_id();
  snap.rounds_updated = rounds_updated_;
  snap.sections.push_back({"spec", spec_.SerializeAsString()});
  snap.sections.push_back({"credential", credential_});
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
    meta.Put(r.round_first_step);
    meta.Put(r.round_last_step);
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
    meta.Put(rs.steps);
  }
  meta.PutAll(hand_off_.Save());
  for (const TensorState& t : tensors_) {
    meta.PutAll(t.important);
    meta.PutAll(t.prev_important_cols);
  }
  snap.sections.push_back({"meta", meta.Take()});
  // Which rank sent which column of its open round (RankArrivals: per rank
  // and step, runs of columns). Checkpoints before it held t<i>.last and
  // t<i>.hits (per rank and column) instead, and no rank's sum folded
  // before the round's update.
  snap.sections.push_back({"arrivals", acc_->arrivals().Save()});
  // The newest round's RoundDone: a rank that never got that round's deltas
  // (the daemon went between this file and them) gets them again after a
  // restore (MissedRound).
  if (last_done_.has_value() && last_done_->round() == rounds_updated_ - 1) {
    snap.sections.push_back({"last_done", last_done_->SerializeAsString()});
  }
  size_t at = 0;
  auto copy = [&](const void* src) {
    Big& b = big[at++];
    if (!b.bytes.empty()) std::memcpy(b.bytes.data(), src, b.bytes.size());
  };
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const int t = static_cast<int>(ti);
    const TensorStore::Raw raw = store_->raw(t);
    copy(raw.master);
    if (raw.m8 == nullptr) {
      copy(raw.m);
      copy(raw.v);
    }
    for (int r = 0; r < acc_->sum_ranks(); ++r) {
      copy(acc_->sum_buffer(t, r, 0).data());
      copy(acc_->sum_buffer(t, r, 1).data());
    }
    if (raw.m8 != nullptr) {
      copy(raw.m8);
      copy(raw.m_scale);
      copy(raw.v8);
      copy(raw.v_scale);
    }
    copy(raw.count);
  }
  snap.pause_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (Big& b : big) snap.sections.push_back({std::move(b.name), std::move(b.bytes)});
  return snap;
}

absl::Status Job::LoadSnapshot(const std::map<std::string, const std::string*>& sections) {
  MutexLock lock(&mu_);
  QuiesceAddsLocked();
  // The divergence's side buffers are not in a checkpoint: the rounds open
  // at the restore are not measured (docs/design.md rule 14).
  divergence_->Invalidate();
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
  const int64_t version = meta.Next();
  if (version != 1 && version != kMetaVersion) return bad("unknown meta version");
  const int64_t uploaded = meta.Next();
  uploaded_ = uploaded != 0;
  selection_version_ = meta.Next();
  selection_step_ = meta.Next();
  rounds_closed_ = meta.Next();
  rounds_updated_ = meta.Next();
  durable_rounds_ = rounds_updated_;  // it came from a durable file
  for (RankState& r : ranks_) {
    r.joined = meta.Next() != 0;
    r.next_round = meta.Next();
    if (r.next_round < 0) return bad("a rank's next round is negative");
    if (version >= 2) {
      r.round_first_step = meta.Next();
      r.round_last_step = meta.Next();
    } else {
      // Version 1 kept no step: the round's first, at a fixed interval.
      int64_t first = 0;
      if (__builtin_mul_overflow(r.next_round, interval_, &first)) {
        return bad("a rank's next round is implausibly large");
      }
      r.round_first_step = first;
      r.round_last_step = -1;
    }
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
    // The snapshot does not say whether its shards were below 2^63: the
    // round's update checks the gradient first (RoundUpdateInput::bounded).
    rs.unbounded = true;
    rs.steps = version >= 2 ? static_cast<int32_t>(meta.Next()) : 0;
    rs.last_close = std::chrono::steady_clock::now();
  }
  const std::vector<int64_t> hand_off_flat = meta.All<int64_t>(int64_t{1} << 40);
  if (!hand_off_.Restore(hand_off_flat)) return bad("hand-off ledger size");
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
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    acc_->arrivals().SetImportant(static_cast<int>(ti), tensors_[ti].important);
  }
  // What Snapshot writes holds all of the below. A file that does not (one
  // whose checksums are right but whose meta is not this daemon's) would
  // make a job that waits forever for an update (its next checkpoint, a
  // hand-off), never completes a round, or reads out of its buffers.
  if (uploaded != 0 && uploaded != 1) return bad("meta: uploaded is not 0 or 1");
  if (selection_version_ < 0 || selection_step_ < 0 ||
      (!auto_interval_ && selection_step_ % interval_ != 0)) {
    return bad(absl::StrCat("meta: selection version ", selection_version_, " at step ",
                            selection_step_));
  }
  if (rounds_updated_ < 0 || rounds_closed_ != rounds_updated_) {
    return bad(absl::StrCat("meta: ", rounds_closed_, " rounds closed but ", rounds_updated_,
                            " updated (a snapshot is taken at a round boundary)"));
  }
  int64_t least_next = rounds_closed_ + 2;
  for (const RankState& r : ranks_) {
    // Its open round's steps: from a step at or after the selection's, at
    // most S of them sent (fixed interval: exactly next_round * S).
    if (r.round_first_step < 0 ||
        (!auto_interval_ && r.round_first_step != r.next_round * interval_) ||
        r.round_last_step < -1 || r.round_last_step >= r.round_first_step + interval_ ||
        (r.round_last_step >= 0 && r.round_last_step < r.round_first_step)) {
      return bad(absl::StrCat("meta: a rank's open round starts at step ", r.round_first_step,
                              " with gradients up to step ", r.round_last_step));
    }
    // A rank is at most two rounds ahead: round r + 2 reuses round r's buffers.
    if (r.next_round < rounds_closed_ || r.next_round > rounds_closed_ + 2) {
      return bad(absl::StrCat("meta: a rank's next round ", r.next_round, " with ",
                              rounds_closed_, " rounds closed"));
    }
    least_next = std::min(least_next, r.next_round);
  }
  if (least_next != rounds_closed_) {
    return bad(absl::StrCat("meta: every rank closed round ", rounds_closed_,
                            " but it is not counted closed"));
  }
  for (int64_t round = rounds_closed_; round < rounds_closed_ + 2; ++round) {
    int32_t closed = 0;  // by the ranks that are past it
    for (const RankState& r : ranks_) closed += r.next_round > round ? 1 : 0;
    auto it = rounds_.find(round);
    if (closed > 0 && (it == rounds_.end() || it->second.closed != closed)) {
      return bad(absl::StrCat("meta: round ", round, " is closed by ", closed,
                              " ranks but not recorded so"));
    }
  }
  for (const auto& [round, rs] : rounds_) {
    if (round < rounds_closed_ || round >= rounds_closed_ + 2 || rs.steps_sum < 0 ||
        rs.steps_sum > rs.closed * interval_ || rs.steps < 0 || rs.steps > interval_ ||
        !(rs.lr >= 0 && std::isfinite(rs.lr))) {
      return bad(absl::StrCat("meta: open round ", round, " (", rs.closed, " closes, ",
                              rs.steps_sum, " steps, lr ", rs.lr, ") does not fit"));
    }
  }
  for (int64_t v : hand_off_flat) {
    if (v < 0 || v > selection_version_) {
      return bad(absl::StrCat("meta: hand-off of selection version ", v, " (current ",
                              selection_version_, ")"));
    }
  }
  for (const TensorState& t : tensors_) {
    for (uint8_t x : t.important) {
      if (x > 1) return bad(absl::StrCat("meta: tensor '", t.name, "' column flag ", x));
    }
    for (size_t i = 0; i < t.prev_important_cols.size(); ++i) {
      const int32_t c = t.prev_important_cols[i];
      if (c < 0 || c >= t.cols || (i > 0 && c <= t.prev_important_cols[i - 1])) {
        return bad(absl::StrCat("meta: tensor '", t.name, "' previous column ", c,
                                " out of order or out of range [0, ", t.cols, ")"));
      }
    }
  }
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
    if (raw.m8 == nullptr) {
      ZF_RETURN_IF_ERROR(load(p + "m", raw.m, raw.elements * sizeof(float)));
      ZF_RETURN_IF_ERROR(load(p + "v", raw.v, raw.elements * sizeof(float)));
    } else if (section(p + "m8") != nullptr) {
      const size_t sb = raw.scales * sizeof(float);
      ZF_RETURN_IF_ERROR(load(p + "m8", raw.m8, raw.elements));
      ZF_RETURN_IF_ERROR(load(p + "m8.scale", raw.m_scale, sb));
      ZF_RETURN_IF_ERROR(load(p + "v8", raw.v8, raw.elements));
      ZF_RETURN_IF_ERROR(load(p + "v8.scale", raw.v_scale, sb));
      for (size_t i = 0; i < raw.scales; ++i) {
        if (!(raw.m_scale[i] >= 0 && std::isfinite(raw.m_scale[i]) && raw.v_scale[i] >= 0 &&
              std::isfinite(raw.v_scale[i]))) {
          return bad(absl::StrCat("tensor ", ti, " has a block scale that is negative or not "
                                  "finite"));
        }
      }
    } else {
      // The fp32 form in an 8-bit job (a file written before 8-bit state
      // existed, its spec edited): quantized as it loads.
      std::vector<float> m(raw.elements), v(raw.elements);
      ZF_RETURN_IF_ERROR(load(p + "m", m.data(), raw.elements * sizeof(float)));
      ZF_RETURN_IF_ERROR(load(p + "v", v.data(), raw.elements * sizeof(float)));
      Adam8Quantize(BestSimdLevel(), tensors_[ti].rows, tensors_[ti].cols, m.data(), v.data(),
                    store_->q8(t, 0));
    }
    ZF_RETURN_IF_ERROR(load(p + "count", raw.count, raw.cols * sizeof(int64_t)));
    for (size_t c = 0; c < raw.cols; ++c) {
      if (raw.count[c] < 0) return bad(absl::StrCat("tensor ", ti, " has a negative update count"));
    }
    for (int r = 0; r < acc_->sum_ranks(); ++r) {
      for (int parity = 0; parity < 2; ++parity) {
        std::vector<float>& sum = acc_->sum_buffer(t, r, parity);
        ZF_RETURN_IF_ERROR(
            load(p + SumSectionName(r, parity), sum.data(), sum.size() * sizeof(float)));
      }
    }
  }
  const std::string* arrivals = section("arrivals");
  if (arrivals != nullptr) {
    const absl::Status loaded = acc_->arrivals().Load(*arrivals);
    if (!loaded.ok()) return bad(std::string(loaded.message()));
  } else {
    // A checkpoint of before RankArrivals: per rank and column the last
    // step received and the open round's count.
    for (int r = 0; r < world_; ++r) acc_->ResetRank(r);
    for (size_t ti = 0; ti < tensors_.size(); ++ti) {
      const std::string p = absl::StrCat("t", ti, ".");
      const std::string* last = section(p + "last");
      const std::string* hits = section(p + "hits");
      const size_t cols = static_cast<size_t>(tensors_[ti].cols);
      if (last == nullptr || hits == nullptr ||
          last->size() != static_cast<size_t>(world_) * cols * sizeof(int64_t) ||
          hits->size() != static_cast<size_t>(world_) * cols * sizeof(int32_t)) {
        return bad(absl::StrCat("arrival sections of tensor ", ti, " do not fit the job"));
      }
      std::vector<int64_t> l(cols);
      std::vector<int32_t> h(cols);
      for (int r = 0; r < world_; ++r) {
        std::memcpy(l.data(), last->data() + r * cols * sizeof(int64_t), cols * sizeof(int64_t));
        std::memcpy(h.data(), hits->data() + r * cols * sizeof(int32_t), cols * sizeof(int32_t));
        // A count is of the open round's steps: at most the interval (and
        // LoadPerColumn walks that many steps per column).
        for (size_t c = 0; c < cols; ++c) {
          if (h[c] < 0 || h[c] > interval_) {
            return bad(absl::StrCat("tensor ", ti, " column ", c, ": rank ", r, " has ", h[c],
                                    " steps of its open round, outside [0, ", interval_, "]"));
          }
        }
        acc_->arrivals().LoadPerColumn(static_cast<int>(ti), r, l.data(), h.data());
      }
    }
  }
  // Rank-ordered sums: the ranks that closed an open round, and every rank
  // before them, are folded (FoldClosedRanksLocked; a Snapshot waits for the
  // folds in flight). A checkpoint of before that folded none: fold them now.
  for (auto& [round, rs] : rounds_) {
    int closed = 0;
    while (closed < world_ && ranks_[closed].next_round > round) ++closed;
    if (acc_->sum_ranks() == 1) {
      rs.folded = world_;
    } else {
      if (arrivals == nullptr) acc_->FoldRanks(ctx_.simd, round, 1, closed);
      rs.folded = closed;
    }
  }
  restored_rounds_ = rounds_updated_;
  last_done_.reset();
  resend_round_ = -1;
  resend_.clear();
  if (const std::string* ld = section("last_done")) {
    v1::RoundDone done;
    if (!done.ParseFromString(*ld) || done.round() != rounds_updated_ - 1 ||
        done.delta_messages() < 0) {
      return bad(absl::StrCat("section last_done does not hold round ", rounds_updated_ - 1,
                              "'s RoundDone"));
    }
    last_done_ = done;
    // The round's deltas again, from the master that round's update left
    // (values kind; the same selection: a reselection drains every rank's
    // updates first, so no rank lacks a round from before one).
    if (spec_.delta_kind() != v1::DELTA_ARITHMETIC &&
        done.selection_version() == selection_version_) {
      std::vector<v1::DownMessage> deltas;
      if (!done.skipped_nonfinite()) {
        deltas = ValueDeltas(done.round(), update_tensors_, RemoteColumnsLocked(), store_.get(),
                             spec_.max_shard_bytes(), WithMoments(done.steps()),
                             DeltasCarryFactoredMoment(spec_), spec_.adamw().beta2());
      }
      if (static_cast<int64_t>(deltas.size()) == done.delta_messages()) {
        for (v1::DownMessage& d : deltas) {
          resend_.push_back(std::make_shared<const v1::DownMessage>(std::move(d)));
        }
        v1::DownMessage marker;
        *marker.mutable_done() = done;
        resend_.push_back(std::make_shared<const v1::DownMessage>(std::move(marker)));
        resend_round_ = done.round();
      }
    }
  }
  last_full_close_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

}  // namespace zenflow
