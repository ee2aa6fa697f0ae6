// The client of a job over several daemons; see partitioned_client.h.
#include "client/partitioned_client.h"

#include <algorithm>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/parts.h"
#include "client/releaser.h"
#include "common/codec.h"
#include "common/status_macros.h"

namespace zenflow {

PartitionedClient::PartitionedClient(Transport transport, std::vector<std::string> targets,
                                     std::vector<std::unique_ptr<OneDaemonClient>> clients,
                                     int64_t split_params)
    : transport_(transport),
      split_params_(split_params),
      map_(std::move(targets)),
      clients_(std::move(clients)) {}

absl::Status PartitionedClient::Named(int part, const absl::Status& s) const {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("zenflowd ", map_.target(part), " (daemon ", part,
                                             " of ", n(), "): ", s.message()));
}

std::vector<int> PartitionedClient::All() const {
  std::vector<int> all(n());
  for (int i = 0; i < n(); ++i) all[i] = i;
  return all;
}

absl::Status PartitionedClient::Each(const std::vector<int>& which,
                                     const std::function<absl::Status(int)>& call) {
  Mutex mu;
  absl::Status first;
  std::vector<bool> finished(which.size(), false);
  size_t done = 0;
  std::vector<std::thread> threads;
  for (size_t k = 0; k < which.size(); ++k) {
    threads.emplace_back([&, k] {
      absl::Status s = Named(which[k], call(which[k]));
      MutexLock lock(&mu);
      if (!s.ok() && first.ok()) first = std::move(s);
      finished[k] = true;
      ++done;
    });
  }
  for (;;) {
    std::vector<int> abandon;
    {
      MutexLock lock(&mu);
      mu.AwaitWithTimeout(
          [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done == which.size() || !first.ok(); },
          absl::Milliseconds(100));
      if (done == which.size()) break;
      if (first.ok()) continue;
      for (size_t k = 0; k < which.size(); ++k) {
        if (!finished[k]) abandon.push_back(which[k]);
      }
    }
    // Again every 100 ms: a call may start after the first try.
    for (int i : abandon) clients_[i]->AbandonCalls();
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (std::thread& t : threads) t.join();
  return first;
}

// ---- Control ------------------------------------------------------------------

absl::StatusOr<v1::JobSpec> PartitionedClient::CreateJob(const v1::JobSpec& spec) {
  if (spec.has_partition()) {
    return absl::InvalidArgumentError(
        "JobSpec.partition is chosen by the client library when its target lists several "
        "daemons: leave it unset");
  }
  ZF_ASSIGN_OR_RETURN(v1::Partition map, PlanPartition(spec, n(), split_params_));
  std::vector<v1::JobSpec> created(n());
  bool exists = false;
  absl::Status first_exists;  // the daemon's own words: what holds the id
  for (int i = 0; i < n(); ++i) {
    std::string new_token;
    absl::StatusOr<v1::JobSpec> s = clients_[i]->CreateJobTokened(PartSpec(spec, map, i), &new_token);
    // The daemons all know the job by the first one's token: a new one
    // (the caller sent none, or the admin's) goes to the others.
    if (i == 0 && !new_token.empty()) {
      for (int j = 1; j < n(); ++j) clients_[j]->SetToken(new_token);
    }
    if (s.status().code() == absl::StatusCode::kAlreadyExists) {
      if (!exists) first_exists = Named(i, s.status());
      exists = true;
      continue;
    }
    if (!s.ok()) {
      // Leave no part behind: the job is whole or absent.
      for (int j = 0; j < i; ++j) {
        if (created[j].job_id().empty()) continue;
        (void)clients_[j]->DeleteJob(spec.job_id());
      }
      return Named(i, s.status());
    }
    created[i] = *std::move(s);
  }
  if (exists) {
    return absl::AlreadyExistsError(absl::StrCat("job ", spec.job_id(),
                                                 " already exists on at least one of its ", n(),
                                                 " daemons: ", first_exists.message()));
  }
  return map_.Merge(created);
}

absl::StatusOr<v1::UploadParametersResponse> PartitionedClient::UploadParameters(
    const std::string& job_id, const std::vector<TensorValues>& tensors) {
  std::vector<std::vector<TensorValues>> by(n());
  std::deque<std::string> cut;  // a split tensor's blocks, row-major
  int64_t extra = 0;            // blocks beyond a split tensor's first
  for (const TensorValues& t : tensors) {
    ZF_ASSIGN_OR_RETURN(Place place, map_.Locate(t.name));
    if (place.blocks == nullptr) {
      by[place.part].push_back(t);
      continue;
    }
    const std::vector<Block>& blocks = *place.blocks;
    extra += static_cast<int64_t>(blocks.size()) - 1;
    const int64_t cols = blocks.back().first + blocks.back().cols;
    if (t.shape.size() != 2 || t.shape[1] != cols || t.shape[0] < 1 || t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' is split into column blocks of its ", cols,
          " columns: upload it whole, as a 2-D tensor with that many columns"));
    }
    const size_t size = DTypeSize(t.dtype);
    const char* src = static_cast<const char*>(t.data);
    for (const Block& b : blocks) {
      std::string& block = cut.emplace_back();
      block.resize(static_cast<size_t>(t.shape[0] * b.cols) * size);
      for (int64_t r = 0; r < t.shape[0]; ++r) {
        std::memcpy(block.data() + static_cast<size_t>(r * b.cols) * size,
                    src + static_cast<size_t>(r * cols + b.first) * size,
                    static_cast<size_t>(b.cols) * size);
      }
      TensorValues v = t;
      v.shape = {t.shape[0], b.cols};
      v.data = block.data();
      by[b.part].push_back(v);
    }
  }
  v1::UploadParametersResponse out;
  absl::Status exists;
  for (int i = 0; i < n(); ++i) {
    if (by[i].empty()) continue;
    absl::StatusOr<v1::UploadParametersResponse> r = clients_[i]->UploadParameters(job_id, by[i]);
    if (r.status().code() == absl::StatusCode::kAlreadyExists) {
      exists = Named(i, r.status());
      continue;
    }
    if (!r.ok()) return Named(i, r.status());
    out.set_elements(out.elements() + r->elements());
    out.set_tensors(out.tensors() + r->tensors());
  }
  if (!exists.ok()) return exists;
  out.set_tensors(out.tensors() - extra);  // a split tensor counts once, as on one daemon
  return out;
}

