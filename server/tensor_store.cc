// A job's optimizer state; see tensor_store.h.
#include "server/tensor_store.h"

#include <algorithm>
#include <cstring>

#include "common/huge_pages.h"

namespace zenflow {

const char* StateFormatName(StateFormat f) { return f == StateFormat::k8bit ? "8bit" : "fp32"; }

bool ParseStateFormat(const std::string& name, StateFormat* out) {
  if (name.empty() || name == "fp32") {
    *out = StateFormat::kFp32;
    return true;
  }
  if (name == "8bit") {
    *out = StateFormat::k8bit;
    return true;
  }
  return false;
}

TensorStore::TensorStore(const std::vector<Shape>& shapes, StateFormat format)
    : format_(format), tensors_(shapes.size()) {
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor& t = tensors_[i];
    t.shape = shapes[i];
    t.quantized = Quantizes(t.shape.rows, format);
    const size_t n = static_cast<size_t>(t.shape.rows * t.shape.cols);
    // Huge pages: AdamW streams these end to end (common/huge_pages.h).
    AssignOnHugePages(&t.master, n);
    if (t.quantized) {
      // Zero state: every scale 0 (each code then reads as 0).
      const size_t scales = static_cast<size_t>(t.shape.cols * Adam8BlocksPerColumn(t.shape.rows));
      AssignOnHugePages(&t.m8, n);
      AssignOnHugePages(&t.v8, n);
      t.m_scale.assign(scales, 0.0f);
      t.v_scale.assign(scales, 0.0f);
    } else {
      AssignOnHugePages(&t.m, n);
      AssignOnHugePages(&t.v, n);
    }
    t.count.assign(static_cast<size_t>(t.shape.cols), 0);
  }
}

void TensorStore::LoadRowMajor(int t, const float* src) {
  Tensor& x = tensors_[t];
  const int64_t rows = x.shape.rows, cols = x.shape.cols;
  // Blocked transpose: both sides stay in cache.
  constexpr int64_t kBlock = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t r1 = std::min(rows, r0 + kBlock), c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r) x.master[c * rows + r] = src[r * cols + c];
      }
    }
  }
}

void TensorStore::CopyMoments(int t, int64_t c, int64_t ncols, float* m, float* v) const {
  const Tensor& x = tensors_[t];
  const int64_t rows = x.shape.rows;
  const size_t at = static_cast<size_t>(c * rows), n = static_cast<size_t>(ncols * rows);
  if (x.quantized) {
    const size_t s = static_cast<size_t>(c * Adam8BlocksPerColumn(rows));
    Adam8Dequantize(BestSimdLevel(), rows, ncols,
                    {x.m8.data() + at, x.m_scale.data() + s, x.v8.data() + at,
                     x.v_scale.data() + s},
                    m, v);
    return;
  }
  if (m != nullptr) std::memcpy(m, x.m.data() + at, n * sizeof(float));
  if (v != nullptr) std::memcpy(v, x.v.data() + at, n * sizeof(float));
}

void TensorStore::ReadColumns(int t, const std::vector<int32_t>& cols,
                              v1::ColumnState* out) const {
  const Tensor& x = tensors_[t];
  const int64_t rows = x.shape.rows;
  for (int32_t c : cols) {
    out->add_columns(c);
    const size_t off = static_cast<size_t>(c) * rows;
    out->mutable_values()->Add(x.master.begin() + off, x.master.begin() + off + rows);
    const int at = out->m_size();
    out->mutable_m()->Resize(at + static_cast<int>(rows), 0.0f);
    out->mutable_v()->Resize(at + static_cast<int>(rows), 0.0f);
    CopyMoments(t, c, 1, out->mutable_m()->mutable_data() + at,
                out->mutable_v()->mutable_data() + at);
    out->add_update_counts(x.count[c]);
  }
}

bool TensorStore::WellFormed(int t, const v1::ColumnState& in) const {
  const Tensor& x = tensors_[t];
  const int64_t n = in.columns_size();
  const int64_t need = n * x.shape.rows;
  if (in.values_size() != need || in.m_size() != need || in.v_size() != need ||
      in.update_counts_size() != n) {
    return false;
  }
  for (int32_t c : in.columns()) {
    if (c < 0 || c >= x.shape.cols) return false;
  }
  return true;
}

int TensorStore::FirstDifference(int t, const v1::ColumnState& in) const {
  const Tensor& x = tensors_[t];
  const int64_t rows = x.shape.rows;
  const size_t bytes = static_cast<size_t>(rows) * sizeof(float);
  const int64_t per = Adam8BlocksPerColumn(rows);
  // A quantized tensor compares what `in` would store: its codes and scales.
  std::vector<uint8_t> m8(x.quantized ? rows : 0), v8(m8.size());
  std::vector<float> ms(x.quantized ? per : 0), vs(ms.size());
  for (int i = 0; i < in.columns_size(); ++i) {
    const int32_t c = in.columns(i);
    const size_t off = static_cast<size_t>(c) * rows;
    const size_t src = static_cast<size_t>(i) * rows;
    if (std::memcmp(x.master.data() + off, in.values().data() + src, bytes) != 0 ||
        x.count[c] != in.update_counts(i)) {
      return i;
    }
    if (x.quantized) {
      Adam8Quantize(BestSimdLevel(), rows, 1, in.m().data() + src, in.v().data() + src,
                    {m8.data(), ms.data(), v8.data(), vs.data()});
      const size_t s = static_cast<size_t>(c) * per;
      if (std::memcmp(x.m8.data() + off, m8.data(), rows) != 0 ||
          std::memcmp(x.v8.data() + off, v8.data(), rows) != 0 ||
          std::memcmp(x.m_scale.data() + s, ms.data(), per * sizeof(float)) != 0 ||
          std::memcmp(x.v_scale.data() + s, vs.data(), per * sizeof(float)) != 0) {
        return i;
      }
    } else if (std::memcmp(x.m.data() + off, in.m().data() + src, bytes) != 0 ||
               std::memcmp(x.v.data() + off, in.v().data() + src, bytes) != 0) {
      return i;
    }
  }
  return -1;
}

void TensorStore::WriteColumns(int t, const v1::ColumnState& in) {
  Tensor& x = tensors_[t];
  const int64_t rows = x.shape.rows;
  for (int i = 0; i < in.columns_size(); ++i) {
    const int32_t c = in.columns(i);
    const size_t off = static_cast<size_t>(c) * rows;
    const size_t src = static_cast<size_t>(i) * rows;
    std::copy_n(in.values().data() + src, rows, x.master.data() + off);
    if (x.quantized) {
      Adam8Quantize(BestSimdLevel(), rows, 1, in.m().data() + src, in.v().data() + src, q8(t, c));
    } else {
      std::copy_n(in.m().data() + src, rows, x.m.data() + off);
      std::copy_n(in.v().data() + src, rows, x.v.data() + off);
    }
    x.count[c] = in.update_counts(i);
  }
}

}  // namespace zenflow
