// One optimizer job: its making, its checks, the ranks' membership and
// liveness, and reads and writes of its state; see job.h. The rounds are in
// job_rounds.cc, the selection and hand-off in job_selection.cc, the upload
// in job_upload.cc and checkpoints in job_checkpoint.cc.
#include "server/job.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype_proto.h"
#include "common/geometry.h"
#include "common/status_macros.h"
#include "common/stream_error.h"
#include "server/quote.h"

namespace zenflow {

absl::StatusOr<std::shared_ptr<Job>> Job::Create(const v1::JobSpec& spec, JobContext ctx) {
  ZF_ASSIGN_OR_RETURN(JobFootprint f, ComputeJobFootprint(spec));
  try {
    return std::shared_ptr<Job>(new Job(spec, ctx, f));
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "job '%s': allocating %d bytes for %d parameters failed (out of memory); "
      "nothing was kept",
      spec.job_id(), f.total(), f.params));
}

Job::Job(const v1::JobSpec& spec, JobContext ctx, const JobFootprint& footprint)
    : spec_(spec),
      ctx_(ctx),
      world_(spec.world_size()),
      interval_(spec.zenflow().update_interval()),
      auto_interval_(spec.mode() == v1::MODE_ZENFLOW && spec.zenflow().auto_update_interval()),
      selection_(spec.world_size()),
      footprint_(footprint),
      strand_(ctx.scheduler->NewStrand()),
      recycler_(std::make_shared<DeltaRecycler>(footprint.delta_bytes)),
      hand_off_(spec.world_size(), spec.tensors_size()),
      all_reduce_(spec.world_size()) {
  tensors_.resize(spec.tensors_size());
  for (int i = 0; i < spec.tensors_size(); ++i) {
    const v1::TensorSpec& ts = spec.tensors(i);
    TensorState& t = tensors_[i];
    t.name = ts.name();
    const ColumnGeometry geo = GeometryOf(ts);
    t.rows = geo.rows;
    t.cols = geo.cols;
    t.always_important = AlwaysImportant(ts, spec.mode());
    t.param_dtype = *FromProto(ts.dtype(), "dtype");
    const size_t n = static_cast<size_t>(t.rows * t.cols);
    params_ += static_cast<int64_t>(n);
    t.important.assign(t.cols, 0);  // version 0: every column remote
    t.select_cols = t.cols;
  }
  if (spec.has_partition()) {
    // Blocks of split tensors (CheckPartition has checked the map): where
    // this part's block starts and how many columns the whole tensor has.
    const v1::Partition& p = spec.partition();
    int mine = 0;
    for (int i = 0; i < p.tensors_size(); ++i) {
      const v1::PartitionEntry& e = p.tensors(i);
      if (e.part() != p.part()) continue;
      TensorState& t = tensors_[mine++];
      if (e.columns() == 0) continue;
      t.block_first = e.first_column();
      int j = i;
      while (j > 0 && p.tensors(j - 1).tensor() == e.tensor()) --j;
      t.select_cols = 0;
      for (; j < p.tensors_size() && p.tensors(j).tensor() == e.tensor(); ++j) {
        t.select_cols += p.tensors(j).columns();
      }
    }
  }
  std::vector<TensorStore::Shape> shapes;
  for (const TensorState& t : tensors_) shapes.push_back({t.rows, t.cols});
  store_ = std::make_unique<TensorStore>(
      shapes, spec_.optimizer_state() == "8bit" ? StateFormat::k8bit : StateFormat::kFp32);
  acc_ = std::make_unique<RoundAccumulator>(shapes, world_, spec.rank_ordered_sums());
  divergence_ = std::make_unique<UpdateDivergence>(shapes, world_, spec.rank_ordered_sums(),
                                                   interval_,
                                                   UpdateDivergence::SeedOf(spec.job_id()));
  for (const TensorState& t : tensors_) update_tensors_.push_back({t.name, t.rows, t.param_dtype});
  ranks_.resize(world_);
  for (RankState& r : ranks_) r.mailbox = std::make_shared<Mailbox>(ctx_.outbox_limit_bytes);
}