absl::StatusOr<v1::JoinJobResponse> PartitionedClient::JoinJob(const std::string& job_id,
                                                               int32_t rank) {
  std::vector<v1::JoinJobResponse> joined(n());
  for (int i = 0; i < n(); ++i) {
    absl::StatusOr<v1::JoinJobResponse> r = clients_[i]->JoinJob(job_id, rank);
    if (!r.ok()) return Named(i, r.status());
    ZF_RETURN_IF_ERROR(map_.CheckPart(i, r->spec()));
    joined[i] = *std::move(r);
  }
  std::vector<v1::JobSpec> specs;
  for (const v1::JoinJobResponse& j : joined) specs.push_back(j.spec());
  v1::JoinJobResponse out;
  ZF_ASSIGN_OR_RETURN(*out.mutable_spec(), map_.Merge(specs));
  v1::Selection* sel = out.mutable_selection();
  *sel = joined[0].selection();
  sel->clear_important();
  for (int i = 0; i < n(); ++i) {
    if (joined[i].selection().version() != sel->version()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job's daemons are at different selections: ", map_.target(0), " at version ",
          sel->version(), ", ", map_.target(i), " at ", joined[i].selection().version(),
          " (was one restored from an older checkpoint?)"));
    }
  }
  std::vector<const v1::Selection*> sels;
  for (const v1::JoinJobResponse& j : joined) sels.push_back(&j.selection());
  for (v1::ColumnSet& cs : MergeSelections(out.spec().partition(), sels)) {
    *sel->add_important() = std::move(cs);
  }
  return out;
}

