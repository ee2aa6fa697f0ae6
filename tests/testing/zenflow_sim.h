// Test support: an independent simulation of docs/design.md rules 1-13 in plain loops
// (worker and daemon together, every rank), to compare the real worker
// engine + daemon against. Shares no code with gpu_worker/ or server/.
//
//   ZenFlowSim sim(cfg, tensors);
//   for (t...) sim.Step(t, lr, grads_per_rank);   // grads from sim.params()
#ifndef ZENFLOW_TESTS_TESTING_ZENFLOW_SIM_H_
#define ZENFLOW_TESTS_TESTING_ZENFLOW_SIM_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "tests/testing/adamw_reference.h"
#include "tests/testing/reference.h"

namespace zenflow::testing {

// The workers' parameter dtype. With kBF16 / kF16 the workers hold rounded
// parameters and an fp32 master of their important columns (docs/design.md rule 4);
// the daemon's master is fp32 and its updates arrive rounded.
enum class SimParamDType { kF32, kBF16, kF16 };

struct SimConfig {
  int world = 1;
  int S = 4;              // update_interval
  int R = 8;              // select_interval
  int warmup_rounds = 0;  // W0
  int delay = 1;          // apply delay d (0 = sync)
  float k = 0.25f;
  bool zero_offload = false;
  bool bf16_wire = false;
  bool int8_wire = false;  // per column and step: scale = max|g|/127, q = rint(g/scale)
  SimParamDType param_dtype = SimParamDType::kF32;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  // update_interval auto (rule 10): S is S_max; warm-up rounds have S steps,
  // later rounds interval_chooser(round, first step)'s (the simulation has
  // no timing to measure), clamped to [1, S], raised to the previous
  // round's apply delay while that round is in flight and cut to end before
  // the next selection step. A delay d >= 1 is then min(d, the round's
  // steps). Without a chooser every round has S steps.
  bool auto_interval = false;
  std::function<int32_t(int64_t round, int64_t start_step)> interval_chooser;
  // The predicted step (rule 11; the daemon's default): with S = 1 or
  // auto and a delay other than sync, a one-step round applied one step
  // after its close is followed, on the workers, by one AdamW step of its
  // columns from the state that round left (its values, bf16 m and v),
  // with the current step's mean gradient; at step 0 (of a one-step round)
  // from the zero state.
  bool predicted_step = true;
  // The scaled round step (rule 12; off by default, as in the daemon): a round of s
  // steps takes its AdamW step with lr * s (one fp32 product), the decay
  // scaled alike.
  bool scale_round_step = false;
  // The local step (rule 13; off by default, as in the daemon): every round's update
  // also yields its tensor's factored second moment of the daemon columns
  // (with vh = v / (1 - beta2^count): row means, column means, the overall
  // mean; double sums in index order, rounded to float), and the workers
  // keep the latest applied one (dropped at a reselection). At the end of a
  // step that is not a selection step, has no predicted step and does not
  // close a round applied at once (sync), every tensor whose daemon columns
  // all have one steps them with the step's mean gradient:
  //   w = round(w - (lr * g) / (sqrt(row_v[i] * col_v[j] / v_mean) + eps)),
  // an element whose estimate is not > 0 unchanged.
  bool local_step = false;
};

struct SimTensor {
  std::string name;
  int64_t rows = 1, cols = 1;
  bool one_d = false;
  std::vector<float> w;  // row-major, initial values
};

class ZenFlowSim {
 public:
  ZenFlowSim(SimConfig cfg, std::vector<SimTensor> tensors) : cfg_(cfg), t_(std::move(tensors)) {
    for (SimTensor& t : t_) {
      const size_t n = t.rows * t.cols;
      // The model starts from its initial values in the parameter dtype; the
      // daemon's master is their exact fp32 value (the upload).
      for (float& x : t.w) x = Round(x);
      State s;
      s.master = t.w;
      s.ww = t.w;
      s.mw.assign(n, 0);
      s.vw.assign(n, 0);
      s.md.assign(n, 0);
      s.vd.assign(n, 0);
      s.cw.assign(t.cols, 0);
      s.cd.assign(t.cols, 0);
      s.acc.assign(n, 0);
      s.important.assign(t.cols, false);
      st_.push_back(s);
    }
  }

