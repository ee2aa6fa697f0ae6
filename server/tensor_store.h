// The optimizer state zenflowd owns for one job: per tensor, the fp32 master
// values, Adam's m and v, column-major ([cols][rows]: each column contiguous,
// adjacent columns adjacent), and each column's update count. This is what a
// checkpoint serializes and what a hand-off moves, and the interface a later
// NVMe or 8-bit tier would implement (docs/design.md#non-goals).
//
//   TensorStore store({{/*rows=*/8, /*cols=*/16}});
//   store.LoadRowMajor(0, uploaded);               // the upload
//   AdamWUpdate(..., store.master(0, c), store.m(0, c), store.v(0, c), n);
//   store.ReadColumns(0, {3, 7}, &state);          // exact, for a hand-off
//
// Not thread-safe: its owner (Job) serializes access, under its mutex or by
// the ownership a round update has of the columns it updates.
#ifndef ZENFLOW_SERVER_TENSOR_STORE_H_
#define ZENFLOW_SERVER_TENSOR_STORE_H_

#include <cstdint>
#include <vector>

#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

class TensorStore {
 public:
  struct Shape {
    int64_t rows = 0;
    int64_t cols = 0;
  };

  // Zeroed state for each shape. Allocates rows * cols * 12 bytes plus 8
  // per column; throws std::bad_alloc (or std::length_error) when it cannot.
  explicit TensorStore(const std::vector<Shape>& shapes);
  TensorStore(const TensorStore&) = delete;
  TensorStore& operator=(const TensorStore&) = delete;

  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  const Shape& shape(int t) const { return tensors_[t].shape; }

  // Column `c` of tensor `t`: rows values, followed by column c + 1's.
  float* master(int t, int64_t c) { return At(tensors_[t].master, t, c); }
  float* m(int t, int64_t c) { return At(tensors_[t].m, t, c); }
  float* v(int t, int64_t c) { return At(tensors_[t].v, t, c); }
  const float* master(int t, int64_t c) const {
    return tensors_[t].master.data() + c * tensors_[t].shape.rows;
  }
  int64_t count(int t, int64_t c) const { return tensors_[t].count[c]; }
  void set_count(int t, int64_t c, int64_t n) { tensors_[t].count[c] = n; }

  // Sets tensor t's master values from a row-major [rows][cols] array.
  void LoadRowMajor(int t, const float* src);

  // The exact state of `cols` of tensor t, in that order: columns, values,
  // m, v (rows each, column after column) and update counts. Sets no tensor
  // name.
  void ReadColumns(int t, const std::vector<int32_t>& cols, v1::ColumnState* out) const;
  // The index (into in.columns()) of the first column whose values, m, v or
  // count differ from `in`'s in any bit; -1 when all are identical. `in`
  // must be well-formed (WellFormed).
  int FirstDifference(int t, const v1::ColumnState& in) const;
  // Replaces the state of in.columns() with `in`'s. `in` must be well-formed.
  void WriteColumns(int t, const v1::ColumnState& in);
  // Columns in range, rows values of each, one count per column.
  bool WellFormed(int t, const v1::ColumnState& in) const;

  // Tensor t's whole state, for checkpoints: rows * cols floats each of
  // master, m and v (column-major) and cols counts.
  struct Raw {
    float* master;
    float* m;
    float* v;
    int64_t* count;
    size_t elements;
    size_t cols;
  };
  Raw raw(int t) {
    Tensor& x = tensors_[t];
    return {x.master.data(), x.m.data(), x.v.data(), x.count.data(), x.master.size(),
            x.count.size()};
  }

 private:
  struct Tensor {
    Shape shape;
    std::vector<float> master, m, v;
    std::vector<int64_t> count;
  };
  float* At(std::vector<float>& buf, int t, int64_t c) {
    return buf.data() + c * tensors_[t].shape.rows;
  }
  std::vector<Tensor> tensors_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_TENSOR_STORE_H_