absl::Status PartitionedClient::Attach(const std::string& job_id, int32_t rank) {
  for (int i = 0; i < n(); ++i) ZF_RETURN_IF_ERROR(Named(i, clients_[i]->Attach(job_id, rank)));
  return absl::OkStatus();
}

absl::StatusOr<v1::GetJobResponse> PartitionedClient::GetJob(const std::string& job_id) {
  std::vector<v1::GetJobResponse> got(n());
  for (int i = 0; i < n(); ++i) {
    absl::StatusOr<v1::GetJobResponse> r = clients_[i]->GetJob(job_id);
    if (!r.ok()) return Named(i, r.status());
    ZF_RETURN_IF_ERROR(map_.CheckPart(i, r->spec()));
    got[i] = *std::move(r);
  }
  std::vector<v1::JobSpec> specs;
  for (const v1::GetJobResponse& g : got) specs.push_back(g.spec());
  v1::GetJobResponse out = got[0];
  ZF_ASSIGN_OR_RETURN(*out.mutable_spec(), map_.Merge(specs));
  for (const v1::GetJobResponse& g : got) {
    out.set_parameters_uploaded(out.parameters_uploaded() && g.parameters_uploaded());
    out.set_rounds_updated(std::min(out.rounds_updated(), g.rounds_updated()));
    out.set_selection_version(std::min(out.selection_version(), g.selection_version()));
    // Ranks joined on every daemon.
    std::vector<int32_t> both;
    for (int32_t r : out.joined_ranks()) {
      if (std::find(g.joined_ranks().begin(), g.joined_ranks().end(), r) != g.joined_ranks().end()) {
        both.push_back(r);
      }
    }
    out.mutable_joined_ranks()->Assign(both.begin(), both.end());
  }
  return out;
}

absl::StatusOr<v1::GetJobResponse> PartitionedClient::WaitForUpload(const std::string& job_id,
                                                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < n(); ++i) {
    ZF_RETURN_IF_ERROR(
        Named(i, clients_[i]->WaitForUpload(job_id, std::max(deadline - absl::Now(), absl::ZeroDuration()))
                     .status()));
  }
  return GetJob(job_id);
}

absl::Status PartitionedClient::DeleteJob(const std::string& job_id) {
  absl::Status first;
  for (int i = 0; i < n(); ++i) {
    const absl::Status s = clients_[i]->DeleteJob(job_id);
    if (!s.ok() && first.ok()) first = Named(i, s);
  }
  return first;
}

absl::StatusOr<v1::DeleteJobResponse> PartitionedClient::FinishJob(const std::string& job_id,
                                                                   int32_t rank, bool keep) {
  // Every daemon hears it, even after one failed: each holds a part of the
  // job that should end with it.
  v1::DeleteJobResponse out;
  out.set_deleted(true);
  out.set_kept(true);
  absl::Status first;
  for (int i = 0; i < n(); ++i) {
    absl::StatusOr<v1::DeleteJobResponse> r = clients_[i]->FinishJob(job_id, rank, keep);
    if (!r.ok()) {
      if (first.ok()) first = Named(i, r.status());
      continue;
    }
    out.set_ranks_finished(i == 0 ? r->ranks_finished()
                                  : std::min(out.ranks_finished(), r->ranks_finished()));
    out.set_deleted(out.deleted() && r->deleted());
    out.set_kept(out.kept() && r->kept());
  }
  if (!first.ok()) return first;
  return out;
}

