// Decoder-only byte-level transformer: init, forward and backward (the
// layout is in layout.cc, the parameter files in param_file.cc). See
// transformer.h.
//
// Determinism: every matrix product is partitioned over fixed 4-row tiles of
// its output, and each output element is a k-ordered sum computed by the same
// code whatever the tiling of threads; column sums (bias and LayerNorm
// gradients) are partitioned over columns; embedding gradients are scattered
// serially. Hence results do not depend on the thread count.

#include "gpu_worker/model/transformer.h"

#include "common/simd.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace zenflow {
namespace model {
namespace {

constexpr size_t kNoBias = std::numeric_limits<size_t>::max();
constexpr float kLnEps = 1e-5f;

// ---------------------------------------------------------------------------
// Matrix product C[m][n] (+)= sum_k A(m, k) * B[k][n].

// A(m, k) = p[m * rs + k * cs]; strides allow reading a transposed operand.
struct MatA {
  const float* p;
  int64_t rs;
  int64_t cs;
};

struct GemmArgs {
  int m;
  int n;
  int k;
  MatA a;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  bool accumulate;  // C += product instead of C = product.
};

constexpr int kMr = 4;  // Rows of C per tile (the unit of thread partition).

typedef float Vec4 __attribute__((vector_size(16)));
typedef float Vec8 __attribute__((vector_size(32)));

// Writes one row segment of two vectors.
template <typename V>
__attribute__((always_inline)) inline void StoreRow(float* dst, const V* lo,
                                                    const V* hi,
                                                    bool accumulate) {
  constexpr int kW = sizeof(V) / sizeof(float);
  if (accumulate) {
    V d0, d1;
    std::memcpy(&d0, dst, sizeof(V));
    std::memcpy(&d1, dst + kW, sizeof(V));
    d0 += *lo;
    d1 += *hi;
    std::memcpy(dst, &d0, sizeof(V));
    std::memcpy(dst + kW, &d1, sizeof(V));
  } else {
    std::memcpy(dst, lo, sizeof(V));
    std::memcpy(dst + kW, hi, sizeof(V));
  }
}

// Computes the row tiles [tile_begin, tile_end) of C. Each element is
// acc = sum over k in increasing order (starting from 0), then C = acc or
// C += acc; the scalar tail computes exactly the same expression.
template <typename V>
__attribute__((always_inline)) inline void GemmTiles(const GemmArgs& g,
                                                     size_t tile_begin,
                                                     size_t tile_end) {
  constexpr int kW = sizeof(V) / sizeof(float);
  constexpr int kNr = 2 * kW;
  const int n_full = g.n / kNr * kNr;
  const int64_t rs = g.a.rs;
  const int64_t cs = g.a.cs;
  for (int j0 = 0; j0 < n_full; j0 += kNr) {
    for (size_t t = tile_begin; t < tile_end; ++t) {
      const int i0 = static_cast<int>(t) * kMr;
      const int rows = std::min(kMr, g.m - i0);
      const float* a0 = g.a.p + i0 * rs;
      const float* bp = g.b + j0;
      if (rows == kMr) {
        const float* a1 = a0 + rs;
        const float* a2 = a1 + rs;
        const float* a3 = a2 + rs;
        V c00 = {}, c01 = {}, c10 = {}, c11 = {};
        V c20 = {}, c21 = {}, c30 = {}, c31 = {};
        for (int kk = 0; kk < g.k; ++kk) {
          V b0, b1;
          std::memcpy(&b0, bp, sizeof(V));
          std::memcpy(&b1, bp + kW, sizeof(V));
          const int64_t ko = kk * cs;
          const float x0 = a0[ko], x1 = a1[ko], x2 = a2[ko], x3 = a3[ko];
          c00 += x0 * b0;
          c01 += x0 * b1;
          c10 += x1 * b0;
          c11 += x1 * b1;
          c20 += x2 * b0;
          c21 += x2 * b1;
          c30 += x3 * b0;
          c31 += x3 * b1;
          bp += g.ldb;
        }
        float* cp = g.c + i0 * g.ldc + j0;
        StoreRow<V>(cp, &c00, &c01, g.accumulate);
        StoreRow<V>(cp + g.ldc, &c10, &c11, g.accumulate);
        StoreRow<V>(cp + 2 * g.ldc, &c20, &c21, g.accumulate);
        StoreRow<V>(cp + 3 * g.ldc, &c30, &c31, g.accumulate);
      } else {
        for (int r = 0; r < rows; ++r) {
          const float* ar = a0 + r * rs;
          const float* brow = bp;
          V c0 = {}, c1 = {};
          for (int kk = 0; kk < g.k; ++kk) {
            V b0, b1;
            std::memcpy(&b0, brow, sizeof(V));
            std::memcpy(&b1, brow + kW, sizeof(V));
            const float x = ar[kk * cs];
            c0 += x * b0;
            c1 += x * b1;
            brow += g.ldb;
          }
          StoreRow<V>(g.c + (i0 + r) * g.ldc + j0, &c0, &c1, g.accumulate);
        }
      }
    }
  }
  if (n_full == g.n) return;
  for (size_t t = tile_begin; t < tile_end; ++t) {
    const int i0 = static_cast<int>(t) * kMr;
    const int rows = std::min(kMr, g.m - i0);
    for (int r = 0; r < rows; ++r) {
      const float* ar = g.a.p + (i0 + r) * rs;
      float* cr = g.c + (i0 + r) * g.ldc;
      for (int j = n_full; j < g.n; ++j) {
        float acc = 0.0f;
        for (int kk = 0; kk < g.k; ++kk) acc += ar[kk * cs] * g.b[kk * g.ldb + j];
        cr[j] = g.accumulate ? cr[j] + acc : acc;
      }
    }
  }
}

void GemmTilesGeneric(const GemmArgs& g, size_t b, size_t e) {
  GemmTiles<Vec4>(g, b, e);
}

__attribute__((target("avx2"))) void GemmTilesAvx2(const GemmArgs& g,
                                                     size_t b, size_t e) {
  GemmTiles<Vec8>(g, b, e);
}

using GemmKernel = void (*)(const GemmArgs&, size_t, size_t);

GemmKernel SelectGemmKernel() {
  if (simd::HasAvx2()) return &GemmTilesAvx2;
  return &GemmTilesGeneric;
}

void Gemm(ThreadPool* pool, const GemmArgs& g) {
  static const GemmKernel kernel = SelectGemmKernel();
  if (g.m <= 0 || g.n <= 0) return;
  const size_t tiles = (static_cast<size_t>(g.m) + kMr - 1) / kMr;
  // Aim for >= ~64k multiply-adds per chunk so tiny products stay inline.
  const double per_tile = static_cast<double>(kMr) * g.n * std::max(g.k, 1);
  const size_t grain =
      std::max<size_t>(1, static_cast<size_t>(65536.0 / per_tile));
  pool->ParallelFor(tiles, grain,
                    [&](size_t b, size_t e) { kernel(g, b, e); });
}

// dst[in][out] = src[out][in].
void Transpose(ThreadPool* pool, const float* src, int out, int in,
               float* dst) {
  pool->ParallelFor(in, std::max(1, 16384 / std::max(out, 1)),
                    [&](size_t b, size_t e) {
                      for (size_t i = b; i < e; ++i) {
                        float* d = dst + i * out;
                        for (int o = 0; o < out; ++o) d[o] = src[o * in + i];
                      }
                    });
}

// sums[j] = sum over rows r (in order) of m[r][j], partitioned by columns.
void ColumnSums(ThreadPool* pool, const float* m, int rows, int cols,
                float* sums) {
  pool->ParallelFor(cols, std::max(16, 65536 / std::max(rows, 1)),
                    [&](size_t b, size_t e) {
                      for (size_t j = b; j < e; ++j) sums[j] = 0.0f;
                      for (int r = 0; r < rows; ++r) {
                        const float* row = m + static_cast<size_t>(r) * cols;
                        for (size_t j = b; j < e; ++j) sums[j] += row[j];
                      }
                    });
}

// y = LayerNorm(x) * g + b per row; records mean and 1/stddev.
void LayerNormForward(ThreadPool* pool, const float* x, const float* g,
                      const float* b, int n, int d, float* y, float* mean,
                      float* rstd) {
  pool->ParallelFor(n, std::max(1, 8192 / d), [&](size_t lo, size_t hi) {
    for (size_t r = lo; r < hi; ++r) {
      const float* xr = x + r * d;
      float s = 0.0f;
      for (int j = 0; j < d; ++j) s += xr[j];
      const float mu = s / d;
      float v = 0.0f;
      for (int j = 0; j < d; ++j) {
        const float c = xr[j] - mu;
        v += c * c;
      }
      const float rs = 1.0f / std::sqrt(v / d + kLnEps);
      mean[r] = mu;
      rstd[r] = rs;
      float* yr = y + r * d;
      for (int j = 0; j < d; ++j) yr[j] = (xr[j] - mu) * rs * g[j] + b[j];
    }
  });
}

// Backward of LayerNormForward: dx (+)= d/dx, dg = sum dy * xhat,
// db = sum dy (both overwritten).
void LayerNormBackward(ThreadPool* pool, const float* x, const float* mean,
                       const float* rstd, const float* g, const float* dy,
                       int n, int d, bool accumulate, float* dx, float* dg,
                       float* db) {
  pool->ParallelFor(n, std::max(1, 8192 / d), [&](size_t lo, size_t hi) {
    for (size_t r = lo; r < hi; ++r) {
      const float* xr = x + r * d;
      const float* dyr = dy + r * d;
      const float mu = mean[r];
      const float rs = rstd[r];
      float sum_dxh = 0.0f;
      float sum_dxh_xh = 0.0f;
      for (int j = 0; j < d; ++j) {
        const float dxh = dyr[j] * g[j];
        sum_dxh += dxh;
        sum_dxh_xh += dxh * (xr[j] - mu) * rs;
      }
      const float m1 = sum_dxh / d;
      const float m2 = sum_dxh_xh / d;
      float* dxr = dx + r * d;
      for (int j = 0; j < d; ++j) {
        const float xh = (xr[j] - mu) * rs;
        const float v = rs * (dyr[j] * g[j] - m1 - xh * m2);
        dxr[j] = accumulate ? dxr[j] + v : v;
      }
    }
  });
  pool->ParallelFor(d, 16, [&](size_t lo, size_t hi) {
    for (size_t j = lo; j < hi; ++j) dg[j] = db[j] = 0.0f;
    for (int r = 0; r < n; ++r) {
      const float* xr = x + static_cast<size_t>(r) * d;
      const float* dyr = dy + static_cast<size_t>(r) * d;
      const float mu = mean[r];
      const float rs = rstd[r];
      for (size_t j = lo; j < hi; ++j) {
        dg[j] += dyr[j] * ((xr[j] - mu) * rs);
        db[j] += dyr[j];
      }
    }
  });
}

// a[i] += b[i] over [0, count), in parallel.
void AddInPlace(ThreadPool* pool, float* a, const float* b, size_t count) {
  pool->ParallelFor(count, 16384, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) a[i] += b[i];
  });
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// ---------------------------------------------------------------------------
// Seeded PRNG: the project's splitmix64 (common/random.h) with Box-Muller
// normals.

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return NextRandom(&state_); }
  // Uniform in (0, 1].
  double Uniform() { return UnitIntervalOpenZero(Next()); }

 private:
  uint64_t state_;
};

}  // namespace

