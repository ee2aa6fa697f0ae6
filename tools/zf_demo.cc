// zf_demo: drives a job on a running zenflowd with several data-parallel
// ranks (one thread and one gRPC connection each) and prints what happens
// round by round. The model is a set of linear layers fitted to fixed
// targets (loss = mean squared distance plus per-rank gradient noise), so
// the loss really falls; important columns are updated on the "worker"
// (here: the CPU), the rest by the daemon, with an apply delay of one step.
//
//   zf_demo --target=127.0.0.1:50051 --rounds=12
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype_proto.h"
#include "common/malloc_tuning.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/tls_flags.h"
#include "common/codec.h"
#include "common/status_macros.h"
#include "common/adamw.h"
#include "common/random.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "zenflowd address");
ABSL_FLAG(std::string, transport, "grpc",
          "data stream transport: grpc, or ucx (shared memory with a local zenflowd; UCX_TLS "
          "reaches others)");
ABSL_FLAG(std::string, job, "demo", "job id (deleted first if it exists)");
ABSL_FLAG(int, ranks, 2, "data-parallel ranks (threads, one connection each)");
ABSL_FLAG(int, rounds, 12, "rounds after the warm-up round");
ABSL_FLAG(int, interval, 4, "update_interval S (steps per round)");
ABSL_FLAG(double, topk, 0.1, "fraction of columns updated on the worker");
ABSL_FLAG(int, width, 256, "layer width (the model has 3 tensors of about width^2)");
ABSL_FLAG(double, lr, 3e-2, "learning rate");
ABSL_FLAG(std::string, wire, "bf16", "gradient wire dtype: fp32, bf16 or fp16");

namespace zenflow {
namespace {

struct Tensor {
  std::string name;
  int64_t rows, cols;
  std::vector<float> w;       // row-major parameters (this rank's copy)
  std::vector<float> target;  // what the loss pulls w toward
  // Worker-side AdamW state of the important columns (column-major).
  std::vector<int32_t> important;
  std::vector<float> m, v;
  std::vector<int64_t> count;
};

// The gradient noise of (rank, step, element), uniform in [-0.1, 0.1). Its
// short mix of the three (splitmix64's constants, not its output function)
// is kept as it is so that the demo's figures stay what they were; the
// bits-to-[0, 1) step is common/random.h's.
float Noise(int rank, int64_t step, int64_t i) {
  uint64_t x = (static_cast<uint64_t>(rank) * kSplitMix64Gamma) ^
               (static_cast<uint64_t>(step) * 0xBF58476D1CE4E5B9ull) ^ static_cast<uint64_t>(i);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<float>(UnitInterval(x) - 0.5) * 0.2f;
}

std::vector<Tensor> MakeModel(int width) {
  std::vector<Tensor> t = {{"layers.0.w", width, 2 * width, {}, {}, {}, {}, {}, {}},
                           {"layers.0.b", 1, 2 * width, {}, {}, {}, {}, {}, {}},
                           {"layers.1.w", 2 * width, width, {}, {}, {}, {}, {}, {}}};
  for (size_t ti = 0; ti < t.size(); ++ti) {
    Tensor& x = t[ti];
    x.w.resize(x.rows * x.cols);
    x.target.resize(x.rows * x.cols);
    for (int64_t r = 0; r < x.rows; ++r) {
      for (int64_t c = 0; c < x.cols; ++c) {
        x.w[r * x.cols + c] = 0.02f * std::sin(0.1f * r + 0.07f * c + ti);
        // A few columns matter much more: importance is concentrated.
        const float scale = (c % 17 == 3) ? 2.0f : 0.2f;
        x.target[r * x.cols + c] = scale * std::cos(0.05f * r * (ti + 1) - 0.03f * c);
      }
    }
  }
  return t;
}

double Loss(const std::vector<Tensor>& model) {
  double s = 0;
  int64_t n = 0;
  for (const Tensor& t : model) {
    for (size_t i = 0; i < t.w.size(); ++i) {
      const double d = t.w[i] - t.target[i];
      s += 0.5 * d * d;
    }
    n += static_cast<int64_t>(t.w.size());
  }
  return s / static_cast<double>(n);
}

struct RoundReport {
  double loss = 0;
  double close_to_done_ms = 0;
  double stall_ms = 0;
  int64_t bytes_up = 0, bytes_down = 0;
  int64_t important = 0;
};

class Rank {
 public:
  Rank(int rank, std::unique_ptr<Client> client, absl::Barrier* ready)
      : rank_(rank), client_(std::move(client)), ready_(ready), model_(MakeModel(absl::GetFlag(FLAGS_width))) {}