absl::StatusOr<v1::ColumnState> PartitionedClient::GetState(const std::string& job_id,
                                                            const std::string& tensor,
                                                            int64_t* selection_version) {
  ZF_ASSIGN_OR_RETURN(Place place, map_.Locate(tensor));
  if (place.blocks == nullptr) {
    const int p = place.part;
    absl::StatusOr<v1::ColumnState> s = clients_[p]->GetState(job_id, tensor, selection_version);
    if (!s.ok()) return Named(p, s.status());
    return s;
  }
  // A split tensor: every block's state, in column order.
  v1::ColumnState out;
  out.set_tensor(tensor);
  int64_t version = -1;
  for (const Block& b : *place.blocks) {
    int64_t v = -1;
    absl::StatusOr<v1::ColumnState> s = clients_[b.part]->GetState(job_id, tensor, &v);
    if (!s.ok()) return Named(b.part, s.status());
    if (version >= 0 && v != version) {
      return absl::AbortedError(absl::StrCat(
          "job '", job_id, "': the daemons of tensor '", tensor, "' are at selections ", version,
          " and ", v, " (a reselection ran while its state was read); read it again"));
    }
    version = v;
    AppendState(*s, b.first, &out);
  }
  if (selection_version != nullptr) *selection_version = version;
  return out;
}

absl::Status PartitionedClient::SetState(const std::string& job_id, const v1::ColumnState& state) {
  ZF_ASSIGN_OR_RETURN(auto pieces, map_.SplitState(state));
  for (auto& [p, cs] : pieces) ZF_RETURN_IF_ERROR(Named(p, clients_[p]->SetState(job_id, cs)));
  return absl::OkStatus();
}

absl::StatusOr<v1::GetStatsResponse> PartitionedClient::GetStats(const std::string& job_id) {
  v1::GetStatsResponse out;
  for (int i = 0; i < n(); ++i) {
    absl::StatusOr<v1::GetStatsResponse> r = clients_[i]->GetStats(job_id);
    if (!r.ok()) return Named(i, r.status());
    if (i == 0) {
      out = *std::move(r);
      continue;
    }
    for (v1::JobStats& j : *r->mutable_jobs()) *out.add_jobs() = std::move(j);
    for (const auto& [code, count] : r->rejected()) (*out.mutable_rejected())[code] += count;
  }
  return out;
}

absl::StatusOr<v1::Selection> PartitionedClient::SubmitImportance(
    int64_t step, const std::vector<v1::TensorImportance>& tensors) {
  std::vector<std::vector<v1::TensorImportance>> by(n());
  for (const v1::TensorImportance& t : tensors) {
    ZF_ASSIGN_OR_RETURN(Place place, map_.Locate(t.tensor()));
    if (place.blocks == nullptr) {
      by[place.part].push_back(t);
      continue;
    }
    // Every block's daemon chooses from the whole tensor's scores.
    for (const Block& b : *place.blocks) by[b.part].push_back(t);
  }
  // Every daemon takes part in every selection (its version counts them),
  // whether or not it has a tensor to choose for.
  std::vector<v1::Selection> got(n());
  ZF_RETURN_IF_ERROR(Each(All(), [&](int i) -> absl::Status {
    ZF_ASSIGN_OR_RETURN(got[i], clients_[i]->SubmitImportance(step, by[i]));
    return absl::OkStatus();
  }));
  v1::Selection out = got[0];
  out.clear_important();
  for (int i = 1; i < n(); ++i) {
    if (got[i].version() != out.version() || got[i].step() != out.step()) {
      return absl::InternalError(absl::StrCat(
          "the job's daemons answered different selections for step ", step, ": ", map_.target(0),
          " version ", out.version(), ", ", map_.target(i), " version ", got[i].version(),
          " (was one restored from an older checkpoint?)"));
    }
  }
  const v1::Partition map = map_.map();
  std::vector<const v1::Selection*> sels;
  for (const v1::Selection& g : got) sels.push_back(&g);
  for (v1::ColumnSet& cs : MergeSelections(map, sels)) *out.add_important() = std::move(cs);
  return out;
}

