// zf_train: one rank of a byte-level transformer fine-tuning run, with the
// optimizer in one of three modes:
//   local         plain AdamW in this process (the accuracy baseline);
//   zero_offload  every column's AdamW on zenflowd, every step, blocking;
//   zenflow       important columns here, the rest on zenflowd (docs/design.md rules 1-9).
// Prints a progress line (loss, step time, stall %, wire bytes) and writes a
// per-step log (CSV, or JSON lines when --log ends in .jsonl). The last line
// on stdout is a machine-readable summary: "ZF_SUMMARY {...}".
//
//   zf_train --mode=zenflow --target=127.0.0.1:50051 --rank=0 --world=2 --steps=200
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype_proto.h"
#include "common/malloc_tuning.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage_config.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/tls_flags.h"
#include "common/flags_usage.h"
#include "common/histogram.h"
#include "common/json_writer.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/worker_stats.h"
#include "common/status_macros.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/model/text_data.h"
#include "gpu_worker/model/transformer.h"
#include "gpu_worker/model/transformer_cuda.h"
#include "gpu_worker/engine/zenflow_optimizer.h"
#include "server/version.h"

ABSL_FLAG(std::string, mode, "zenflow", "local, zero_offload or zenflow");
ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "zenflowd address, or a comma-separated list of daemons to spread the job over, the "
          "same list in the same order on every rank (docs/several-daemons.md; not used by "
          "local)");
ABSL_FLAG(std::string, transport, "grpc",
          "data stream transport: grpc, or ucx (shared memory with a local zenflowd; UCX_TLS "
          "reaches others)");
ABSL_FLAG(std::string, ucx_tls, "sm,self",
          "with --transport=ucx: UCX transports (UCX_TLS syntax); they must overlap the "
          "daemon's --ucx_tls (e.g. tcp,self for a daemon on another host)");
// A string, not an absl::Duration flag: those use a sequence lock that
// ThreadSanitizer builds refuse.
ABSL_FLAG(std::string, daemon_wait, "5m",
          "how long to wait for zenflowd to come back when it goes away (a restart from "
          "--state_dir): the rank reconnects and replays what the daemon may have lost. The "
          "default, 5m, covers a systemd or Kubernetes restart (SIGTERM checkpoint, start, "
          "restore); 0s = fail at once");
ABSL_FLAG(bool, keep_job, false,
          "keep the job on zenflowd when the run ends (checkpointed first when the daemon has "
          "--state_dir); by default the job is deleted once every rank has finished");
ABSL_FLAG(std::string, job, "train", "job id on the daemon (rank 0 creates it)");
ABSL_FLAG(int64_t, split_tensor_params, 0,
          "with several daemons in --target: split a 2-D tensor of more parameters than this "
          "into column blocks over them (0: one of more than twice a daemon's share; docs/several-daemons.md)");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the job's token, sent with every call (docs/security.md); "
          "every rank of the job uses the same one. Empty: $ZENFLOW_TOKEN; neither: with one "
          "rank, the daemon makes a token for the job");
ABSL_FLAG(int, rank, 0, "this process's data-parallel rank");
ABSL_FLAG(int, world, 1, "data-parallel ranks");
ABSL_FLAG(std::string, data, "", "training text (default: a text every Debian system carries)");
ABSL_FLAG(int, layers, 2, "transformer blocks");
ABSL_FLAG(int, width, 64, "model width");
ABSL_FLAG(int, heads, 4, "attention heads");
ABSL_FLAG(int, context, 64, "sequence length");
ABSL_FLAG(int, batch, 8, "sequences per step per rank");
ABSL_FLAG(int, steps, 200, "optimizer steps");
ABSL_FLAG(double, lr, 3e-3, "learning rate (constant)");
ABSL_FLAG(double, weight_decay, 0.0, "AdamW decoupled weight decay");
ABSL_FLAG(double, topk, 0.1, "zenflow: fraction of columns updated on the worker");
ABSL_FLAG(std::string, interval, "auto",
          "zenflow: update_interval S (steps per round), or auto (the default): each round's S "
          "chosen from the daemon's measured round time, 1..--max_interval (docs/design.md rule 10)");
ABSL_FLAG(bool, predicted_step, true,
          "zenflow: the predicted step (docs/engine.md): a one-step round applied a step late is "
          "followed by the daemon's next AdamW step of its columns, run here with this step's "
          "gradient and the moments sent with the round");
