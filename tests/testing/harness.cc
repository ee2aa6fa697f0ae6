// Test support: drives a job on a real daemon; see harness.h.
#include "tests/testing/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow::testing {

Transport TestTransport() {
  const char* t = std::getenv("ZF_TEST_TRANSPORT");
  return (t != nullptr && std::string(t) == "ucx") ? Transport::kUcx : Transport::kGrpc;
}

ClientOptions TestClientOptions(const std::string& target) {
  ClientOptions co;
  co.target = target;
  co.transport = TestTransport();
  co.token = kTestToken;
  return co;
}

void AddTestToken(grpc::ClientContext* ctx) {
  ctx->AddMetadata("authorization", std::string("Bearer ") + kTestToken);
}

float TestGrad(int rank, int64_t step, int ti, int64_t r, int64_t c) {
  const double x = 0.37 * r + 1.3 * c + 0.11 * step + 0.7 * rank + 0.5 * ti;
  return static_cast<float>(std::sin(x) * (1.0 + 0.05 * c) + 0.01 * rank);
}

float TestInit(int ti, int64_t r, int64_t c) {
  return static_cast<float>(0.1 * std::cos(0.3 * r - 0.2 * c + ti));
}

Harness::Harness(std::string target, JobOptions opts)
    : target_(std::move(target)), opts_(std::move(opts)) {
  std::vector<RefTensor> tensors;
  for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
    const TensorDef& d = opts_.tensors[ti];
    RefTensor t;
    t.name = d.name;
    t.rows = d.rows;
    t.cols = d.cols;
    t.p.resize(d.rows * d.cols);
    for (int64_t r = 0; r < d.rows; ++r) {
      for (int64_t c = 0; c < d.cols; ++c) t.p[r * d.cols + c] = TestInit(ti, r, c);
    }
    t.m.assign(d.rows * d.cols, 0.0f);
    t.v.assign(d.rows * d.cols, 0.0f);
    t.count.assign(d.cols, 0);
    tensors.push_back(std::move(t));
    std::vector<int32_t> all(d.cols);
    for (int64_t c = 0; c < d.cols; ++c) all[c] = static_cast<int32_t>(c);
    remote_.push_back(all);
    important_.push_back({});
  }
  ref_ = std::make_unique<RefOptimizer>(std::move(tensors), RefHyper{});
}

v1::JobSpec Harness::spec() const {
  v1::JobSpec spec;
  spec.set_job_id(opts_.job_id);
  for (const TensorDef& d : opts_.tensors) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(d.name);
    if (d.one_d) {
      t->add_shape(d.cols);
    } else {
      t->add_shape(d.rows);
      t->add_shape(d.cols);
    }
    t->set_dtype(v1::DTYPE_FP32);
  }
  spec.set_world_size(opts_.world);
  spec.set_wire_dtype(opts_.wire == DType::kF32 ? v1::DTYPE_FP32
                      : opts_.wire == DType::kBF16 ? v1::DTYPE_BF16
                                                   : v1::DTYPE_FP16);
  spec.mutable_zenflow()->set_update_interval(opts_.interval);
  spec.mutable_zenflow()->set_topk_ratio(opts_.topk);
  spec.mutable_zenflow()->mutable_apply_delay()->set_steps(1);
  spec.set_skip_nonfinite_rounds(opts_.skip_nonfinite);
  spec.mutable_adamw()->set_max_grad_norm(opts_.max_grad_norm);
  spec.set_delta_kind(opts_.delta_kind);
  if (opts_.scale_round_step.has_value()) {
    spec.mutable_zenflow()->set_scale_round_step(*opts_.scale_round_step);
  }
  if (opts_.local_step.has_value()) spec.mutable_zenflow()->set_local_step(*opts_.local_step);
  return spec;
}

float Harness::RoundLr(float lr) const {
  const bool scaled = created_.zenflow().scale_round_step() && opts_.interval > 1;
  return scaled ? lr * static_cast<float>(opts_.interval) : lr;
}