absl::Status Job::CheckLive() const {
  if (deleted_) {
    return absl::NotFoundError(absl::StrCat("job '", spec_.job_id(), "' was deleted"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Job::TensorIndex(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return absl::NotFoundError(
      absl::StrCat("job '", spec_.job_id(), "' has no tensor ", Quote(name)));
}

absl::Status Job::CheckRankInRange(int32_t rank) const {
  if (rank < 0 || rank >= world_) {
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " out of range [0, ", world_,
                                              ") of job '", spec_.job_id(), "'"));
  }
  return absl::OkStatus();
}

absl::Status Job::CheckRank(int32_t rank) const {
  ZF_RETURN_IF_ERROR(CheckRankInRange(rank));
  if (!ranks_[rank].joined) {
    return absl::NotFoundError(absl::StrCat("rank ", rank, " has not joined job '",
                                            spec_.job_id(), "' (call JoinJob first)"));
  }
  return absl::OkStatus();
}

absl::Status Job::CheckRoundBuffer(int64_t round) const {
  if (round - 2 >= rounds_updated_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", round, " would reuse the accumulation buffer of round ", round - 2,
        ", whose update has not finished: wait for round ", round - 2,
        "'s deltas (apply delay must not exceed update_interval)"));
  }
  return absl::OkStatus();
}

// ---- Membership and liveness ------------------------------------------------

absl::StatusOr<v1::JoinJobResponse> Job::Join(int32_t rank) {
  MutexLock lock(&mu_);
  QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(CheckLive());
  ZF_RETURN_IF_ERROR(CheckRankInRange(rank));
  if (ranks_[rank].joined) {
    return absl::AlreadyExistsError(
        absl::StrCat("rank ", rank, " already joined job '", spec_.job_id(), "'"));
  }
  ranks_[rank].joined = true;
  v1::JoinJobResponse resp;
  *resp.mutable_spec() = spec_;
  *resp.mutable_selection() = SelectionLocked();
  return resp;
}

void Job::Describe(v1::GetJobResponse* out) {
  MutexLock lock(&mu_);
  *out->mutable_spec() = spec_;
  out->set_parameters_uploaded(uploaded_);
  for (int r = 0; r < world_; ++r) {
    if (ranks_[r].joined) out->add_joined_ranks(r);
  }
  out->set_rounds_updated(rounds_updated_);
  out->set_selection_version(selection_version_);
}

void Job::Stats(v1::JobStats* out) {
  MutexLock lock(&mu_);
  out->set_job_id(spec_.job_id());
  stats_.Export(out);
  out->set_rounds_updated(rounds_updated_);
  out->set_params(params_);
  out->set_durable_rounds(durable_rounds_);
  out->set_age_seconds(absl::ToDoubleSeconds(absl::Now() - created_));
  rejected_.Export(out->mutable_rejected());
  out->set_memory_bytes(footprint_.total());
  out->set_state_bytes(footprint_.state_bytes);
  out->set_bookkeeping_bytes(footprint_.bookkeeping_bytes);
  out->set_delta_bytes(footprint_.delta_bytes);
  out->set_pending_rendezvous_bytes(all_reduce_.bytes() + selection_.bytes());
  for (int r = 0; r < world_; ++r) {
    const RankState& rs = ranks_[r];
    if (!rs.joined) continue;
    v1::RankStats* o = out->add_ranks();
    o->set_rank(r);
    o->set_next_round(rs.next_round);
    o->set_outbox_bytes(rs.mailbox->bytes());
    o->set_outbox_messages(static_cast<int64_t>(rs.mailbox->queued()));
    o->set_reading_paused(rs.mailbox->paused());
    Wire wire;
    if (rs.mailbox->attached(&wire)) {
      o->set_attached(true);
      o->set_transport(WireName(wire));
    }
    *o->mutable_worker() = rs.worker;
    rs.stall_per_step.Export(o->mutable_worker()->mutable_stall_per_step_seconds());
  }
  out->set_world_size(world_);
  if (spec_.has_partition()) *out->mutable_partition() = spec_.partition();
  for (Wire wire : {Wire::kGrpc, Wire::kUcx}) {
    v1::TransportStats* t = out->add_transports();
    t->set_transport(WireName(wire));
    t->set_shards_received(stats_.received[static_cast<int>(wire)].shards);
    t->set_shard_bytes_received(stats_.received[static_cast<int>(wire)].bytes);
    for (const RankState& rs : ranks_) {
      const Mailbox::Sent sent = rs.mailbox->sent(wire);
      t->set_deltas_sent(t->deltas_sent() + sent.deltas);
      t->set_delta_bytes_sent(t->delta_bytes_sent() + sent.bytes);
    }
  }
  out->set_update_queue_depth(rounds_closed_ - rounds_updated_);
}

