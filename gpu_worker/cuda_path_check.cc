// zf_cuda_path_check: the device check of the framework-neutral path
// (gpu_worker/engine/array_worker.h), the one the Python extension and so
// zenflow.torch take with CUDA tensors, without Python or torch. It runs a
// small model a few steps against a zenflowd twice: once from host arrays
// (the CPU backend) and once from device memory allocated with the CUDA
// runtime, its gradients written by an asynchronous copy on a stream of its
// own (the "framework's" stream, handed to the engine as an integer), and
// requires the parameters to come out the same, bit for bit, in each mode
// (zenflow and zero_offload). tools/gpu_run.sh runs it on a GPU machine.
//
//   zf_cuda_path_check --target=127.0.0.1:50051 [--steps=8] [--require_device]
//
// Without a device (or in a build without CUDA) the host runs still run and
// the CUDA part answers SKIPPED with the CUDA backend's UNAVAILABLE status
// (reached through a device array): exit 0, or 1 with --require_device.
// One line per check starts with ZF_SUMMARY.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/flags_usage.h"
#include "common/status_macros.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/engine/array_worker.h"
#include "gpu_worker/runtime_arrays.h"
#include "google/protobuf/util/json_util.h"
#include "server/version.h"


ABSL_FLAG(std::string, target, "127.0.0.1:50051", "zenflowd's host:port");
ABSL_FLAG(int, steps, 8, "optimizer steps per run");
ABSL_FLAG(bool, require_device, false,
          "exit 1 when the CUDA runs cannot run (no device, or no CUDA build)");

namespace zenflow {
namespace {

// The model: an fp32 matrix, an fp32 vector (always important) and a bf16
// matrix (fp32 masters on both sides).
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  ElemType elem;
  int64_t n() const {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    return k;
  }
  size_t bytes() const { return n() * (elem == ElemType::kF32 ? 4 : 2); }
};

const std::vector<Tensor>& Model() {
  static const std::vector<Tensor> m = {{"p0", {64, 96}, ElemType::kF32},
                                        {"p1", {64}, ElemType::kF32},
                                        {"p2", {48, 64}, ElemType::kBF16}};
  return m;
}

// A value in [-1, 1) from (a, b, c): deterministic, no state.
float Noise(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
               (c + 1) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E9F8CC1F0A2A35ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1ull << 23) - 1.0f;
}