absl::Status Harness::Connect() {
  for (int r = 0; r < opts_.world; ++r) {
    ClientOptions co = TestClientOptions(target_);
    co.token = opts_.token;
    co.tls_ca = opts_.tls_ca;
    co.tls_cert = opts_.tls_cert;
    co.tls_key = opts_.tls_key;
    if (opts_.ucx.has_value()) {
      co.transport = Transport::kUcx;
      co.ucx = *opts_.ucx;
    }
    co.max_shard_bytes = opts_.max_shard_bytes;
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(co));
    clients_.push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::Status Harness::CreateJob() {
  ZF_ASSIGN_OR_RETURN(created_, clients_[0]->CreateJob(spec()));
  return absl::OkStatus();
}

absl::Status Harness::Upload() {
  std::vector<Client::TensorValues> values;
  for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
    const TensorDef& d = opts_.tensors[ti];
    Client::TensorValues v;
    v.name = d.name;
    v.shape = d.one_d ? std::vector<int64_t>{d.cols} : std::vector<int64_t>{d.rows, d.cols};
    v.data = ref_->tensor(ti).p.data();
    values.push_back(v);
  }
  return clients_[0]->UploadParameters(opts_.job_id, values).status();
}

absl::Status Harness::JoinAll() {
  for (int r = 0; r < opts_.world; ++r) {
    ZF_RETURN_IF_ERROR(clients_[r]->JoinJob(opts_.job_id, r).status());
  }
  return absl::OkStatus();
}

absl::Status Harness::Setup() {
  ZF_RETURN_IF_ERROR(Connect());
  ZF_RETURN_IF_ERROR(CreateJob());
  ZF_RETURN_IF_ERROR(Upload());
  return JoinAll();
}

absl::Status Harness::PushStep(int rank, int64_t step) {
  pushed_.insert({rank, step});
  for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
    const TensorDef& d = opts_.tensors[ti];
    const std::vector<int32_t>& cols = remote_[ti];
    if (cols.empty()) continue;
    std::vector<float> colmajor(cols.size() * d.rows);
    for (size_t i = 0; i < cols.size(); ++i) {
      for (int64_t r = 0; r < d.rows; ++r) {
        colmajor[i * d.rows + r] = TestGrad(rank, step, static_cast<int>(ti), r, cols[i]);
      }
    }
    ZF_RETURN_IF_ERROR(clients_[rank]->PushColumns(step, d.name, version_, cols, colmajor.data(),
                                                   d.rows, opts_.wire));
  }
  return absl::OkStatus();
}

std::vector<std::vector<float>> Harness::FullGrad(int rank, int64_t step) const {
  std::vector<std::vector<float>> g(opts_.tensors.size());
  for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
    const TensorDef& d = opts_.tensors[ti];
    g[ti].resize(d.rows * d.cols);
    for (int64_t r = 0; r < d.rows; ++r) {
      for (int64_t c = 0; c < d.cols; ++c) {
        g[ti][r * d.cols + c] = TestGrad(rank, step, static_cast<int>(ti), r, c);
      }
    }
  }
  return g;
}

absl::Status Harness::GoodRound(float lr) {
  const int64_t round = next_round_;
  std::vector<std::vector<std::vector<float>>> grads;
  for (int rank = 0; rank < opts_.world; ++rank) {
    for (int s = 0; s < opts_.interval; ++s) {
      const int64_t step = round * opts_.interval + s;
      if (pushed_.count({rank, step}) == 0) ZF_RETURN_IF_ERROR(PushStep(rank, step));
      grads.push_back(FullGrad(rank, step));
    }
  }
  for (int rank = 0; rank < opts_.world; ++rank) {
    ZF_RETURN_IF_ERROR(clients_[rank]->CloseRound(round, lr));
  }
  // Important columns change too, as a worker would change them: their
  // state must reach the daemon exactly at the next hand-off.
  std::vector<std::vector<int32_t>> all(opts_.tensors.size());
  for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
    for (int64_t c = 0; c < opts_.tensors[ti].cols; ++c) all[ti].push_back(static_cast<int32_t>(c));
  }
  // The daemon's columns take the round's step (rule 12); the others
  // stand in for the worker's, one step of lr.
  ref_->Round(grads, lr, remote_, all, opts_.wire == DType::kBF16, opts_.max_grad_norm,
              RoundLr(lr));
  ZF_RETURN_IF_ERROR(CheckRound(round));
  ++next_round_;
  return absl::OkStatus();
}

