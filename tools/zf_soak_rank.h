// One rank of the loopback soak (tools/zf_soak.cc): a zenflow::Client in its
// own thread on its own connection, pushing its gradients, taking part in
// selections and hand-offs and applying every round's deltas; and the checks
// of a job's ranks against the reference (CheckJob, in zf_soak_rank.cc).
#ifndef ZENFLOW_TOOLS_ZF_SOAK_RANK_H_
#define ZENFLOW_TOOLS_ZF_SOAK_RANK_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "tools/zf_soak_model.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {
namespace soak {

// ---- One rank ---------------------------------------------------------------------

// What a rank saw, for the checks after the pass.
struct RankResult {
  std::string error;                         // the first failure; empty: none
  std::vector<int> round_count;              // deliveries of each round
  std::vector<uint64_t> round_digest;        // of each round's deltas
  std::vector<uint64_t> selection_digest;    // per selection: the Selection
  std::vector<uint64_t> joining_digest;      // per selection: the HandOffResponse
  std::vector<v1::Selection> selections;     // rank 0 only
  std::vector<v1::HandOffResponse> joining;  // rank 0 only
  std::vector<v1::ColumnState> final_state;  // rank 0 only: GetState per tensor
  std::vector<std::vector<float>> params;    // the rank's values: init, then every delta applied
  ClientStats stats;
  int64_t deltas_applied = 0;
};

// What the ranks of one job share.
struct JobShared {
  int index = 0;
  std::string id;
  std::string token;
  v1::JobSpec spec;
  bool delete_while_attached = false;  // odd jobs: DeleteJob before the other ranks close
  std::mutex mu;
  std::condition_variable cv;
  bool uploaded = false;  // rank 0 created the job and uploaded (or failed: upload_failed)
  bool upload_failed = false;
  int finished = 0;      // ranks other than 0 done with their rounds
  bool deleted = false;  // rank 0 deleted the job (or gave up)
};

class Rank {
 public:
  Rank(const Config& cfg, JobShared* job, int rank, Transport transport, const std::string& target,
       int global_index, std::atomic<int>* progress, RankResult* out)
      : cfg_(cfg),
        job_(job),
        rank_(rank),
        transport_(transport),
        target_(target),
        global_index_(global_index),
        progress_(progress),
        out_(out) {}

  void Run() {
    out_->round_count.assign(cfg_.rounds, 0);
    out_->round_digest.assign(cfg_.rounds, 0);
    out_->params.resize(cfg_.tensors);
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      std::vector<float>& p = out_->params[ti];
      p.resize(static_cast<size_t>(cfg_.rows) * cfg_.cols);
      for (int r = 0; r < cfg_.rows; ++r) {
        for (int c = 0; c < cfg_.cols; ++c) p[r * cfg_.cols + c] = Init(job_->index, ti, r, c);
      }
    }
    absl::Status s = Drive();
    if (!s.ok()) Fail(s);
    if (client_ != nullptr) out_->stats = client_->stats();
    Finish();
    std::lock_guard<std::mutex> lock(mu_);
    if (out_->error.empty() && !error_.empty()) out_->error = error_;
  }