ABSL_FLAG(bool, scale_round_step, false,
          "zenflow: the scaled round step (docs/design.md rule 12): a round of S steps takes one "
          "AdamW step of S x lr on the daemon (default off, as the daemon's)");
ABSL_FLAG(bool, local_step, false,
          "zenflow: the local step (docs/design.md rule 13): between rounds the daemon's columns "
          "move every step here, scaled by the factored second moment the deltas carry "
          "(default off, as the daemon's)");
ABSL_FLAG(std::string, fidelity_budget, "",
          "zenflow: the update divergence --interval=auto keeps under (docs/design.md rule 10); "
          "0 or below: no limit; empty (the default): the daemon's default");
ABSL_FLAG(int, max_interval, 4, "zenflow with --interval=auto: the longest round (S_max)");
ABSL_FLAG(std::string, interval_schedule, "",
          "zenflow with --interval=auto: round lengths to use instead of the measured choice, "
          "cycled (e.g. 1,3,2,4; for tests and experiments: the same on every run)");
ABSL_FLAG(int, select_interval, 0, "zenflow: select_interval R (0 = 25*S)");
ABSL_FLAG(int, warmup_rounds, 0, "zenflow: full warm-up rounds");
ABSL_FLAG(std::string, delay, "adaptive", "zenflow: apply delay: sync, 1..S, or adaptive");
ABSL_FLAG(std::string, wire, "",
          "gradient wire dtype: fp32, bf16, fp16, or int8 (one fp32 scale per column); empty: "
          "the daemon's default (int8 for zenflow, bf16 for zero_offload)");
ABSL_FLAG(std::string, param_dtype, "fp32",
          "the model's parameter dtype: fp32, bf16 or fp16. 16-bit parameters are what the "
          "optimizer updates (zenflow: the important columns here, from an fp32 master of "
          "them, the rest on zenflowd, whose fp32 master comes back rounded; local: every "
          "column from an fp32 master); the model computes in fp32 from a converted copy, "
          "and gradients stay fp32");
ABSL_FLAG(bool, rank_ordered_sums, false,
          "zenflow, zero_offload: the daemon sums each rank's gradients apart and adds the "
          "ranks in rank order (JobSpec.rank_ordered_sums), so multi-rank reruns and runs "
          "through a daemon restart are bit-identical; 8 B per parameter per extra rank");
ABSL_FLAG(std::string, optimizer_state, "fp32",
          "how the daemon keeps Adam's m and v (JobSpec.optimizer_state): fp32, or 8bit "
          "(one byte each, block-wise quantized, the fp32 master kept; docs/design.md)");
ABSL_FLAG(int, emulate_device_ms, 0,
          "adds this much emulated device time per step (sleep), to study stalls on a CPU machine");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve this rank's own Prometheus metrics on (/metrics: the "
          "zenflow_worker_* series), for setups that scrape workers directly; empty: none");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, the bound metrics port is written here (with --metrics_listen=HOST:0)");
ABSL_FLAG(std::string, log, "", "per-step log file (.csv, or .jsonl for JSON lines)");
ABSL_FLAG(std::string, init, "", "start from these parameters (a file written by --save)");
ABSL_FLAG(std::string, save, "", "write the final parameters here");
ABSL_FLAG(uint64_t, seed, 1, "data sampling and initialization seed");
ABSL_FLAG(int, eval_batches, 8, "validation batches at the end");
ABSL_FLAG(int, threads, 2, "CPU threads for the model and the optimizer");
ABSL_FLAG(bool, progress, true, "print a progress line");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, or cuda (the CUDA model and backend; needs a build with nvcc and a GPU)");

