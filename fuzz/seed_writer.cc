// Writes the fuzz targets' seed corpora: small inputs made of valid
// messages, each checked against a real job as it is made (a seed whose
// messages the job refuses is an error here, not a weak seed).
//
//   bazel run //fuzz:seed_writer -- "$PWD/fuzz/corpus"
//
// writes <dir>/<target>/<name> for every target, replacing files of the
// same name and leaving others.
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/crc32c.h"
#include "common/ucx_frame.h"
#include "fuzz/fuzz_job.h"
#include "fuzz/input.h"
#include "fuzz/ops.h"
#include "fuzz/scenarios.h"
#include "server/checkpoint_file.h"

namespace zenflow {
namespace fuzz {
namespace {

std::string g_out;
int g_written = 0;

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "seed_writer: %s\n", why.c_str());
  std::exit(1);
}

void Must(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Fail(absl::StrCat(what, ": ", s.ToString()));
}

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = g_out + "/" + target;
  mkdir(g_out.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) Fail("cannot write " + dir + "/" + name);
  ++g_written;
}

std::string UcxFrame(v1::UpMessage m) {
  std::string payload, header;
  SplitFrame(&m, &payload, &header);
  return payload + header;
}

std::string UcxFrame(v1::DownMessage m) {
  std::string payload, header;
  SplitFrame(&m, &payload, &header);
  return payload + header;
}

// An up message applied to the job (it must be accepted) and added to the
// seed as an op, over UCX or gRPC.
void Up(const FuzzJob& job, int32_t rank, const v1::UpMessage& m, bool ucx,
        FuzzInputWriter* seed) {
  Must(Ingest(job, rank, ucx ? Wire::kUcx : Wire::kGrpc, absl::OkStatus(), m),
       absl::StrCat("seed message ", m.ShortDebugString()));
  seed->Record(OpTag(ucx ? kOpUcxUp : kOpGrpcUp, rank),
               ucx ? UcxFrame(m) : m.SerializeAsString());
}

// A shard of `cols` of tensor `ts` for `step` in dtype `dt`, values made
// from their position.
v1::UpMessage Shard(const v1::TensorSpec& ts, int64_t step, int64_t version,
                    const std::vector<int32_t>& cols, v1::DType dt) {
  const int64_t rows = ts.shape_size() == 2 ? ts.shape(0) : 1;
  v1::UpMessage m;
  m.set_seq(static_cast<uint64_t>(step * 100 + cols.size()));
  v1::GradientShard* s = m.mutable_shard();
  s->set_step(step);
  s->set_tensor(ts.name());
  s->set_selection_version(version);
  s->set_dtype(dt);
  std::vector<float> g;
  for (int32_t c : cols) {
    s->add_columns(c);
    for (int64_t r = 0; r < rows; ++r) g.push_back(0.03125f * ((r + 3 * c + step) % 9) - 0.125f);
  }
  if (dt == v1::DTYPE_INT8) {
    std::string q;
    for (size_t i = 0; i < g.size(); ++i) q.push_back(static_cast<char>(static_cast<int>(i % 7) - 3));
    s->set_payload(q);
    for (size_t i = 0; i < cols.size(); ++i) s->add_scales(0.015625f);
    return m;
  }
  const DType codec = dt == v1::DTYPE_FP32 ? DType::kF32
                      : dt == v1::DTYPE_FP16 ? DType::kF16
                                             : DType::kBF16;
  std::string payload(g.size() * DTypeSize(codec), '\0');
  Encode(codec, g.data(), g.size(), payload.data());
  s->set_payload(payload);
  return m;
}

std::vector<int32_t> Range(int64_t n) {
  std::vector<int32_t> out;
  for (int32_t c = 0; c < n; ++c) out.push_back(c);
  return out;
}

v1::UpMessage Close(int64_t round) {
  v1::UpMessage m;
  m.set_seq(static_cast<uint64_t>(1000 + round));
  m.mutable_close()->set_round(round);
  m.mutable_close()->set_lr(0.01f);
  v1::StepReport* r = m.mutable_close()->add_step_reports();
  r->set_step_seconds(0.02);
  r->set_stall_seconds(0.001);
  r->set_up_bytes(512);
  r->set_down_bytes(256);
  return m;
}

// Every rank sends every column of every tensor for round `round`'s steps
// (selection version 0: nothing is important) and closes it.
void FullRound(const FuzzJob& job, int64_t round, FuzzInputWriter* seed) {
  const int64_t s = job.spec.zenflow().update_interval();
  for (int32_t rank = 0; rank < job.spec.world_size(); ++rank) {
    for (int64_t step = round * s; step < round * s + s; ++step) {
      int i = 0;
      for (const v1::TensorSpec& ts : job.spec.tensors()) {
        const int64_t cols = ts.shape_size() == 2 ? ts.shape(1) : ts.shape(0);
        Up(job, rank, Shard(ts, step, 0, Range(cols), job.spec.wire_dtype()), (i++ + step) % 2 == 1,
           seed);
      }
    }
    Up(job, rank, Close(round), rank == 1, seed);
  }
  Must(JobState(job.job.get()).status(), "drain");
}

