// A job over several daemons; see parts.h.
#include "client/parts.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace zenflow {

absl::StatusOr<std::vector<std::string>> SplitTargets(const std::string& target) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (absl::string_view t : absl::StrSplit(target, ',')) {
    std::string s(absl::StripAsciiWhitespace(t));
    if (s.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target '", target, "' has an empty entry (want host:port or a comma-separated list)"));
    }
    if (!seen.insert(s).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("target '", target, "' lists ", s, " twice"));
    }
    out.push_back(std::move(s));
  }
  if (static_cast<int>(out.size()) > kMaxDaemons) {
    return absl::InvalidArgumentError(absl::StrCat("target lists ", out.size(),
                                                   " daemons; at most ", kMaxDaemons));
  }
  return out;
}

namespace {

bool Hosted(const v1::JobSpec& spec, const v1::TensorSpec& t) {
  if (spec.mode() == v1::MODE_ZERO_OFFLOAD) return true;
  return t.shape_size() == 2 && !t.local();
}

int64_t Params(const v1::TensorSpec& t) {
  int64_t n = 1;
  for (int64_t d : t.shape()) n *= std::max<int64_t>(d, 0);
  return n;
}

// The map without the part it was sent to: what every daemon must agree on.
std::string MapKey(v1::Partition p) {
  p.set_part(0);
  return p.SerializeAsString();
}

}  // namespace

absl::StatusOr<v1::Partition> PlanPartition(const v1::JobSpec& spec, int parts) {
  if (parts < 2) return absl::InvalidArgumentError("a partition needs at least 2 daemons");
  if (spec.tensors_size() < parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", spec.job_id(), " has ", spec.tensors_size(),
                     " tensors: it cannot be spread over ", parts,
                     " daemons (each hosts whole tensors); list at most ", spec.tensors_size()));
  }
  std::vector<int> order(spec.tensors_size());
  for (int i = 0; i < spec.tensors_size(); ++i) order[i] = i;
  auto weight = [&](int i) { return Hosted(spec, spec.tensors(i)) ? Params(spec.tensors(i)) : 0; };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight(a) > weight(b); });
  std::vector<int64_t> load(parts, 0);
  std::vector<int> count(parts, 0);
  std::vector<int> part_of(spec.tensors_size());
  for (int i : order) {
    int best = 0;
    for (int p = 1; p < parts; ++p) {
      if (std::tie(load[p], count[p]) < std::tie(load[best], count[best])) best = p;
    }
    part_of[i] = best;
    load[best] += weight(i);
    ++count[best];
  }
  v1::Partition map;
  map.set_version(1);
  map.set_parts(parts);
  for (int i = 0; i < spec.tensors_size(); ++i) {
    v1::PartitionEntry* e = map.add_tensors();
    e->set_tensor(spec.tensors(i).name());
    e->set_part(part_of[i]);
    e->set_params(Params(spec.tensors(i)));
  }
  return map;
}

v1::JobSpec PartSpec(const v1::JobSpec& spec, const v1::Partition& map, int part) {
  v1::JobSpec out = spec;
  out.clear_tensors();
  for (int i = 0; i < spec.tensors_size() && i < map.tensors_size(); ++i) {
    if (map.tensors(i).part() == part) *out.add_tensors() = spec.tensors(i);
  }
  *out.mutable_partition() = map;
  out.mutable_partition()->set_part(part);
  return out;
}

Client::Parts::Parts(std::vector<std::string> targets, std::vector<std::unique_ptr<Client>> clients)
    : targets_(std::move(targets)), clients_(std::move(clients)) {}

absl::Status Client::Parts::Named(int part, const absl::Status& s) const {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("zenflowd ", targets_[part], " (daemon ", part,
                                             " of ", n(), "): ", s.message()));
}

std::vector<int> Client::Parts::All() const {
  std::vector<int> all(n());
  for (int i = 0; i < n(); ++i) all[i] = i;
  return all;
}

absl::Status Client::Parts::Each(const std::vector<int>& which,
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

absl::Status Client::Parts::CheckPart(int i, const v1::JobSpec& s) const {
  if (!s.has_partition()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "zenflowd ", targets_[i], " hosts job ", s.job_id(), " whole (no partition), but this "
        "client lists ", n(), " daemons: list only that daemon"));
  }
  const v1::Partition& p = s.partition();
  if (p.parts() != n() || p.part() != i) {
    return absl::FailedPreconditionError(absl::StrCat(
        "zenflowd ", targets_[i], " hosts part ", p.part(), " of ", p.parts(), " of job ",
        s.job_id(), ", but this client lists it as daemon ", i, " of ", n(),
        ": list the job's daemons in the order it was created with"));
  }
  return absl::OkStatus();
}