// ---------------------------------------------------------------------------
// Transformer.

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Create(
    const ModelConfig& cfg, int threads) {
  ZF_RETURN_IF_ERROR(cfg.Validate());
  if (threads < 1 || threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be in [1, 1024], got ", threads));
  }
  return std::unique_ptr<Transformer>(new Transformer(cfg, threads));
}

Transformer::Transformer(const ModelConfig& cfg, int threads)
    : cfg_(cfg),
      pool_(std::make_unique<ThreadPool>(threads)),
      tensors_(BuildTensorLayout(cfg)),
      off_(BuildParamOffsets(cfg)),
      last_loss_(std::numeric_limits<double>::quiet_NaN()) {
  num_params_ = tensors_.back().offset + tensors_.back().numel();
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const TensorInfo& t : tensors_) {
    int kind = 0;
    if (t.shape.size() == 1) kind = ends_with(t.name, ".g") ? 2 : 1;
    init_kind_.push_back(kind);
  }
  acts_.resize(cfg.layers);
}

Transformer::~Transformer() = default;

int Transformer::FindTensor(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

void Transformer::InitParams(float* params) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    float* p = params + t.offset;
    const size_t n = t.numel();
    if (init_kind_[i] == 1) {
      std::fill(p, p + n, 0.0f);
      continue;
    }
    if (init_kind_[i] == 2) {
      std::fill(p, p + n, 1.0f);
      continue;
    }
    // One independent stream per tensor, keyed by (seed, tensor index).
    Rng key(cfg_.seed ^ (0xD1B54A32D192ED03ULL * (i + 1)));
    Rng rng(key.Next());
    constexpr double kTwoPi = 6.283185307179586;
    for (size_t j = 0; j < n; j += 2) {
      const double r = std::sqrt(-2.0 * std::log(rng.Uniform()));
      const double theta = kTwoPi * rng.Uniform();
      p[j] = static_cast<float>(0.02 * r * std::cos(theta));
      if (j + 1 < n) p[j + 1] = static_cast<float>(0.02 * r * std::sin(theta));
    }
  }
}

