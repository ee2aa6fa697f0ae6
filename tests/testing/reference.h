// Test support: an independent, plain-loop model of what the daemon must do
// with a round (docs/design.md rule 6): mean of the ranks' x steps' gradients of the
// remote columns, then one AdamW step per column with that column's own update
// count (adamw_reference.h). Row-major like the worker. Written separately from server/ on
// purpose; it shares no code with the daemon.
#ifndef ZENFLOW_TESTS_TESTING_REFERENCE_H_
#define ZENFLOW_TESTS_TESTING_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/testing/adamw_reference.h"

namespace zenflow::testing {

// Rounds to bfloat16 (nearest, ties to even) and back, without the codec.
inline float RoundToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf / nan
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  u &= 0xffff0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}

// Rounds to IEEE binary16 (nearest, ties to even; overflow to +-Inf) and
// back, through the compiler's half type, not the codec: _Float16 (gcc, the
// build's compiler), or __fp16 for clang before 15, which has no _Float16 on
// x86-64 (./zf lint parses this with clang 14). Both are IEEE binary16.
#if defined(__clang__) && __clang_major__ < 15
inline float RoundToF16(float x) { return static_cast<float>(static_cast<__fp16>(x)); }
#else
inline float RoundToF16(float x) { return static_cast<float>(static_cast<_Float16>(x)); }
#endif

// The optimizer's hyperparameters (adamw_reference.h's).
using RefHyper = AdamWRefHyper;

struct RefTensor {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<float> p, m, v;  // row-major
  std::vector<int64_t> count;  // per column
};

class RefOptimizer {
 public:
  RefOptimizer(std::vector<RefTensor> tensors, RefHyper h) : t_(std::move(tensors)), h_(h) {}

  // grads[k][tensor] is the row-major gradient of contribution k (a rank's
  // step); `remote[tensor]` lists the columns the daemon owns (the clipping
  // norm covers those); `update[tensor]` the columns to update (remote ones
  // plus any a test updates in place of a worker); `bf16` rounds every
  // gradient value to bf16 first (the wire). `remote_lr` >= 0: the remote
  // columns' step takes it instead of lr (docs/design.md rule 12: the
  // daemon's step of a round of s steps has lr * s).
  void Round(const std::vector<std::vector<std::vector<float>>>& grads, float lr,
             const std::vector<std::vector<int32_t>>& remote,
             const std::vector<std::vector<int32_t>>& update, bool bf16,
             float max_grad_norm = 0, float remote_lr = -1) {
    const size_t n = grads.size();
    std::vector<std::vector<float>> mean(t_.size());
    double norm2 = 0;
    for (size_t ti = 0; ti < t_.size(); ++ti) {
      RefTensor& t = t_[ti];
      mean[ti].assign(t.rows * t.cols, 0.0f);
      for (int32_t c : update[ti]) {
        for (int64_t r = 0; r < t.rows; ++r) {
          float s = 0;
          for (size_t k = 0; k < n; ++k) {
            const float g = grads[k][ti][r * t.cols + c];
            s += bf16 ? RoundToBf16(g) : g;
          }
          mean[ti][r * t.cols + c] = s;
        }
      }
      for (int32_t c : remote[ti]) {
        for (int64_t r = 0; r < t.rows; ++r) {
          const double mg = static_cast<double>(mean[ti][r * t.cols + c]) / static_cast<double>(n);
          norm2 += mg * mg;
        }
      }
    }
    double clip = 1.0;
    const double norm = std::sqrt(norm2);
    if (max_grad_norm > 0 && norm > max_grad_norm) clip = max_grad_norm / (norm + 1e-6);
    const float scale = static_cast<float>(clip / static_cast<double>(n));
    for (size_t ti = 0; ti < t_.size(); ++ti) {
      RefTensor& t = t_[ti];
      for (int32_t c : update[ti]) {
        const bool daemon = std::find(remote[ti].begin(), remote[ti].end(), c) != remote[ti].end();
        const AdamWStepFactors f =
            AdamWFactors(h_, daemon && remote_lr >= 0 ? remote_lr : lr, ++t.count[c]);
        for (int64_t r = 0; r < t.rows; ++r) {
          const size_t i = r * t.cols + c;
          AdamWElement(h_, f, mean[ti][i] * scale, &t.p[i], &t.m[i], &t.v[i]);
        }
      }
    }
  }

  RefTensor& tensor(size_t i) { return t_[i]; }
  size_t size() const { return t_.size(); }

 private:
  std::vector<RefTensor> t_;
  RefHyper h_;
};

}  // namespace zenflow::testing

#endif  // ZENFLOW_TESTS_TESTING_REFERENCE_H_