absl::Status Client::Parts::Learn(const std::vector<v1::JobSpec>& specs) {
  std::string key;
  for (int i = 0; i < n(); ++i) {
    const v1::JobSpec& s = specs[i];
    const v1::Partition& p = s.partition();
    ZF_RETURN_IF_ERROR(CheckPart(i, s));
    if (i == 0) {
      key = MapKey(p);
    } else if (MapKey(p) != key) {
      return absl::FailedPreconditionError(absl::StrCat(
          "zenflowd ", targets_[i], " and ", targets_[0], " hold different partition maps of job ",
          s.job_id(), ": they do not host parts of the same job"));
    }
  }
  MutexLock lock(&mu_);
  map_ = specs[0].partition();
  map_.set_part(0);
  part_of_.clear();
  for (const v1::PartitionEntry& e : map_.tensors()) part_of_[e.tensor()] = e.part();
  known_ = true;
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> Client::Parts::Merge(const std::vector<v1::JobSpec>& specs) {
  ZF_RETURN_IF_ERROR(Learn(specs));
  v1::JobSpec out = specs[0];
  out.clear_tensors();
  out.mutable_partition()->set_part(0);
  for (const v1::PartitionEntry& e : out.partition().tensors()) {
    const v1::JobSpec& s = specs[e.part()];
    bool found = false;
    for (const v1::TensorSpec& t : s.tensors()) {
      if (t.name() != e.tensor()) continue;
      *out.add_tensors() = t;
      found = true;
      break;
    }
    if (!found) {
      return absl::InternalError(absl::StrCat("zenflowd ", targets_[e.part()], " does not host tensor ",
                                              e.tensor(), " that its partition map puts there"));
    }
  }
  return out;
}

absl::StatusOr<int> Client::Parts::PartOf(const std::string& tensor) {
  MutexLock lock(&mu_);
  if (!known_) {
    return absl::FailedPreconditionError(
        "the job's partition map is not known yet: call CreateJob, GetJob or JoinJob first");
  }
  auto it = part_of_.find(tensor);
  if (it == part_of_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor, "' is not in the job's partition map"));
  }
  return it->second;
}


// ---- Control ------------------------------------------------------------------

absl::StatusOr<v1::JobSpec> Client::Parts::CreateJob(const v1::JobSpec& spec) {
  if (spec.has_partition()) {
    return absl::InvalidArgumentError(
        "JobSpec.partition is chosen by the client library when its target lists several "
        "daemons: leave it unset");
  }
  ZF_ASSIGN_OR_RETURN(v1::Partition map, PlanPartition(spec, n()));
  std::vector<v1::JobSpec> created(n());
  bool exists = false;
  for (int i = 0; i < n(); ++i) {
    std::string new_token;
    absl::StatusOr<v1::JobSpec> s = clients_[i]->CreateJobTokened(PartSpec(spec, map, i), &new_token);
    // The daemons all know the job by the first one's token: a new one
    // (the caller sent none, or the admin's) goes to the others.
    if (i == 0 && !new_token.empty()) {
      for (int j = 1; j < n(); ++j) clients_[j]->SetToken(new_token);
    }
    if (s.status().code() == absl::StatusCode::kAlreadyExists) {
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
    return absl::AlreadyExistsError(absl::StrCat(
        "job ", spec.job_id(), " already exists on at least one of its ", n(), " daemons"));
  }
  return Merge(created);
}

absl::StatusOr<v1::UploadParametersResponse> Client::Parts::UploadParameters(
    const std::string& job_id, const std::vector<TensorValues>& tensors) {
  std::vector<std::vector<TensorValues>> by(n());
  for (const TensorValues& t : tensors) {
    ZF_ASSIGN_OR_RETURN(int p, PartOf(t.name));
    by[p].push_back(t);
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
  return out;
}

absl::StatusOr<v1::JoinJobResponse> Client::Parts::JoinJob(const std::string& job_id, int32_t rank) {
  std::vector<v1::JoinJobResponse> joined(n());
  for (int i = 0; i < n(); ++i) {
    absl::StatusOr<v1::JoinJobResponse> r = clients_[i]->JoinJob(job_id, rank);
    if (!r.ok()) return Named(i, r.status());
    ZF_RETURN_IF_ERROR(CheckPart(i, r->spec()));
    joined[i] = *std::move(r);
  }
  std::vector<v1::JobSpec> specs;
  for (const v1::JoinJobResponse& j : joined) specs.push_back(j.spec());
  v1::JoinJobResponse out;
  ZF_ASSIGN_OR_RETURN(*out.mutable_spec(), Merge(specs));
  v1::Selection* sel = out.mutable_selection();
  *sel = joined[0].selection();
  sel->clear_important();
  for (int i = 0; i < n(); ++i) {
    if (joined[i].selection().version() != sel->version()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job's daemons are at different selections: ", targets_[0], " at version ",
          sel->version(), ", ", targets_[i], " at ", joined[i].selection().version(),
          " (was one restored from an older checkpoint?)"));
    }
  }
  for (const v1::PartitionEntry& e : out.spec().partition().tensors()) {
    for (const v1::ColumnSet& cs : joined[e.part()].selection().important()) {
      if (cs.tensor() == e.tensor()) *sel->add_important() = cs;
    }
  }
  return out;
}