void Transformer::Reserve(int batch, int seq) {
  const size_t n = static_cast<size_t>(batch) * seq;
  const size_t d = cfg_.width;
  const size_t f = d * cfg_.mlp_mult;
  const size_t v = cfg_.vocab;
  for (LayerActs& a : acts_) {
    a.x_in.resize(n * d);
    a.ln1_out.resize(n * d);
    a.ln1_mean.resize(n);
    a.ln1_rstd.resize(n);
    a.qkv.resize(n * 3 * d);
    a.probs.resize(static_cast<size_t>(batch) * cfg_.heads * seq * seq);
    a.attn.resize(n * d);
    a.x_mid.resize(n * d);
    a.ln2_out.resize(n * d);
    a.ln2_mean.resize(n);
    a.ln2_rstd.resize(n);
    a.h_pre.resize(n * f);
    a.h_tanh.resize(n * f);
    a.h_act.resize(n * f);
  }
  x_final_.resize(n * d);
  lnf_out_.resize(n * d);
  lnf_mean_.resize(n);
  lnf_rstd_.resize(n);
  probs_.resize(n * v);
  row_loss_.resize(n);
  wt_.resize(std::max(f * d, v * d) + 3 * d * d);
}

void Transformer::Linear(const float* params, size_t w_off, size_t b_off,
                         const float* x, int n, int in_dim, int out_dim,
                         float* out) {
  Transpose(pool_.get(), params + w_off, out_dim, in_dim, wt_.data());
  GemmArgs g;
  g.m = n;
  g.n = out_dim;
  g.k = in_dim;
  g.a = MatA{x, in_dim, 1};
  g.b = wt_.data();
  g.ldb = out_dim;
  g.c = out;
  g.ldc = out_dim;
  g.accumulate = false;
  Gemm(pool_.get(), g);
  if (b_off == kNoBias) return;
  const float* bias = params + b_off;
  pool_->ParallelFor(n, std::max(1, 16384 / out_dim), [&](size_t lo,
                                                          size_t hi) {
    for (size_t r = lo; r < hi; ++r) {
      float* row = out + r * out_dim;
      for (int j = 0; j < out_dim; ++j) row[j] += bias[j];
    }
  });
}