  absl::Status Run(std::vector<RoundReport>* reports) {
    const std::string job = absl::GetFlag(FLAGS_job);
    const int S = absl::GetFlag(FLAGS_interval);
    const int rounds = absl::GetFlag(FLAGS_rounds) + 1;
    const float lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
    ZF_ASSIGN_OR_RETURN(v1::JoinJobResponse joined, client_->JoinJob(job, rank_));
    const v1::AdamWConfig adamw = joined.spec().adamw();
    hyper_ = AdamWHyper{lr, adamw.beta1(), adamw.beta2(), adamw.eps(), adamw.weight_decay()};
    ZF_ASSIGN_OR_RETURN(wire_, FromProto(joined.spec().wire_dtype(), "the job's wire dtype"));
    if (ready_ != nullptr) ready_->Block();
    int64_t version = 0;
    std::vector<float> importance_acc;
    for (int64_t round = 0; round < rounds; ++round) {
      // Reselect at the start of round 1 (after the warm-up round), from the
      // warm-up round's gradient magnitudes.
      if (round == 1) {
        // Rule 8: drain first (apply the warm-up round's update), then select.
        ZF_RETURN_IF_ERROR(ApplyRound(0, &(*reports)[0]));
        ZF_ASSIGN_OR_RETURN(version, Reselect(round * S));
      }
      RoundReport rep;
      const ClientStats before = client_->stats();
      for (int s = 0; s < S; ++s) {
        const int64_t step = round * S + s;
        ZF_RETURN_IF_ERROR(Step(step, version));
        // Apply delay d = 1: the previous round's update lands after the
        // first step of this round.
        if (s == 0 && round > 1) {
          ZF_RETURN_IF_ERROR(ApplyRound(round - 1, &(*reports)[round - 1]));
        }
      }
      ZF_RETURN_IF_ERROR(client_->CloseRound(round, lr));
      const ClientStats after = client_->stats();
      rep.bytes_up = after.bytes_sent - before.bytes_sent;
      (*reports)[round].bytes_up = rep.bytes_up;
      (*reports)[round].important = ImportantCount();
    }
    ZF_RETURN_IF_ERROR(ApplyRound(rounds - 1, &(*reports)[rounds - 1]));
    return absl::OkStatus();
  }

  const std::vector<Tensor>& model() const { return model_; }

 private:
  int64_t ImportantCount() const {
    int64_t n = 0;
    for (const Tensor& t : model_) n += static_cast<int64_t>(t.important.size()) * t.rows;
    return n;
  }

  std::vector<float> Grad(const Tensor& t, int ti, int64_t step) const {
    std::vector<float> g(t.w.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = (t.w[i] - t.target[i]) + Noise(rank_, step, static_cast<int64_t>(i) * 7 + ti);
    }
    return g;
  }