void ShardSeeds() {
  struct Variant {
    uint8_t config;
    const char* name;
    int rounds;
  };
  const Variant variants[] = {
      {0, "bf16_one_rank", 2},    {1 | 2, "fp32_two_ranks", 1}, {4, "fp16", 1},
      {6, "int8", 1},             {16, "zero_offload", 2},      {1 | 32, "rank_ordered", 1},
      {64 | 8 | 2, "arith_skip", 1},
  };
  for (const Variant& v : variants) {
    absl::StatusOr<FuzzJob> job = StartShardJob(v.config);
    Must(job.status(), "shard job");
    FuzzInputWriter seed;
    seed.Byte(v.config);
    for (int r = 0; r < v.rounds; ++r) FullRound(*job, r, &seed);
    Write("shard", v.name, seed.bytes());
    DeleteAllJobs();
  }
  // A non-finite gradient, which a job with skip_nonfinite_rounds takes.
  {
    const uint8_t config = 8 | 2;  // fp32 wire
    absl::StatusOr<FuzzJob> job = StartShardJob(config);
    Must(job.status(), "shard job");
    FuzzInputWriter seed;
    seed.Byte(config);
    v1::UpMessage m = Shard(job->spec.tensors(0), 0, 0, {1}, v1::DTYPE_FP32);
    std::string* p = m.mutable_shard()->mutable_payload();
    const float inf = HUGE_VALF;
    std::memcpy(p->data() + 4, &inf, 4);
    Up(*job, 0, m, false, &seed);
    Write("shard", "nonfinite", seed.bytes());
    DeleteAllJobs();
  }
}

// Scores chosen so that selections 1 and 2 differ.
const char kScores1[] = "\x09\x01\x07\x02\x00\x00\x00\x00\x03\x08";
const char kScores2[] = "\x01\x09\x02\x07\x00\x00\x00\x00\x08\x03";

// Each rank's valid hand-off of the job's current selection (the leaving
// columns' state as the daemon holds it), applied and added as ops.
void HandOffs(const HandOffJob& h, FuzzInputWriter* seed) {
  for (int32_t rank = 0; rank < h.job.spec.world_size(); ++rank) {
    v1::HandOffRequest req;
    req.set_job_id(h.job.spec.job_id());
    req.set_rank(rank);
    req.set_version(h.selection.version());
    for (const v1::TensorSpec& ts : h.job.spec.tensors()) {
      const std::vector<int32_t> leaving = LeavingColumns(h.previous, h.selection, ts.name());
      if (leaving.empty()) continue;
      absl::StatusOr<v1::ColumnState> state = h.job.job->ReadColumns(ts.name(), leaving);
      Must(state.status(), "read leaving columns");
      *req.add_leaving() = *state;
    }
    Must(h.job.job->HandOff(req).status(), absl::StrCat("seed hand-off ", req.ShortDebugString()));
    seed->Record(OpTag(kOpHandOff, 0), req.SerializeAsString());
  }
}

// After the hand-off: every rank sends the unimportant columns of the round
// at the selection's step and closes it.
void RoundAfter(const HandOffJob& h, FuzzInputWriter* seed) {
  const int64_t step = h.selection.step();
  for (int32_t rank = 0; rank < h.job.spec.world_size(); ++rank) {
    for (const v1::TensorSpec& ts : h.job.spec.tensors()) {
      if (ts.shape_size() != 2) continue;
      std::vector<int32_t> cols;
      for (int32_t c = 0; c < ts.shape(1); ++c) {
        bool important = false;
        for (const v1::ColumnSet& cs : h.selection.important()) {
          if (cs.tensor() != ts.name()) continue;
          for (int32_t i : cs.columns()) important = important || i == c;
        }
        if (!important) cols.push_back(c);
      }
      if (cols.empty()) continue;
      Up(h.job, rank, Shard(ts, step, h.selection.version(), cols, v1::DTYPE_FP32), rank == 0,
         seed);
    }
    Up(h.job, rank, Close(step), false, seed);
  }
  Must(JobState(h.job.job.get()).status(), "drain");
}

void HandOffSeeds() {
  for (uint8_t config : {0, 1, 2, 3}) {
    absl::StatusOr<HandOffJob> h = StartHandOffJob(config, kScores1, kScores2, "handoff");
    Must(h.status(), "hand-off job");
    FuzzInputWriter seed;
    seed.Byte(config).Record(0, kScores1).Record(0, kScores2);
    HandOffs(*h, &seed);
    RoundAfter(*h, &seed);
    Write("hand_off", absl::StrCat("config", static_cast<int>(config)), seed.bytes());
    DeleteAllJobs();
  }
}