void Transformer::LinearBackward(const float* params, size_t w_off,
                                 size_t b_off, const float* x, const float* dy,
                                 int n, int in_dim, int out_dim, float* grads,
                                 float* dx) {
  GemmArgs gw;  // dW[out][in] = dy^T x.
  gw.m = out_dim;
  gw.n = in_dim;
  gw.k = n;
  gw.a = MatA{dy, 1, out_dim};
  gw.b = x;
  gw.ldb = in_dim;
  gw.c = grads + w_off;
  gw.ldc = in_dim;
  gw.accumulate = false;
  Gemm(pool_.get(), gw);
  if (b_off != kNoBias) ColumnSums(pool_.get(), dy, n, out_dim, grads + b_off);
  if (dx == nullptr) return;
  GemmArgs gx;  // dx[n][in] = dy W.
  gx.m = n;
  gx.n = in_dim;
  gx.k = out_dim;
  gx.a = MatA{dy, out_dim, 1};
  gx.b = params + w_off;
  gx.ldb = in_dim;
  gx.c = dx;
  gx.ldc = in_dim;
  gx.accumulate = false;
  Gemm(pool_.get(), gx);
}

void Transformer::AttentionForward(LayerActs* a, int batch, int seq) {
  const int d = cfg_.width;
  const int heads = cfg_.heads;
  const int hd = d / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qkv = a->qkv.data();
  float* probs = a->probs.data();
  float* attn = a->attn.data();
  pool_->ParallelFor(
      static_cast<size_t>(batch) * heads, 1, [&](size_t lo, size_t hi) {
        std::vector<float> kt(static_cast<size_t>(hd) * seq);
        for (size_t item = lo; item < hi; ++item) {
          const int b = static_cast<int>(item) / heads;
          const int h = static_cast<int>(item) % heads;
          const float* base = qkv + static_cast<size_t>(b) * seq * 3 * d;
          // kt[i][u] = k_u[i], so scores are contiguous axpys over u.
          for (int u = 0; u < seq; ++u) {
            const float* k = base + static_cast<size_t>(u) * 3 * d + d + h * hd;
            for (int i = 0; i < hd; ++i) kt[i * seq + u] = k[i];
          }
          for (int t = 0; t < seq; ++t) {
            const float* q = base + static_cast<size_t>(t) * 3 * d + h * hd;
            float* p = probs + ((static_cast<size_t>(b) * heads + h) * seq + t) * seq;
            const int cnt = t + 1;
            for (int u = 0; u < cnt; ++u) p[u] = 0.0f;
            for (int i = 0; i < hd; ++i) {
              const float qi = q[i] * scale;
              const float* kr = kt.data() + i * seq;
              for (int u = 0; u < cnt; ++u) p[u] += qi * kr[u];
            }
            float mx = p[0];
            for (int u = 1; u < cnt; ++u) mx = std::max(mx, p[u]);
            float sum = 0.0f;
            for (int u = 0; u < cnt; ++u) {
              p[u] = std::exp(p[u] - mx);
              sum += p[u];
            }
            const float inv = 1.0f / sum;
            for (int u = 0; u < cnt; ++u) p[u] *= inv;
            for (int u = cnt; u < seq; ++u) p[u] = 0.0f;
            float* o = attn + (static_cast<size_t>(b) * seq + t) * d + h * hd;
            for (int i = 0; i < hd; ++i) o[i] = 0.0f;
            for (int u = 0; u < cnt; ++u) {
              const float* v =
                  base + static_cast<size_t>(u) * 3 * d + 2 * d + h * hd;
              const float pu = p[u];
              for (int i = 0; i < hd; ++i) o[i] += pu * v[i];
            }
          }
        }
      });
}

