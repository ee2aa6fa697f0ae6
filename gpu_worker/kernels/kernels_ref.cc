// Single-threaded reference kernels; see kernels_ref.h.
#include "gpu_worker/kernels/kernels_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/codec.h"

namespace zenflow::worker {
namespace {

float EncodedToFloat(PackDType dtype, const void* src, int64_t i, float scale) {
  switch (dtype) {
    case PackDType::kF32: {
      float x;
      std::memcpy(&x, static_cast<const char*>(src) + 4 * i, 4);
      return x;
    }
    case PackDType::kBF16:
    case PackDType::kF16: {
      uint16_t bits;
      std::memcpy(&bits, static_cast<const char*>(src) + 2 * i, 2);
      return dtype == PackDType::kBF16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
    }
    case PackDType::kInt8: {
      const int8_t q = static_cast<const int8_t*>(src)[i];
      return static_cast<float>(q) * scale;
    }
  }
  return 0.0f;
}

// Stores x as element i of a kF32, kBF16 or kF16 array.
void StoreFloat(PackDType dtype, void* dst, int64_t i, float x) {
  if (dtype == PackDType::kF32) {
    std::memcpy(static_cast<char*>(dst) + 4 * i, &x, 4);
    return;
  }
  const uint16_t bits = dtype == PackDType::kBF16 ? FloatToBf16(x) : FloatToF16(x);
  std::memcpy(static_cast<char*>(dst) + 2 * i, &bits, 2);
}

int8_t RefQuantize(float x, float scale) {
  if (scale == 0.0f) return 0;
  const float y = x / scale;
  if (std::isnan(y)) return 0;
  const float r = std::nearbyint(y);  // Default rounding: half to even.
  if (r > 127.0f) return 127;
  if (r < -127.0f) return -127;
  return static_cast<int8_t>(r);
}

// Strict "a ranks above b" on scores alone (see RefTopK).
bool ScoreAbove(float a, float b) {
  const bool a_nan = std::isnan(a);
  const bool b_nan = std::isnan(b);
  if (a_nan || b_nan) return a_nan && !b_nan;
  return a > b;
}

}  // namespace

void RefColumnImportance(const float* grad, int64_t rows, int64_t cols, Importance kind,
                         float* out) {
  for (int64_t j = 0; j < cols; ++j) {
    float sum = 0.0f;
    for (int64_t i = 0; i < rows; ++i) {
      const float g = grad[i * cols + j];
      if (kind == Importance::kL1) {
        sum += std::fabs(g);
      } else {
        const float sq = g * g;
        sum += sq;
      }
    }
    out[j] = sum;
  }
}

void RefTopK(const float* scores, int64_t cols, int64_t k, int32_t* out) {
  std::vector<int32_t> order(static_cast<size_t>(cols));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [scores](int32_t a, int32_t b) { return ScoreAbove(scores[a], scores[b]); });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  std::copy(order.begin(), order.end(), out);
}

void RefPackColumns(const float* w, int64_t rows, int64_t cols, const int32_t* columns,
                    int64_t ncols, PackDType dtype, void* dst, float* scales) {
  char* out = static_cast<char*>(dst);
  for (int64_t c = 0; c < ncols; ++c) {
    const int64_t col = columns[c];
    float scale = 0.0f;
    if (dtype == PackDType::kInt8) {
      float max_abs = 0.0f;
      for (int64_t r = 0; r < rows; ++r) {
        const float a = std::fabs(w[r * cols + col]);
        if (!std::isnan(a) && a > max_abs) max_abs = a;
      }
      scale = max_abs / 127.0f;
      scales[c] = scale;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float x = w[r * cols + col];
      const int64_t i = c * rows + r;
      switch (dtype) {
        case PackDType::kF32:
          std::memcpy(out + 4 * i, &x, 4);
          break;
        case PackDType::kBF16: {
          const uint16_t b = FloatToBf16(x);
          std::memcpy(out + 2 * i, &b, 2);
          break;
        }
        case PackDType::kF16: {
          const uint16_t h = FloatToF16(x);
          std::memcpy(out + 2 * i, &h, 2);
          break;
        }
        case PackDType::kInt8:
          reinterpret_cast<int8_t*>(out)[i] = RefQuantize(x, scale);
          break;
      }
    }
  }
}

