// CUDA forward/backward of the reference transformer (see transformer_cuda.h
// and, for the math, transformer.cc).
//
// Row-major everywhere: activations are [rows][features], weights W[out][in].
// cuBLAS is column-major, so a row-major product C = op(A) op(B) is issued as
// the column-major product C^T = op(B)^T op(A)^T, i.e. with the operands
// swapped (see GemmRM). Attention works on per-head copies [b*h][seq][hd] of
// q, k and v so that one strided-batched GEMM covers every (batch, head).
//
// Reductions that produce gradients (bias, LayerNorm parameters, embeddings)
// run one thread per output element over the rows in order, so results are
// deterministic run to run (no atomics).
#include <cublas_v2.h>
#include <dlfcn.h>

#include <type_traits>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gpu_worker/cuda_util.h"
#include "gpu_worker/model/transformer.h"
#include "gpu_worker/model/transformer_cuda.h"
#include "gpu_worker/model/transformer_kernels.cuh"

namespace zenflow {
namespace model {
namespace {

using cuda_kernels::AddBiasResidualKernel;
using cuda_kernels::CausalSoftmaxBackwardKernel;
using cuda_kernels::CausalSoftmaxKernel;
using cuda_kernels::ColumnSumsKernel;
using cuda_kernels::CrossEntropyKernel;
using cuda_kernels::DLogitsKernel;
using cuda_kernels::EmbeddingForwardKernel;
using cuda_kernels::EmbeddingPosBackwardKernel;
using cuda_kernels::EmbeddingTokBackwardKernel;
using cuda_kernels::GeluBackwardKernel;
using cuda_kernels::GeluForwardKernel;
using cuda_kernels::LayerNormBackwardDxKernel;
using cuda_kernels::LayerNormBackwardParamsKernel;
using cuda_kernels::LayerNormForwardKernel;
using cuda_kernels::MeanLossKernel;
using cuda_kernels::MergeHeadsKernel;
using cuda_kernels::SplitHeadsKernel;
using cuda_kernels::kEwThreads;
using cuda_kernels::kRowThreads;

// ---------------------------------------------------------------------------
// Errors.

// Names this component in CUDA error messages (see gpu_worker/cuda_util.h).
constexpr char kWho[] = "CUDA transformer";

// cuBLAS, loaded with dlopen the first time a model is made, not linked:
// libcublasLt's static TLS (about 92 KiB) would otherwise be reserved in
// every thread of the process, and threads with small fixed stacks then fail
// to start (civetweb's, which serves zf_train --metrics_listen, use 100 KiB:
// pthread_create returned EINVAL). TLS of a dlopen'ed library is allocated
// per thread on first use instead. Only the calls this model makes.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The loaded API, or why it could not be loaded. Thread-safe (loaded once;
// the library stays loaded).
const absl::StatusOr<CublasApi>& Cublas() {
  static const absl::StatusOr<CublasApi>* api = [] {
    const std::string lib = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      return new absl::StatusOr<CublasApi>(absl::FailedPreconditionError(
          absl::StrCat(kWho, ": cannot load ", lib, ": ", dlerror())));
    }
    CublasApi a;
    std::string missing;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(h, name));
      if (*fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
    };
    sym(&a.create, "cublasCreate_v2");
    sym(&a.destroy, "cublasDestroy_v2");
    sym(&a.set_stream, "cublasSetStream_v2");
    sym(&a.set_math_mode, "cublasSetMathMode");
    sym(&a.sgemm, "cublasSgemm_v2");
    sym(&a.sgemm_strided_batched, "cublasSgemmStridedBatched");
    sym(&a.status_name, "cublasGetStatusName");
    sym(&a.status_string, "cublasGetStatusString");
    if (!missing.empty()) {
      return new absl::StatusOr<CublasApi>(absl::FailedPreconditionError(
          absl::StrCat(kWho, ": ", lib, " lacks ", missing)));
    }
    return new absl::StatusOr<CublasApi>(a);
  }();
  return *api;
}

absl::Status CublasStatus(cublasStatus_t st, const std::string& what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const CublasApi& api = *Cublas();  // a status comes from a loaded library
  const std::string msg =
      absl::StrCat(kWho, ": cuBLAS ", what, " failed: ", api.status_name(st), " (",
                   api.status_string(st), ")");
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

#define ZF_CUDA_TRY(expr, what) ZF_RETURN_IF_ERROR(worker::CudaStatus(kWho, (expr), (what)))
#define ZF_LAUNCH_CHECK(kernel) ZF_RETURN_IF_ERROR(worker::CheckLaunch(kWho, (kernel)))

unsigned int EwBlocks(size_t count) {
  size_t blocks = (count + kEwThreads - 1) / kEwThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > (size_t{1} << 20)) blocks = size_t{1} << 20;  // Grid-stride beyond.
  return static_cast<unsigned int>(blocks);
}

// ---------------------------------------------------------------------------
// Device workspace: one allocation carved into 256-byte aligned pieces.

class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T>
  T* Take(size_t count) {
    const size_t off = used_;
    used_ += (count * sizeof(T) + 255) / 256 * 256;
    return base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + off);
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

struct LayerActs {
  float* x_in;      // [n][d]
  float* ln1_out;   // [n][d]
  float* ln1_mean;  // [n]
  float* ln1_rstd;  // [n]
  float* qkv;       // [n][3d]
  float* probs;     // [batch*heads][seq][seq]
  float* attn;      // [n][d]
  float* x_mid;     // [n][d]
  float* ln2_out;   // [n][d]
  float* ln2_mean;  // [n]
  float* ln2_rstd;  // [n]
  float* h_pre;     // [n][f]
  float* h_tanh;    // [n][f]
  float* h_act;     // [n][f]
};

}  // namespace