void Transformer::AttentionBackward(const LayerActs& a, const float* d_attn,
                                    int batch, int seq, float* d_qkv) {
  const int d = cfg_.width;
  const int heads = cfg_.heads;
  const int hd = d / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qkv = a.qkv.data();
  const float* probs = a.probs.data();
  pool_->ParallelFor(
      static_cast<size_t>(batch) * heads, 1, [&](size_t lo, size_t hi) {
        std::vector<float> vt(static_cast<size_t>(hd) * seq);
        std::vector<float> dp(seq);
        for (size_t item = lo; item < hi; ++item) {
          const int b = static_cast<int>(item) / heads;
          const int h = static_cast<int>(item) % heads;
          const size_t row0 = static_cast<size_t>(b) * seq;
          const float* base = qkv + row0 * 3 * d;
          float* dbase = d_qkv + row0 * 3 * d;
          for (int u = 0; u < seq; ++u) {
            const float* v = base + static_cast<size_t>(u) * 3 * d + 2 * d + h * hd;
            for (int i = 0; i < hd; ++i) vt[i * seq + u] = v[i];
            float* dr = dbase + static_cast<size_t>(u) * 3 * d + h * hd;
            for (int i = 0; i < hd; ++i) dr[i] = dr[d + i] = dr[2 * d + i] = 0.0f;
          }
          for (int t = 0; t < seq; ++t) {
            const float* p = probs + ((static_cast<size_t>(b) * heads + h) * seq + t) * seq;
            const float* dout = d_attn + (row0 + t) * d + h * hd;
            const int cnt = t + 1;
            // dp[u] = dout . v_u
            for (int u = 0; u < cnt; ++u) dp[u] = 0.0f;
            for (int i = 0; i < hd; ++i) {
              const float di = dout[i];
              const float* vr = vt.data() + i * seq;
              for (int u = 0; u < cnt; ++u) dp[u] += di * vr[u];
            }
            float pdp = 0.0f;
            for (int u = 0; u < cnt; ++u) pdp += p[u] * dp[u];
            const float* q = base + static_cast<size_t>(t) * 3 * d + h * hd;
            float* dq = dbase + static_cast<size_t>(t) * 3 * d + h * hd;
            for (int u = 0; u < cnt; ++u) {
              const float* urow = base + static_cast<size_t>(u) * 3 * d;
              const float* k = urow + d + h * hd;
              float* durow = dbase + static_cast<size_t>(u) * 3 * d;
              float* dk = durow + d + h * hd;
              float* dv = durow + 2 * d + h * hd;
              const float pu = p[u];
              const float ds = pu * (dp[u] - pdp) * scale;
              for (int i = 0; i < hd; ++i) {
                dv[i] += pu * dout[i];
                dq[i] += ds * k[i];
                dk[i] += ds * q[i];
              }
            }
          }
        }
      });
}