void RefApplyColumns(float* w, int64_t rows, int64_t cols, const int32_t* columns, int64_t ncols,
                     PackDType dtype, const void* src, const float* scales, bool add) {
  for (int64_t c = 0; c < ncols; ++c) {
    const int64_t col = columns[c];
    const float scale = dtype == PackDType::kInt8 ? scales[c] : 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const float x = EncodedToFloat(dtype, src, c * rows + r, scale);
      float& p = w[r * cols + col];
      p = add ? p + x : x;
    }
  }
}

void RefSelectiveAdamW(const AdamWHyper& h, float grad_scale, float* w, int64_t rows, int64_t cols,
                       const int32_t* columns, int64_t ncols, const int64_t* steps,
                       const float* grad, float* m, float* v) {
  for (int64_t c = 0; c < ncols; ++c) {
    const double t = static_cast<double>(steps[c]);
    const double bias1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
    const double bias2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
    const float lr_over_bc1 = static_cast<float>(static_cast<double>(h.lr) / bias1);
    const float sqrt_bc2 = static_cast<float>(std::sqrt(bias2));
    const float keep =
        static_cast<float>(1.0 - static_cast<double>(h.lr) * static_cast<double>(h.weight_decay));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = c * rows + r;
      float& p = w[r * cols + columns[c]];
      const float g = grad[i] * grad_scale;
      m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * g;
      v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * g * g;
      p = p * keep;
      p = p - lr_over_bc1 * m[i] / (std::sqrt(v[i]) / sqrt_bc2 + h.eps);
    }
  }
}

void RefApplyColumns16(void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                       const int32_t* columns, int64_t ncols, PackDType src_dtype,
                       const void* src) {
  for (int64_t c = 0; c < ncols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      const float x = EncodedToFloat(src_dtype, src, c * rows + r, 0.0f);
      StoreFloat(w_dtype, w, r * cols + columns[c], x);
    }
  }
}

void RefSelectiveAdamW16(const AdamWHyper& h, float grad_scale, void* w, PackDType w_dtype,
                         int64_t rows, int64_t cols, const int32_t* columns, int64_t ncols,
                         const int64_t* steps, const float* grad, float* master, float* m,
                         float* v) {
  // Master column c (rows contiguous values) is a row-major [rows][1]
  // tensor whose one column is updated with grad, m, v column c: the fp32
  // reference's step, unchanged.
  for (int64_t c = 0; c < ncols; ++c) {
    const int32_t zero = 0;
    const int64_t off = c * rows;
    RefSelectiveAdamW(h, grad_scale, master + off, rows, 1, &zero, 1, steps + c, grad + off,
                      m + off, v + off);
    for (int64_t r = 0; r < rows; ++r) StoreFloat(w_dtype, w, r * cols + columns[c], master[off + r]);
  }
}

void RefFactoredStep(float lr, float eps, void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                     const int32_t* columns, int64_t ncols, const float* grad, const float* row_v,
                     const float* col_v, float v_mean) {
  for (int64_t c = 0; c < ncols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at = r * cols + columns[c];
      const float estimate = row_v[r] * col_v[c];
      const float vh = estimate / v_mean;
      if (std::isnan(vh) || vh <= 0.0f) continue;  // no scale: no step
      const float numerator = lr * grad[c * rows + r];
      const float denominator = std::sqrt(vh) + eps;
      const float x = EncodedToFloat(w_dtype, w, at, 0.0f);
      StoreFloat(w_dtype, w, at, x - numerator / denominator);
    }
  }
}

void RefConvert(const void* src, PackDType src_dtype, void* dst, PackDType dst_dtype, int64_t n) {
  for (int64_t i = 0; i < n; ++i) StoreFloat(dst_dtype, dst, i, EncodedToFloat(src_dtype, src, i, 0.0f));
}

double RefSquaredNorm(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]);
    sum += d * d;
  }
  return sum;
}

}  // namespace zenflow::worker