  // The workers' parameters (rounded to the parameter dtype, held as fp32).
  const std::vector<float>& params(size_t ti) const { return t_[ti].w; }
  int reselections() const { return reselections_; }
  // Steps that ended with a local step (rule 13).
  int local_steps() const { return local_steps_; }
  // The steps of every round closed so far, in order.
  const std::vector<int32_t>& round_steps() const { return round_steps_; }
  std::vector<int32_t> important(size_t ti) const {
    std::vector<int32_t> out;
    for (int64_t c = 0; c < t_[ti].cols; ++c) {
      if (st_[ti].important[c]) out.push_back(static_cast<int32_t>(c));
    }
    return out;
  }

  // grads[rank][tensor]: row-major gradients of step t on every rank.
  void Step(int64_t t, float lr, const std::vector<std::vector<std::vector<float>>>& grads) {
    const int S = cfg_.zero_offload ? 1 : cfg_.S;
    const int64_t warm_end = static_cast<int64_t>(cfg_.warmup_rounds) * S;
    const bool select = !cfg_.zero_offload && (t == warm_end || (t > warm_end && t % cfg_.R == 0));
    if (select) {
      // Drain, then choose from this step's gradient, summed over ranks.
      while (!pending_.empty()) ApplyFront();
      Reselect(grads);
    }
    if (steps_ == 0) {  // the round's first step: its length
      steps_ = S;
      if (cfg_.auto_interval && !cfg_.zero_offload) {
        int64_t n = S;
        if (round_ >= cfg_.warmup_rounds && cfg_.interval_chooser) {
          n = std::min<int64_t>(S, std::max<int64_t>(1, cfg_.interval_chooser(round_, t)));
        }
        if (!pending_.empty() && pending_.back().round == round_ - 1) {
          n = std::max<int64_t>(n, pending_.back().delay);
        }
        const int64_t next_select = t < warm_end ? warm_end : (t / cfg_.R + 1) * cfg_.R;
        steps_ = static_cast<int>(std::min<int64_t>(n, next_select - t));
      }
    }
    const float inv_world = 1.0f / static_cast<float>(cfg_.world);
    for (size_t ti = 0; ti < t_.size(); ++ti) {
      SimTensor& x = t_[ti];
      State& s = st_[ti];
      for (int64_t c = 0; c < x.cols; ++c) {
        if (s.important[c]) {
          s.cw[c] += 1;
          for (int64_t r = 0; r < x.rows; ++r) {
            const size_t i = r * x.cols + c;
            float g = 0;
            for (int k = 0; k < cfg_.world; ++k) g += grads[k][ti][i];
            g *= inv_world;
            // On the worker's fp32 master; the parameter is its rounding.
            Adam(&s.ww[i], &s.mw[i], &s.vw[i], g, lr, s.cw[c]);
            x.w[i] = Round(s.ww[i]);
          }
        } else if (cfg_.int8_wire) {
          for (int k = 0; k < cfg_.world; ++k) {
            float mx = 0;
            for (int64_t r = 0; r < x.rows; ++r) mx = std::max(mx, std::fabs(grads[k][ti][r * x.cols + c]));
            const float scale = mx / 127.0f;
            for (int64_t r = 0; r < x.rows; ++r) {
              const size_t i = r * x.cols + c;
              float q = 0;
              if (scale > 0) q = std::rint(std::min(127.0f, std::max(-127.0f, grads[k][ti][i] / scale)));
              s.acc[i] += q * scale;
            }
          }
        } else {
          for (int64_t r = 0; r < x.rows; ++r) {
            const size_t i = r * x.cols + c;
            for (int k = 0; k < cfg_.world; ++k) {
              const float g = grads[k][ti][i];
              s.acc[i] += cfg_.bf16_wire ? RoundToBf16(g) : g;
            }
          }
        }
      }
    }
    next_ = t + 1;
    last_lr_ = lr;
    // Rule 11: the state the predicted step starts from is the daemon's
    // before this step's round closes (the previous round's, or at step 0
    // the new job's).
    const bool predict =
        cfg_.predicted_step && !cfg_.zero_offload && cfg_.delay != 0 &&
        (cfg_.S == 1 || cfg_.auto_interval) && steps_ == 1 &&
        (t == 0 || (pending_.size() == 1 && pending_.front().close == t - 1 &&
                    pending_.front().steps == 1 && pending_.front().delay == 1));
    std::vector<State> before;
    if (predict) before = st_;
    if (t == start_ + steps_ - 1) {
      Close(t, lr, Delay(steps_));
      closed_at_ = t;
    }
    while (!pending_.empty() && pending_.front().due <= t) {
      if (pending_.front().close == t) applied_at_ = t;
      ApplyFront();
    }
    if (predict) {
      for (size_t ti = 0; ti < t_.size(); ++ti) {
        SimTensor& x = t_[ti];
        State& b = before[ti];
        for (int64_t c = 0; c < x.cols; ++c) {
          if (b.important[c]) continue;
          for (int64_t r = 0; r < x.rows; ++r) {
            const size_t i = r * x.cols + c;
            float g = 0;
            for (int k = 0; k < cfg_.world; ++k) g += grads[k][ti][i];
            g *= inv_world;
            // From the values the round sent (the master in the parameter
            // dtype) and its bf16 m and v; at step 0 the zero state.
            float w = Round(b.master[i]), m = RoundToBf16(b.md[i]), v = RoundToBf16(b.vd[i]);
            Adam(&w, &m, &v, g, lr, b.cd[c] + 1);
            x.w[i] = Round(w);
          }
        }
      }
    }
    // Rule 13: a sync round closed at this step holds its gradient already.
    const bool closed_sync = closed_at_ == t && applied_at_ == t;
    if (cfg_.local_step && !cfg_.zero_offload && !select && !predict && !closed_sync) {
      bool any = false;
      for (size_t ti = 0; ti < t_.size(); ++ti) any = LocalStep(ti, lr, grads) || any;
      if (any) ++local_steps_;
    }
  }