absl::Status Harness::CheckRound(int64_t round) {
  std::vector<RoundUpdate> updates;
  for (int rank = 0; rank < opts_.world; ++rank) {
    absl::StatusOr<RoundUpdate> u = clients_[rank]->WaitRound(round, absl::Seconds(60));
    if (!u.ok()) {
      std::string errs;
      for (const absl::Status& e : clients_[rank]->TakeErrors()) absl::StrAppend(&errs, "; ", e.ToString());
      return absl::Status(u.status().code(),
                          absl::StrCat("rank ", rank, ": ", u.status().message(), errs));
    }
    updates.push_back(*std::move(u));
  }
  for (int rank = 1; rank < opts_.world; ++rank) {
    if (updates[rank].deltas.size() != updates[0].deltas.size()) {
      return absl::InternalError("ranks received different numbers of deltas");
    }
    for (size_t i = 0; i < updates[0].deltas.size(); ++i) {
      if (updates[rank].deltas[i].SerializeAsString() != updates[0].deltas[i].SerializeAsString()) {
        return absl::InternalError(absl::StrCat("rank ", rank, " delta ", i, " differs from rank 0's"));
      }
    }
  }
  const RoundUpdate& u = updates[0];
  last_deltas_.assign(u.deltas.begin(), u.deltas.end());
  if (u.done.skipped_nonfinite()) {
    return absl::InternalError(absl::StrCat("round ", round, " was skipped as non-finite"));
  }
  std::vector<std::vector<int>> seen(opts_.tensors.size());
  for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) seen[ti].assign(opts_.tensors[ti].cols, 0);
  for (const v1::ParameterDelta& d : u.deltas) {
    if (d.round() != round) return absl::InternalError("delta of another round");
    size_t ti = 0;
    while (ti < opts_.tensors.size() && opts_.tensors[ti].name != d.tensor()) ++ti;
    if (ti == opts_.tensors.size()) return absl::InternalError("delta for an unknown tensor");
    const RefTensor& t = ref_->tensor(ti);
    std::vector<float> vals(d.columns_size() * t.rows);
    if (d.dtype() != v1::DTYPE_FP32 || d.payload().size() != vals.size() * 4) {
      return absl::InternalError("unexpected delta encoding");
    }
    Decode(DType::kF32, d.payload().data(), vals.size(), vals.data());
    // The predicted step's state (ZenFlowConfig.predicted_step, on by
    // default): exactly in the deltas of one-step rounds of value deltas
    // (this harness's apply delay is 1, never sync).
    const bool moments = opts_.interval == 1 && opts_.delta_kind != v1::DELTA_ARITHMETIC;
    if (moments != !d.m().empty()) {
      return absl::InternalError(absl::StrCat("round ", round, " tensor '", t.name, "': the delta ",
                                              moments ? "lacks" : "carries", " m and v"));
    }
    std::vector<float> dm, dv;
    if (moments) {
      if (d.m().size() != vals.size() * 2 || d.v().size() != vals.size() * 2 ||
          d.update_counts_size() != d.columns_size()) {
        return absl::InternalError(absl::StrCat("round ", round, " tensor '", t.name,
                                                "': malformed predicted-step state"));
      }
      dm.resize(vals.size());
      dv.resize(vals.size());
      Decode(DType::kBF16, d.m().data(), dm.size(), dm.data());
      Decode(DType::kBF16, d.v().data(), dv.size(), dv.data());
    }
    ZF_RETURN_IF_ERROR(CheckFactoredMoment(round, ti, d));
    for (int i = 0; i < d.columns_size(); ++i) {
      const int32_t c = d.columns(i);
      seen[ti][c] += 1;
      if (moments) {
        if (d.update_counts(i) != t.count[c]) {
          return absl::InternalError(absl::StrCat("round ", round, " tensor '", t.name, "' column ",
                                                  c, ": update count ", d.update_counts(i),
                                                  " want ", t.count[c]));
        }
        for (int64_t r = 0; r < t.rows; ++r) {
          // bf16 of the reference's fp32 (within its rounding of it).
          const float wm = RoundToBf16(t.m[r * t.cols + c]), wv = RoundToBf16(t.v[r * t.cols + c]);
          const float gm = dm[i * t.rows + r], gv = dv[i * t.rows + r];
          if (!(std::fabs(gm - wm) <= 1e-6f + 8e-3f * std::fabs(wm)) ||  // a bf16 unit or two
              !(std::fabs(gv - wv) <= 1e-9f + 8e-3f * std::fabs(wv))) {
            return absl::InternalError(absl::StrCat("round ", round, " tensor '", t.name, "' [", r,
                                                    ", ", c, "]: m, v ", gm, ", ", gv, " want ",
                                                    wm, ", ", wv));
          }
        }
      }
      for (int64_t r = 0; r < t.rows; ++r) {
        const float got = vals[i * t.rows + r];
        const float want = t.p[r * t.cols + c];
        if (!(std::fabs(got - want) <= 1e-6f + 1e-5f * std::fabs(want))) {
          return absl::InternalError(absl::StrCat("round ", round, " tensor '", t.name, "' [", r,
                                                  ", ", c, "]: got ", got, " want ", want));
        }
      }
    }
  }
  for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
    std::vector<int> want(opts_.tensors[ti].cols, 0);
    for (int32_t c : remote_[ti]) want[c] = 1;
    if (seen[ti] != want) {
      return absl::InternalError(absl::StrCat("round ", round, " tensor '", opts_.tensors[ti].name,
                                              "': returned columns differ from the remote set"));
    }
  }
  return absl::OkStatus();
}