absl::Status Client::Parts::Attach(const std::string& job_id, int32_t rank) {
  for (int i = 0; i < n(); ++i) ZF_RETURN_IF_ERROR(Named(i, clients_[i]->Attach(job_id, rank)));
  return absl::OkStatus();
}

absl::StatusOr<v1::GetJobResponse> Client::Parts::GetJob(const std::string& job_id) {
  std::vector<v1::GetJobResponse> got(n());
  for (int i = 0; i < n(); ++i) {
    absl::StatusOr<v1::GetJobResponse> r = clients_[i]->GetJob(job_id);
    if (!r.ok()) return Named(i, r.status());
    ZF_RETURN_IF_ERROR(CheckPart(i, r->spec()));
    got[i] = *std::move(r);
  }
  std::vector<v1::JobSpec> specs;
  for (const v1::GetJobResponse& g : got) specs.push_back(g.spec());
  v1::GetJobResponse out = got[0];
  ZF_ASSIGN_OR_RETURN(*out.mutable_spec(), Merge(specs));
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

absl::StatusOr<v1::GetJobResponse> Client::Parts::WaitForUpload(const std::string& job_id,
                                                                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < n(); ++i) {
    ZF_RETURN_IF_ERROR(
        Named(i, clients_[i]->WaitForUpload(job_id, std::max(deadline - absl::Now(), absl::ZeroDuration()))
                     .status()));
  }
  return GetJob(job_id);
}

absl::Status Client::Parts::DeleteJob(const std::string& job_id) {
  absl::Status first;
  for (int i = 0; i < n(); ++i) {
    const absl::Status s = clients_[i]->DeleteJob(job_id);
    if (!s.ok() && first.ok()) first = Named(i, s);
  }
  return first;
}

absl::StatusOr<v1::ColumnState> Client::Parts::GetState(const std::string& job_id,
                                                        const std::string& tensor,
                                                        int64_t* selection_version) {
  ZF_ASSIGN_OR_RETURN(int p, PartOf(tensor));
  absl::StatusOr<v1::ColumnState> s = clients_[p]->GetState(job_id, tensor, selection_version);
  if (!s.ok()) return Named(p, s.status());
  return s;
}

absl::Status Client::Parts::SetState(const std::string& job_id, const v1::ColumnState& state) {
  ZF_ASSIGN_OR_RETURN(int p, PartOf(state.tensor()));
  return Named(p, clients_[p]->SetState(job_id, state));
}

absl::StatusOr<v1::GetStatsResponse> Client::Parts::GetStats(const std::string& job_id) {
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

absl::StatusOr<v1::Selection> Client::Parts::SubmitImportance(
    int64_t step, const std::vector<v1::TensorImportance>& tensors) {
  std::vector<std::vector<v1::TensorImportance>> by(n());
  for (const v1::TensorImportance& t : tensors) {
    ZF_ASSIGN_OR_RETURN(int p, PartOf(t.tensor()));
    by[p].push_back(t);
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
          "the job's daemons answered different selections for step ", step, ": ", targets_[0],
          " version ", out.version(), ", ", targets_[i], " version ", got[i].version(),
          " (was one restored from an older checkpoint?)"));
    }
  }
  v1::Partition map;
  {
    MutexLock lock(&mu_);
    map = map_;
  }
  for (const v1::PartitionEntry& e : map.tensors()) {
    for (const v1::ColumnSet& cs : got[e.part()].important()) {
      if (cs.tensor() == e.tensor()) *out.add_important() = cs;
    }
  }
  return out;
}