absl::StatusOr<std::shared_ptr<Mailbox>> Job::MailboxFor(int32_t rank) {
  MutexLock lock(&mu_);
  ZF_RETURN_IF_ERROR(CheckLive());
  ZF_RETURN_IF_ERROR(CheckRank(rank));
  return ranks_[rank].mailbox;
}

v1::DownMessage Job::AttachedMessage(int32_t rank) {
  MutexLock lock(&mu_);
  v1::DownMessage msg;
  msg.mutable_attached()->set_selection_version(selection_version_);
  msg.mutable_attached()->set_rounds_updated(rounds_updated_);
  msg.mutable_attached()->set_durable_rounds(durable_rounds_);
  if (rank >= 0 && rank < world_) msg.mutable_attached()->set_next_round(ranks_[rank].next_round);
  return msg;
}

absl::StatusOr<std::vector<Mailbox::Message>> Job::MissedRound(int32_t rank,
                                                              int64_t rounds_done) {
  MutexLock lock(&mu_);
  ZF_RETURN_IF_ERROR(CheckLive());
  ZF_RETURN_IF_ERROR(CheckRank(rank));
  if (rounds_done < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach: rounds_done ", rounds_done, " must be >= 0"));
  }
  // Rounds this daemon updated itself are in the rank's mailbox until
  // written; only those updated before a restart can have been lost.
  if (rounds_done >= restored_rounds_ || rounds_done >= rounds_updated_) {
    return std::vector<Mailbox::Message>{};
  }
  if (rounds_done == resend_round_) return resend_;
  std::string why;
  if (rounds_done == restored_rounds_ - 1) {
    why = spec_.delta_kind() == v1::DELTA_ARITHMETIC
              ? "arithmetic deltas cannot be made again from the restored state"
              : "the checkpoint the job was restored from does not hold that round's RoundDone";
  } else {
    why = "only the newest round updated before the restart can be sent again";
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank, " of job '", spec_.job_id(), "' has the updates of rounds [0, ",
      rounds_done, ") but zenflowd restarted with ", restored_rounds_,
      " rounds updated: the deltas of rounds ", rounds_done, "..", restored_rounds_ - 1,
      " never reached the rank and ", why, "; it cannot continue exactly"));
}

void Job::Shutdown() {
  std::vector<std::function<void(absl::StatusOr<v1::Selection>)>> waiters;
  std::vector<std::shared_ptr<Mailbox>> boxes;
  {
    MutexLock lock(&mu_);
    QuiesceAddsLocked();
    deleted_ = true;
    for (const RankState& r : ranks_) {
      if (r.joined) boxes.push_back(r.mailbox);
    }
    for (auto& w : selection_.Take()) waiters.push_back(std::move(w));
  }
  const absl::Status gone = absl::NotFoundError(absl::StrCat("job '", spec_.job_id(), "' was deleted"));
  for (auto& w : waiters) w(gone);
  all_reduce_.Shutdown(gone);
  // Attached ranks hear it at once, and their streams end.
  for (const auto& box : boxes) {
    box->Push(StreamErrorMessage(gone, 0, /*fatal=*/true));
  }
}

uint64_t Job::StreamAttached(int32_t rank) {
  MutexLock lock(&mu_);
  if (rank < 0 || rank >= world_) return 0;
  ranks_[rank].streaming = true;
  ranks_[rank].absence_reported = false;
  return ++ranks_[rank].stream_number;
}

void Job::StreamEnded(int32_t rank, uint64_t stream) {
  MutexLock lock(&mu_);
  if (rank < 0 || rank >= world_ || ranks_[rank].stream_number != stream) return;
  ranks_[rank].streaming = false;
  ranks_[rank].stream_gone = std::chrono::steady_clock::now();
}

absl::StatusOr<Job::Finished> Job::FinishRank(int32_t rank, bool keep) {
  MutexLock lock(&mu_);
  if (deleted_) return absl::NotFoundError(absl::StrCat("job ", Quote(spec_.job_id()), " was deleted"));
  if (rank < 0 || rank >= world_) {
    return absl::InvalidArgumentError(absl::StrCat("finished_rank ", rank, " is not a rank of job ",
                                                   Quote(spec_.job_id()), " (world_size ",
                                                   world_, ")"));
  }
  RankState& me = ranks_[rank];
  if (!me.finished) {
    me.finished = true;
    me.keep = keep;
  }
  Finished f;
  for (const RankState& r : ranks_) {
    if (!r.finished) continue;
    ++f.ranks_finished;
    f.keep = f.keep || r.keep;
  }
  f.all = f.ranks_finished == world_;
  return f;
}