absl::StatusOr<float> Transformer::Forward(const float* params,
                                           const uint8_t* tokens, int batch,
                                           int seq) {
  if (params == nullptr || tokens == nullptr) {
    return absl::InvalidArgumentError("Forward: null params or tokens");
  }
  if (batch < 1 || seq < 1 || seq > cfg_.context) {
    return absl::InvalidArgumentError(
        absl::StrCat("Forward: need batch >= 1 and 1 <= seq <= context (",
                     cfg_.context, "); got batch ", batch, ", seq ", seq));
  }
  const size_t tok_count = static_cast<size_t>(batch) * (seq + 1);
  for (size_t i = 0; i < tok_count; ++i) {
    if (tokens[i] >= cfg_.vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("Forward: token ", static_cast<int>(tokens[i]),
                       " at index ", i, " is >= vocab ", cfg_.vocab));
    }
  }
  have_forward_ = false;
  Reserve(batch, seq);
  batch_ = batch;
  seq_ = seq;
  tokens_.assign(tokens, tokens + tok_count);

  ThreadPool* pool = pool_.get();
  const int n = batch * seq;
  const int d = cfg_.width;
  const int f = d * cfg_.mlp_mult;
  const int vocab = cfg_.vocab;

  // Token + position embeddings.
  {
    float* x = acts_[0].x_in.data();
    const float* te = params + off_.tok_emb;
    const float* pe = params + off_.pos_emb;
    pool->ParallelFor(n, 64, [&](size_t lo, size_t hi) {
      for (size_t r = lo; r < hi; ++r) {
        const int b = static_cast<int>(r) / seq;
        const int t = static_cast<int>(r) % seq;
        const float* tr = te + static_cast<size_t>(tokens_[b * (seq + 1) + t]) * d;
        const float* pr = pe + static_cast<size_t>(t) * d;
        float* xr = x + r * d;
        for (int j = 0; j < d; ++j) xr[j] = tr[j] + pr[j];
      }
    });
  }

  for (int l = 0; l < cfg_.layers; ++l) {
    LayerActs& a = acts_[l];
    const LayerOffsets& o = off_.layers[l];
    LayerNormForward(pool, a.x_in.data(), params + o.ln1_g, params + o.ln1_b,
                     n, d, a.ln1_out.data(), a.ln1_mean.data(),
                     a.ln1_rstd.data());
    Linear(params, o.wqkv, o.bqkv, a.ln1_out.data(), n, d, 3 * d,
           a.qkv.data());
    AttentionForward(&a, batch, seq);
    Linear(params, o.wo, o.bo, a.attn.data(), n, d, d, a.x_mid.data());
    AddInPlace(pool, a.x_mid.data(), a.x_in.data(), a.x_mid.size());
    LayerNormForward(pool, a.x_mid.data(), params + o.ln2_g, params + o.ln2_b,
                     n, d, a.ln2_out.data(), a.ln2_mean.data(),
                     a.ln2_rstd.data());
    Linear(params, o.w1, o.b1, a.ln2_out.data(), n, d, f, a.h_pre.data());
    {
      const float* hp = a.h_pre.data();
      float* th = a.h_tanh.data();
      float* ha = a.h_act.data();
      pool->ParallelFor(a.h_pre.size(), 8192, [&](size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i) {
          const float x = hp[i];
          const float t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
          th[i] = t;
          ha[i] = 0.5f * x * (1.0f + t);
        }
      });
    }
    float* next =
        (l + 1 < cfg_.layers) ? acts_[l + 1].x_in.data() : x_final_.data();
    Linear(params, o.w2, o.b2, a.h_act.data(), n, f, d, next);
    AddInPlace(pool, next, a.x_mid.data(), a.x_mid.size());
  }

  LayerNormForward(pool, x_final_.data(), params + off_.lnf_g,
                   params + off_.lnf_b, n, d, lnf_out_.data(), lnf_mean_.data(),
                   lnf_rstd_.data());
  Linear(params, off_.head, kNoBias, lnf_out_.data(), n, d, vocab,
         probs_.data());

  // Softmax cross-entropy; logits become probabilities in place.
  pool->ParallelFor(n, std::max(1, 4096 / vocab), [&](size_t lo, size_t hi) {
    for (size_t r = lo; r < hi; ++r) {
      float* p = probs_.data() + r * vocab;
      const int b = static_cast<int>(r) / seq;
      const int t = static_cast<int>(r) % seq;
      const int target = tokens_[b * (seq + 1) + t + 1];
      const double target_logit = p[target];
      float mx = p[0];
      for (int j = 1; j < vocab; ++j) mx = std::max(mx, p[j]);
      double sum = 0.0;
      for (int j = 0; j < vocab; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int j = 0; j < vocab; ++j) p[j] *= inv;
      row_loss_[r] = static_cast<double>(mx) + std::log(sum) - target_logit;
    }
  });
  double total = 0.0;
  for (int r = 0; r < n; ++r) total += row_loss_[r];
  last_loss_ = total / n;
  have_forward_ = true;
  return static_cast<float>(last_loss_);
}

