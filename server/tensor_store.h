// The optimizer state zenflowd owns for one job: per tensor, the fp32 master
// values, Adam's m and v, column-major ([cols][rows]: each column contiguous,
// adjacent columns adjacent), and each column's update count. This is what a
// checkpoint serializes and what a hand-off moves, and the interface a later
// NVMe tier would implement (docs/design.md#non-goals).
//
// m and v are fp32, or with StateFormat::k8bit (JobSpec.optimizer_state
// "8bit") one byte each in blocks with an fp32 scale (common/adam8.h) for
// the tensors of at least kAdam8MinRows rows; the others stay fp32. State
// leaves the store as fp32 (ReadColumns, CopyMoments: the dequantized
// values, exactly what the update reads) and enters it quantized
// (WriteColumns).
//
//   TensorStore store({{/*rows=*/8, /*cols=*/16}});
//   store.LoadRowMajor(0, uploaded);               // the upload
//   AdamWUpdate(..., store.master(0, c), store.m(0, c), store.v(0, c), n);
//   Adam8Update(..., store.master(1, c), store.q8(1, c), rows, n, ...);  // quantized(1)
//   store.ReadColumns(0, {3, 7}, &state);          // exact, for a hand-off
//
// Not thread-safe: its owner (Job) serializes access, under its mutex or by
// the ownership a round update has of the columns it updates.
#ifndef ZENFLOW_SERVER_TENSOR_STORE_H_
#define ZENFLOW_SERVER_TENSOR_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/adam8.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

// How a store keeps m and v (JobSpec.optimizer_state).
enum class StateFormat { kFp32, k8bit };
// "fp32" or "8bit".
const char* StateFormatName(StateFormat f);
// "fp32" (or "", the unset field) and "8bit"; false for anything else.
bool ParseStateFormat(const std::string& name, StateFormat* out);

class TensorStore {
 public:
  struct Shape {
    int64_t rows = 0;
    int64_t cols = 0;
  };

  // Zeroed state for each shape: StateBytes(rows, cols, format) bytes each;
  // throws std::bad_alloc (or std::length_error) when it cannot allocate.
  explicit TensorStore(const std::vector<Shape>& shapes,
                       StateFormat format = StateFormat::kFp32);

  // Whether a tensor of `rows` rows keeps 8-bit m and v under `format`.
  static bool Quantizes(int64_t rows, StateFormat format) {
    return format == StateFormat::k8bit && rows >= kAdam8MinRows;
  }
  // Bytes a tensor's state takes: master, m and v (12 B per value in fp32;
  // 4 + 2 and two scales per block of 256 with 8 bits) and 8 per column.
  static int64_t StateBytes(int64_t rows, int64_t cols, StateFormat format) {
    const int64_t moments = Quantizes(rows, format) ? Adam8StateBytes(rows, cols) : rows * cols * 8;
    return rows * cols * 4 + moments + cols * 8;
  }
  TensorStore(const TensorStore&) = delete;
  TensorStore& operator=(const TensorStore&) = delete;

  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  const Shape& shape(int t) const { return tensors_[t].shape; }

  StateFormat format() const { return format_; }
  // Whether tensor t's m and v are 8-bit (then m() and v() must not be
  // used: q8() gives the codes).
  bool quantized(int t) const { return tensors_[t].quantized; }

  // Column `c` of tensor `t`: rows values, followed by column c + 1's.
  float* master(int t, int64_t c) { return At(tensors_[t].master, t, c); }
  float* m(int t, int64_t c) { return At(tensors_[t].m, t, c); }  // !quantized(t)
  float* v(int t, int64_t c) { return At(tensors_[t].v, t, c); }  // !quantized(t)
  // The 8-bit m and v from column c on (quantized(t)).
  Adam8Columns q8(int t, int64_t c) {
    Tensor& x = tensors_[t];
    const size_t at = static_cast<size_t>(c * x.shape.rows);
    const size_t s = static_cast<size_t>(c * Adam8BlocksPerColumn(x.shape.rows));
    return {x.m8.data() + at, x.m_scale.data() + s, x.v8.data() + at, x.v_scale.data() + s};
  }
  // m and v of columns [c, c + ncols) as fp32 (rows * ncols each; either
  // may be null): a copy, or the dequantized values.
  void CopyMoments(int t, int64_t c, int64_t ncols, float* m, float* v) const;
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

  // Tensor t's whole state, for checkpoints: rows * cols floats of master
  // and cols counts; m and v as rows * cols floats each (fp32), or (8-bit)
  // rows * cols codes each and `scales` floats of scales each.
  struct Raw {
    float* master;
    float* m;  // null when quantized
    float* v;  // null when quantized
    int64_t* count;
    size_t elements;
    size_t cols;
    uint8_t* m8;  // null unless quantized
    uint8_t* v8;
    float* m_scale;
    float* v_scale;
    size_t scales;
  };
  Raw raw(int t) {
    Tensor& x = tensors_[t];
    return {x.master.data(),  x.quantized ? nullptr : x.m.data(),
            x.quantized ? nullptr : x.v.data(),
            x.count.data(),   x.master.size(),
            x.count.size(),   x.quantized ? x.m8.data() : nullptr,
            x.quantized ? x.v8.data() : nullptr,
            x.m_scale.data(), x.v_scale.data(),
            x.m_scale.size()};
  }

 private:
  struct Tensor {
    Shape shape;
    bool quantized = false;
    std::vector<float> master, m, v;  // m, v empty when quantized
    std::vector<uint8_t> m8, v8;      // quantized: codes
    std::vector<float> m_scale, v_scale;
    std::vector<int64_t> count;
  };
  float* At(std::vector<float>& buf, int t, int64_t c) {
    return buf.data() + c * tensors_[t].shape.rows;
  }
  StateFormat format_;
  std::vector<Tensor> tensors_;
};

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_TENSOR_STORE_H_