absl::StatusOr<v1::HandOffResponse> PartitionedClient::HandOff(
    int64_t version, const std::vector<v1::ColumnState>& leaving,
    const std::vector<std::string>& tensors) {
  std::vector<std::vector<v1::ColumnState>> leave(n());
  std::vector<std::vector<std::string>> names(n());
  for (const v1::ColumnState& cs : leaving) {
    ZF_ASSIGN_OR_RETURN(auto pieces, map_.SplitState(cs));
    for (auto& [p, piece] : pieces) leave[p].push_back(std::move(piece));
  }
  for (const std::string& t : tensors) {
    ZF_ASSIGN_OR_RETURN(Place place, map_.Locate(t));
    if (place.blocks == nullptr) {
      names[place.part].push_back(t);
      continue;
    }
    for (const Block& b : *place.blocks) names[b.part].push_back(t);
  }
  // Every daemon when no tensors are named (all of them), else those of
  // the named tensors.
  std::vector<int> which;
  for (int i = 0; i < n(); ++i) {
    if (tensors.empty() || !names[i].empty()) which.push_back(i);
  }
  std::vector<v1::HandOffResponse> got(n());
  ZF_RETURN_IF_ERROR(Each(which, [&](int i) -> absl::Status {
    ZF_ASSIGN_OR_RETURN(got[i], clients_[i]->HandOff(version, leave[i], names[i]));
    return absl::OkStatus();
  }));
  v1::HandOffResponse out;
  // A split tensor's joining columns come from each block's daemon: one
  // ColumnState of the tensor's columns, in column order, as one daemon gives.
  std::map<std::string, std::vector<std::pair<int64_t, v1::ColumnState>>> split;
  for (int i : which) {
    for (v1::ColumnState& cs : *got[i].mutable_joining()) {
      const Block* b = PartitionMap::BlockOn(map_.SplitOf(cs.tensor()), i);
      if (b == nullptr) {
        *out.add_joining() = std::move(cs);
        continue;
      }
      split[cs.tensor()].push_back({b->first, std::move(cs)});
    }
  }
  for (auto& [name, pieces] : split) {
    std::sort(pieces.begin(), pieces.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    v1::ColumnState* whole = out.add_joining();
    whole->set_tensor(name);
    for (auto& [first, cs] : pieces) AppendState(cs, first, whole);
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<float>>> PartitionedClient::AllReduce(
    int64_t step, const std::vector<std::pair<std::string, const std::vector<float>*>>& parts) {
  // A part named after a tensor goes to that tensor's daemon, any other to
  // the first: every rank sends each name to the same daemon.
  std::vector<std::vector<std::pair<std::string, const std::vector<float>*>>> by(n());
  std::vector<std::pair<int, size_t>> where(parts.size());
  for (size_t k = 0; k < parts.size(); ++k) {
    absl::StatusOr<int> p = map_.PartOf(parts[k].first);
    if (!p.ok() && p.status().code() == absl::StatusCode::kFailedPrecondition) return p.status();
    const int d = p.ok() ? *p : 0;
    where[k] = {d, by[d].size()};
    by[d].push_back(parts[k]);
  }
  std::vector<int> which;
  for (int i = 0; i < n(); ++i) {
    if (!by[i].empty()) which.push_back(i);
  }
  std::vector<std::vector<std::vector<float>>> got(n());
  ZF_RETURN_IF_ERROR(Each(which, [&](int i) -> absl::Status {
    ZF_ASSIGN_OR_RETURN(got[i], clients_[i]->AllReduce(step, by[i]));
    return absl::OkStatus();
  }));
  std::vector<std::vector<float>> out(parts.size());
  for (size_t k = 0; k < parts.size(); ++k) out[k] = std::move(got[where[k].first][where[k].second]);
  return out;
}

// ---- Data ---------------------------------------------------------------------

absl::Status PartitionedClient::PushUp(v1::UpMessage msg) {
  switch (msg.kind_case()) {
    case v1::UpMessage::kShard:
      return PushShardMessage(std::move(msg));
    case v1::UpMessage::kClose:
      for (int i = 0; i < n(); ++i) ZF_RETURN_IF_ERROR(Named(i, clients_[i]->PushUp(msg)));
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          "with several daemons an up message must be a shard or a round close");
  }
}

absl::Status PartitionedClient::PushShardMessage(v1::UpMessage msg) {
  const v1::GradientShard& shard = msg.shard();
  ZF_ASSIGN_OR_RETURN(Place place, map_.Locate(shard.tensor()));
  if (place.blocks == nullptr) return Named(place.part, clients_[place.part]->PushUp(std::move(msg)));
  const int64_t n = shard.columns_size();
  const size_t per = n == 0 ? 0 : shard.payload().size() / static_cast<size_t>(n);
  if (n == 0 || per * static_cast<size_t>(n) != shard.payload().size() ||
      (shard.scales_size() != 0 && shard.scales_size() != n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard of tensor '", shard.tensor(), "' (split into column blocks): ",
        shard.payload().size(), " payload bytes and ", shard.scales_size(), " scales for ", n,
        " columns; need the same bytes for every column, and no scales or one per column"));
  }
  ZF_ASSIGN_OR_RETURN(std::vector<Piece> pieces, map_.Pieces(shard.tensor(), shard.columns().data(), n));
  for (const Piece& pc : pieces) {
    v1::UpMessage part;
    v1::GradientShard* s = part.mutable_shard();
    s->set_step(shard.step());
    s->set_tensor(shard.tensor());
    s->set_selection_version(shard.selection_version());
    s->set_dtype(shard.dtype());
    s->mutable_columns()->Add(pc.local.begin(), pc.local.end());
    s->set_payload(shard.payload().substr(pc.begin * per, (pc.end - pc.begin) * per));
    if (shard.scales_size() != 0) {
      s->mutable_scales()->Add(shard.scales().begin() + pc.begin, shard.scales().begin() + pc.end);
    }
    ZF_RETURN_IF_ERROR(Named(pc.part, clients_[pc.part]->PushUp(std::move(part))));
  }
  return absl::OkStatus();
}

absl::Status PartitionedClient::PushToParts(
    const std::string& tensor, const int32_t* columns, int64_t ncols,
    const std::function<absl::Status(OneDaemonClient*, const int32_t*, int64_t, int64_t)>& push) {
  ZF_ASSIGN_OR_RETURN(std::vector<Piece> pieces, map_.Pieces(tensor, columns, ncols));
  for (const Piece& pc : pieces) {
    ZF_RETURN_IF_ERROR(Named(pc.part, push(clients_[pc.part].get(), pc.cols(columns), pc.begin,
                                           pc.end - pc.begin)));
  }
  return absl::OkStatus();
}

absl::Status PartitionedClient::PushColumns(int64_t step, const std::string& tensor,
                                            int64_t version, const std::vector<int32_t>& columns,
                                            const float* col_major, int64_t rows, DType dtype) {
  return PushToParts(tensor, columns.data(), static_cast<int64_t>(columns.size()),
                     [&](OneDaemonClient* c, const int32_t* cols, int64_t begin, int64_t n) {
                       return c->PushColumns(step, tensor, version,
                                             std::vector<int32_t>(cols, cols + n),
                                             col_major + begin * rows, rows, dtype);
                     });
}

absl::Status PartitionedClient::PushEncodedBorrowed(int64_t step, const std::string& tensor,
                                                    int64_t version, const int32_t* columns,
                                                    int64_t ncols, const char* payload,
                                                    int64_t rows, DType dtype,
                                                    std::function<void()> release) {
  // Released once every piece's daemon let go of it.
  auto hold = std::make_shared<Releaser>(std::move(release));
  const int64_t col_bytes = rows * static_cast<int64_t>(DTypeSize(dtype));
  return PushToParts(tensor, columns, ncols,
                     [&](OneDaemonClient* c, const int32_t* cols, int64_t begin, int64_t n) {
                       return c->PushEncodedBorrowed(step, tensor, version, cols, n,
                                                     payload + begin * col_bytes, rows, dtype,
                                                     [hold] {});
                     });
}

absl::Status PartitionedClient::PushInt8Borrowed(int64_t step, const std::string& tensor,
                                                 int64_t version, const int32_t* columns,
                                                 int64_t ncols, const int8_t* payload,
                                                 const float* scales, int64_t rows,
                                                 std::function<void()> release) {
  auto hold = std::make_shared<Releaser>(std::move(release));
  return PushToParts(tensor, columns, ncols,
                     [&](OneDaemonClient* c, const int32_t* cols, int64_t begin, int64_t n) {
                       return c->PushInt8Borrowed(step, tensor, version, cols, n,
                                                  payload + begin * rows, scales + begin, rows,
                                                  [hold] {});
                     });
}

absl::Status PartitionedClient::CloseRound(int64_t round, float lr, int32_t steps,
                                           const WorkerReport& report) {
  for (int i = 0; i < n(); ++i) {
    ZF_RETURN_IF_ERROR(Named(i, clients_[i]->CloseRound(round, lr, steps, report)));
  }
  return absl::OkStatus();
}

absl::Status PartitionedClient::Flush(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < n(); ++i) {
    ZF_RETURN_IF_ERROR(
        Named(i, clients_[i]->Flush(std::max(deadline - absl::Now(), absl::ZeroDuration()))));
  }
  return absl::OkStatus();
}