  void Finish() {
    if (next_ > start_) Close(next_ - 1, last_lr_, 0);  // a partial last round
    while (!pending_.empty()) ApplyFront();
  }

 private:
  // A tensor's factored second moment (rule 13): per row, per column (by
  // column index; `have` marks the columns it covers) and overall.
  struct Factored {
    std::vector<float> row_v, col_v;
    std::vector<bool> have;
    float v_mean = 0;
  };
  struct State {
    // master: the daemon's fp32 master; ww: the worker's fp32 master (its
    // important columns'; for fp32 parameters ww of those columns equals w).
    std::vector<float> master, ww, mw, vw, md, vd, acc;
    std::vector<int64_t> cw, cd;
    std::vector<bool> important;
    Factored fact;  // the workers' latest
  };
  struct Pending {
    int64_t round;
    int delay;
    int64_t due;
    int64_t close = 0;  // the round's last step
    int steps = 0;
    std::vector<std::vector<std::pair<int32_t, std::vector<float>>>> cols;  // per tensor
    std::vector<Factored> fact;  // per tensor, after the round's update
  };

  // The factored moment of tensor ti's daemon columns as the daemon's v and
  // update counts stand (rule 13, ParameterDelta.row_v's definition).
  Factored FactoredOf(size_t ti) const {
    const SimTensor& x = t_[ti];
    const State& s = st_[ti];
    Factored f;
    f.row_v.assign(x.rows, 0.0f);
    f.col_v.assign(x.cols, 0.0f);
    f.have.assign(x.cols, false);
    std::vector<double> rows(x.rows, 0.0);
    double total = 0;
    int64_t n = 0;
    for (int64_t c = 0; c < x.cols; ++c) {
      if (s.important[c]) continue;
      const double inv_bc2 =
          1.0 / (1.0 - std::pow(static_cast<double>(cfg_.beta2), static_cast<double>(s.cd[c])));
      double col = 0;
      for (int64_t r = 0; r < x.rows; ++r) {
        const double vh = static_cast<double>(s.vd[r * x.cols + c]) * inv_bc2;
        rows[r] += vh;
        col += vh;
      }
      f.col_v[c] = static_cast<float>(col / static_cast<double>(x.rows));
      f.have[c] = true;
      total += col;
      ++n;
    }
    if (n == 0) return Factored{};
    for (int64_t r = 0; r < x.rows; ++r) f.row_v[r] = static_cast<float>(rows[r] / static_cast<double>(n));
    f.v_mean = static_cast<float>(total / (static_cast<double>(x.rows) * static_cast<double>(n)));
    return f;
  }