v1::AllReduceRequest Reduce(int32_t rank, int64_t step, bool replay) {
  v1::AllReduceRequest req;
  req.set_job_id("allreduce");
  req.set_rank(rank);
  req.set_step(step);
  req.set_replay(replay);
  const float g[4] = {0.5f * rank, -1.25f, 3.0f + step, 1e-3f};
  v1::ReducePart* a = req.add_parts();
  a->set_name("grad.w");
  a->set_payload(g, sizeof(g));
  v1::ReducePart* b = req.add_parts();
  b->set_name("loss");
  b->set_payload(g + 2, 4);
  return req;
}

void AllReduceSeeds() {
  for (int world = 1; world <= 3; ++world) {
    FuzzInputWriter seed;
    seed.Byte(static_cast<uint8_t>(world - 1));
    for (int64_t step = 0; step < 2; ++step) {
      for (int32_t r = 0; r < world; ++r) seed.Record(0, Reduce(r, step, false).SerializeAsString());
    }
    Write("all_reduce", absl::StrCat("world", world), seed.bytes());
  }
  // A call, its retry, a withdrawn call, a replay and a deletion.
  FuzzInputWriter seed;
  seed.Byte(1);
  seed.Record(0, Reduce(0, 5, false).SerializeAsString());
  seed.Record(0, Reduce(0, 5, false).SerializeAsString());
  seed.Record(2, std::string(1, '\x01'));
  seed.Record(0, Reduce(1, 5, true).SerializeAsString());
  seed.Record(1 + 4 * 0, Reduce(1, 6, false).SerializeAsString());
  seed.Record(3, "");
  seed.Record(0, Reduce(0, 6, false).SerializeAsString());
  Write("all_reduce", "retry_withdraw_replay_delete", seed.bytes());
}

void JobSpecSeeds() {
  Write("job_spec", "shard_job", ShardJobSpec(0).SerializeAsString());
  Write("job_spec", "shard_job_variants", ShardJobSpec(1 | 6 | 8 | 32 | 64).SerializeAsString());
  v1::JobSpec z = ShardJobSpec(16);
  z.set_job_id("zero-offload.1");
  Write("job_spec", "zero_offload", z.SerializeAsString());
  v1::JobSpec spec;
  spec.set_job_id("llm_layer");
  for (const char* name : {"wq", "wk"}) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(name);
    t->add_shape(256);
    t->add_shape(512);
  }
  v1::TensorSpec* emb = spec.add_tensors();
  emb->set_name("tok_emb");
  emb->add_shape(64);
  emb->add_shape(32);
  emb->set_local(true);
  emb->set_dtype(v1::DTYPE_FP16);
  spec.set_world_size(4);
  spec.mutable_adamw()->set_lr(3e-4f);
  spec.mutable_adamw()->set_max_grad_norm(1.0f);
  spec.mutable_zenflow()->set_update_interval(4);
  spec.mutable_zenflow()->set_select_interval(8);
  spec.mutable_zenflow()->set_full_warmup_rounds(2);
  spec.mutable_zenflow()->mutable_apply_delay()->set_steps(2);
  spec.set_max_shard_bytes(64 << 10);
  Write("job_spec", "layer_four_ranks", spec.SerializeAsString());
  for (const v1::JobSpec& s : {ShardJobSpec(0), ShardJobSpec(1 | 6 | 8 | 32 | 64), z, spec}) {
    Must(CreateFuzzJob(s).status(), "seed spec " + s.job_id());
    DeleteAllJobs();
  }
}

// A job's state as the checkpoint target's sections, for job "ck".
void AddSections(const std::map<std::string, std::string>& state, FuzzInputWriter* seed) {
  for (const auto& [name, bytes] : state) {
    std::string data = bytes;
    if (name == "spec") {
      v1::JobSpec spec;
      if (!spec.ParseFromString(bytes)) Fail("snapshot spec");
      spec.set_job_id("ck");
      data = spec.SerializeAsString();
    }
    seed->Record(static_cast<uint8_t>(name.size()), name + data);
  }
  seed->Record(0xff, "");
}

