// Reference model for the fine-tuning experiments: a small decoder-only
// transformer language model over bytes, with forward and backward passes on
// the CPU (multithreaded through common/thread_pool.h).
//
// All parameters live in ONE contiguous fp32 buffer described by tensors();
// gradients use the same layout in a second buffer. Every weight matrix is
// stored W[out][in] row-major (rows = output features, columns = input
// channels), and linear layers compute y = x W^T + b, so an optimizer such as
// ZenFlow can treat each weight as a 2-D tensor and select columns.
//
//   ModelConfig cfg;
//   ZF_ASSIGN_OR_RETURN(auto model, Transformer::Create(cfg, /*threads=*/2));
//   std::vector<float> params(model->num_params()), grads(params.size());
//   model->InitParams(params.data());
//   ZF_ASSIGN_OR_RETURN(float loss, model->Forward(params.data(), tokens,
//                                                  batch, seq));
//   ZF_RETURN_IF_ERROR(model->Backward(params.data(), grads.data()));

#ifndef ZENFLOW_GPU_WORKER_MODEL_TRANSFORMER_H_
#define ZENFLOW_GPU_WORKER_MODEL_TRANSFORMER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/thread_pool.h"

namespace zenflow {
namespace model {

// Architecture hyper-parameters. Plain value type.
struct ModelConfig {
  int vocab = 256;    // Token ids are bytes, so 2 <= vocab <= 256.
  int layers = 2;     // Transformer blocks, >= 1.
  int width = 64;     // Residual stream width, divisible by heads.
  int heads = 4;      // Attention heads.
  int context = 64;   // Maximum sequence length (learned positions).
  int mlp_mult = 4;   // MLP hidden width = mlp_mult * width.
  uint64_t seed = 1;  // Seed of InitParams.

  // OK when every field is in range and width % heads == 0.
  absl::Status Validate() const;

  bool operator==(const ModelConfig& o) const {
    return vocab == o.vocab && layers == o.layers && width == o.width &&
           heads == o.heads && context == o.context &&
           mlp_mult == o.mlp_mult && seed == o.seed;
  }
  bool operator!=(const ModelConfig& o) const { return !(*this == o); }
};

// One parameter tensor inside the flat parameter buffer.
struct TensorInfo {
  std::string name;            // e.g. "layers.0.attn.wqkv".
  std::vector<int64_t> shape;  // [out, in] for matrices, [n] for vectors.
  size_t offset = 0;           // In floats, from the start of the buffer.

  // Product of the shape.
  size_t numel() const;
};

// The parameter layout of `cfg` (which must be valid), in buffer order:
// tok_emb, pos_emb, layers.<i>.{ln1.g, ln1.b, attn.wqkv, attn.bqkv, attn.wo,
// attn.bo, ln2.g, ln2.b, mlp.w1, mlp.b1, mlp.w2, mlp.b2}, ln_f.g, ln_f.b,
// head. Tensors are packed back to back without padding.
std::vector<TensorInfo> BuildTensorLayout(const ModelConfig& cfg);

// Total number of parameters of `cfg`; error when cfg is invalid.
absl::StatusOr<size_t> NumParams(const ModelConfig& cfg);

// Offsets (in floats) of the tensors of one block.
struct LayerOffsets {
  size_t ln1_g, ln1_b, wqkv, bqkv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2;
};

// Where each tensor of BuildTensorLayout(cfg) starts, by role: the table the
// forward and backward passes of both models (Transformer and
// CudaTransformer) index the parameter and gradient buffers with.
struct ParamOffsets {
  size_t tok_emb = 0, pos_emb = 0, lnf_g = 0, lnf_b = 0, head = 0;
  std::vector<LayerOffsets> layers;  // One per block.
};

// The offsets of BuildTensorLayout(cfg); `cfg` must be valid.
ParamOffsets BuildParamOffsets(const ModelConfig& cfg);

// The model: parameter layout, initialization, forward and backward passes.
// The parameters are NOT owned; callers pass the flat buffer to each call.
//
// Thread-compatible: the object owns the activation workspace of the last
// Forward, so calls on one instance must be serialized; distinct instances
// may be used concurrently. Results are bitwise identical for any thread
// count (every reduction has a fixed order independent of the partition).
class Transformer {
 public:
  // Validates `cfg`; `threads` >= 1 is the size of the internal thread pool
  // (the calling thread counts as one).
  static absl::StatusOr<std::unique_ptr<Transformer>> Create(
      const ModelConfig& cfg, int threads);

  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;
  ~Transformer();