  // Rule 13's local step of tensor ti; whether it took one.
  bool LocalStep(size_t ti, float lr, const std::vector<std::vector<std::vector<float>>>& grads) {
    SimTensor& x = t_[ti];
    const State& s = st_[ti];
    const Factored& f = s.fact;
    bool any_remote = false;
    for (int64_t c = 0; c < x.cols; ++c) {
      if (s.important[c]) continue;
      any_remote = true;
      if (f.have.empty() || !f.have[c]) return false;  // not every daemon column has one
    }
    if (!any_remote) return false;
    const float inv_world = 1.0f / static_cast<float>(cfg_.world);
    for (int64_t c = 0; c < x.cols; ++c) {
      if (s.important[c]) continue;
      for (int64_t r = 0; r < x.rows; ++r) {
        const size_t i = r * x.cols + c;
        float g = 0;
        for (int k = 0; k < cfg_.world; ++k) g += grads[k][ti][i];
        g *= inv_world;
        const float vh = f.row_v[r] * f.col_v[c] / f.v_mean;
        if (!(vh > 0.0f)) continue;
        x.w[i] = Round(x.w[i] - lr * g / (std::sqrt(vh) + cfg_.eps));
      }
    }
    return true;
  }

  // The apply delay of a round of `steps` steps.
  int Delay(int steps) const {
    if (cfg_.zero_offload || cfg_.delay == 0) return 0;
    return cfg_.auto_interval ? std::max(1, std::min(cfg_.delay, steps)) : cfg_.delay;
  }

  // Closes the open round (steps start_..t) with delay d: daemon AdamW on
  // the mean of the remote columns.
  void Close(int64_t t, float lr, int d) {
    const int steps = static_cast<int>(t + 1 - start_);
    Pending p;
    p.round = round_;
    p.delay = d;
    p.due = t + d;
    p.close = t;
    p.steps = steps;
    const float scale = static_cast<float>(1.0 / (static_cast<double>(cfg_.world) * steps));
    // Rule 12: one step standing for the round's s.
    const float round_lr =
        cfg_.scale_round_step && !cfg_.zero_offload ? lr * static_cast<float>(steps) : lr;
    for (size_t ti = 0; ti < t_.size(); ++ti) {
      SimTensor& x = t_[ti];
      State& s = st_[ti];
      std::vector<std::pair<int32_t, std::vector<float>>> cols;
      for (int64_t c = 0; c < x.cols; ++c) {
        if (s.important[c]) continue;
        s.cd[c] += 1;
        std::vector<float> col(x.rows);
        for (int64_t r = 0; r < x.rows; ++r) {
          const size_t i = r * x.cols + c;
          Adam(&s.master[i], &s.md[i], &s.vd[i], s.acc[i] * scale, round_lr, s.cd[c]);
          s.acc[i] = 0;
          col[r] = s.master[i];
        }
        cols.push_back({static_cast<int32_t>(c), std::move(col)});
      }
      p.cols.push_back(std::move(cols));
      if (cfg_.local_step && !cfg_.zero_offload) p.fact.push_back(FactoredOf(ti));
    }
    pending_.push_back(std::move(p));
    round_steps_.push_back(steps);
    round_ += 1;
    start_ = t + 1;
    steps_ = 0;
  }

  float Round(float x) const {
    switch (cfg_.param_dtype) {
      case SimParamDType::kBF16:
        return RoundToBf16(x);
      case SimParamDType::kF16:
        return RoundToF16(x);
      case SimParamDType::kF32:
        break;
    }
    return x;
  }

