// The CUDA transformer against the CPU reference model. Device tests skip
// when no CUDA device is visible (or the binary was built without CUDA).
// Parameters and gradients live in DeviceBuffers of a CUDA backend, as in
// zf_train.
#include "gpu_worker/model/transformer_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_worker/backend.h"
#include "gpu_worker/device_buffer.h"
#include "gpu_worker/model/transformer.h"
#include "gtest/gtest.h"

#ifndef ZF_EXPECT_CUDA_COMPILED
#error "ZF_EXPECT_CUDA_COMPILED must be defined by the build (1 when nvcc exists)"
#endif

namespace zenflow {
namespace model {
namespace {

ModelConfig SmallConfig() {
  ModelConfig cfg;
  cfg.vocab = 61;
  cfg.layers = 2;
  cfg.width = 32;
  cfg.heads = 4;
  cfg.context = 16;
  cfg.mlp_mult = 3;
  cfg.seed = 7;
  return cfg;
}

std::vector<uint8_t> RandomTokens(int batch, int seq, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> t(static_cast<size_t>(batch) * (seq + 1));
  for (uint8_t& x : t) x = static_cast<uint8_t>(rng() % vocab);
  return t;
}

// InitParams plus a deterministic perturbation, so that biases and LayerNorm
// parameters are not at their trivial values and activations are not tiny.
std::vector<float> TestParams(const Transformer& cpu) {
  std::vector<float> p(cpu.num_params());
  cpu.InitParams(p.data());
  std::mt19937 rng(123);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  for (float& x : p) x += noise(rng);
  return p;
}

class CudaTransformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaModelCompiled()) GTEST_SKIP() << "built without CUDA";
    if (worker::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    cfg_ = SmallConfig();
    auto cpu = Transformer::Create(cfg_, /*threads=*/2);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    auto gpu = CudaTransformer::Create(cfg_, 0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    ASSERT_EQ(gpu_->num_params(), cpu_->num_params());
    params_ = TestParams(*cpu_);
    auto backend = worker::MakeCudaBackend(0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    const size_t bytes = params_.size() * sizeof(float);
    ASSERT_TRUE(d_params_.Reserve(backend_.get(), bytes).ok());
    ASSERT_TRUE(d_grads_.Reserve(backend_.get(), bytes).ok());
    ASSERT_NO_FATAL_FAILURE(Upload(params_, &d_params_));
  }

  // Copies `host` into `dst`. The backend's stream is not ordered with the
  // model's, so this waits for the copy.
  void Upload(const std::vector<float>& host, worker::DeviceBuffer* dst) {
    ASSERT_TRUE(backend_->CopyToDevice(dst->p(), host.data(), host.size() * sizeof(float)).ok());
    ASSERT_TRUE(backend_->Synchronize().ok());
  }

  void Download(const worker::DeviceBuffer& src, std::vector<float>* host) {
    ASSERT_TRUE(backend_->CopyToHost(host->data(), src.p(), host->size() * sizeof(float)).ok());
    ASSERT_TRUE(backend_->Synchronize().ok());
  }

  // Runs both models on the same tokens and compares loss and gradients.
  void CompareWithCpu(int batch, int seq, uint32_t token_seed) {
    SCOPED_TRACE(testing::Message() << "batch " << batch << ", seq " << seq);
    const std::vector<uint8_t> tokens = RandomTokens(batch, seq, cfg_.vocab, token_seed);
    auto cpu_loss = cpu_->Forward(params_.data(), tokens.data(), batch, seq);
    ASSERT_TRUE(cpu_loss.ok()) << cpu_loss.status();
    std::vector<float> cpu_grads(params_.size());
    ASSERT_TRUE(cpu_->Backward(params_.data(), cpu_grads.data()).ok());

    // Poison the device gradients: Backward must overwrite every entry.
    std::vector<float> poison(params_.size(), 12345.0f);
    ASSERT_NO_FATAL_FAILURE(Upload(poison, &d_grads_));
    auto gpu_loss = gpu_->Forward(d_params_.f32(), tokens.data(), batch, seq);
    ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status();
    ASSERT_TRUE(gpu_->Backward(d_params_.f32(), d_grads_.f32()).ok());
    std::vector<float> gpu_grads(params_.size());
    ASSERT_NO_FATAL_FAILURE(Download(d_grads_, &gpu_grads));

    EXPECT_NEAR(*gpu_loss, *cpu_loss, 1e-4 * std::fabs(*cpu_loss));
    EXPECT_NEAR(gpu_->last_loss(), cpu_->last_loss(), 1e-4 * std::fabs(cpu_->last_loss()));

    int bad = 0;
    double max_abs = 0.0;
    for (const TensorInfo& t : gpu_->tensors()) {
      for (size_t i = 0; i < t.numel(); ++i) {
        const size_t j = t.offset + i;
        const double g = gpu_grads[j];
        const double c = cpu_grads[j];
        max_abs = std::max(max_abs, std::fabs(c));
        if (!(std::fabs(g - c) <= 1e-4 + 1e-3 * std::fabs(c))) {
          if (++bad <= 10) {
            ADD_FAILURE() << t.name << "[" << i << "]: cuda " << g << " vs cpu " << c;
          }
        }
      }
    }
    EXPECT_EQ(bad, 0) << "gradient entries out of tolerance";
    EXPECT_GT(max_abs, 1e-3) << "gradients are suspiciously small; the test is too weak";
  }

  ModelConfig cfg_;
  std::unique_ptr<Transformer> cpu_;
  std::unique_ptr<CudaTransformer> gpu_;
  std::vector<float> params_;
  std::unique_ptr<worker::Backend> backend_;  // Outlives the buffers below.
  worker::DeviceBuffer d_params_;
  worker::DeviceBuffer d_grads_;
};

TEST(CudaTransformerBuildTest, CompiledMatchesToolkit) {
  EXPECT_EQ(CudaModelCompiled(), ZF_EXPECT_CUDA_COMPILED != 0)
      << "CudaModelCompiled() disagrees with whether nvcc was found at build time";
  if (!CudaModelCompiled()) {
    EXPECT_EQ(worker::CudaDeviceCount(), 0);
  }
}

TEST(CudaTransformerBuildTest, CreateUnavailableWithoutDevice) {
  if (worker::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible";
  auto m = CudaTransformer::Create(SmallConfig(), 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
}

TEST(CudaTransformerBuildTest, CreateRejectsInvalidConfig) {
  ModelConfig cfg = SmallConfig();
  cfg.heads = 5;  // Does not divide width.
  auto m = CudaTransformer::Create(cfg, 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
}

TEST_F(CudaTransformerTest, LayoutMatchesCpu) {
  ASSERT_EQ(gpu_->tensors().size(), cpu_->tensors().size());
  for (size_t i = 0; i < gpu_->tensors().size(); ++i) {
    EXPECT_EQ(gpu_->tensors()[i].name, cpu_->tensors()[i].name);
    EXPECT_EQ(gpu_->tensors()[i].offset, cpu_->tensors()[i].offset);
    EXPECT_EQ(gpu_->tensors()[i].shape, cpu_->tensors()[i].shape);
  }
}

TEST_F(CudaTransformerTest, MatchesCpu) { CompareWithCpu(3, 11, 1); }

TEST_F(CudaTransformerTest, MatchesCpuAtFullContext) { CompareWithCpu(2, 16, 2); }

TEST_F(CudaTransformerTest, MatchesCpuWhenShapesChangeAndRepeat) {
  // Workspace reuse (same shape) and reallocation (new shapes).
  CompareWithCpu(2, 5, 3);
  CompareWithCpu(2, 5, 4);
  CompareWithCpu(1, 1, 5);
  CompareWithCpu(4, 9, 6);
  CompareWithCpu(2, 5, 7);
}

TEST_F(CudaTransformerTest, RejectsBadArguments) {
  EXPECT_EQ(gpu_->Backward(d_params_.f32(), d_grads_.f32()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::isnan(gpu_->last_loss()));
  std::vector<uint8_t> tokens = RandomTokens(2, 4, cfg_.vocab, 9);
  EXPECT_EQ(gpu_->Forward(d_params_.f32(), tokens.data(), 2, cfg_.context + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Forward(d_params_.f32(), tokens.data(), 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Forward(nullptr, tokens.data(), 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Host memory is not a valid parameter buffer.
  EXPECT_EQ(gpu_->Forward(params_.data(), tokens.data(), 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  tokens[3] = static_cast<uint8_t>(cfg_.vocab);
  EXPECT_EQ(gpu_->Forward(d_params_.f32(), tokens.data(), 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  tokens[3] = 0;
  auto loss = gpu_->Forward(d_params_.f32(), tokens.data(), 2, 4);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(std::isfinite(*loss));
  EXPECT_TRUE(gpu_->Backward(d_params_.f32(), d_grads_.f32()).ok());
  // An argument error leaves the last Forward usable (as in the CPU model).
  EXPECT_FALSE(gpu_->Forward(d_params_.f32(), tokens.data(), 0, 4).ok());
  EXPECT_TRUE(gpu_->Backward(d_params_.f32(), d_grads_.f32()).ok());
}

}  // namespace
}  // namespace model
}  // namespace zenflow