 private:
  void Fail(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty())
      error_ = absl::StrCat("job ", job_->id, " rank ", rank_, ": ", s.ToString());
    cv_.notify_all();
  }

  absl::Status Drive() {
    ClientOptions co;
    co.target = target_;
    co.token = job_->token;
    co.transport = transport_;
    // gRPC pools channels with identical arguments onto one connection:
    // a different (and harmless) size limit per rank gives each its own.
    co.max_message_bytes = (int64_t{1} << 30) - global_index_;
    co.max_shard_bytes = 16 << 10;  // several shards per tensor and step
    co.rpc_timeout = absl::Seconds(120);
    co.selection_timeout = absl::Seconds(120);
    ZF_ASSIGN_OR_RETURN(client_, Client::Connect(co));
    // The callback runs on the client's receive thread, which the client's
    // destructor ends: it may still run while client_ is being reset, so it
    // is given the client itself.
    Client* client = client_.get();
    client_->SetRoundCallback([this, client](RoundUpdate u) { OnRound(client, std::move(u)); });
    if (rank_ == 0) {
      absl::Status s = CreateAndUpload();
      {
        std::lock_guard<std::mutex> lock(job_->mu);
        job_->uploaded = true;
        job_->upload_failed = !s.ok();
      }
      job_->cv.notify_all();
      ZF_RETURN_IF_ERROR(s);
    } else {
      std::unique_lock<std::mutex> lock(job_->mu);
      if (!job_->cv.wait_for(lock, std::chrono::seconds(120), [&] { return job_->uploaded; })) {
        return absl::DeadlineExceededError("rank 0 did not create the job within 120 s");
      }
      if (job_->upload_failed) return absl::AbortedError("rank 0 failed to create the job");
    }
    ZF_ASSIGN_OR_RETURN(v1::JoinJobResponse joined, client_->JoinJob(job_->id, rank_));
    if (joined.selection().version() != 0) {
      return absl::InternalError(
          absl::StrCat("joined at selection ", joined.selection().version(), ", want 0"));
    }
    important_.assign(cfg_.tensors, {});
    held_.assign(cfg_.tensors, v1::ColumnState());
    std::vector<std::vector<int32_t>> remote(cfg_.tensors);
    for (int ti = 0; ti < cfg_.tensors; ++ti) remote[ti] = Complement({}, cfg_.cols);
    int64_t version = 0;
    std::vector<float> colmajor;
    for (int64_t round = 0; round < cfg_.rounds; ++round) {
      if (const int sel = SelectionAt(cfg_, round); sel > 0) {
        ZF_ASSIGN_OR_RETURN(version, Select(round, sel));
        for (int ti = 0; ti < cfg_.tensors; ++ti)
          remote[ti] = Complement(important_[ti], cfg_.cols);
      }
      for (int s = 0; s < cfg_.interval; ++s) {
        const int64_t step = round * cfg_.interval + s;
        for (int ti = 0; ti < cfg_.tensors; ++ti) {
          const std::vector<int32_t>& cols = remote[ti];
          colmajor.resize(cols.size() * cfg_.rows);
          for (size_t i = 0; i < cols.size(); ++i) {
            for (int r = 0; r < cfg_.rows; ++r) {
              colmajor[i * cfg_.rows + r] = Grad(job_->index, rank_, step, ti, r, cols[i]);
            }
          }
          ZF_RETURN_IF_ERROR(client_->PushColumns(step, TensorName(ti), version, cols,
                                                  colmajor.data(), cfg_.rows, DType::kF32));
        }
      }
      ZF_RETURN_IF_ERROR(client_->CloseRound(round, LearningRate(round)));
      if (round >= 1) ZF_RETURN_IF_ERROR(WaitDelivered(round - 1));
      ZF_RETURN_IF_ERROR(CheckNoErrors());
    }
    ZF_RETURN_IF_ERROR(WaitDelivered(cfg_.rounds - 1));
    ZF_RETURN_IF_ERROR(CheckNoErrors());
    if (std::optional<RoundUpdate> extra = client_->PollRound()) {
      return absl::InternalError(absl::StrCat("round ", extra->round, " queued after the last"));
    }
    ZF_RETURN_IF_ERROR(client_->stream_status());
    if (rank_ == 0) {
      for (int ti = 0; ti < cfg_.tensors; ++ti) {
        ZF_ASSIGN_OR_RETURN(v1::ColumnState st, client_->GetState(job_->id, TensorName(ti)));
        out_->final_state.push_back(std::move(st));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CreateAndUpload() {
    ZF_ASSIGN_OR_RETURN(v1::JobSpec spec, client_->CreateJob(job_->spec));
    if (spec.wire_dtype() != v1::DTYPE_FP32 || !spec.rank_ordered_sums()) {
      return absl::InternalError("the daemon changed the job's wire dtype or summation");
    }
    if (client_->token() != job_->token) {
      return absl::InternalError("the daemon answered CreateJob with a token other than ours");
    }
    std::vector<Client::TensorValues> values;
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      values.push_back({TensorName(ti), {cfg_.rows, cfg_.cols}, out_->params[ti].data()});
    }
    return client_->UploadParameters(job_->id, values).status();
  }

  // Selection `sel` at `round`: importance, then the exact hand-off of the
  // columns leaving and joining this rank's important set. Returns the
  // selection's version.
  absl::StatusOr<int64_t> Select(int64_t round, int sel) {
    std::vector<v1::TensorImportance> imp(cfg_.tensors);
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      imp[ti].set_tensor(TensorName(ti));
      for (float s : Scores(cfg_, sel, ti)) imp[ti].add_scores(s);
    }
    ZF_ASSIGN_OR_RETURN(v1::Selection selection,
                        client_->SubmitImportance(round * cfg_.interval, imp));
    out_->selection_digest.push_back(
        Fnv(kFnvBasis, selection.SerializeAsString().data(), selection.ByteSizeLong()));
    if (rank_ == 0) out_->selections.push_back(selection);
    std::vector<std::vector<int32_t>> next(cfg_.tensors);
    for (const v1::ColumnSet& cs : selection.important()) {
      for (int ti = 0; ti < cfg_.tensors; ++ti) {
        if (cs.tensor() == TensorName(ti))
          next[ti].assign(cs.columns().begin(), cs.columns().end());
      }
    }
    // Leaving: the state this rank holds for columns it kept (unchanged
    // since they joined: the soak's workers do not update them).
    std::vector<v1::ColumnState> leaving;
    std::vector<v1::ColumnState> kept(cfg_.tensors);
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      const v1::ColumnState& h = held_[ti];
      v1::ColumnState out, stay;
      out.set_tensor(TensorName(ti));
      stay.set_tensor(TensorName(ti));
      for (int i = 0; i < h.columns_size(); ++i) {
        const bool stays = std::binary_search(next[ti].begin(), next[ti].end(), h.columns(i));
        v1::ColumnState& dst = stays ? stay : out;
        dst.add_columns(h.columns(i));
        for (int r = 0; r < cfg_.rows; ++r) {
          dst.add_values(h.values(i * cfg_.rows + r));
          dst.add_m(h.m(i * cfg_.rows + r));
          dst.add_v(h.v(i * cfg_.rows + r));
        }
        dst.add_update_counts(h.update_counts(i));
      }
      if (out.columns_size() > 0) leaving.push_back(std::move(out));
      kept[ti] = std::move(stay);
    }
    ZF_ASSIGN_OR_RETURN(v1::HandOffResponse resp, client_->HandOff(selection.version(), leaving));
    out_->joining_digest.push_back(
        Fnv(kFnvBasis, resp.SerializeAsString().data(), resp.ByteSizeLong()));
    // The joining columns' values must be what this rank's deltas left,
    // once the last round's deltas are here (the selection waited for its
    // update on the daemon, not for its deltas to reach this rank).
    ZF_RETURN_IF_ERROR(WaitDelivered(round - 1));
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const v1::ColumnState& cs : resp.joining()) {
        const int ti = TensorIndex(cs.tensor());
        if (ti < 0 || cs.values_size() != cs.columns_size() * cfg_.rows) {
          return absl::InternalError("a malformed joining state");
        }
        for (int i = 0; i < cs.columns_size(); ++i) {
          for (int r = 0; r < cfg_.rows; ++r) {
            const float want = out_->params[ti][r * cfg_.cols + cs.columns(i)];
            if (Bits(cs.values(i * cfg_.rows + r)) != Bits(want)) {
              return absl::InternalError(absl::StrCat("selection ", sel, ": joining value of ",
                                                      cs.tensor(), "[", r, ", ", cs.columns(i),
                                                      "] is ", cs.values(i * cfg_.rows + r),
                                                      ", the rank's deltas left ", want));
            }
          }
        }
      }
    }
    // Held from now on: kept plus joining, by column.
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      std::map<int32_t, std::pair<const v1::ColumnState*, int>> by_col;
      for (int i = 0; i < kept[ti].columns_size(); ++i)
        by_col[kept[ti].columns(i)] = {&kept[ti], i};
      for (const v1::ColumnState& cs : resp.joining()) {
        if (cs.tensor() != TensorName(ti)) continue;
        for (int i = 0; i < cs.columns_size(); ++i) by_col[cs.columns(i)] = {&cs, i};
      }
      v1::ColumnState h;
      h.set_tensor(TensorName(ti));
      std::vector<int32_t> cols;
      for (const auto& [col, src] : by_col) {
        cols.push_back(col);
        h.add_columns(col);
        for (int r = 0; r < cfg_.rows; ++r) {
          h.add_values(src.first->values(src.second * cfg_.rows + r));
          h.add_m(src.first->m(src.second * cfg_.rows + r));
          h.add_v(src.first->v(src.second * cfg_.rows + r));
        }
        h.add_update_counts(src.first->update_counts(src.second));
      }
      if (cols != next[ti]) {
        return absl::InternalError(absl::StrCat("selection ", sel, ", tensor ", TensorName(ti),
                                                ": kept + joining columns differ from the "
                                                "selection's important set"));
      }
      held_[ti] = std::move(h);
      important_[ti] = std::move(next[ti]);
    }
    if (rank_ == 0) out_->joining.push_back(std::move(resp));
    return selection.version();
  }

  int TensorIndex(const std::string& name) const {
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      if (name == TensorName(ti)) return ti;
    }
    return -1;
  }

  // Runs on the client's receive thread: counts, checks and applies a round.
  void OnRound(Client* client, RoundUpdate u) {
    std::lock_guard<std::mutex> lock(mu_);
    auto fail = [&](const std::string& why) {
      if (error_.empty()) error_ = absl::StrCat("job ", job_->id, " rank ", rank_, ": ", why);
      cv_.notify_all();
    };
    if (u.round < 0 || u.round >= cfg_.rounds)
      return fail(absl::StrCat("round ", u.round, " received"));
    if (++out_->round_count[u.round] > 1)
      return fail(absl::StrCat("round ", u.round, " received twice"));
    if (u.round != next_round_) {
      return fail(
          absl::StrCat("round ", u.round, " received while round ", next_round_, " was due"));
    }
    if (u.done.skipped_nonfinite()) return fail(absl::StrCat("round ", u.round, " was skipped"));
    if (u.done.delta_messages() != static_cast<int>(u.deltas.size())) {
      return fail(absl::StrCat("round ", u.round, ": ", u.deltas.size(), " deltas, RoundDone says ",
                               u.done.delta_messages()));
    }
    const int sel = SelectionOf(cfg_, u.round);
    if (u.done.selection_version() != sel) {
      return fail(absl::StrCat("round ", u.round, " at selection ", u.done.selection_version(),
                               ", want ", sel));
    }
    std::vector<std::vector<char>> seen(cfg_.tensors, std::vector<char>(cfg_.cols, 0));
    uint64_t digest = kFnvBasis;
    for (v1::ParameterDelta& d : u.deltas) {
      const int ti = TensorIndex(d.tensor());
      const size_t want_bytes = static_cast<size_t>(d.columns_size()) * cfg_.rows * 4;
      if (ti < 0 || d.round() != u.round || d.dtype() != v1::DTYPE_FP32 ||
          (d.kind() != v1::DELTA_VALUES && d.kind() != v1::DELTA_UNSPECIFIED) ||
          d.payload().size() != want_bytes) {
        return fail(absl::StrCat("round ", u.round, ": an unexpected delta (tensor '", d.tensor(),
                                 "', ", d.columns_size(), " columns, ", d.payload().size(),
                                 " bytes)"));
      }
      digest = Fnv(digest, d.tensor().data(), d.tensor().size());
      digest = Fnv(digest, d.columns().data(), d.columns_size() * sizeof(int32_t));
      digest = Fnv(digest, d.payload().data(), d.payload().size());
      std::vector<float>& p = out_->params[ti];
      for (int i = 0; i < d.columns_size(); ++i) {
        const int32_t c = d.columns(i);
        if (c < 0 || c >= cfg_.cols || seen[ti][c]++ != 0) {
          return fail(absl::StrCat("round ", u.round, ": column ", c, " of ", d.tensor(),
                                   " out of range or sent twice"));
        }
        for (int r = 0; r < cfg_.rows; ++r) {
          float x;
          std::memcpy(&x, d.payload().data() + (static_cast<size_t>(i) * cfg_.rows + r) * 4, 4);
          p[static_cast<size_t>(r) * cfg_.cols + c] = x;
        }
      }
      ++out_->deltas_applied;
      if (transport_ == Transport::kUcx) client->Recycle(std::move(*d.mutable_payload()));
    }
    for (int ti = 0; ti < cfg_.tensors; ++ti) {
      const std::vector<int32_t> important = ExpectedImportant(cfg_, sel, ti);
      for (int c = 0; c < cfg_.cols; ++c) {
        const bool remote = !std::binary_search(important.begin(), important.end(), c);
        if (seen[ti][c] != (remote ? 1 : 0)) {
          return fail(absl::StrCat("round ", u.round, ": column ", c, " of ", TensorName(ti),
                                   remote ? " (remote) missing" : " (important) sent"));
        }
      }
    }
    out_->round_digest[u.round] = digest;
    next_round_ = u.round + 1;
    progress_->store(static_cast<int>(next_round_), std::memory_order_relaxed);
    cv_.notify_all();
  }

  absl::Status WaitDelivered(int64_t round) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool ok = cv_.wait_for(lock, std::chrono::seconds(120),
                                 [&] { return next_round_ > round || !error_.empty(); });
    if (!error_.empty()) return absl::InternalError(error_);
    if (!ok) {
      lock.unlock();
      return absl::DeadlineExceededError(absl::StrCat(
          "round ", round,
          " not received within 120 s (stream: ", client_->stream_status().ToString(), ")"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckNoErrors() {
    std::vector<absl::Status> errors = client_->TakeErrors();
    if (errors.empty()) return absl::OkStatus();
    return absl::Status(errors[0].code(),
                        absl::StrCat("the daemon rejected ", errors.size(),
                                     " message(s), first: ", errors[0].message()));
  }

  // The end: rank 0 deletes the job; the clients go. Even jobs close their
  // other ranks first, odd ones delete while those are still attached.
  void Finish() {
    if (rank_ != 0) {
      if (!job_->delete_while_attached) client_.reset();
      std::unique_lock<std::mutex> lock(job_->mu);
      ++job_->finished;
      job_->cv.notify_all();
      if (job_->delete_while_attached) {
        job_->cv.wait_for(lock, std::chrono::seconds(240), [&] { return job_->deleted; });
        lock.unlock();
        client_.reset();
      }
      return;
    }
    {
      std::unique_lock<std::mutex> lock(job_->mu);
      if (!job_->cv.wait_for(lock, std::chrono::seconds(240),
                             [&] { return job_->finished == cfg_.ranks - 1; })) {
        lock.unlock();
        Fail(absl::DeadlineExceededError("the other ranks did not finish within 240 s"));
      }
    }
    if (client_ != nullptr) {
      absl::Status s = client_->DeleteJob(job_->id);
      if (!s.ok()) Fail(s);
    }
    {
      std::lock_guard<std::mutex> lock(job_->mu);
      job_->deleted = true;
    }
    job_->cv.notify_all();
    client_.reset();
  }

  const Config& cfg_;
  JobShared* const job_;
  const int rank_;
  const Transport transport_;
  const std::string target_;
  const int global_index_;
  std::atomic<int>* const progress_;
  RankResult* const out_;
  std::unique_ptr<Client> client_;
  std::vector<std::vector<int32_t>> important_;  // per tensor, ascending
  std::vector<v1::ColumnState> held_;            // their state, as handed to this rank

  std::mutex mu_;  // guards what OnRound touches: out_'s rounds and params, error_
  std::condition_variable cv_;
  int64_t next_round_ = 0;
  std::string error_;
};

// ---- Checks against the reference ----------------------------------------------------

// What CheckJob found.
struct JobCheck {
  std::vector<std::string> failures;  // empty: every check held
  std::string model;  // the rounding of p*decay - update the daemon matched: fused or plain
  int64_t values_compared = 0;  // parameter values compared bit for bit
};

// Replays job `job`'s rounds on the reference and compares every rank's
// record with it (zf_soak_rank.cc).
JobCheck CheckJob(const Config& cfg, int job, const std::vector<RankResult>& ranks,
                  const RefStep& adam);

}  // namespace soak
}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_ZF_SOAK_RANK_H_