  const ModelConfig& config() const { return cfg_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t num_params() const { return num_params_; }
  int threads() const { return pool_->num_threads(); }

  // Index into tensors() of `name`, or -1.
  int FindTensor(const std::string& name) const;

  // Writes a deterministic initialization (a function of config().seed
  // only) into params[0, num_params()): normal(0, 0.02) for matrices and
  // embeddings, zeros for biases and LayerNorm shifts, ones for LayerNorm
  // gains.
  void InitParams(float* params) const;

  // tokens is [batch][seq + 1] bytes: inputs are tokens[:, :seq], targets
  // tokens[:, 1:]. Returns the mean cross-entropy (natural log) over the
  // batch * seq predictions, and keeps the activations for Backward.
  // Requires batch >= 1, 1 <= seq <= context and every token < vocab.
  absl::StatusOr<float> Forward(const float* params, const uint8_t* tokens,
                                int batch, int seq);

  // The loss of the last successful Forward, accumulated in double (useful
  // for finite-difference checks). NaN before the first Forward.
  double last_loss() const { return last_loss_; }

  // Writes d(mean loss)/d(params) for the last Forward into
  // grads[0, num_params()), overwriting it. `params` must be the buffer the
  // last Forward used, unchanged. FailedPrecondition without a Forward.
  absl::Status Backward(const float* params, float* grads);

 private:
  // Activations of one block kept for the backward pass.
  struct LayerActs {
    std::vector<float> x_in;      // [n][d] block input (residual stream).
    std::vector<float> ln1_out;   // [n][d]
    std::vector<float> ln1_mean;  // [n]
    std::vector<float> ln1_rstd;  // [n]
    std::vector<float> qkv;       // [n][3d]
    std::vector<float> probs;     // [batch][heads][seq][seq] attention.
    std::vector<float> attn;      // [n][d] attention output, pre-projection.
    std::vector<float> x_mid;     // [n][d] after the attention residual.
    std::vector<float> ln2_out;   // [n][d]
    std::vector<float> ln2_mean;  // [n]
    std::vector<float> ln2_rstd;  // [n]
    std::vector<float> h_pre;     // [n][f] MLP pre-activation.
    std::vector<float> h_tanh;    // [n][f] tanh term of the GELU.
    std::vector<float> h_act;     // [n][f] GELU output.
  };

  Transformer(const ModelConfig& cfg, int threads);

  // Resizes the workspace for `batch` x `seq`.
  void Reserve(int batch, int seq);

  // out[n][out_dim] = x[n][in_dim] W^T + bias, W = params + w_off.
  void Linear(const float* params, size_t w_off, size_t b_off, const float* x,
              int n, int in_dim, int out_dim, float* out);
  // Backward of Linear: writes dW, db into grads, dx = dy W (overwrite).
  void LinearBackward(const float* params, size_t w_off, size_t b_off,
                      const float* x, const float* dy, int n, int in_dim,
                      int out_dim, float* grads, float* dx);

  void AttentionForward(LayerActs* a, int batch, int seq);
  void AttentionBackward(const LayerActs& a, const float* d_attn, int batch,
                         int seq, float* d_qkv);

  ModelConfig cfg_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<TensorInfo> tensors_;
  std::vector<int> init_kind_;  // Per tensor: 0 normal, 1 zeros, 2 ones.
  size_t num_params_ = 0;
  ParamOffsets off_;  // Where each tensor of tensors_ starts, by role.

  // Workspace of the last Forward.
  int batch_ = 0;
  int seq_ = 0;
  bool have_forward_ = false;
  double last_loss_;
  std::vector<uint8_t> tokens_;   // [batch][seq + 1]
  std::vector<LayerActs> acts_;
  std::vector<float> x_final_;    // [n][d]
  std::vector<float> lnf_out_;    // [n][d]
  std::vector<float> lnf_mean_;   // [n]
  std::vector<float> lnf_rstd_;   // [n]
  std::vector<float> probs_;      // [n][vocab] softmax of the logits.
  std::vector<double> row_loss_;  // [n]
  std::vector<float> wt_;         // Transposed weight scratch.

  // Backward scratch.
  std::vector<float> d_res_;   // [n][d] gradient of the residual stream.
  std::vector<float> d_ln_;    // [n][d]
  std::vector<float> d_tmp_;   // [n][d]
  std::vector<float> d_qkv_;   // [n][3d]
  std::vector<float> d_h_;     // [n][f]
  std::vector<float> d_logits_;  // [n][vocab]
};

// Writes `params` (n floats, n == NumParams(cfg)) and `cfg` to `path` in a
// small little-endian binary format: magic "ZFMODEL\0", version, config,
// parameter count, the parameters and an FNV-1a 64 checksum. The file is
// written to path + ".tmp" and renamed into place.
absl::Status SaveParams(const std::string& path, const ModelConfig& cfg,
                        const float* params, size_t n);

// Reads a file written by SaveParams; stores its config in *cfg_out (may be
// null). NotFound when the file is missing, InvalidArgument for a file that
// is not a model file or has an unsupported version, DataLoss for a
// truncated or corrupted file (size or checksum mismatch, bad config).
absl::StatusOr<std::vector<float>> LoadParams(const std::string& path,
                                              ModelConfig* cfg_out);

}  // namespace model
}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_MODEL_TRANSFORMER_H_