absl::Status Harness::CheckFactoredMoment(int64_t round, size_t ti,
                                          const v1::ParameterDelta& d) const {
  const RefTensor& t = ref_->tensor(ti);
  const bool want = created_.mode() == v1::MODE_ZENFLOW && created_.zenflow().local_step() &&
                    created_.delta_kind() == v1::DELTA_VALUES;
  const std::string where = absl::StrCat("round ", round, " tensor '", t.name, "': ");
  if (!want) {
    if (d.row_v_size() > 0 || d.col_v_size() > 0 || d.v_mean() != 0) {
      return absl::InternalError(absl::StrCat(where, "a factored moment without local_step"));
    }
    return absl::OkStatus();
  }
  if (d.row_v_size() != t.rows || d.col_v_size() != d.columns_size()) {
    return absl::InternalError(absl::StrCat(where, d.row_v_size(), " row_v and ", d.col_v_size(),
                                            " col_v for ", t.rows, " rows and ", d.columns_size(),
                                            " columns"));
  }
  // The definition, from the reference's v (the daemon's to fp32 rounding).
  const std::vector<int32_t>& cols = remote_[ti];
  const RefHyper h;
  std::vector<double> row(t.rows, 0.0);
  double total = 0;
  auto vh = [&](int64_t r, int32_t c) {
    const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(t.count[c]));
    return static_cast<double>(t.v[r * t.cols + c]) / bc2;
  };
  for (int32_t c : cols) {
    for (int64_t r = 0; r < t.rows; ++r) {
      row[r] += vh(r, c);
      total += vh(r, c);
    }
  }
  auto close = [](double got, double want) {
    return std::fabs(got - want) <= 1e-12 + 2e-5 * std::fabs(want);
  };
  for (int64_t r = 0; r < t.rows; ++r) {
    const double w = row[r] / static_cast<double>(cols.size());
    if (!close(d.row_v(static_cast<int>(r)), w)) {
      return absl::InternalError(absl::StrCat(where, "row_v[", r, "] ", d.row_v(static_cast<int>(r)),
                                              " want ", w));
    }
  }
  for (int i = 0; i < d.columns_size(); ++i) {
    double s = 0;
    for (int64_t r = 0; r < t.rows; ++r) s += vh(r, d.columns(i));
    const double w = s / static_cast<double>(t.rows);
    if (!close(d.col_v(i), w)) {
      return absl::InternalError(absl::StrCat(where, "col_v of column ", d.columns(i), " ",
                                              d.col_v(i), " want ", w));
    }
  }
  const double w = total / (static_cast<double>(t.rows) * static_cast<double>(cols.size()));
  if (!close(d.v_mean(), w)) {
    return absl::InternalError(absl::StrCat(where, "v_mean ", d.v_mean(), " want ", w));
  }
  return absl::OkStatus();
}