absl::Status Transformer::Backward(const float* params, float* grads) {
  if (!have_forward_) {
    return absl::FailedPreconditionError(
        "Backward: no successful Forward to differentiate");
  }
  if (params == nullptr || grads == nullptr) {
    return absl::InvalidArgumentError("Backward: null params or grads");
  }
  ThreadPool* pool = pool_.get();
  const int batch = batch_;
  const int seq = seq_;
  const int n = batch * seq;
  const int d = cfg_.width;
  const int f = d * cfg_.mlp_mult;
  const int vocab = cfg_.vocab;
  const size_t nd = static_cast<size_t>(n) * d;
  d_res_.resize(nd);
  d_ln_.resize(nd);
  d_tmp_.resize(nd);
  d_qkv_.resize(nd * 3);
  d_h_.resize(static_cast<size_t>(n) * f);
  d_logits_.resize(static_cast<size_t>(n) * vocab);
  std::memset(grads, 0, num_params_ * sizeof(float));

  // d loss / d logits = (softmax - onehot) / n.
  {
    const float inv_n = 1.0f / n;
    pool->ParallelFor(n, std::max(1, 8192 / vocab), [&](size_t lo, size_t hi) {
      for (size_t r = lo; r < hi; ++r) {
        const float* p = probs_.data() + r * vocab;
        float* g = d_logits_.data() + r * vocab;
        for (int j = 0; j < vocab; ++j) g[j] = p[j] * inv_n;
        const int b = static_cast<int>(r) / seq;
        const int t = static_cast<int>(r) % seq;
        g[tokens_[b * (seq + 1) + t + 1]] -= inv_n;
      }
    });
  }
  LinearBackward(params, off_.head, kNoBias, lnf_out_.data(), d_logits_.data(),
                 n, d, vocab, grads, d_ln_.data());
  LayerNormBackward(pool, x_final_.data(), lnf_mean_.data(), lnf_rstd_.data(),
                    params + off_.lnf_g, d_ln_.data(), n, d,
                    /*accumulate=*/false, d_res_.data(), grads + off_.lnf_g,
                    grads + off_.lnf_b);

  for (int l = cfg_.layers - 1; l >= 0; --l) {
    const LayerActs& a = acts_[l];
    const LayerOffsets& o = off_.layers[l];
    // MLP branch: x_out = x_mid + W2 gelu(W1 ln2(x_mid) + b1) + b2.
    LinearBackward(params, o.w2, o.b2, a.h_act.data(), d_res_.data(), n, f, d,
                   grads, d_h_.data());
    {
      const float* hp = a.h_pre.data();
      const float* th = a.h_tanh.data();
      float* dh = d_h_.data();
      pool->ParallelFor(d_h_.size(), 8192, [&](size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i) {
          const float x = hp[i];
          const float t = th[i];
          const float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
          dh[i] *= 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
        }
      });
    }
    LinearBackward(params, o.w1, o.b1, a.ln2_out.data(), d_h_.data(), n, d, f,
                   grads, d_ln_.data());
    LayerNormBackward(pool, a.x_mid.data(), a.ln2_mean.data(),
                      a.ln2_rstd.data(), params + o.ln2_g, d_ln_.data(), n, d,
                      /*accumulate=*/true, d_res_.data(), grads + o.ln2_g,
                      grads + o.ln2_b);
    // Attention branch: x_mid = x_in + Wo attn(Wqkv ln1(x_in) + bqkv) + bo.
    LinearBackward(params, o.wo, o.bo, a.attn.data(), d_res_.data(), n, d, d,
                   grads, d_tmp_.data());
    AttentionBackward(a, d_tmp_.data(), batch, seq, d_qkv_.data());
    LinearBackward(params, o.wqkv, o.bqkv, a.ln1_out.data(), d_qkv_.data(), n,
                   d, 3 * d, grads, d_ln_.data());
    LayerNormBackward(pool, a.x_in.data(), a.ln1_mean.data(),
                      a.ln1_rstd.data(), params + o.ln1_g, d_ln_.data(), n, d,
                      /*accumulate=*/true, d_res_.data(), grads + o.ln1_g,
                      grads + o.ln1_b);
  }

  // Embeddings: serial scatter keeps the summation order fixed.
  float* gte = grads + off_.tok_emb;
  float* gpe = grads + off_.pos_emb;
  for (int r = 0; r < n; ++r) {
    const int b = r / seq;
    const int t = r % seq;
    const float* dr = d_res_.data() + static_cast<size_t>(r) * d;
    float* te = gte + static_cast<size_t>(tokens_[b * (seq + 1) + t]) * d;
    float* pe = gpe + static_cast<size_t>(t) * d;
    for (int j = 0; j < d; ++j) {
      te[j] += dr[j];
      pe[j] += dr[j];
    }
  }
  return absl::OkStatus();
}

}  // namespace model
}  // namespace zenflow