std::vector<char> InitialValues(size_t ti) {
  const Tensor& t = Model()[ti];
  std::vector<char> out(t.bytes());
  for (int64_t i = 0; i < t.n(); ++i) {
    const float v = 0.1f * Noise(ti, i, 7);
    if (t.elem == ElemType::kF32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = FloatToBf16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Step t's gradient: columns of different scales, so the important columns
// change with t.
std::vector<float> Gradient(size_t ti, int64_t step) {
  const Tensor& t = Model()[ti];
  const int64_t cols = t.shape.size() == 2 ? t.shape[1] : t.shape[0];
  std::vector<float> g(t.n());
  for (int64_t i = 0; i < t.n(); ++i) {
    const float scale = 0.05f + std::fabs(Noise(ti, (i % cols) + 1000 * (step / 3), 3));
    g[i] = scale * Noise(ti, i, 100 + step);
  }
  return g;
}

std::string SpecJson(const std::string& job, const std::string& mode) {
  std::string tensors;
  for (const Tensor& t : Model()) {
    absl::StrAppend(&tensors, tensors.empty() ? "" : ",", "{\"name\":\"", t.name,
                    "\",\"shape\":[", t.shape[0], t.shape.size() == 2 ? "," : "",
                    t.shape.size() == 2 ? absl::StrCat(t.shape[1]) : "", "],\"dtype\":\"",
                    t.elem == ElemType::kF32 ? "DTYPE_FP32" : "DTYPE_BF16", "\"}");
  }
  const bool zen = mode == "zenflow";
  return absl::StrCat(
      "{\"jobId\":\"", job, "\",\"tensors\":[", tensors, "],",
      "\"adamw\":{\"lr\":0.01,\"beta1\":0.9,\"beta2\":0.999,\"eps\":1e-8,\"weightDecay\":0.01},",
      zen ? "\"zenflow\":{\"topkRatio\":0.25,\"updateInterval\":2,\"selectInterval\":4,"
            "\"fullWarmupRounds\":1,\"applyDelay\":{\"steps\":1}},\"mode\":\"MODE_ZENFLOW\","
            "\"wireDtype\":\"DTYPE_BF16\","
          : "\"mode\":\"MODE_ZERO_OFFLOAD\",\"wireDtype\":\"DTYPE_FP32\",",
      "\"worldSize\":1}");
}

absl::StatusOr<ArrayWorkerOptions> Options(const std::string& job, const std::string& mode,
                                           uintptr_t stream) {
  ArrayWorkerOptions o;
  const auto parsed = google::protobuf::util::JsonStringToMessage(SpecJson(job, mode), &o.want);
  if (!parsed.ok()) return absl::InternalError(std::string(parsed.message()));
  o.client.target = absl::GetFlag(FLAGS_target);
  const char* token = std::getenv("ZENFLOW_TOKEN");
  o.client.token = token == nullptr ? "" : token;
  o.client.connect_timeout = absl::Seconds(20);
  o.threads = 2;
  o.stream = stream;
  return o;
}

ArrayRef Ref(uintptr_t data, const Tensor& t, ElemType elem, bool device) {
  ArrayRef a;
  a.data = data;
  a.shape = t.shape;
  a.elem = elem;
  a.typestr = elem == ElemType::kF32 ? "<f4" : "<V2";
  a.device = device;
  return a;
}

// The final parameter bytes of a run from host arrays (the CPU backend).
absl::StatusOr<std::vector<std::vector<char>>> RunHost(const std::string& mode, int steps,
                                                       const std::string& job) {
  std::vector<std::vector<char>> params;
  std::vector<std::vector<float>> grads;
  std::vector<ArrayParam> arrays;
  for (size_t i = 0; i < Model().size(); ++i) {
    params.push_back(InitialValues(i));
    grads.emplace_back(Model()[i].n());
  }
  for (size_t i = 0; i < Model().size(); ++i) {
    const Tensor& t = Model()[i];
    arrays.push_back({t.name, Ref(reinterpret_cast<uintptr_t>(params[i].data()), t, t.elem, false),
                      Ref(reinterpret_cast<uintptr_t>(grads[i].data()), t, ElemType::kF32,
                          false)});
  }
  ZF_ASSIGN_OR_RETURN(ArrayWorkerOptions o, Options(job, mode, 0));
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<ArrayWorker> w, ArrayWorker::Create(o, arrays));
  if (w->backend_name() != "cpu") return absl::InternalError("host arrays did not run on cpu");
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < Model().size(); ++i) {
      const std::vector<float> g = Gradient(i, s);  // into the engine's buffer, in place
      std::copy(g.begin(), g.end(), grads[i].begin());
    }
    ZF_RETURN_IF_ERROR(w->Step(s, 0.01f, 0));
  }
  ZF_RETURN_IF_ERROR(w->Finish(0));
  ZF_RETURN_IF_ERROR(w->EndJob(false).status());
  return params;
}

// The same run from device memory: the "framework" (RuntimeArrays) owns
// its stream, its buffers and its pinned gradient staging; it queues each
// step's gradients on its stream (asynchronous copies) and reads the
// parameters back on it.
absl::StatusOr<std::vector<std::vector<char>>> RunDevice(const std::string& mode, int steps,
                                                         const std::string& job, int* device) {
  const size_t k = Model().size();
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<worker::RuntimeArrays> rt, worker::RuntimeArrays::Create(0));
  std::vector<void*> dparams(k), dgrads(k);
  std::vector<float*> staged(k * steps);
  std::vector<ArrayParam> arrays;
  std::vector<std::vector<char>> init;
  for (size_t i = 0; i < k; ++i) {
    const Tensor& t = Model()[i];
    init.push_back(InitialValues(i));
    ZF_ASSIGN_OR_RETURN(dparams[i], rt->Malloc(t.bytes()));
    ZF_ASSIGN_OR_RETURN(dgrads[i], rt->Malloc(t.n() * 4));
    ZF_RETURN_IF_ERROR(rt->CopyAsync(dparams[i], init[i].data(), t.bytes()));
    arrays.push_back({t.name, Ref(reinterpret_cast<uintptr_t>(dparams[i]), t, t.elem, true),
                      Ref(reinterpret_cast<uintptr_t>(dgrads[i]), t, ElemType::kF32, true)});
    for (int s = 0; s < steps; ++s) {
      ZF_ASSIGN_OR_RETURN(void* h, rt->MallocHost(t.n() * 4));
      staged[s * k + i] = static_cast<float*>(h);
      const std::vector<float> g = Gradient(i, s);
      std::memcpy(h, g.data(), g.size() * 4);
    }
  }
  // The initial values may still be on their way on the stream: the
  // engine's creation reads them after it (WaitForStream), not before.
  const uintptr_t stream = rt->stream();
  ZF_ASSIGN_OR_RETURN(ArrayWorkerOptions o, Options(job, mode, stream));
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<ArrayWorker> w, ArrayWorker::Create(o, arrays));
  *device = w->device();
  if (w->backend_name() != "cuda") return absl::InternalError("device arrays did not run on cuda");
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < k; ++i) {
      ZF_RETURN_IF_ERROR(rt->CopyAsync(dgrads[i], staged[s * k + i], Model()[i].n() * 4));
    }
    ZF_RETURN_IF_ERROR(w->Step(s, 0.01f, stream));
  }
  ZF_RETURN_IF_ERROR(w->Finish(stream));
  std::vector<std::vector<char>> params(k);
  for (size_t i = 0; i < k; ++i) {
    params[i].resize(Model()[i].bytes());
    ZF_RETURN_IF_ERROR(rt->CopyAsync(params[i].data(), dparams[i], params[i].size()));
  }
  ZF_RETURN_IF_ERROR(rt->Synchronize());
  ZF_RETURN_IF_ERROR(w->EndJob(false).status());
  return params;
}

