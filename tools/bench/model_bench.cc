// Times one forward + backward pass of the reference transformer at a few
// sizes. Usage: model_bench [threads] [reps]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gpu_worker/model/transformer.h"

namespace {

int Run(const zenflow::model::ModelConfig& cfg, int batch, int threads,
        int reps) {
  auto model_or = zenflow::model::Transformer::Create(cfg, threads);
  if (!model_or.ok()) {
    std::fprintf(stderr, "%s\n", model_or.status().ToString().c_str());
    return 1;
  }
  auto& model = *model_or;
  std::vector<float> params(model->num_params()), grads(params.size());
  model->InitParams(params.data());
  std::vector<uint8_t> tokens(static_cast<size_t>(batch) * (cfg.context + 1));
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint8_t>((i * 131 + 7) % cfg.vocab);
  }
  auto step = [&]() -> bool {
    auto loss = model->Forward(params.data(), tokens.data(), batch,
                               cfg.context);
    return loss.ok() && model->Backward(params.data(), grads.data()).ok();
  };
  if (!step()) return 1;  // Warm-up (allocates the workspace).
  double best = 1e30, total = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!step()) return 1;
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
    best = ms < best ? ms : best;
    total += ms;
  }
  std::printf(
      "width %4d layers %d heads %d context %3d batch %d params %8zu "
      "threads %d: fwd+bwd mean %7.2f ms, best %7.2f ms\n",
      cfg.width, cfg.layers, cfg.heads, cfg.context, batch,
      model->num_params(), threads, total / reps, best);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  struct Size {
    int width, layers, heads, context, batch;
  };
  const Size sizes[] = {
      {64, 2, 4, 64, 8}, {128, 2, 4, 64, 8}, {256, 4, 8, 128, 8}};
  for (const Size& s : sizes) {
    zenflow::model::ModelConfig cfg;
    cfg.width = s.width;
    cfg.layers = s.layers;
    cfg.heads = s.heads;
    cfg.context = s.context;
    if (Run(cfg, s.batch, threads, reps) != 0) return 1;
  }
  return 0;
}
