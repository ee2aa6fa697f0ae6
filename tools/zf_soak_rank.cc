#include "tools/zf_soak_rank.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace soak {

// Replays job `job`'s rounds on the reference and compares every rank's
// record with it.
JobCheck CheckJob(const Config& cfg, int job, const std::vector<RankResult>& ranks,
                  const RefStep& adam) {
  JobCheck out;
  std::vector<std::string>& bad = out.failures;
  auto note = [&](std::string s) {
    if (bad.size() < 20) bad.push_back(std::move(s));
  };
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].error.empty()) note(ranks[r].error);
  }
  if (!bad.empty()) return out;
  const RankResult& r0 = ranks[0];
  // Every round delivered once to every rank, the same deltas everywhere.
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (int i = 0; i < cfg.rounds; ++i) {
      if (ranks[r].round_count[i] != 1) {
        note(absl::StrCat("rank ", r, " received round ", i, " ", ranks[r].round_count[i],
                          " times"));
      }
    }
    if (ranks[r].round_digest != r0.round_digest) {
      note(absl::StrCat("rank ", r, "'s deltas differ from rank 0's"));
    }
    if (ranks[r].selection_digest != r0.selection_digest ||
        ranks[r].joining_digest != r0.joining_digest) {
      note(absl::StrCat("rank ", r, "'s selections or joining states differ from rank 0's"));
    }
    const ClientStats& s = ranks[r].stats;
    if (s.rounds_received != cfg.rounds || s.rounds_dropped_duplicate != 0 ||
        s.deltas_received != ranks[r].deltas_applied || s.reconnects != 0) {
      note(absl::StrCat("rank ", r, ": client counted ", s.rounds_received, " rounds, ",
                        s.rounds_dropped_duplicate, " duplicates, ", s.deltas_received, " deltas (",
                        ranks[r].deltas_applied, " applied), ", s.reconnects, " reconnects"));
    }
  }
  // The reference: each round's gradient summed rank by rank (each rank's
  // steps first), as the job's rank_ordered_sums makes the daemon do.
  std::vector<RefTensor> ref(cfg.tensors);
  for (int ti = 0; ti < cfg.tensors; ++ti) {
    RefTensor& t = ref[ti];
    const size_t n = static_cast<size_t>(cfg.rows) * cfg.cols;
    t.p.resize(n);
    t.m.assign(n, 0.0f);
    t.v.assign(n, 0.0f);
    t.count.assign(cfg.cols, 0);
    for (int r = 0; r < cfg.rows; ++r) {
      for (int c = 0; c < cfg.cols; ++c) t.p[r * cfg.cols + c] = Init(job, ti, r, c);
    }
    t.pf = t.p;
  }
  ValueTally values;
  // m, v and counts do not depend on how p's last operation rounds: exact.
  auto check_state = [&](const std::string& what, const RefTensor& t, const v1::ColumnState& cs,
                         int i, int32_t c) {
    if (cs.update_counts(i) != t.count[c]) {
      note(absl::StrCat(what, ": count of ", cs.tensor(), " column ", c, " is ",
                        cs.update_counts(i), ", want ", t.count[c]));
    }
    for (int r = 0; r < cfg.rows; ++r) {
      const size_t e = static_cast<size_t>(r) * cfg.cols + c;
      const int k = i * cfg.rows + r;
      values.Compare(cs.values(k), t, e,
                     [&] { return absl::StrCat(what, ": ", cs.tensor(), "[", r, ", ", c, "]"); });
      if (Bits(cs.m(k)) != Bits(t.m[e]) || Bits(cs.v(k)) != Bits(t.v[e])) {
        note(absl::StrFormat("%s: m, v of %s[%d, %d] are (%.9g, %.9g), want (%.9g, %.9g)", what,
                             cs.tensor(), r, c, cs.m(k), cs.v(k), t.m[e], t.v[e]));
        return;
      }
    }
  };
  const float grad_scale =
      static_cast<float>(1.0 / (static_cast<double>(cfg.ranks) * cfg.interval));
  std::vector<std::vector<int32_t>> important(cfg.tensors);
  size_t sel_seen = 0;
  for (int64_t round = 0; round < cfg.rounds; ++round) {
    if (const int sel = SelectionAt(cfg, round); sel > 0) {
      if (sel_seen >= r0.selections.size() || sel_seen >= r0.joining.size()) {
        note(absl::StrCat("selection ", sel, " missing from rank 0's record"));
        return out;
      }
      const v1::Selection& got = r0.selections[sel_seen];
      const v1::HandOffResponse& joining = r0.joining[sel_seen];
      ++sel_seen;
      if (got.version() != sel) {
        note(absl::StrCat("selection ", sel, " has version ", got.version()));
      }
      std::vector<std::vector<int32_t>> next(cfg.tensors);
      for (int ti = 0; ti < cfg.tensors; ++ti) next[ti] = ExpectedImportant(cfg, sel, ti);
      for (const v1::ColumnSet& cs : got.important()) {
        for (int ti = 0; ti < cfg.tensors; ++ti) {
          if (cs.tensor() == TensorName(ti) && !std::equal(cs.columns().begin(), cs.columns().end(),
                                                           next[ti].begin(), next[ti].end())) {
            note(absl::StrCat("selection ", sel, ", ", cs.tensor(),
                              ": not the top-k of the summed scores"));
          }
        }
      }
      // Joining columns carry the reference's state exactly.
      int64_t joined = 0;
      const std::string what = absl::StrCat("selection ", sel, " joining state");
      for (const v1::ColumnState& cs : joining.joining()) {
        int ti = 0;
        while (ti < cfg.tensors && cs.tensor() != TensorName(ti)) ++ti;
        if (ti == cfg.tensors) {
          note("joining state of an unknown tensor");
          continue;
        }
        for (int i = 0; i < cs.columns_size(); ++i) {
          const int32_t c = cs.columns(i);
          ++joined;
          if (std::binary_search(important[ti].begin(), important[ti].end(), c) ||
              !std::binary_search(next[ti].begin(), next[ti].end(), c)) {
            note(absl::StrCat("selection ", sel, ": column ", c, " of ", cs.tensor(),
                              " is not joining"));
            continue;
          }
          check_state(what, ref[ti], cs, i, c);
        }
      }
      int64_t want_joined = 0;
      for (int ti = 0; ti < cfg.tensors; ++ti) {
        for (int32_t c : next[ti]) {
          want_joined += std::binary_search(important[ti].begin(), important[ti].end(), c) ? 0 : 1;
        }
      }
      if (joined != want_joined) {
        note(absl::StrCat("selection ", sel, ": ", joined, " joining columns, want ", want_joined));
      }
      important = std::move(next);
    }
    const float lr = LearningRate(round);
    for (int ti = 0; ti < cfg.tensors; ++ti) {
      RefTensor& t = ref[ti];
      for (int32_t c : Complement(important[ti], cfg.cols)) {
        const int64_t count = ++t.count[c];
        for (int r = 0; r < cfg.rows; ++r) {
          float total = 0.0f;
          for (int rank = 0; rank < cfg.ranks; ++rank) {
            float s = 0.0f;
            for (int st = 0; st < cfg.interval; ++st) {
              s += Grad(job, rank, round * cfg.interval + st, ti, r, c);
            }
            total = rank == 0 ? s : total + s;
          }
          const size_t e = static_cast<size_t>(r) * cfg.cols + c;
          adam.Apply(lr, count, grad_scale, total, &t.p[e], &t.pf[e], &t.m[e], &t.v[e]);
        }
      }
    }
  }
  // The daemon's final state of its columns.
  if (static_cast<int>(r0.final_state.size()) != cfg.tensors) {
    note("rank 0 read no final state");
  } else {
    for (int ti = 0; ti < cfg.tensors; ++ti) {
      const v1::ColumnState& cs = r0.final_state[ti];
      const std::vector<int32_t> remote = Complement(important[ti], cfg.cols);
      if (cs.tensor() != TensorName(ti) ||
          !std::equal(cs.columns().begin(), cs.columns().end(), remote.begin(), remote.end()) ||
          cs.values_size() != cs.columns_size() * cfg.rows || cs.m_size() != cs.values_size() ||
          cs.v_size() != cs.values_size() || cs.update_counts_size() != cs.columns_size()) {
        note(absl::StrCat("final state of ", cs.tensor(), ": not the remote columns"));
        continue;
      }
      for (int i = 0; i < cs.columns_size(); ++i) {
        check_state("final daemon state", ref[ti], cs, i, cs.columns(i));
      }
    }
  }
  // Every rank's parameters (every delta applied; the important columns as
  // they were when they joined) equal the reference's.
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (int ti = 0; ti < cfg.tensors; ++ti) {
      const std::vector<float>& p = ranks[r].params[ti];
      for (size_t e = 0; e < p.size(); ++e) {
        values.Compare(p[e], ref[ti], e, [&] {
          return absl::StrCat("rank ", r, "'s ", TensorName(ti), "[", e / cfg.cols, ", ",
                              e % cfg.cols, "]");
        });
      }
    }
  }
  out.model = values.model();
  out.values_compared = values.compared;
  if (!values.exact()) {
    note(absl::StrCat(values.off_fused, " of ", values.compared,
                      " parameter values differ from the reference with p*decay - update fused "
                      "(first: ",
                      values.first_fused, "), ", values.off_plain,
                      " without (first: ", values.first_plain, ")"));
  }
  return out;
}

}  // namespace soak
}  // namespace zenflow