Job::Presence Job::GetPresence() {
  MutexLock lock(&mu_);
  Presence p;
  p.held_since = held_since_;
  for (const RankState& r : ranks_) {
    if (r.joined && r.streaming) ++p.attached;
    if (r.finished) ++p.finished;
  }
  p.rounds_updated = rounds_updated_;
  return p;
}

absl::Duration Job::IdleFor() {
  MutexLock lock(&mu_);
  if (uploading_) return absl::ZeroDuration();
  // Each rank's stream_gone starts at the job's creation, so the latest of
  // them is when the job last had (or was given) a reason to live.
  std::chrono::steady_clock::time_point last = ranks_.empty()
                                                   ? std::chrono::steady_clock::now()
                                                   : ranks_[0].stream_gone;
  for (const RankState& r : ranks_) {
    if (r.streaming) return absl::ZeroDuration();
    last = std::max(last, r.stream_gone);
  }
  return absl::FromChrono(std::chrono::steady_clock::now() - last);
}

void Job::FailIfRankGone(absl::Duration timeout) {
  std::vector<std::function<void(absl::StatusOr<v1::Selection>)>> waiters;
  std::vector<std::shared_ptr<Mailbox>> boxes;
  absl::Status why;
  {
    MutexLock lock(&mu_);
    if (deleted_) return;
    const auto now = std::chrono::steady_clock::now();
    int gone = -1;
    double seconds = 0;
    for (int r = 0; r < world_; ++r) {
      RankState& rs = ranks_[r];
      if (!rs.joined || rs.streaming || rs.absence_reported) continue;
      seconds = Seconds(now - rs.stream_gone);
      if (seconds < absl::ToDoubleSeconds(timeout)) continue;
      rs.absence_reported = true;
      gone = r;
      break;
    }
    if (gone < 0) return;
    why = absl::AbortedError(absl::StrCat(
        "rank ", gone, " of job '", spec_.job_id(), "' has had no data stream for ",
        static_cast<int64_t>(seconds), " s (zenflowd --dead_rank_timeout_s): the job cannot go on "
        "without it (round ", rounds_closed_, " waits for its close); a rank that kept its "
        "worker state may attach again (Client::Attach) and go on from the daemon's state, "
        "otherwise start the job's ranks again"));
    for (auto& w : selection_.Take()) waiters.push_back(std::move(w));
    for (const RankState& r : ranks_) {
      if (r.joined && r.streaming) boxes.push_back(r.mailbox);
    }
  }
  // Nobody waits and no rank is attached (a finished job): nothing to say.
  if (waiters.empty() && boxes.empty() && all_reduce_.bytes() == 0) return;
  std::fprintf(stderr, "zenflowd: %s\n", std::string(why.message()).c_str());
  for (auto& w : waiters) w(why);
  all_reduce_.FailWaiters(why);
  for (const auto& box : boxes) box->Push(StreamErrorMessage(why, 0, /*fatal=*/true));
}

void Job::SetDurableRounds(int64_t rounds) {
  MutexLock lock(&mu_);
  durable_rounds_ = std::max(durable_rounds_, rounds);
}

// ---- State ------------------------------------------------------------------

void Job::FillColumnState(int ti, const std::vector<int32_t>& cols, v1::ColumnState* out) const {
  out->set_tensor(tensors_[ti].name);
  store_->ReadColumns(ti, cols, out);
}

namespace {
// A GetState answer carries at most this much state (values, m, v).
constexpr int64_t kStateResponseBytes = 32 << 20;
}  // namespace