  // One AdamW step of one element (the tests' reference, adamw_reference.h).
  void Adam(float* p, float* m, float* v, float g, float lr, int64_t step) const {
    const AdamWRefHyper h{cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.wd};
    AdamWElement(h, AdamWFactors(h, lr, step), g, p, m, v);
  }

  void ApplyFront() {
    Pending& p = pending_.front();
    for (size_t ti = 0; ti < t_.size(); ++ti) {
      for (auto& [c, col] : p.cols[ti]) {
        for (int64_t r = 0; r < t_[ti].rows; ++r) t_[ti].w[r * t_[ti].cols + c] = Round(col[r]);
      }
      // Rule 13: the round's factored moment, for the columns it covers.
      if (ti < p.fact.size() && !p.fact[ti].have.empty()) {
        Factored& f = st_[ti].fact;
        const Factored& from = p.fact[ti];
        if (f.have.empty()) {
          f.col_v.assign(t_[ti].cols, 0.0f);
          f.have.assign(t_[ti].cols, false);
        }
        f.row_v = from.row_v;
        f.v_mean = from.v_mean;
        for (int64_t c = 0; c < t_[ti].cols; ++c) {
          if (!from.have[c]) continue;
          f.col_v[c] = from.col_v[c];
          f.have[c] = true;
        }
      }
    }
    pending_.erase(pending_.begin());
  }

  void Reselect(const std::vector<std::vector<std::vector<float>>>& grads) {
    ++reselections_;
    for (size_t ti = 0; ti < t_.size(); ++ti) {
      SimTensor& x = t_[ti];
      State& s = st_[ti];
      s.fact = Factored{};  // rule 13: the daemon columns change
      std::vector<bool> now(x.cols, false);
      if (x.one_d) {
        now.assign(x.cols, true);
      } else {
        std::vector<float> score(x.cols, 0.0f);
        for (int k = 0; k < cfg_.world; ++k) {
          for (int64_t c = 0; c < x.cols; ++c) {
            float sk = 0;
            for (int64_t r = 0; r < x.rows; ++r) sk += std::fabs(grads[k][ti][r * x.cols + c]);
            score[c] += sk;
          }
        }
        std::vector<int32_t> idx(x.cols);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
        const int64_t n = static_cast<int64_t>(std::ceil(static_cast<double>(cfg_.k) * x.cols - 1e-6));
        for (int64_t i = 0; i < n; ++i) now[idx[i]] = true;
      }
      for (int64_t c = 0; c < x.cols; ++c) {
        if (s.important[c] && !now[c]) {  // leaving: worker state to the daemon
          for (int64_t r = 0; r < x.rows; ++r) {
            const size_t i = r * x.cols + c;
            s.master[i] = s.ww[i];  // the fp32 master, not its rounding
            s.md[i] = s.mw[i];
            s.vd[i] = s.vw[i];
          }
          s.cd[c] = s.cw[c];
        } else if (!s.important[c] && now[c]) {  // joining: daemon state to the worker
          for (int64_t r = 0; r < x.rows; ++r) {
            const size_t i = r * x.cols + c;
            s.ww[i] = s.master[i];
            x.w[i] = Round(s.master[i]);
            s.mw[i] = s.md[i];
            s.vw[i] = s.vd[i];
          }
          s.cw[c] = s.cd[c];
        }
      }
      s.important = now;
    }
  }

  SimConfig cfg_;
  std::vector<SimTensor> t_;
  std::vector<State> st_;
  std::vector<Pending> pending_;
  int reselections_ = 0;
  int local_steps_ = 0;
  // The step that closed the last round, and the last step that applied a
  // round closed at that same step (sync).
  int64_t closed_at_ = -1, applied_at_ = -1;
  // The open round: its number, first step and steps (0 before its first
  // step); the next step and the last step's lr (for a partial close).
  int64_t round_ = 0, start_ = 0, next_ = 0;
  int steps_ = 0;
  float last_lr_ = 0;
  std::vector<int32_t> round_steps_;
};

}  // namespace zenflow::testing

#endif  // ZENFLOW_TESTS_TESTING_ZENFLOW_SIM_H_