void CheckpointSeeds() {
  {
    absl::StatusOr<FuzzJob> job = StartShardJob(1 | 2);
    Must(job.status(), "shard job");
    FuzzInputWriter ops;
    FullRound(*job, 0, &ops);
    absl::StatusOr<std::map<std::string, std::string>> state = JobState(job->job.get());
    Must(state.status(), "snapshot");
    FuzzInputWriter seed;
    seed.Byte(1);
    AddSections(*state, &seed);
    Write("checkpoint", "shard_two_ranks_round1", seed.bytes());
    DeleteAllJobs();
  }
  {
    absl::StatusOr<HandOffJob> h = StartHandOffJob(2, kScores1, kScores2, "handoff");
    Must(h.status(), "hand-off job");
    absl::StatusOr<std::map<std::string, std::string>> state = JobState(h->job.job.get());
    Must(state.status(), "snapshot");
    FuzzInputWriter seed;
    seed.Byte(1);
    AddSections(*state, &seed);
    // What the ranks do next, against the restored job.
    HandOffs(*h, &seed);
    RoundAfter(*h, &seed);
    Write("checkpoint", "reselected_then_handoff", seed.bytes());
    DeleteAllJobs();
  }
  {
    v1::JobSpec spec = ShardJobSpec(0);
    spec.set_job_id("fresh");
    absl::StatusOr<FuzzJob> job = CreateFuzzJob(spec);
    Must(job.status(), "fresh job");
    absl::StatusOr<std::map<std::string, std::string>> state = JobState(job->job.get());
    Must(state.status(), "snapshot");
    FuzzInputWriter seed;
    seed.Byte(1);
    AddSections(*state, &seed);
    Write("checkpoint", "fresh_job", seed.bytes());
    DeleteAllJobs();
  }
  // Raw files: a header of no sections, and one of an empty "spec" section
  // (zero-padded to 4096 by the target), with their checksums right.
  for (int sections = 0; sections <= 1; ++sections) {
    std::string header("ZFCKPT\0\1", 8);
    const uint32_t version = 1, count = static_cast<uint32_t>(sections);
    header.append(reinterpret_cast<const char*>(&version), 4);
    header.append(reinterpret_cast<const char*>(&count), 4);
    if (sections == 1) {
      std::string entry(56, '\0');
      std::memcpy(entry.data(), "spec", 4);
      const uint64_t offset = 4096;
      std::memcpy(entry.data() + 32, &offset, 8);
      header += entry;
    }
    const uint32_t crc = Crc32c(header.data(), header.size());
    header.append(reinterpret_cast<const char*>(&crc), 4);
    Write("checkpoint", absl::StrCat("raw_header_", sections), std::string(1, '\0') + header);
  }
}

void UcxFrameSeeds() {
  const v1::JobSpec spec = ShardJobSpec(0);
  v1::UpMessage shard = Shard(spec.tensors(0), 3, 1, {0, 2}, v1::DTYPE_BF16);
  Write("ucx_frame", "up_shard", std::string(1, '\0') + UcxFrame(shard));
  Write("ucx_frame", "up_close", std::string(1, '\0') + UcxFrame(Close(4)));
  v1::UpMessage attach;
  attach.mutable_attach()->set_job_id("shard");
  attach.mutable_attach()->set_rank(1);
  attach.mutable_attach()->set_ucx_tag(0x1234567890abcdefULL);
  Write("ucx_frame", "up_attach", std::string(1, '\0') + UcxFrame(attach));
  v1::DownMessage delta;
  v1::ParameterDelta* d = delta.mutable_delta();
  d->set_round(2);
  d->set_tensor("w");
  d->add_columns(1);
  d->add_columns(3);
  d->set_dtype(v1::DTYPE_FP32);
  d->set_kind(v1::DELTA_VALUES);
  const float v[6] = {1, -2, 3.5f, 0.25f, -0.0f, 7};
  d->set_payload(v, sizeof(v));
  Write("ucx_frame", "down_delta", std::string(1, '\1') + UcxFrame(delta));
  v1::DownMessage done;
  done.mutable_done()->set_round(2);
  done.mutable_done()->set_delta_messages(1);
  done.mutable_done()->set_durable_rounds(1);
  Write("ucx_frame", "down_done", std::string(1, '\1') + UcxFrame(done));
  v1::DownMessage error;
  error.mutable_error()->set_seq(7);
  error.mutable_error()->set_code(3);
  error.mutable_error()->set_message("column 9 out of range");
  Write("ucx_frame", "down_error", std::string(1, '\1') + UcxFrame(error));
}

}  // namespace
}  // namespace fuzz
}  // namespace zenflow

int main(int argc, char** argv) {
  using namespace zenflow::fuzz;
  if (argc != 2) {
    std::fprintf(stderr, "usage: seed_writer CORPUS_DIR\n");
    return 2;
  }
  g_out = argv[1];
  ShardSeeds();
  HandOffSeeds();
  AllReduceSeeds();
  JobSpecSeeds();
  CheckpointSeeds();
  UcxFrameSeeds();
  std::printf("seed_writer: %d seeds under %s\n", g_written, g_out.c_str());
  return 0;
}