namespace zenflow {
namespace {

using model::DefaultTextPath;
using model::LoadParams;
using model::ModelConfig;
using model::SaveParams;
using model::TensorInfo;
using model::TextData;
using model::CudaTransformer;
using model::Transformer;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::Status Run() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "local" && mode != "zero_offload" && mode != "zenflow") {
    return absl::InvalidArgumentError("--mode must be local, zero_offload or zenflow");
  }
  const int rank = absl::GetFlag(FLAGS_rank);
  const int world = absl::GetFlag(FLAGS_world);
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("--rank ", rank, " must be in [0, --world ", world, ")"));
  }
  if (mode == "local" && world != 1) {
    return absl::InvalidArgumentError("--mode=local runs one rank (--world=1)");
  }
  // Served from the start (empty until the first step): a scraper finds the
  // rank as soon as it runs.
  // This rank's own figures for --metrics_listen, read by scrapes.
  Mutex worker_mu;
  v1::WorkerStats worker_stats;
  HistogramCounts stall_per_step(StallSecondsBuckets());
  std::unique_ptr<MetricsServer> metrics;
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    const std::string job = absl::GetFlag(FLAGS_job);
    ZF_ASSIGN_OR_RETURN(metrics, MetricsServer::Start(absl::GetFlag(FLAGS_metrics_listen), [&, job] {
                          MutexLock lock(&worker_mu);
                          return RenderWorkerMetrics(job, rank, worker_stats);
                        }));
    std::fprintf(stderr, "zf_train: rank %d serves its metrics on port %d\n", rank,
                 metrics->port());
    if (const std::string f = absl::GetFlag(FLAGS_metrics_port_file); !f.empty()) {
      std::ofstream(f + ".tmp") << metrics->port() << "\n";
      std::rename((f + ".tmp").c_str(), f.c_str());
    }
  }
  std::string data_path = absl::GetFlag(FLAGS_data);
  if (data_path.empty()) data_path = DefaultTextPath();
  ZF_ASSIGN_OR_RETURN(TextData data, TextData::FromFile(data_path));

  ModelConfig cfg;
  cfg.layers = absl::GetFlag(FLAGS_layers);
  cfg.width = absl::GetFlag(FLAGS_width);
  cfg.heads = absl::GetFlag(FLAGS_heads);
  cfg.context = absl::GetFlag(FLAGS_context);
  cfg.seed = absl::GetFlag(FLAGS_seed);
  std::vector<float> params;
  if (!absl::GetFlag(FLAGS_init).empty()) {
    ModelConfig loaded;
    ZF_ASSIGN_OR_RETURN(params, LoadParams(absl::GetFlag(FLAGS_init), &loaded));
    if (loaded.layers != cfg.layers || loaded.width != cfg.width || loaded.heads != cfg.heads ||
        loaded.context != cfg.context || loaded.vocab != cfg.vocab || loaded.mlp_mult != cfg.mlp_mult) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--init ", absl::GetFlag(FLAGS_init), " holds a model of layers=", loaded.layers,
          " width=", loaded.width, " heads=", loaded.heads, " context=", loaded.context,
          "; the flags ask for layers=", cfg.layers, " width=", cfg.width, " heads=", cfg.heads,
          " context=", cfg.context));
    }
    cfg = loaded;
  }
  const std::string param_dtype_name = absl::GetFlag(FLAGS_param_dtype);
  DType param_dtype = DType::kF32;
  if (param_dtype_name == "bf16") {
    param_dtype = DType::kBF16;
  } else if (param_dtype_name == "fp16") {
    param_dtype = DType::kF16;
  } else if (param_dtype_name != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--param_dtype=", param_dtype_name, " must be fp32, bf16 or fp16"));
  }
  const bool params16 = param_dtype != DType::kF32;
  const worker::PackDType pack16 =
      param_dtype == DType::kF16 ? worker::PackDType::kF16 : worker::PackDType::kBF16;
  const int threads = std::max(1, absl::GetFlag(FLAGS_threads));
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError("--device must be cpu or cuda");
  }
  // The model and the optimizer backend live on the same device; params and
  // grads are backend memory (host memory for the CPU backend).
  std::unique_ptr<Transformer> cpu_model;
  std::unique_ptr<CudaTransformer> cuda_model;
  std::unique_ptr<worker::Backend> backend;
  std::vector<TensorInfo> tensors;
  size_t num_params = 0;
  if (device == "cuda") {
    ZF_ASSIGN_OR_RETURN(backend, worker::MakeCudaBackend(0));
    ZF_ASSIGN_OR_RETURN(cuda_model, CudaTransformer::Create(cfg, 0));
    tensors = cuda_model->tensors();
    num_params = cuda_model->num_params();
  } else {
    backend = worker::MakeCpuBackend(threads);
    ZF_ASSIGN_OR_RETURN(cpu_model, Transformer::Create(cfg, threads));
    tensors = cpu_model->tensors();
    num_params = cpu_model->num_params();
  }
  if (params.empty()) {
    params.assign(num_params, 0.0f);
    // The CPU model's initializer defines the initial values on every device.
    ZF_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> init_model, Transformer::Create(cfg, 1));
    init_model->InitParams(params.data());
  }
  if (params.size() != num_params) {
    return absl::InvalidArgumentError("--init has the wrong number of parameters");
  }
  // d_params: the fp32 weights the model computes with. With 16-bit
  // parameters those live in d_params16 (what the optimizer updates) and
  // d_params is their fp32 copy, refreshed before every forward.
  worker::DeviceBuffer d_params, d_grads, d_params16;
  ZF_RETURN_IF_ERROR(d_params.Reserve(backend.get(), num_params * sizeof(float)));
  ZF_RETURN_IF_ERROR(d_grads.Reserve(backend.get(), num_params * sizeof(float)));
  if (params16) {
    std::vector<char> init(num_params * DTypeSize(param_dtype));
    Encode(param_dtype, params.data(), num_params, init.data());
    ZF_RETURN_IF_ERROR(d_params16.Reserve(backend.get(), init.size()));
    ZF_RETURN_IF_ERROR(backend->CopyToDevice(d_params16.p(), init.data(), init.size()));
  } else {
    ZF_RETURN_IF_ERROR(backend->CopyToDevice(d_params.p(), params.data(), num_params * sizeof(float)));
  }
  auto refresh_weights = [&]() -> absl::Status {
    if (!params16) return absl::OkStatus();
    ZF_RETURN_IF_ERROR(backend->Convert(d_params16.p(), pack16, d_params.p(),
                                        worker::PackDType::kF32, static_cast<int64_t>(num_params)));
    return backend->Synchronize();  // the CUDA model runs on a stream of its own
  };
  ZF_RETURN_IF_ERROR(refresh_weights());
  ZF_RETURN_IF_ERROR(backend->Synchronize());
  auto forward = [&](const std::vector<uint8_t>& tok, int b, int q) -> absl::StatusOr<float> {
    ZF_RETURN_IF_ERROR(refresh_weights());
    if (cuda_model != nullptr) return cuda_model->Forward(d_params.f32(), tok.data(), b, q);
    return cpu_model->Forward(d_params.f32(), tok.data(), b, q);
  };
  auto backward = [&]() -> absl::Status {
    if (cuda_model != nullptr) return cuda_model->Backward(d_params.f32(), d_grads.f32());
    return cpu_model->Backward(d_params.f32(), d_grads.f32());
  };

  std::vector<ParamSpec> specs;
  for (const TensorInfo& t : tensors) {
    ParamSpec ps;
    ps.name = t.name;
    ps.shape = t.shape;
    ps.param = params16 ? static_cast<void*>(static_cast<char*>(d_params16.p()) + t.offset * 2)
                        : static_cast<void*>(d_params.f32() + t.offset);
    ps.grad = d_grads.f32() + t.offset;
    ps.dtype = param_dtype;
    specs.push_back(ps);
  }

  const float lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  const int emulate_ms = absl::GetFlag(FLAGS_emulate_device_ms);
  std::unique_ptr<Client> client;
  std::unique_ptr<ZenFlowOptimizer> opt;
  // Local AdamW state, compact per tensor (all columns), in backend memory;
  // with 16-bit parameters also their fp32 master (as the engine keeps for
  // its important columns), so local is the like-for-like baseline.
  std::vector<std::unique_ptr<worker::DeviceBuffer>> lm, lv, lg, lmaster, lcols, lsteps;
  if (mode == "local") {
    for (size_t i = 0; i < specs.size(); ++i) {
      const ParamSpec& p = specs[i];
      const int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1;
      const int64_t cols = p.shape.back();
      for (auto* v : {&lm, &lv, &lg, &lmaster}) {
        v->push_back(std::make_unique<worker::DeviceBuffer>());
        if (v == &lmaster && !params16) continue;
        ZF_RETURN_IF_ERROR(v->back()->Reserve(backend.get(), rows * cols * sizeof(float)));
      }
      std::vector<int32_t> c(cols);
      for (int64_t j = 0; j < cols; ++j) c[j] = static_cast<int32_t>(j);
      lcols.push_back(std::make_unique<worker::DeviceBuffer>());
      ZF_RETURN_IF_ERROR(lcols.back()->Reserve(backend.get(), cols * sizeof(int32_t)));
      ZF_RETURN_IF_ERROR(backend->CopyToDevice(lcols.back()->p(), c.data(), cols * sizeof(int32_t)));
      lsteps.push_back(std::make_unique<worker::DeviceBuffer>());
      ZF_RETURN_IF_ERROR(lsteps.back()->Reserve(backend.get(), cols * sizeof(int64_t)));
      if (params16) {  // the master starts as the parameters' exact value
        ZF_RETURN_IF_ERROR(backend->PackColumns(d_params.f32() + tensors[i].offset, rows, cols,
                                                lcols.back()->i32(), cols, worker::PackDType::kF32,
                                                lmaster.back()->p(), nullptr));
      }
    }
    ZF_RETURN_IF_ERROR(backend->Synchronize());
  } else {
    ClientOptions co;
    co.target = absl::GetFlag(FLAGS_target);
    ApplyTlsFlags(&co);  // --tls_ca, --tls_cert, --tls_key, --tls_server_name
    ZF_ASSIGN_OR_RETURN(co.token, LoadToken(absl::GetFlag(FLAGS_token_file)));
    if (co.token.empty() && world > 1) {
      return absl::InvalidArgumentError(
          "the ranks of one job share its token: give every rank --token_file=FILE (or "
          "ZENFLOW_TOKEN); e.g. head -c 24 /dev/urandom | base64 > FILE");
    }
    ZF_ASSIGN_OR_RETURN(co.transport, ParseTransport(absl::GetFlag(FLAGS_transport)));
    co.ucx.tls = absl::GetFlag(FLAGS_ucx_tls);
    co.split_tensor_params = absl::GetFlag(FLAGS_split_tensor_params);
    if (co.split_tensor_params < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--split_tensor_params=", co.split_tensor_params, " must be >= 0 (0: automatic)"));
    }
    if (!absl::ParseDuration(absl::GetFlag(FLAGS_daemon_wait), &co.daemon_wait) ||
        co.daemon_wait < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("--daemon_wait=", absl::GetFlag(FLAGS_daemon_wait),
                                                     " is not a duration >= 0 (e.g. 60s, 2m)"));
    }
    ZF_ASSIGN_OR_RETURN(client, Client::Connect(co));
    v1::JobSpec want;
    want.set_job_id(absl::GetFlag(FLAGS_job));
    for (const ParamSpec& p : specs) {
      v1::TensorSpec* t = want.add_tensors();
      t->set_name(p.name);
      t->mutable_shape()->Add(p.shape.begin(), p.shape.end());
      t->set_dtype(ToProto(p.dtype));
    }
    want.set_world_size(world);
    want.set_mode(mode == "zero_offload" ? v1::MODE_ZERO_OFFLOAD : v1::MODE_ZENFLOW);
    const std::string wire = absl::GetFlag(FLAGS_wire);
    if (!wire.empty()) {
      absl::StatusOr<v1::DType> wire_dtype = WireDTypeFromName(wire);
      if (!wire_dtype.ok()) {
        return absl::InvalidArgumentError("--wire must be fp32, bf16, fp16 or int8");
      }
      want.set_wire_dtype(*wire_dtype);
    }
    want.set_rank_ordered_sums(absl::GetFlag(FLAGS_rank_ordered_sums));
    want.set_optimizer_state(absl::GetFlag(FLAGS_optimizer_state));
    want.mutable_adamw()->set_lr(lr);
    want.mutable_adamw()->set_weight_decay(static_cast<float>(absl::GetFlag(FLAGS_weight_decay)));
    v1::ZenFlowConfig* z = want.mutable_zenflow();
    z->set_topk_ratio(static_cast<float>(absl::GetFlag(FLAGS_topk)));
    const std::string interval = absl::GetFlag(FLAGS_interval);
    int s_fixed = 0;
    if (interval == "auto") {
      z->set_auto_update_interval(true);
      z->set_update_interval(absl::GetFlag(FLAGS_max_interval));
    } else if (absl::SimpleAtoi(interval, &s_fixed) && s_fixed >= 1) {
      z->set_update_interval(s_fixed);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--interval must be auto or a number of steps >= 1, not '", interval, "'"));
    }
    if (absl::GetFlag(FLAGS_select_interval) > 0) z->set_select_interval(absl::GetFlag(FLAGS_select_interval));
    z->set_predicted_step(absl::GetFlag(FLAGS_predicted_step));
    z->set_scale_round_step(absl::GetFlag(FLAGS_scale_round_step));
    z->set_local_step(absl::GetFlag(FLAGS_local_step));
    if (const std::string budget = absl::GetFlag(FLAGS_fidelity_budget); !budget.empty()) {
      float b = 0;
      if (!absl::SimpleAtof(budget, &b) || !std::isfinite(b)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--fidelity_budget must be a finite number (or empty: the daemon's default), not '",
            budget, "'"));
      }
      z->set_fidelity_budget(b);
    }
    z->set_full_warmup_rounds(absl::GetFlag(FLAGS_warmup_rounds));
    const std::string delay = absl::GetFlag(FLAGS_delay);
    int d = 0;
    if (delay == "sync") {
      z->mutable_apply_delay()->set_sync(true);
    } else if (delay == "adaptive") {
      z->mutable_apply_delay()->set_adaptive(true);
    } else if (absl::SimpleAtoi(delay, &d)) {
      z->mutable_apply_delay()->set_steps(d);
    } else {
      return absl::InvalidArgumentError("--delay must be sync, adaptive or a number of steps");
    }
    ZF_ASSIGN_OR_RETURN(v1::JobSpec spec, JoinOrCreateJob(client.get(), want, rank, backend.get(), specs));
    ZF_ASSIGN_OR_RETURN(opt, ZenFlowOptimizer::Create(backend.get(), client.get(), spec, rank, specs));
    const std::string schedule = absl::GetFlag(FLAGS_interval_schedule);
    if (!schedule.empty()) {
      std::vector<int32_t> lengths;
      for (absl::string_view part : absl::StrSplit(schedule, ',')) {
        int32_t v = 0;
        if (!absl::SimpleAtoi(part, &v) || v < 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--interval_schedule: '", part, "' is not a number of steps >= 1"));
        }
        lengths.push_back(v);
      }
      if (absl::GetFlag(FLAGS_interval) != "auto") {
        return absl::InvalidArgumentError("--interval_schedule needs --interval=auto");
      }
      opt->set_interval_chooser([lengths](int64_t round, int64_t) {
        return lengths[static_cast<size_t>(round) % lengths.size()];
      });
    }
  }

  std::FILE* log = nullptr;
  const std::string log_path = absl::GetFlag(FLAGS_log);
  const bool jsonl = absl::EndsWith(log_path, ".jsonl");
  if (!log_path.empty()) {
    log = std::fopen(log_path.c_str(), "w");
    if (log == nullptr) return absl::InvalidArgumentError(absl::StrCat("cannot write --log ", log_path));
    if (!jsonl) std::fprintf(log, "step,loss,step_ms,stall_ms,send_blocked_ms,bytes_up,bytes_down,emulated_device_ms\n");
  }
  const bool tty = isatty(STDERR_FILENO);
  std::fprintf(stderr, "zf_train: mode=%s device=%s rank=%d/%d model=%d layers x %d wide (%zu %s params), data=%s%s\n",
               mode.c_str(), device.c_str(), rank, world, cfg.layers, cfg.width, num_params,
               DTypeName(param_dtype),
               data_path.c_str(),
               emulate_ms > 0 ? absl::StrFormat(", EMULATED device time %d ms/step", emulate_ms).c_str() : "");

  const int steps = absl::GetFlag(FLAGS_steps);
  const int batch = absl::GetFlag(FLAGS_batch);
  const int seq = cfg.context;
  const uint64_t seed = absl::GetFlag(FLAGS_seed) * 1000003ull + static_cast<uint64_t>(rank);
  std::vector<uint8_t> tokens;
  double sum_step = 0, sum_stall = 0, last_loss_avg = 0;
  int64_t sum_up = 0, sum_down = 0;
  for (int t = 0; t < steps; ++t) {
    const double t0 = Now();
    data.SampleBatch(false, batch, seq, static_cast<uint64_t>(t), seed, &tokens);
    ZF_ASSIGN_OR_RETURN(float loss, forward(tokens, batch, seq));
    ZF_RETURN_IF_ERROR(backward());
    if (emulate_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(emulate_ms));
    StepStats st;
    if (opt != nullptr) {
      ZF_RETURN_IF_ERROR(opt->Step(t, lr));
      st = opt->last_step();
      MutexLock lock(&worker_mu);
      AddStep(opt->last_report(), &worker_stats);
      stall_per_step.Observe(st.stall_seconds);
      stall_per_step.Export(worker_stats.mutable_stall_per_step_seconds());
    } else {
      AdamWHyper h;
      h.lr = lr;
      h.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
      for (size_t i = 0; i < specs.size(); ++i) {
        const int64_t rows = specs[i].shape.size() == 2 ? specs[i].shape[0] : 1;
        const int64_t cols = specs[i].shape.back();
        std::vector<int64_t> counts(cols, t + 1);
        ZF_RETURN_IF_ERROR(backend->CopyToDevice(lsteps[i]->p(), counts.data(), cols * sizeof(int64_t)));
        ZF_RETURN_IF_ERROR(backend->PackColumns(specs[i].grad, rows, cols, lcols[i]->i32(), cols,
                                                worker::PackDType::kF32, lg[i]->p(), nullptr));
        if (params16) {
          ZF_RETURN_IF_ERROR(backend->SelectiveAdamW16(
              h, 1.0f, specs[i].param, pack16, rows, cols, lcols[i]->i32(), cols, lsteps[i]->i64(),
              lg[i]->f32(), lmaster[i]->f32(), lm[i]->f32(), lv[i]->f32()));
        } else {
          ZF_RETURN_IF_ERROR(backend->SelectiveAdamW(
              h, 1.0f, static_cast<float*>(specs[i].param), rows, cols, lcols[i]->i32(), cols,
              lsteps[i]->i64(), lg[i]->f32(), lm[i]->f32(), lv[i]->f32()));
        }
      }
      ZF_RETURN_IF_ERROR(backend->Synchronize());
    }
    const double step_s = Now() - t0;
    sum_step += step_s;
    sum_stall += st.stall_seconds;
    sum_up += st.bytes_sent;
    sum_down += st.bytes_received;
    last_loss_avg = t == 0 ? loss : 0.9 * last_loss_avg + 0.1 * loss;
    if (log != nullptr) {
      if (jsonl) {
        JsonWriter line(JsonWriter::Style::kCompact);
        line.BeginObject();
        line.Key("step").Int(t);
        line.Key("loss").Float(loss);
        line.Key("step_ms").Double(step_s * 1e3);
        line.Key("stall_ms").Double(st.stall_seconds * 1e3);
        line.Key("send_blocked_ms").Double(st.send_blocked_seconds * 1e3);
        line.Key("bytes_up").Int(st.bytes_sent);
        line.Key("bytes_down").Int(st.bytes_received);
        line.Key("emulated_device_ms").Int(emulate_ms);
        line.EndObject();
        std::fprintf(log, "%s\n", line.str().c_str());
      } else {
        std::fprintf(log, "%d,%.6f,%.3f,%.3f,%.3f,%lld,%lld,%d\n", t, loss, step_s * 1e3,
                     st.stall_seconds * 1e3, st.send_blocked_seconds * 1e3,
                     static_cast<long long>(st.bytes_sent), static_cast<long long>(st.bytes_received),
                     emulate_ms);
      }
    }
    if (absl::GetFlag(FLAGS_progress) && (tty || (t + 1) % 20 == 0 || t + 1 == steps)) {
      const int width = 30;
      const int filled = static_cast<int>(static_cast<double>(t + 1) / steps * width);
      std::fprintf(stderr, "%s[%s%s] %d/%d loss %.4f  step %.1f ms  stall %.1f%%  wire %.1f KiB/step%s%s",
                   tty ? "\r" : "", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), t + 1, steps, last_loss_avg,
                   sum_step / (t + 1) * 1e3, sum_step > 0 ? 100.0 * sum_stall / sum_step : 0.0,
                   static_cast<double>(sum_up + sum_down) / (t + 1) / 1024.0,
                   emulate_ms > 0 ? " (emulated device)" : "", tty ? "" : "\n");
    }
  }
  if (tty && absl::GetFlag(FLAGS_progress)) std::fprintf(stderr, "\n");
  if (opt != nullptr) ZF_RETURN_IF_ERROR(opt->Finish());
  if (log != nullptr) std::fclose(log);

  // Validation loss on fixed batches (the same on every rank).
  double val = 0;
  const int eval = std::max(1, absl::GetFlag(FLAGS_eval_batches));
  for (int i = 0; i < eval; ++i) {
    data.SampleBatch(true, batch, seq, static_cast<uint64_t>(i), absl::GetFlag(FLAGS_seed), &tokens);
    ZF_ASSIGN_OR_RETURN(float loss, forward(tokens, batch, seq));
    val += loss;
  }
  val /= eval;
  if (!absl::GetFlag(FLAGS_save).empty()) {
    ZF_RETURN_IF_ERROR(refresh_weights());  // 16-bit parameters are saved as their fp32 values
    ZF_RETURN_IF_ERROR(backend->CopyToHost(params.data(), d_params.p(), num_params * sizeof(float)));
    ZF_RETURN_IF_ERROR(backend->Synchronize());
    ZF_RETURN_IF_ERROR(SaveParams(absl::GetFlag(FLAGS_save), cfg, params.data(), params.size()));
  }
  // The run is over: this rank is done with the job, which the daemon
  // deletes once every rank is (unless kept), docs/protocol.md, "When a job ends".
  std::string job_end = "none";
  if (client != nullptr) {
    ZF_ASSIGN_OR_RETURN(v1::DeleteJobResponse end,
                        client->FinishJob(absl::GetFlag(FLAGS_job), rank,
                                          absl::GetFlag(FLAGS_keep_job)));
    job_end = end.deleted() ? "deleted" : end.kept() ? "kept" : "left to the other ranks";
    std::fprintf(stderr, "zf_train: rank %d finished; job '%s' %s (%d of %d ranks finished)\n",
                 rank, absl::GetFlag(FLAGS_job).c_str(), job_end.c_str(), end.ranks_finished(),
                 world);
  }
  // One line that scripts pick out by its prefix (tools/json_get reads it).
  JsonWriter summary(JsonWriter::Style::kCompact);
  summary.BeginObject();
  summary.Key("mode").String(mode);
  summary.Key("rank").Int(rank);
  summary.Key("world").Int(world);
  summary.Key("steps").Int(steps);
  summary.Key("params").Int(static_cast<int64_t>(num_params));
  summary.Key("param_dtype").String(DTypeName(param_dtype));
  summary.Key("train_loss_ema").Double(last_loss_avg);
  summary.Key("val_loss").Double(val);
  summary.Key("mean_step_ms").Double(sum_step / std::max(1, steps) * 1e3);
  summary.Key("stall_ms_per_step").Double(sum_stall / std::max(1, steps) * 1e3);
  summary.Key("wire_bytes_per_step").Double(static_cast<double>(sum_up + sum_down) / std::max(1, steps));
  summary.Key("emulated_device_ms").Int(emulate_ms);
  summary.Key("transport").String(mode == "local" ? "none" : absl::GetFlag(FLAGS_transport));
  summary.Key("job_end").String(job_end);  // deleted, kept, left to the other ranks, none
  if (opt != nullptr) {
    // The update interval: fixed, or (auto) the mean of the rounds' S.
    const OptimizerTotals& tot = opt->totals();
    summary.Key("update_interval").String(absl::GetFlag(FLAGS_interval));
    summary.Key("rounds_closed").Int(tot.rounds_closed);
    summary.Key("predicted_steps").Int(tot.predicted_steps);
    summary.Key("local_steps").Int(tot.local_steps);  // docs/design.md rule 13
    summary.Key("s_mean").Double(tot.rounds_closed > 0 ? static_cast<double>(tot.round_steps) /
                                                             static_cast<double>(tot.rounds_closed)
                                                       : 0.0);
    // The mean update divergence of the rounds the daemon measured
    // (docs/design.md rule 14); null when it measured none.
    summary.Key("divergence");
    if (tot.divergence_rounds > 0) {
      summary.Double(tot.divergence_sum / static_cast<double>(tot.divergence_rounds));
    } else {
      summary.Null();
    }
  }
  if (opt != nullptr) {
    // What went to the daemon, for checks against its figures.
    const v1::WorkerStats& r = opt->reported();
    summary.Key("reported").BeginObject();
    summary.Key("steps").Int(r.steps());
    summary.Key("step_seconds").Double(r.step_seconds());
    summary.Key("stall_seconds").Double(r.stall_seconds());
    summary.Key("send_blocked_seconds").Double(r.send_blocked_seconds());
    summary.Key("up_bytes").Int(r.up_bytes());
    summary.Key("down_bytes").Int(r.down_bytes());
    summary.EndObject();
    const ClientStats cs = client->stats();
    summary.Key("shard_bytes_sent").Int(cs.shard_bytes_sent);
    summary.Key("deltas_received").Int(cs.deltas_received);
    summary.Key("delta_bytes_received").Int(cs.delta_bytes_received);
    summary.Key("reconnects").Int(cs.reconnects);
    summary.Key("rounds_dropped_duplicate").Int(cs.rounds_dropped_duplicate);
  }
  summary.EndObject();
  std::printf("ZF_SUMMARY %s\n", summary.str().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("One rank of a ZenFlow fine-tuning run (see --mode).");
  // --help (stdout, exit 0) lists this file's flags and the TLS ones
  // (common/flags_usage.h).
  zenflow::ParseFlags(argc, argv,
                      {"zf_train", zenflow::kZenflowVersion, {"train_main.cc", "client/tls_flags.cc"}});
  zenflow::TuneMallocForBulkBuffers();
  absl::Status s = zenflow::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "zf_train: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