void PartitionedClient::Recycle(std::string buffer) {
  size_t i;
  {
    MutexLock lock(&mu_);
    i = recycle_next_++ % clients_.size();
  }
  clients_[i]->Recycle(std::move(buffer));
}

std::vector<absl::Status> PartitionedClient::TakeErrors() {
  std::vector<absl::Status> got;
  for (int i = 0; i < n(); ++i) {
    for (const absl::Status& s : clients_[i]->TakeErrors()) got.push_back(Named(i, s));
  }
  MutexLock lock(&mu_);
  std::vector<absl::Status> out = std::move(errors_);
  errors_.clear();
  out.insert(out.end(), got.begin(), got.end());
  return out;
}

bool PartitionedClient::WaitForErrors(size_t want, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::vector<absl::Status> got;
    for (int i = 0; i < n(); ++i) {
      for (const absl::Status& s : clients_[i]->TakeErrors()) got.push_back(Named(i, s));
    }
    {
      MutexLock lock(&mu_);
      errors_.insert(errors_.end(), got.begin(), got.end());
      if (errors_.size() >= want) return true;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

absl::Status PartitionedClient::stream_status() {
  for (int i = 0; i < n(); ++i) ZF_RETURN_IF_ERROR(Named(i, clients_[i]->stream_status()));
  return absl::OkStatus();
}

ClientStats PartitionedClient::stats() {
  ClientStats out;
  for (int i = 0; i < n(); ++i) {
    const ClientStats s = clients_[i]->stats();
    out.messages_sent += s.messages_sent;
    out.bytes_sent += s.bytes_sent;
    out.bytes_received += s.bytes_received;
    out.send_blocked_seconds += s.send_blocked_seconds;
    out.wait_seconds += s.wait_seconds;
    out.stream_errors += s.stream_errors;
    out.ucx_frames_dropped += s.ucx_frames_dropped;
    out.shard_bytes_sent += s.shard_bytes_sent;
    out.deltas_received += s.deltas_received;
    out.delta_bytes_received += s.delta_bytes_received;
    out.reconnects += s.reconnects;
    out.rounds_dropped_duplicate += s.rounds_dropped_duplicate;
    out.replay_log_bytes += s.replay_log_bytes;
    out.replay_log_entries += s.replay_log_entries;
    // Whole rounds: every daemon's part of each.
    out.rounds_received = i == 0 ? s.rounds_received : std::min(out.rounds_received, s.rounds_received);
  }
  return out;
}
}  // namespace zenflow