absl::Status Harness::Reselect(const std::vector<std::vector<float>>& importance_per_tensor) {
  const int64_t step = next_round_ * opts_.interval;
  std::vector<absl::StatusOr<v1::Selection>> results(opts_.world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < opts_.world; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<v1::TensorImportance> imp;
      for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
        if (opts_.tensors[ti].one_d) continue;
        v1::TensorImportance t;
        t.set_tensor(opts_.tensors[ti].name);
        // Ranks submit different halves; the daemon must use the sum.
        for (float s : importance_per_tensor[ti]) t.add_scores(rank == 0 ? s * 0.25f : s * 0.75f);
        imp.push_back(t);
      }
      results[rank] = clients_[rank]->SubmitImportance(step, imp);
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < opts_.world; ++rank) {
    if (!results[rank].ok()) return results[rank].status();
    if (results[rank]->SerializeAsString() != results[0]->SerializeAsString()) {
      return absl::InternalError("ranks got different selections");
    }
  }
  const v1::Selection& sel = *results[0];
  std::vector<std::vector<int32_t>> new_important(opts_.tensors.size());
  for (const v1::ColumnSet& cs : sel.important()) {
    for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
      if (opts_.tensors[ti].name == cs.tensor()) {
        new_important[ti].assign(cs.columns().begin(), cs.columns().end());
      }
    }
  }
  // Hand off: leaving columns carry the reference's exact state (what a
  // worker would hold); joining columns must come back equal to it.
  std::vector<v1::ColumnState> leaving;
  for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
    const RefTensor& t = ref_->tensor(ti);
    v1::ColumnState cs;
    cs.set_tensor(t.name);
    for (int32_t c : important_[ti]) {
      if (std::binary_search(new_important[ti].begin(), new_important[ti].end(), c)) continue;
      cs.add_columns(c);
      for (int64_t r = 0; r < t.rows; ++r) {
        cs.add_values(t.p[r * t.cols + c]);
        cs.add_m(t.m[r * t.cols + c]);
        cs.add_v(t.v[r * t.cols + c]);
      }
      cs.add_update_counts(t.count[c]);
    }
    if (cs.columns_size() > 0) leaving.push_back(cs);
  }
  for (int rank = 0; rank < opts_.world; ++rank) {
    absl::StatusOr<v1::HandOffResponse> r;
    if (opts_.handoff_per_tensor) {
      v1::HandOffResponse all;
      for (const TensorDef& d : opts_.tensors) {
        std::vector<v1::ColumnState> part;
        for (const v1::ColumnState& cs : leaving) {
          if (cs.tensor() == d.name) part.push_back(cs);
        }
        absl::StatusOr<v1::HandOffResponse> one = clients_[rank]->HandOff(sel.version(), part, {d.name});
        if (!one.ok()) return one.status();
        for (const v1::ColumnState& cs : one->joining()) *all.add_joining() = cs;
      }
      r = all;
    } else {
      r = clients_[rank]->HandOff(sel.version(), leaving);
    }
    if (!r.ok()) return r.status();
    for (const v1::ColumnState& cs : r->joining()) {
      size_t ti = 0;
      while (ti < opts_.tensors.size() && opts_.tensors[ti].name != cs.tensor()) ++ti;
      if (ti == opts_.tensors.size()) return absl::InternalError("joining state of unknown tensor");
      const RefTensor& t = ref_->tensor(ti);
      for (int i = 0; i < cs.columns_size(); ++i) {
        const int32_t c = cs.columns(i);
        if (!std::binary_search(new_important[ti].begin(), new_important[ti].end(), c) ||
            std::binary_search(important_[ti].begin(), important_[ti].end(), c)) {
          return absl::InternalError(absl::StrCat("column ", c, " is not joining"));
        }
        for (int64_t r = 0; r < t.rows; ++r) {
          const float want_p = t.p[r * t.cols + c];
          const float got_p = cs.values(i * t.rows + r);
          if (std::fabs(got_p - want_p) > 1e-6f + 1e-5f * std::fabs(want_p) ||
              std::fabs(cs.m(i * t.rows + r) - t.m[r * t.cols + c]) > 1e-6f ||
              std::fabs(cs.v(i * t.rows + r) - t.v[r * t.cols + c]) > 1e-6f) {
            return absl::InternalError(absl::StrCat("joining state of '", t.name, "' column ", c,
                                                    " differs from the reference"));
          }
        }
        if (cs.update_counts(i) != t.count[c]) {
          return absl::InternalError(absl::StrCat("joining count of '", t.name, "' column ", c,
                                                  " is ", cs.update_counts(i), " want ", t.count[c]));
        }
      }
    }
  }
  version_ = sel.version();
  for (size_t ti = 0; ti < opts_.tensors.size(); ++ti) {
    important_[ti] = new_important[ti];
    remote_[ti].clear();
    for (int64_t c = 0; c < opts_.tensors[ti].cols; ++c) {
      if (!std::binary_search(important_[ti].begin(), important_[ti].end(), c)) {
        remote_[ti].push_back(static_cast<int32_t>(c));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace zenflow::testing