// ---------------------------------------------------------------------------
// Free functions.

bool CudaModelCompiled() { return true; }

namespace {

absl::Status CheckDevice(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "CUDA transformer: no CUDA device is visible (cudaGetDeviceCount: ",
        err == cudaSuccess ? "0 devices" : cudaGetErrorString(err),
        "); check the driver and CUDA_VISIBLE_DEVICES, or use the CPU Transformer"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA transformer: device ", device, " does not exist (", count, " visible)"));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// CudaTransformer.

struct CudaTransformer::Impl {
  int device = 0;
  worker::CudaStream stream;
  cublasHandle_t cublas = nullptr;

  // Offsets (floats) into the parameter buffer.
  ParamOffsets offsets;

  // Workspace for (ws_batch, ws_seq).
  char* ws = nullptr;
  size_t ws_bytes = 0;
  int ws_batch = 0;
  int ws_seq = 0;
  std::vector<LayerActs> acts;
  float* x_final = nullptr;   // [n][d]
  float* lnf_out = nullptr;   // [n][d]
  float* lnf_mean = nullptr;  // [n]
  float* lnf_rstd = nullptr;  // [n]
  float* probs = nullptr;     // [n][vocab] logits, then softmax.
  double* row_loss = nullptr; // [n]
  double* loss = nullptr;     // [1]
  uint8_t* tokens = nullptr;  // [batch][seq + 1]
  // Scratch shared by all layers.
  float* q = nullptr;         // [bh][seq][hd] (each of q..dv is n*d floats)
  float* k = nullptr;
  float* v = nullptr;
  float* o = nullptr;         // Attention output per head; dO in backward.
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  float* dp = nullptr;        // [bh][seq][seq]
  float* d_res = nullptr;     // [n][d]
  float* d_ln = nullptr;      // [n][d]
  float* d_tmp = nullptr;     // [n][d]
  float* d_qkv = nullptr;     // [n][3d]
  float* d_h = nullptr;       // [n][f]
  float* d_logits = nullptr;  // [n][vocab]

  bool have_forward = false;

  ~Impl() {
    (void)cudaSetDevice(device);
    if (stream.get() != nullptr) (void)cudaStreamSynchronize(stream.get());
    if (ws != nullptr) (void)cudaFree(ws);
    if (cublas != nullptr) (void)Cublas()->destroy(cublas);
    stream.Reset();
  }

  // Assigns every workspace pointer inside `base` (or only measures when
  // base is null); returns the bytes needed.
  size_t Layout(char* base, const ModelConfig& cfg, int batch, int seq) {
    Carver c(base);
    const size_t n = static_cast<size_t>(batch) * seq;
    const size_t d = cfg.width;
    const size_t f = d * cfg.mlp_mult;
    const size_t vocab = cfg.vocab;
    const size_t scores = static_cast<size_t>(batch) * cfg.heads * seq * seq;
    acts.resize(cfg.layers);
    for (LayerActs& a : acts) {
      a.x_in = c.Take<float>(n * d);
      a.ln1_out = c.Take<float>(n * d);
      a.ln1_mean = c.Take<float>(n);
      a.ln1_rstd = c.Take<float>(n);
      a.qkv = c.Take<float>(n * 3 * d);
      a.probs = c.Take<float>(scores);
      a.attn = c.Take<float>(n * d);
      a.x_mid = c.Take<float>(n * d);
      a.ln2_out = c.Take<float>(n * d);
      a.ln2_mean = c.Take<float>(n);
      a.ln2_rstd = c.Take<float>(n);
      a.h_pre = c.Take<float>(n * f);
      a.h_tanh = c.Take<float>(n * f);
      a.h_act = c.Take<float>(n * f);
    }
    x_final = c.Take<float>(n * d);
    lnf_out = c.Take<float>(n * d);
    lnf_mean = c.Take<float>(n);
    lnf_rstd = c.Take<float>(n);
    probs = c.Take<float>(n * vocab);
    row_loss = c.Take<double>(n);
    loss = c.Take<double>(1);
    tokens = c.Take<uint8_t>(static_cast<size_t>(batch) * (seq + 1));
    q = c.Take<float>(n * d);
    k = c.Take<float>(n * d);
    v = c.Take<float>(n * d);
    o = c.Take<float>(n * d);
    dq = c.Take<float>(n * d);
    dk = c.Take<float>(n * d);
    dv = c.Take<float>(n * d);
    dp = c.Take<float>(scores);
    d_res = c.Take<float>(n * d);
    d_ln = c.Take<float>(n * d);
    d_tmp = c.Take<float>(n * d);
    d_qkv = c.Take<float>(n * 3 * d);
    d_h = c.Take<float>(n * f);
    d_logits = c.Take<float>(n * vocab);
    return c.used();
  }

  absl::Status Reserve(const ModelConfig& cfg, int batch, int seq) {
    if (ws != nullptr && batch == ws_batch && seq == ws_seq) return absl::OkStatus();
    if (ws != nullptr) {
      ZF_CUDA_TRY(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
      ZF_CUDA_TRY(cudaFree(ws), "cudaFree of the workspace");
      ws = nullptr;
      ws_bytes = 0;
      ws_batch = ws_seq = 0;
    }
    const size_t bytes = Layout(nullptr, cfg, batch, seq);
    void* p = nullptr;
    ZF_CUDA_TRY(cudaMalloc(&p, bytes),
                absl::StrCat("cudaMalloc of the ", bytes, "-byte workspace for batch ", batch,
                             ", seq ", seq));
    ws = static_cast<char*>(p);
    ws_bytes = bytes;
    ws_batch = batch;
    ws_seq = seq;
    Layout(ws, cfg, batch, seq);
    return absl::OkStatus();
  }

  // Row-major C[m][n] = alpha * op(A) op(B) + beta * C with op(A) m x k and
  // op(B) k x n; lda/ldb/ldc are the row lengths of the stored buffers. As
  // column-major cuBLAS sees each buffer transposed, this is
  // C^T = op(B)^T op(A)^T: B goes first, A second, and m, n swap.
  absl::Status GemmRM(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                      const float* b, int ldb, float beta, float* c, int ldc, const char* what) {
    return CublasStatus(Cublas()->sgemm(cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
                                        a, lda, &beta, c, ldc),
                        absl::StrCat("cublasSgemm (", what, ")"));
  }

  // GemmRM over `count` independent problems at fixed element strides.
  absl::Status GemmRMBatched(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                             int lda, long long sa, const float* b, int ldb, long long sb,
                             float beta, float* c, int ldc, long long sc, int count,
                             const char* what) {
    return CublasStatus(
        Cublas()->sgemm_strided_batched(cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
                                        sb, a, lda, sa, &beta, c, ldc, sc, count),
        absl::StrCat("cublasSgemmStridedBatched (", what, ")"));
  }

  // out[n][out_dim] = x[n][in_dim] W^T (+ bias) (+ residual).
  absl::Status Linear(const float* params, size_t w_off, const float* bias, const float* x, int n,
                      int in_dim, int out_dim, const float* residual, float* out,
                      const char* what) {
    ZF_RETURN_IF_ERROR(GemmRM(false, true, n, out_dim, in_dim, 1.0f, x, in_dim, params + w_off,
                              in_dim, 0.0f, out, out_dim, what));
    if (bias == nullptr && residual == nullptr) return absl::OkStatus();
    const size_t count = static_cast<size_t>(n) * out_dim;
    AddBiasResidualKernel<<<EwBlocks(count), kEwThreads, 0, stream.get()>>>(out, bias, residual,
                                                                            out_dim, count);
    ZF_LAUNCH_CHECK("AddBiasResidualKernel");
    return absl::OkStatus();
  }

  // dW = dy^T x and db = column sums of dy into grads (overwrite);
  // dx = dy W (overwrite) unless dx is null.
  absl::Status LinearBackward(const float* params, size_t w_off, float* grads, float* db,
                              const float* x, const float* dy, int n, int in_dim, int out_dim,
                              float* dx, const char* what) {
    ZF_RETURN_IF_ERROR(GemmRM(true, false, out_dim, in_dim, n, 1.0f, dy, out_dim, x, in_dim,
                              0.0f, grads + w_off, in_dim, what));
    if (db != nullptr) {
      ColumnSumsKernel<<<(out_dim + kEwThreads - 1) / kEwThreads, kEwThreads, 0, stream.get()>>>(
          dy, n, out_dim, db);
      ZF_LAUNCH_CHECK("ColumnSumsKernel");
    }
    if (dx == nullptr) return absl::OkStatus();
    return GemmRM(false, false, n, in_dim, out_dim, 1.0f, dy, out_dim, params + w_off, in_dim,
                  0.0f, dx, in_dim, what);
  }

  absl::Status LayerNormForward(const float* x, const float* g, const float* b, int n, int d,
                                float* y, float* mean, float* rstd) {
    LayerNormForwardKernel<<<n, kRowThreads, 0, stream.get()>>>(x, g, b, d, y, mean, rstd);
    ZF_LAUNCH_CHECK("LayerNormForwardKernel");
    return absl::OkStatus();
  }

  absl::Status LayerNormBackward(const float* x, const float* mean, const float* rstd,
                                 const float* g, const float* dy, int n, int d, bool accumulate,
                                 float* dx, float* dg, float* db) {
    LayerNormBackwardDxKernel<<<n, kRowThreads, 0, stream.get()>>>(x, mean, rstd, g, dy, d,
                                                                   accumulate ? 1 : 0, dx);
    ZF_LAUNCH_CHECK("LayerNormBackwardDxKernel");
    LayerNormBackwardParamsKernel<<<(d + kEwThreads - 1) / kEwThreads, kEwThreads, 0,
                                    stream.get()>>>(x, mean, rstd, dy, n, d, dg, db);
    ZF_LAUNCH_CHECK("LayerNormBackwardParamsKernel");
    return absl::OkStatus();
  }

  absl::Status SplitHeads(const float* src, int ld, int off, int batch, int seq, int heads,
                          int hd, float* dst) {
    const size_t count = static_cast<size_t>(batch) * heads * seq * hd;
    SplitHeadsKernel<<<EwBlocks(count), kEwThreads, 0, stream.get()>>>(src, ld, off, seq, heads, hd,
                                                                       count, dst);
    ZF_LAUNCH_CHECK("SplitHeadsKernel");
    return absl::OkStatus();
  }

  absl::Status MergeHeads(const float* src, int ld, int off, int batch, int seq, int heads,
                          int hd, float* dst) {
    const size_t count = static_cast<size_t>(batch) * heads * seq * hd;
    MergeHeadsKernel<<<EwBlocks(count), kEwThreads, 0, stream.get()>>>(src, ld, off, seq, heads, hd,
                                                                       count, dst);
    ZF_LAUNCH_CHECK("MergeHeadsKernel");
    return absl::OkStatus();
  }

  // probs = causal softmax(scale q k^T); attn = probs v, heads merged.
  absl::Status AttentionForward(const LayerActs& a, const ModelConfig& cfg, int batch, int seq) {
    const int d = cfg.width;
    const int heads = cfg.heads;
    const int hd = d / heads;
    const int bh = batch * heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const long long s_qkv = static_cast<long long>(seq) * hd;
    const long long s_p = static_cast<long long>(seq) * seq;
    ZF_RETURN_IF_ERROR(SplitHeads(a.qkv, 3 * d, 0, batch, seq, heads, hd, q));
    ZF_RETURN_IF_ERROR(SplitHeads(a.qkv, 3 * d, d, batch, seq, heads, hd, k));
    ZF_RETURN_IF_ERROR(SplitHeads(a.qkv, 3 * d, 2 * d, batch, seq, heads, hd, v));
    // scores[t][u] = scale * q_t . k_u
    ZF_RETURN_IF_ERROR(GemmRMBatched(false, true, seq, seq, hd, scale, q, hd, s_qkv, k, hd, s_qkv,
                                     0.0f, a.probs, seq, s_p, bh, "attention scores"));
    CausalSoftmaxKernel<<<static_cast<unsigned int>(static_cast<size_t>(bh) * seq), kRowThreads, 0,
                          stream.get()>>>(a.probs, seq);
    ZF_LAUNCH_CHECK("CausalSoftmaxKernel");
    // o[t] = sum_u p[t][u] v_u
    ZF_RETURN_IF_ERROR(GemmRMBatched(false, false, seq, hd, seq, 1.0f, a.probs, seq, s_p, v, hd,
                                     s_qkv, 0.0f, o, hd, s_qkv, bh, "attention output"));
    return MergeHeads(o, d, 0, batch, seq, heads, hd, a.attn);
  }

  // d_qkv (overwritten) from d_attn.
  absl::Status AttentionBackward(const LayerActs& a, const float* d_attn, const ModelConfig& cfg,
                                 int batch, int seq, float* dqkv) {
    const int d = cfg.width;
    const int heads = cfg.heads;
    const int hd = d / heads;
    const int bh = batch * heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const long long s_qkv = static_cast<long long>(seq) * hd;
    const long long s_p = static_cast<long long>(seq) * seq;
    ZF_RETURN_IF_ERROR(SplitHeads(a.qkv, 3 * d, 0, batch, seq, heads, hd, q));
    ZF_RETURN_IF_ERROR(SplitHeads(a.qkv, 3 * d, d, batch, seq, heads, hd, k));
    ZF_RETURN_IF_ERROR(SplitHeads(a.qkv, 3 * d, 2 * d, batch, seq, heads, hd, v));
    float* dout = o;
    ZF_RETURN_IF_ERROR(SplitHeads(d_attn, d, 0, batch, seq, heads, hd, dout));
    // dP = dO V^T
    ZF_RETURN_IF_ERROR(GemmRMBatched(false, true, seq, seq, hd, 1.0f, dout, hd, s_qkv, v, hd,
                                     s_qkv, 0.0f, dp, seq, s_p, bh, "attention dP"));
    // dV = P^T dO
    ZF_RETURN_IF_ERROR(GemmRMBatched(true, false, seq, hd, seq, 1.0f, a.probs, seq, s_p, dout, hd,
                                     s_qkv, 0.0f, dv, hd, s_qkv, bh, "attention dV"));
    // dS = P (dP - rowsum(P dP)) * scale, in place in dp.
    CausalSoftmaxBackwardKernel<<<static_cast<unsigned int>(static_cast<size_t>(bh) * seq),
                                  kRowThreads, 0, stream.get()>>>(a.probs, dp, seq, scale);
    ZF_LAUNCH_CHECK("CausalSoftmaxBackwardKernel");
    // dQ = dS K, dK = dS^T Q
    ZF_RETURN_IF_ERROR(GemmRMBatched(false, false, seq, hd, seq, 1.0f, dp, seq, s_p, k, hd, s_qkv,
                                     0.0f, dq, hd, s_qkv, bh, "attention dQ"));
    ZF_RETURN_IF_ERROR(GemmRMBatched(true, false, seq, hd, seq, 1.0f, dp, seq, s_p, q, hd, s_qkv,
                                     0.0f, dk, hd, s_qkv, bh, "attention dK"));
    ZF_RETURN_IF_ERROR(MergeHeads(dq, 3 * d, 0, batch, seq, heads, hd, dqkv));
    ZF_RETURN_IF_ERROR(MergeHeads(dk, 3 * d, d, batch, seq, heads, hd, dqkv));
    return MergeHeads(dv, 3 * d, 2 * d, batch, seq, heads, hd, dqkv);
  }
};

absl::StatusOr<std::unique_ptr<CudaTransformer>> CudaTransformer::Create(const ModelConfig& cfg,
                                                                         int device) {
  ZF_RETURN_IF_ERROR(cfg.Validate());
  ZF_RETURN_IF_ERROR(CheckDevice(device));
  std::unique_ptr<CudaTransformer> m(new CudaTransformer(cfg, device));
  Impl& im = *m->impl_;
  ZF_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
  // A blocking stream: ordered with the legacy default stream, so plain
  // cudaMemcpy / kernels on stream 0 that write the parameters are seen.
  ZF_RETURN_IF_ERROR(im.stream.Create(kWho, cudaStreamDefault));
  ZF_RETURN_IF_ERROR(Cublas().status());
  const CublasApi& api = *Cublas();
  ZF_RETURN_IF_ERROR(CublasStatus(api.create(&im.cublas), "cublasCreate"));
  ZF_RETURN_IF_ERROR(CublasStatus(api.set_stream(im.cublas, im.stream.get()), "cublasSetStream"));
  // Plain fp32 arithmetic (no TF32 tensor-op downconversion).
  ZF_RETURN_IF_ERROR(
      CublasStatus(api.set_math_mode(im.cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  return m;
}

CudaTransformer::CudaTransformer(const ModelConfig& cfg, int device)
    : cfg_(cfg),
      device_(device),
      tensors_(BuildTensorLayout(cfg)),
      last_loss_(std::numeric_limits<double>::quiet_NaN()),
      impl_(std::make_unique<Impl>()) {
  num_params_ = tensors_.back().offset + tensors_.back().numel();
  Impl& im = *impl_;
  im.device = device;
  im.offsets = BuildParamOffsets(cfg);
}

CudaTransformer::~CudaTransformer() = default;

namespace {

// InvalidArgument unless p is device (or managed) memory of `device`.
absl::Status CheckDevicePointer(const void* p, int device, const char* what) {
  cudaPointerAttributes attr;
  std::memset(&attr, 0, sizeof(attr));
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA transformer: ", what, " is not a CUDA pointer (", cudaGetErrorString(err), ")"));
  }
  if (attr.type == cudaMemoryTypeManaged) return absl::OkStatus();
  if (attr.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA transformer: ", what, " must point to device memory (got a host pointer)"));
  }
  if (attr.device != device) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA transformer: ", what,
                                                   " is on device ", attr.device,
                                                   " but the model runs on device ", device));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<float> CudaTransformer::Forward(const float* d_params, const uint8_t* host_tokens,
                                               int batch, int seq) {
  if (d_params == nullptr || host_tokens == nullptr) {
    return absl::InvalidArgumentError("Forward: null params or tokens");
  }
  if (batch < 1 || seq < 1 || seq > cfg_.context) {
    return absl::InvalidArgumentError(
        absl::StrCat("Forward: need batch >= 1 and 1 <= seq <= context (", cfg_.context,
                     "); got batch ", batch, ", seq ", seq));
  }
  // Every row count handed to cuBLAS or used as a grid size is an int.
  const int64_t rows = int64_t{batch} * seq;
  const int64_t score_rows = rows * cfg_.heads;
  if (rows > INT_MAX || score_rows > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("Forward: batch * seq * heads = ", score_rows, " is too large"));
  }
  const size_t tok_count = static_cast<size_t>(batch) * (seq + 1);
  for (size_t i = 0; i < tok_count; ++i) {
    if (host_tokens[i] >= cfg_.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("Forward: token ",
                                                     static_cast<int>(host_tokens[i]),
                                                     " at index ", i, " is >= vocab ", cfg_.vocab));
    }
  }
  Impl& im = *impl_;
  ZF_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
  ZF_RETURN_IF_ERROR(CheckDevicePointer(d_params, device_, "Forward params"));
  im.have_forward = false;
  ZF_RETURN_IF_ERROR(im.Reserve(cfg_, batch, seq));
  cudaStream_t stream = im.stream.get();
  ZF_CUDA_TRY(cudaMemcpyAsync(im.tokens, host_tokens, tok_count, cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync of the tokens");

  const float* params = d_params;
  const int n = batch * seq;
  const int d = cfg_.width;
  const int f = d * cfg_.mlp_mult;
  const int vocab = cfg_.vocab;
  const size_t nd = static_cast<size_t>(n) * d;

  EmbeddingForwardKernel<<<EwBlocks(nd), kEwThreads, 0, stream>>>(
      params + im.offsets.tok_emb, params + im.offsets.pos_emb, im.tokens, seq, d, nd,
      im.acts[0].x_in);
  ZF_LAUNCH_CHECK("EmbeddingForwardKernel");

  for (int l = 0; l < cfg_.layers; ++l) {
    const LayerActs& a = im.acts[l];
    const LayerOffsets& o = im.offsets.layers[l];
    ZF_RETURN_IF_ERROR(im.LayerNormForward(a.x_in, params + o.ln1_g, params + o.ln1_b, n, d,
                                           a.ln1_out, a.ln1_mean, a.ln1_rstd));
    ZF_RETURN_IF_ERROR(im.Linear(params, o.wqkv, params + o.bqkv, a.ln1_out, n, d, 3 * d,
                                 nullptr, a.qkv, "qkv"));
    ZF_RETURN_IF_ERROR(im.AttentionForward(a, cfg_, batch, seq));
    ZF_RETURN_IF_ERROR(
        im.Linear(params, o.wo, params + o.bo, a.attn, n, d, d, a.x_in, a.x_mid, "attn out"));
    ZF_RETURN_IF_ERROR(im.LayerNormForward(a.x_mid, params + o.ln2_g, params + o.ln2_b, n, d,
                                           a.ln2_out, a.ln2_mean, a.ln2_rstd));
    ZF_RETURN_IF_ERROR(
        im.Linear(params, o.w1, params + o.b1, a.ln2_out, n, d, f, nullptr, a.h_pre, "mlp.w1"));
    const size_t nf = static_cast<size_t>(n) * f;
    GeluForwardKernel<<<EwBlocks(nf), kEwThreads, 0, stream>>>(a.h_pre, nf, a.h_tanh, a.h_act);
    ZF_LAUNCH_CHECK("GeluForwardKernel");
    float* next = (l + 1 < cfg_.layers) ? im.acts[l + 1].x_in : im.x_final;
    ZF_RETURN_IF_ERROR(
        im.Linear(params, o.w2, params + o.b2, a.h_act, n, f, d, a.x_mid, next, "mlp.w2"));
  }

  ZF_RETURN_IF_ERROR(im.LayerNormForward(im.x_final, params + im.offsets.lnf_g,
                                         params + im.offsets.lnf_b, n, d, im.lnf_out, im.lnf_mean,
                                         im.lnf_rstd));
  ZF_RETURN_IF_ERROR(im.Linear(params, im.offsets.head, nullptr, im.lnf_out, n, d, vocab, nullptr,
                               im.probs, "head"));
  CrossEntropyKernel<<<n, kRowThreads, 0, stream>>>(im.probs, im.tokens, seq, vocab,
                                                    im.row_loss);
  ZF_LAUNCH_CHECK("CrossEntropyKernel");
  MeanLossKernel<<<1, 1024, 0, stream>>>(im.row_loss, n, im.loss);
  ZF_LAUNCH_CHECK("MeanLossKernel");

  double loss = 0.0;
  ZF_CUDA_TRY(cudaMemcpyAsync(&loss, im.loss, sizeof(double), cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync of the loss");
  ZF_CUDA_TRY(cudaStreamSynchronize(stream), "Forward (cudaStreamSynchronize)");
  last_loss_ = loss;
  im.have_forward = true;
  return static_cast<float>(loss);
}

absl::Status CudaTransformer::Backward(const float* d_params, float* d_grads) {
  Impl& im = *impl_;
  if (!im.have_forward) {
    return absl::FailedPreconditionError("Backward: no successful Forward to differentiate");
  }
  if (d_params == nullptr || d_grads == nullptr) {
    return absl::InvalidArgumentError("Backward: null params or grads");
  }
  ZF_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
  ZF_RETURN_IF_ERROR(CheckDevicePointer(d_params, device_, "Backward params"));
  ZF_RETURN_IF_ERROR(CheckDevicePointer(d_grads, device_, "Backward grads"));
  cudaStream_t stream = im.stream.get();
  const float* params = d_params;
  float* grads = d_grads;
  const int batch = im.ws_batch;
  const int seq = im.ws_seq;
  const int n = batch * seq;
  const int d = cfg_.width;
  const int f = d * cfg_.mlp_mult;
  const int vocab = cfg_.vocab;

  ZF_CUDA_TRY(cudaMemsetAsync(grads, 0, num_params_ * sizeof(float), stream),
              "cudaMemsetAsync of the gradients");
  {
    const size_t count = static_cast<size_t>(n) * vocab;
    DLogitsKernel<<<EwBlocks(count), kEwThreads, 0, stream>>>(im.probs, im.tokens, seq, vocab,
                                                              1.0f / n, count, im.d_logits);
    ZF_LAUNCH_CHECK("DLogitsKernel");
  }
  ZF_RETURN_IF_ERROR(im.LinearBackward(params, im.offsets.head, grads, nullptr, im.lnf_out,
                                       im.d_logits, n, d, vocab, im.d_ln, "head backward"));
  ZF_RETURN_IF_ERROR(im.LayerNormBackward(
      im.x_final, im.lnf_mean, im.lnf_rstd, params + im.offsets.lnf_g, im.d_ln, n, d,
      /*accumulate=*/false, im.d_res, grads + im.offsets.lnf_g, grads + im.offsets.lnf_b));

  for (int l = cfg_.layers - 1; l >= 0; --l) {
    const LayerActs& a = im.acts[l];
    const LayerOffsets& o = im.offsets.layers[l];
    // MLP branch.
    ZF_RETURN_IF_ERROR(im.LinearBackward(params, o.w2, grads, grads + o.b2, a.h_act, im.d_res, n,
                                         f, d, im.d_h, "mlp.w2 backward"));
    const size_t nf = static_cast<size_t>(n) * f;
    GeluBackwardKernel<<<EwBlocks(nf), kEwThreads, 0, stream>>>(a.h_pre, a.h_tanh, nf, im.d_h);
    ZF_LAUNCH_CHECK("GeluBackwardKernel");
    ZF_RETURN_IF_ERROR(im.LinearBackward(params, o.w1, grads, grads + o.b1, a.ln2_out, im.d_h, n,
                                         d, f, im.d_ln, "mlp.w1 backward"));
    ZF_RETURN_IF_ERROR(im.LayerNormBackward(a.x_mid, a.ln2_mean, a.ln2_rstd, params + o.ln2_g,
                                            im.d_ln, n, d, /*accumulate=*/true, im.d_res,
                                            grads + o.ln2_g, grads + o.ln2_b));
    // Attention branch.
    ZF_RETURN_IF_ERROR(im.LinearBackward(params, o.wo, grads, grads + o.bo, a.attn, im.d_res, n, d,
                                         d, im.d_tmp, "attn out backward"));
    ZF_RETURN_IF_ERROR(im.AttentionBackward(a, im.d_tmp, cfg_, batch, seq, im.d_qkv));
    ZF_RETURN_IF_ERROR(im.LinearBackward(params, o.wqkv, grads, grads + o.bqkv, a.ln1_out,
                                         im.d_qkv, n, d, 3 * d, im.d_ln, "qkv backward"));
    ZF_RETURN_IF_ERROR(im.LayerNormBackward(a.x_in, a.ln1_mean, a.ln1_rstd, params + o.ln1_g,
                                            im.d_ln, n, d, /*accumulate=*/true, im.d_res,
                                            grads + o.ln1_g, grads + o.ln1_b));
  }

  EmbeddingTokBackwardKernel<<<(d + kEwThreads - 1) / kEwThreads, kEwThreads, 0, stream>>>(
      im.d_res, im.tokens, n, seq, d, grads + im.offsets.tok_emb);
  ZF_LAUNCH_CHECK("EmbeddingTokBackwardKernel");
  const size_t sd = static_cast<size_t>(seq) * d;
  EmbeddingPosBackwardKernel<<<EwBlocks(sd), kEwThreads, 0, stream>>>(im.d_res, batch, seq, d,
                                                                      grads + im.offsets.pos_emb);
  ZF_LAUNCH_CHECK("EmbeddingPosBackwardKernel");
  ZF_CUDA_TRY(cudaStreamSynchronize(stream), "Backward (cudaStreamSynchronize)");
  return absl::OkStatus();
}

}  // namespace model
}  // namespace zenflow