// Why the CUDA runs cannot run here: the CUDA backend's own answer to a
// device array (UNAVAILABLE), reached through the same entry.
absl::Status WhyNoDevice() {
  std::vector<float> p(8), g(8);
  const Tensor t{"p0", {8}, ElemType::kF32};
  std::vector<ArrayParam> arrays = {
      {"p0", Ref(reinterpret_cast<uintptr_t>(p.data()), t, ElemType::kF32, true),
       Ref(reinterpret_cast<uintptr_t>(g.data()), t, ElemType::kF32, true)}};
  absl::StatusOr<ArrayWorkerOptions> o = Options("cpc-unavailable", "zero_offload", 0);
  if (!o.ok()) return o.status();
  return ArrayWorker::Create(*o, arrays).status();
}

int Main() {
  const int steps = absl::GetFlag(FLAGS_steps);
  const bool device = worker::CudaDeviceCount() > 0;
  int failed = 0, skipped = 0;
  for (const std::string mode : {"zenflow", "zero_offload"}) {
    const std::string job = absl::StrCat("cpc-", mode, "-", getpid());
    absl::StatusOr<std::vector<std::vector<char>>> host = RunHost(mode, steps, job + "-cpu");
    if (!host.ok()) {
      std::printf("ZF_SUMMARY cuda_path_check mode=%s FAILED (host run: %s)\n", mode.c_str(),
                  host.status().ToString().c_str());
      ++failed;
      continue;
    }
    if (!device) {
      const absl::Status why = WhyNoDevice();
      std::printf("ZF_SUMMARY cuda_path_check mode=%s host=ok cuda=SKIPPED (%s)\n", mode.c_str(),
                  why.ToString().c_str());
      if (why.code() != absl::StatusCode::kUnavailable) ++failed;  // must be the CUDA answer
      ++skipped;
      continue;
    }
    int dev = -1;
    absl::StatusOr<std::vector<std::vector<char>>> cuda =
        RunDevice(mode, steps, job + "-cuda", &dev);
    if (!cuda.ok()) {
      std::printf("ZF_SUMMARY cuda_path_check mode=%s FAILED (device run: %s)\n", mode.c_str(),
                  cuda.status().ToString().c_str());
      ++failed;
      continue;
    }
    int64_t differing = 0, total = 0;
    double max_diff = 0;
    for (size_t i = 0; i < Model().size(); ++i) {
      const Tensor& t = Model()[i];
      const size_t es = t.elem == ElemType::kF32 ? 4 : 2;
      for (int64_t e = 0; e < t.n(); ++e) {
        const char* a = (*host)[i].data() + e * es;
        const char* b = (*cuda)[i].data() + e * es;
        ++total;
        if (std::memcmp(a, b, es) == 0) continue;
        ++differing;
        float fa, fb;
        if (es == 4) {
          std::memcpy(&fa, a, 4);
          std::memcpy(&fb, b, 4);
        } else {
          uint16_t ha, hb;
          std::memcpy(&ha, a, 2);
          std::memcpy(&hb, b, 2);
          fa = Bf16ToFloat(ha);
          fb = Bf16ToFloat(hb);
        }
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(fa) - fb));
      }
    }
    std::printf("ZF_SUMMARY cuda_path_check mode=%s device=%d steps=%d elements=%lld "
                "differing=%lld max_abs_diff=%g %s\n",
                mode.c_str(), dev, steps, static_cast<long long>(total),
                static_cast<long long>(differing), max_diff, differing == 0 ? "PASSED" : "FAILED");
    if (differing != 0) ++failed;
  }
  if (skipped > 0 && absl::GetFlag(FLAGS_require_device)) {
    std::printf("cuda_path_check: --require_device, but the CUDA runs were skipped\n");
    return 1;
  }
  std::printf("cuda_path_check: %s (%d skipped)\n", failed == 0 ? "passed" : "FAILED", skipped);
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The CUDA path of the framework-neutral worker against the CPU backend, bit for bit.");
  zenflow::ParseFlags(argc, argv,
                      {"zf_cuda_path_check", zenflow::kZenflowVersion, {"cuda_path_check.cc"}});
  return zenflow::Main();
}