absl::StatusOr<v1::HandOffResponse> Client::Parts::HandOff(
    int64_t version, const std::vector<v1::ColumnState>& leaving,
    const std::vector<std::string>& tensors) {
  std::vector<std::vector<v1::ColumnState>> leave(n());
  std::vector<std::vector<std::string>> names(n());
  for (const v1::ColumnState& cs : leaving) {
    ZF_ASSIGN_OR_RETURN(int p, PartOf(cs.tensor()));
    leave[p].push_back(cs);
  }
  for (const std::string& t : tensors) {
    ZF_ASSIGN_OR_RETURN(int p, PartOf(t));
    names[p].push_back(t);
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
  for (int i : which) {
    for (v1::ColumnState& cs : *got[i].mutable_joining()) *out.add_joining() = std::move(cs);
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<float>>> Client::Parts::AllReduce(
    int64_t step, const std::vector<std::pair<std::string, const std::vector<float>*>>& parts) {
  // A part named after a tensor goes to that tensor's daemon, any other to
  // the first: every rank sends each name to the same daemon.
  std::vector<std::vector<std::pair<std::string, const std::vector<float>*>>> by(n());
  std::vector<std::pair<int, size_t>> where(parts.size());
  for (size_t k = 0; k < parts.size(); ++k) {
    absl::StatusOr<int> p = PartOf(parts[k].first);
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

absl::Status Client::Parts::PushUp(v1::UpMessage msg) {
  switch (msg.kind_case()) {
    case v1::UpMessage::kShard: {
      ZF_ASSIGN_OR_RETURN(int p, PartOf(msg.shard().tensor()));
      return Named(p, clients_[p]->PushUp(std::move(msg)));
    }
    case v1::UpMessage::kClose:
      for (int i = 0; i < n(); ++i) ZF_RETURN_IF_ERROR(Named(i, clients_[i]->PushUp(msg)));
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          "with several daemons an up message must be a shard or a round close");
  }
}

absl::Status Client::Parts::CloseRound(int64_t round, float lr, int32_t steps,
                                       const WorkerReport* report) {
  for (int i = 0; i < n(); ++i) {
    const absl::Status s = report == nullptr ? clients_[i]->CloseRound(round, lr, steps)
                                             : clients_[i]->CloseRound(round, lr, steps, *report);
    ZF_RETURN_IF_ERROR(Named(i, s));
  }
  return absl::OkStatus();
}

absl::Status Client::Parts::Flush(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < n(); ++i) {
    ZF_RETURN_IF_ERROR(
        Named(i, clients_[i]->Flush(std::max(deadline - absl::Now(), absl::ZeroDuration()))));
  }
  return absl::OkStatus();
}

absl::StatusOr<RoundUpdate> Client::Parts::Combine(std::vector<RoundUpdate> parts) {
  RoundUpdate out;
  out.round = parts[0].round;
  out.done = parts[0].done;
  double norm2 = 0;
  int32_t messages = 0;
  for (int i = 0; i < n(); ++i) {
    RoundUpdate& u = parts[i];
    const v1::RoundDone& d = u.done;
    if (d.selection_version() != out.done.selection_version() || d.steps() != out.done.steps()) {
      return absl::InternalError(absl::StrCat(
          "round ", out.round, ": the job's daemons disagree (", targets_[0], ": selection ",
          out.done.selection_version(), ", ", out.done.steps(), " steps; ", targets_[i],
          ": selection ", d.selection_version(), ", ", d.steps(), " steps)"));
    }
    for (v1::ParameterDelta& delta : u.deltas) out.deltas.push_back(std::move(delta));
    messages += d.delta_messages();
    norm2 += static_cast<double>(d.grad_norm()) * d.grad_norm();
    // What every rank gets alike, so ranks that decide from it (adaptive
    // delay, auto interval) still decide alike: the slowest daemon's times.
    out.done.set_close_to_done_seconds(
        std::max(out.done.close_to_done_seconds(), d.close_to_done_seconds()));
    out.done.set_round_interval_seconds(
        std::max(out.done.round_interval_seconds(), d.round_interval_seconds()));
    out.done.set_durable_rounds(std::min(out.done.durable_rounds(), d.durable_rounds()));
    out.done.set_skipped_nonfinite(out.done.skipped_nonfinite() || d.skipped_nonfinite());
  }
  out.done.set_delta_messages(messages);
  out.done.set_grad_norm(static_cast<float>(std::sqrt(norm2)));
  return out;
}

absl::StatusOr<RoundUpdate> Client::Parts::WaitRound(int64_t round, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<RoundUpdate> got(n());
  std::vector<bool> have(n(), false);
  int left = n();
  while (left > 0) {
    // Wait on the first daemon still owed, a second at a time; but a daemon
    // whose stream broke goes first: its wait rides through its restart or
    // fails, naming it, rather than waiting behind a daemon that cannot
    // finish the round without the ranks it lost.
    int pick = -1;
    for (int i = 0; i < n() && pick < 0; ++i) {
      if (!have[i] && !clients_[i]->stream_status().ok()) pick = i;
    }
    const bool broken = pick >= 0;
    for (int i = 0; i < n() && pick < 0; ++i) {
      if (!have[i]) pick = i;
    }
    const absl::Duration remaining = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::StatusOr<RoundUpdate> u =
        clients_[pick]->WaitRound(round, broken ? remaining : std::min(remaining, absl::Seconds(1)));
    if (u.ok()) {
      got[pick] = *std::move(u);
      have[pick] = true;
      --left;
      continue;
    }
    if (u.status().code() != absl::StatusCode::kDeadlineExceeded || absl::Now() >= deadline) {
      return Named(pick, u.status());
    }
  }
  return Combine(std::move(got));
}

absl::StatusOr<std::optional<RoundUpdate>> Client::Parts::Offer(int part, RoundUpdate u) {
  std::vector<std::optional<RoundUpdate>>& slot = partial_[u.round];
  if (slot.empty()) slot.resize(n());
  const int64_t round = u.round;
  slot[part] = std::move(u);
  for (const std::optional<RoundUpdate>& s : slot) {
    if (!s.has_value()) return std::optional<RoundUpdate>();
  }
  std::vector<RoundUpdate> all;
  for (std::optional<RoundUpdate>& s : slot) all.push_back(*std::move(s));
  partial_.erase(round);
  ZF_ASSIGN_OR_RETURN(RoundUpdate whole, Combine(std::move(all)));
  return std::optional<RoundUpdate>(std::move(whole));
}

void Client::Parts::SetRoundCallback(std::function<void(RoundUpdate)> cb) {
  {
    MutexLock lock(&rounds_mu_);
    callback_ = std::move(cb);
  }
  for (int i = 0; i < n(); ++i) {
    clients_[i]->SetRoundCallback([this, i](RoundUpdate u) {
      std::function<void(RoundUpdate)> deliver;
      {
        MutexLock lock(&rounds_mu_);
        absl::StatusOr<std::optional<RoundUpdate>> whole = Offer(i, std::move(u));
        if (!whole.ok()) {
          MutexLock elock(&mu_);
          errors_.push_back(whole.status());
          return;
        }
        if (!whole->has_value()) return;
        // Rounds complete in round order (each daemon delivers in order);
        // one thread at a time hands them on, in that order.
        whole_.push_back(**std::move(whole));
        if (delivering_) return;
        delivering_ = true;
      }
      for (;;) {
        RoundUpdate next;
        {
          MutexLock lock(&rounds_mu_);
          if (whole_.empty()) {
            delivering_ = false;
            return;
          }
          next = std::move(whole_.front());
          whole_.pop_front();
          deliver = callback_;
        }
        if (deliver) deliver(std::move(next));
      }
    });
  }
}

std::optional<RoundUpdate> Client::Parts::PollRound() {
  MutexLock lock(&rounds_mu_);
  for (int i = 0; i < n(); ++i) {
    while (std::optional<RoundUpdate> u = clients_[i]->PollRound()) {
      absl::StatusOr<std::optional<RoundUpdate>> whole = Offer(i, *std::move(u));
      if (!whole.ok()) {
        MutexLock elock(&mu_);
        errors_.push_back(whole.status());
      } else if (whole->has_value()) {
        whole_.push_back(**std::move(whole));
      }
    }
  }
  if (whole_.empty()) return std::nullopt;
  RoundUpdate u = std::move(whole_.front());
  whole_.pop_front();
  return u;
}

void Client::Parts::Recycle(std::string buffer) {
  size_t i;
  {
    MutexLock lock(&mu_);
    i = recycle_next_++ % clients_.size();
  }
  clients_[i]->Recycle(std::move(buffer));
}

std::vector<absl::Status> Client::Parts::TakeErrors() {
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

bool Client::Parts::WaitForErrors(size_t want, absl::Duration timeout) {
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

absl::Status Client::Parts::stream_status() {
  for (int i = 0; i < n(); ++i) ZF_RETURN_IF_ERROR(Named(i, clients_[i]->stream_status()));
  return absl::OkStatus();
}

ClientStats Client::Parts::stats() {
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