absl::StatusOr<v1::GetStateResponse> Job::GetState(const v1::GetStateRequest& req) {
  MutexLock lock(&mu_);
  QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(CheckLive());
  if (!uploaded_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", spec_.job_id(), "': its parameters are not uploaded yet, so it has no state"));
  }
  ZF_ASSIGN_OR_RETURN(int ti, TensorIndex(req.tensor()));
  const TensorState& t = tensors_[ti];
  if (req.first_column() < 0 || req.first_column() > t.cols) {
    return absl::OutOfRangeError(absl::StrCat("tensor '", t.name, "': first_column ",
                                              req.first_column(), " out of range [0, ", t.cols,
                                              "]"));
  }
  if (req.max_columns() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_columns ", req.max_columns(), " must be >= 0 (0: as many as fit)"));
  }
  // A round boundary: no update owns the store.
  if (!mu_.AwaitWithTimeout(
          [&] {
            AwaitHoldsMu();
            return rounds_updated_ == rounds_closed_ || deleted_;
          },
          absl::Seconds(60))) {
    return absl::DeadlineExceededError(absl::StrCat("job '", spec_.job_id(), "': round ",
                                                    rounds_updated_,
                                                    "'s update did not finish within 60 s"));
  }
  ZF_RETURN_IF_ERROR(CheckLive());
  const int64_t per_column = t.rows * 3 * static_cast<int64_t>(sizeof(float)) + 8;
  int64_t n = std::max<int64_t>(1, kStateResponseBytes / per_column);
  if (req.max_columns() > 0) n = std::min<int64_t>(n, req.max_columns());
  const int64_t end = std::min<int64_t>(t.cols, req.first_column() + n);
  std::vector<int32_t> cols;
  for (int64_t c = req.first_column(); c < end; ++c) {
    if (!t.important[c]) cols.push_back(static_cast<int32_t>(c));
  }
  v1::GetStateResponse resp;
  FillColumnState(ti, cols, resp.mutable_state());
  resp.set_next_column(static_cast<int32_t>(end));
  resp.set_selection_version(selection_version_);
  resp.set_rounds_updated(rounds_updated_);
  resp.set_columns(static_cast<int32_t>(t.cols));
  return resp;
}

absl::Status Job::SetState(const v1::SetStateRequest& req) {
  MutexLock lock(&mu_);
  QuiesceAddsLocked();
  ZF_RETURN_IF_ERROR(CheckLive());
  if (!uploaded_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", spec_.job_id(), "': upload the parameters before setting their state"));
  }
  if (selection_version_ > 0 || rounds_closed_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", spec_.job_id(), "' has started (selection version ", selection_version_, ", ",
        rounds_closed_, " rounds closed): SetState writes the state of a job before its first "
        "selection and round; create a new job to resume from saved state"));
  }
  const v1::ColumnState& in = req.state();
  ZF_ASSIGN_OR_RETURN(int ti, TensorIndex(in.tensor()));
  const TensorState& t = tensors_[ti];
  if (!store_->WellFormed(ti, in)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "': the state of ", in.columns_size(), " columns needs columns in [0, ",
        t.cols, "), ", t.rows, " values, m and v per column and one update count each; got ",
        in.values_size(), " values, ", in.m_size(), " m, ", in.v_size(), " v, ",
        in.update_counts_size(), " counts"));
  }
  std::vector<int32_t> sorted(in.columns().begin(), in.columns().end());
  std::sort(sorted.begin(), sorted.end());
  // Before the first selection every column is the daemon's (version 0).
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i] == sorted[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': column ", sorted[i], " is repeated"));
    }
  }
  for (int i = 0; i < in.values_size(); ++i) {
    if (!std::isfinite(in.values(i)) || !std::isfinite(in.m(i)) || !std::isfinite(in.v(i)) ||
        in.v(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': column ", in.columns(i / t.rows), " row ", i % t.rows,
          ": values and m must be finite, v finite and >= 0 (value ", in.values(i), ", m ",
          in.m(i), ", v ", in.v(i), ")"));
    }
  }
  for (int i = 0; i < in.update_counts_size(); ++i) {
    if (in.update_counts(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': column ",
                                                     in.columns(i), ": update count ",
                                                     in.update_counts(i), " must be >= 0"));
    }
  }
  store_->WriteColumns(ti, in);
  return absl::OkStatus();
}

absl::StatusOr<v1::ColumnState> Job::ReadColumns(const std::string& tensor,
                                                 const std::vector<int32_t>& cols) {
  MutexLock lock(&mu_);
  mu_.Await([&] {
    AwaitHoldsMu();
    return rounds_updated_ == rounds_closed_;
  });
  ZF_ASSIGN_OR_RETURN(int ti, TensorIndex(tensor));
  const TensorState& t = tensors_[ti];
  for (int32_t c : cols) {
    if (c < 0 || c >= t.cols) {
      return absl::OutOfRangeError(absl::StrCat("tensor '", tensor, "': column ", c,
                                                " out of range [0, ", t.cols, ")"));
    }
  }
  v1::ColumnState out;
  FillColumnState(ti, cols, &out);
  return out;
}

}  // namespace zenflow
