// A job's optimizer state; see tensor_store.h.
#include "server/tensor_store.h"

#include <algorithm>
#include <cstring>

namespace zenflow {

TensorStore::TensorStore(const std::vector<Shape>& shapes) : tensors_(shapes.size()) {
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor& t = tensors_[i];
    t.shape = shapes[i];
    const size_t n = static_cast<size_t>(t.shape.rows * t.shape.cols);
    t.master.assign(n, 0.0f);
    t.m.assign(n, 0.0f);
    t.v.assign(n, 0.0f);
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

void TensorStore::ReadColumns(int t, const std::vector<int32_t>& cols,
                              v1::ColumnState* out) const {
  const Tensor& x = tensors_[t];
  const int64_t rows = x.shape.rows;
  for (int32_t c : cols) {
    out->add_columns(c);
    const size_t off = static_cast<size_t>(c) * rows;
    out->mutable_values()->Add(x.master.begin() + off, x.master.begin() + off + rows);
    out->mutable_m()->Add(x.m.begin() + off, x.m.begin() + off + rows);
    out->mutable_v()->Add(x.v.begin() + off, x.v.begin() + off + rows);
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
  for (int i = 0; i < in.columns_size(); ++i) {
    const int32_t c = in.columns(i);
    const size_t off = static_cast<size_t>(c) * rows;
    const size_t src = static_cast<size_t>(i) * rows;
    if (std::memcmp(x.master.data() + off, in.values().data() + src, bytes) != 0 ||
        std::memcmp(x.m.data() + off, in.m().data() + src, bytes) != 0 ||
        std::memcmp(x.v.data() + off, in.v().data() + src, bytes) != 0 ||
        x.count[c] != in.update_counts(i)) {
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
    std::copy_n(in.m().data() + src, rows, x.m.data() + off);
    std::copy_n(in.v().data() + src, rows, x.v.data() + off);
    x.count[c] = in.update_counts(i);
  }
}

}  // namespace zenflow