  absl::Status Step(int64_t step, int64_t version) {
    for (size_t ti = 0; ti < model_.size(); ++ti) {
      Tensor& t = model_[ti];
      std::vector<float> g = Grad(t, static_cast<int>(ti), step);
      last_grad_abs_.resize(model_.size());
      last_grad_abs_[ti].assign(t.cols, 0.0f);
      for (int64_t r = 0; r < t.rows; ++r) {
        for (int64_t c = 0; c < t.cols; ++c) last_grad_abs_[ti][c] += std::fabs(g[r * t.cols + c]);
      }
      // Important columns: AdamW here, every step (ranks agree because the
      // demo's ranks use the same gradient for them: the mean over ranks
      // would need an all-reduce, which is the worker engine's job).
      std::vector<float> col(t.rows), gcol(t.rows);
      for (size_t k = 0; k < t.important.size(); ++k) {
        const int32_t c = t.important[k];
        for (int64_t r = 0; r < t.rows; ++r) {
          col[r] = t.w[r * t.cols + c];
          gcol[r] = t.w[r * t.cols + c] - t.target[r * t.cols + c];
        }
        t.count[k] += 1;
        AdamWReference(hyper_, t.count[k], 1.0f, gcol.data(), col.data(), t.m.data() + k * t.rows,
                       t.v.data() + k * t.rows, t.rows);
        for (int64_t r = 0; r < t.rows; ++r) t.w[r * t.cols + c] = col[r];
      }
      // The rest goes to the daemon, column-major.
      std::vector<int32_t> remote;
      std::vector<float> colmajor;
      size_t k = 0;
      for (int32_t c = 0; c < t.cols; ++c) {
        if (k < t.important.size() && t.important[k] == c) {
          ++k;
          continue;
        }
        remote.push_back(c);
        for (int64_t r = 0; r < t.rows; ++r) colmajor.push_back(g[r * t.cols + c]);
      }
      if (!remote.empty()) {
        ZF_RETURN_IF_ERROR(
            client_->PushColumns(step, t.name, version, remote, colmajor.data(), t.rows, wire_));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ApplyRound(int64_t round, RoundReport* rep) {
    const ClientStats before = client_->stats();
    ZF_ASSIGN_OR_RETURN(RoundUpdate u, client_->WaitRound(round, absl::Seconds(120)));
    const ClientStats after = client_->stats();
    for (const v1::ParameterDelta& d : u.deltas) {
      Tensor* t = nullptr;
      for (Tensor& x : model_) {
        if (x.name == d.tensor()) t = &x;
      }
      if (t == nullptr) return absl::InternalError("delta for an unknown tensor");
      std::vector<float> vals(d.columns_size() * t->rows);
      Decode(DType::kF32, d.payload().data(), vals.size(), vals.data());
      for (int i = 0; i < d.columns_size(); ++i) {
        for (int64_t r = 0; r < t->rows; ++r) {
          t->w[r * t->cols + d.columns(i)] = vals[i * t->rows + r];
        }
      }
    }
    if (rank_ == 0) {
      rep->loss = Loss(model_);
      rep->close_to_done_ms = u.done.close_to_done_seconds() * 1e3;
      rep->stall_ms = (after.wait_seconds - before.wait_seconds) * 1e3;
      rep->bytes_down = after.bytes_received - before.bytes_received;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Reselect(int64_t step) {
    std::vector<v1::TensorImportance> imp;
    for (size_t ti = 0; ti < model_.size(); ++ti) {
      if (model_[ti].rows == 1) continue;  // 1-D: always important
      v1::TensorImportance x;
      x.set_tensor(model_[ti].name);
      x.mutable_scores()->Add(last_grad_abs_[ti].begin(), last_grad_abs_[ti].end());
      imp.push_back(x);
    }
    ZF_ASSIGN_OR_RETURN(v1::Selection sel, client_->SubmitImportance(step, imp));
    // First selection: nothing leaves (everything was remote).
    ZF_ASSIGN_OR_RETURN(v1::HandOffResponse handoff, client_->HandOff(sel.version(), {}));
    for (const v1::ColumnSet& cs : sel.important()) {
      for (Tensor& t : model_) {
        if (t.name != cs.tensor()) continue;
        t.important.assign(cs.columns().begin(), cs.columns().end());
        t.m.assign(t.important.size() * t.rows, 0.0f);
        t.v.assign(t.important.size() * t.rows, 0.0f);
        t.count.assign(t.important.size(), 0);
      }
    }
    for (const v1::ColumnState& js : handoff.joining()) {
      for (Tensor& t : model_) {
        if (t.name != js.tensor()) continue;
        for (int i = 0; i < js.columns_size(); ++i) {
          const auto it = std::lower_bound(t.important.begin(), t.important.end(), js.columns(i));
          const size_t k = static_cast<size_t>(it - t.important.begin());
          for (int64_t r = 0; r < t.rows; ++r) {
            t.w[r * t.cols + js.columns(i)] = js.values(i * t.rows + r);
            t.m[k * t.rows + r] = js.m(i * t.rows + r);
            t.v[k * t.rows + r] = js.v(i * t.rows + r);
          }
          t.count[k] = js.update_counts(i);
        }
      }
    }
    return sel.version();
  }

  const int rank_;
  std::unique_ptr<Client> client_;
  absl::Barrier* ready_;
  std::vector<Tensor> model_;
  std::vector<std::vector<float>> last_grad_abs_;
  AdamWHyper hyper_{};
  DType wire_ = DType::kBF16;
};

absl::Status RunDemo() {
  const std::string target = absl::GetFlag(FLAGS_target);
  const std::string job = absl::GetFlag(FLAGS_job);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int rounds = absl::GetFlag(FLAGS_rounds) + 1;
  if (ranks < 1 || ranks > 64 || rounds < 2 || absl::GetFlag(FLAGS_width) < 8) {
    return absl::InvalidArgumentError("need --ranks in [1, 64], --rounds >= 1, --width >= 8");
  }
  ClientOptions co;
  co.target = target;
  ApplyTlsFlags(&co);
  co.token = NewToken();  // the job's, shared by its ranks
  ZF_ASSIGN_OR_RETURN(co.transport, ParseTransport(absl::GetFlag(FLAGS_transport)));
  std::vector<std::unique_ptr<Client>> clients;
  for (int r = 0; r < ranks; ++r) {
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(co));
    clients.push_back(std::move(c));
  }
  (void)clients[0]->DeleteJob(job);  // a previous demo's job, if any
  std::vector<Tensor> model = MakeModel(absl::GetFlag(FLAGS_width));
  v1::JobSpec spec;
  spec.set_job_id(job);
  std::vector<Client::TensorValues> init;
  int64_t params = 0;
  for (const Tensor& t : model) {
    v1::TensorSpec* ts = spec.add_tensors();
    ts->set_name(t.name);
    if (t.rows == 1) {
      ts->add_shape(t.cols);
      init.push_back({t.name, {t.cols}, t.w.data()});
    } else {
      ts->add_shape(t.rows);
      ts->add_shape(t.cols);
      init.push_back({t.name, {t.rows, t.cols}, t.w.data()});
    }
    params += t.rows * t.cols;
  }
  spec.set_world_size(ranks);
  const std::string wire = absl::GetFlag(FLAGS_wire);
  absl::StatusOr<v1::DType> wire_dtype = WireDTypeFromName(wire);
  if (!wire_dtype.ok() || *wire_dtype == v1::DTYPE_INT8) {
    return absl::InvalidArgumentError("--wire must be fp32, bf16 or fp16");
  }
  spec.set_wire_dtype(*wire_dtype);
  spec.mutable_adamw()->set_lr(static_cast<float>(absl::GetFlag(FLAGS_lr)));
  spec.mutable_adamw()->set_weight_decay(0.0f);
  spec.mutable_zenflow()->set_topk_ratio(static_cast<float>(absl::GetFlag(FLAGS_topk)));
  spec.mutable_zenflow()->set_update_interval(absl::GetFlag(FLAGS_interval));
  spec.mutable_zenflow()->mutable_apply_delay()->set_steps(1);
  ZF_ASSIGN_OR_RETURN(v1::JobSpec created, clients[0]->CreateJob(spec));
  ZF_RETURN_IF_ERROR(clients[0]->UploadParameters(job, init).status());
  std::printf("job '%s': %lld parameters in %d tensors, %d ranks, k=%.2f, S=%d, wire %s, apply delay 1 step\n",
              job.c_str(), static_cast<long long>(params), created.tensors_size(), ranks,
              created.zenflow().topk_ratio(), created.zenflow().update_interval(), wire.c_str());
  std::printf("initial loss %.6f\n", Loss(model));

  std::vector<std::unique_ptr<Rank>> workers;
  absl::Barrier* ready = new absl::Barrier(ranks);  // deletes itself when the last thread passes
  for (int r = 0; r < ranks; ++r) {
    workers.push_back(std::make_unique<Rank>(r, std::move(clients[r]), ready));
  }
  std::vector<std::vector<RoundReport>> reports(ranks, std::vector<RoundReport>(rounds));
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] { status[r] = workers[r]->Run(&reports[r]); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    if (!status[r].ok()) return absl::Status(status[r].code(), absl::StrCat("rank ", r, ": ", status[r].message()));
  }
  std::printf("\n%5s %12s %16s %14s %12s %12s %s\n", "round", "loss", "update_ms", "stall_ms",
              "up_KiB", "down_KiB", "note");
  for (int64_t round = 0; round < rounds; ++round) {
    const RoundReport& rep = reports[0][round];
    std::printf("%5lld %12.6f %16.2f %14.2f %12.1f %12.1f %s\n", static_cast<long long>(round),
                rep.loss, rep.close_to_done_ms, rep.stall_ms, rep.bytes_up / 1024.0,
                rep.bytes_down / 1024.0,
                round == 0 ? "warm-up: every column through the daemon"
                           : absl::StrFormat("%lld params on the worker", static_cast<long long>(rep.important)).c_str());
  }
  // Every rank must hold the same parameters, bit for bit.
  for (int r = 1; r < ranks; ++r) {
    for (size_t ti = 0; ti < workers[0]->model().size(); ++ti) {
      if (workers[r]->model()[ti].w != workers[0]->model()[ti].w) {
        return absl::InternalError(absl::StrCat("rank ", r, " diverged from rank 0 in tensor ",
                                                workers[0]->model()[ti].name));
      }
    }
  }
  std::printf("\nfinal loss %.6f; all %d ranks hold bit-identical parameters\n",
              Loss(workers[0]->model()), ranks);
  ClientOptions co2;
  co2.target = target;
  ApplyTlsFlags(&co2);
  co2.token = co.token;
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<Client> admin, Client::Connect(co2));
  ZF_ASSIGN_OR_RETURN(v1::GetStatsResponse stats, admin->GetStats(job));
  const v1::JobStats& js = stats.jobs(0);
  std::printf("daemon: %lld shards (%.1f MiB) in, %lld rounds updated in %.1f ms total (simd %s, %d threads), "
              "%lld delta messages (%.1f MiB) out\n",
              static_cast<long long>(js.shards_received()), js.shard_bytes_received() / 1048576.0,
              static_cast<long long>(js.rounds_updated()), js.update_seconds_total() * 1e3,
              stats.simd().c_str(), stats.update_threads(),
              static_cast<long long>(js.delta_messages_sent()), js.delta_bytes_sent() / 1048576.0);
  return absl::OkStatus();
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Drives ranks of a ZenFlow job on a running zenflowd.");
  absl::ParseCommandLine(argc, argv);
  zenflow::TuneMallocForBulkBuffers();
  absl::Status s = zenflow::RunDemo();
  if (!s.ok()) {
    std::fprintf(stderr, "zf_demo: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
