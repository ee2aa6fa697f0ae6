// AdamW with 8-bit optimizer state: Adam's m and v stored in one byte each,
// block-wise (one fp32 scale per block of at most kAdam8Block values of one
// column), the fp32 master kept. The block-wise scaling with a non-linear
// code that keeps small values follows 8-bit Adam (Dettmers et al., "8-bit
// Optimizers via Block-wise Quantization", 2021, arXiv:2110.02861); the code
// here is a fixed exponent/mantissa split (docs/design.md, 8-bit optimizer
// state), computable with integer operations in SIMD registers:
//
//   m: sign and a 7-bit magnitude k: 0 is zero, k >= 1 is
//      2^((k >> 3) - 15) * (1 + (k & 7) / 8) times the block's scale
//      (4 exponent bits, 3 mantissa bits: 1.125 * 2^-15 .. 1.875).
//   v: an 8-bit k: 2^((k >> 3) - 31) * (1 + (k & 7) / 8) times the block's
//      scale (5 exponent bits, 3 mantissa bits: 2^-31 .. 1.875); no zero
//      code, so a positive v never becomes 0 (an update m / sqrt(v) stays
//      bounded); v is 0 only in a block whose scale is 0.
//
// A block's scale is its largest magnitude / 1.875, so its largest value
// keeps its code exactly up to the scale's rounding; values round to the
// nearest code (ties away from zero). Relative error: at most 1/16 of a
// value (one half step of 3 mantissa bits). Exception: the update
// (Adam8Update, Adam8Reference) rounds v stochastically, to the code below
// or above with probabilities that make the stored v unbiased, so v
// follows beta2's 0.1% per step decay; the draw hashes the value, its row
// in its column and the step (deterministic; docs/design.md rule 15).
//
//   Adam8Columns s{m_codes, m_scales, v_codes, v_scales};
//   Adam8Update(BestSimdLevel(), hyper, step, grad_scale, grad, master, s, rows, ncols,
//               nullptr, nullptr);
//
// Layout: ncols adjacent columns of `rows` values each (column-major, as
// server/tensor_store.h); column c's blocks start at c * rows + b * 256 and
// its scales at c * Adam8BlocksPerColumn(rows) + b. Blocks never span
// columns, so updates of disjoint column runs never share a block.
#ifndef ZENFLOW_COMMON_ADAM8_H_
#define ZENFLOW_COMMON_ADAM8_H_

#include <cstddef>
#include <cstdint>

#include "common/adamw.h"

namespace zenflow {

// Values per block (at most; a column's last block may be shorter).
inline constexpr int64_t kAdam8Block = 256;
// Tensors with fewer rows keep fp32 state (a scale per few values would
// cost more than it saves, as 8-bit Adam keeps small tensors in 32 bits).
inline constexpr int64_t kAdam8MinRows = 16;

inline int64_t Adam8BlocksPerColumn(int64_t rows) {
  return (rows + kAdam8Block - 1) / kAdam8Block;
}

// Bytes of 8-bit m and v (codes and scales) for rows x cols values.
inline int64_t Adam8StateBytes(int64_t rows, int64_t cols) {
  return 2 * (rows * cols + cols * Adam8BlocksPerColumn(rows) * 4);
}

// The 8-bit state of a run of adjacent columns (pointers at its first
// column's first code and scale).
struct Adam8Columns {
  uint8_t* m = nullptr;
  float* m_scale = nullptr;
  uint8_t* v = nullptr;
  float* v_scale = nullptr;
};
struct Adam8ConstColumns {
  const uint8_t* m = nullptr;
  const float* m_scale = nullptr;
  const uint8_t* v = nullptr;
  const float* v_scale = nullptr;
};

// One block's codes from n <= kAdam8Block fp32 values, and back. m values
// must be finite, v values finite and >= 0.
void Adam8QuantizeM(const float* x, size_t n, uint8_t* q, float* scale);
void Adam8QuantizeV(const float* x, size_t n, uint8_t* q, float* scale);
float Adam8DecodeM(uint8_t q, float scale);
float Adam8DecodeV(uint8_t q, float scale);

// ncols columns of fp32 m and v (rows each) quantized into `out`, and
// dequantized back from `in` (either output may be null). At `level`; every
// level gives the same bits.
void Adam8Quantize(SimdLevel level, int64_t rows, int64_t ncols, const float* m, const float* v,
                   const Adam8Columns& out);
void Adam8Dequantize(SimdLevel level, int64_t rows, int64_t ncols, const Adam8ConstColumns& in,
                     float* m, float* v);

// Scalar reference: the columns' m and v dequantized, AdamWReference over
// the rows * ncols values (adamw.h), m and v quantized again.
void Adam8Reference(const AdamWHyper& h, int64_t step, float grad_scale, const float* grad,
                    float* p, const Adam8Columns& s, int64_t rows, int64_t ncols);

// The same update in one pass over memory, block by block while the block
// is in L1: dequantize, AdamWUpdate at `level` (its vector kernels), the
// block's new scales, quantize. With m_out / v_out (rows * ncols floats;
// either may be null), also the stored m and v after the update,
// dequantized (what a hand-off reads). Results equal Adam8Reference's up
// to AdamWUpdate's rounding at `level` (with kScalar: bit for bit); a code
// may then differ by one step. Stateless and thread-safe for disjoint
// columns; no alignment requirements. draw_seed picks another set of v's
// stochastic-rounding draws (0: Adam8Reference's; a diagnostic of how far
// one draw moves a training, zenflowd --adam8_draw_seed).
void Adam8Update(SimdLevel level, const AdamWHyper& h, int64_t step, float grad_scale,
                 const float* grad, float* p, const Adam8Columns& s, int64_t rows, int64_t ncols,
                 float* m_out, float* v_out, uint32_t draw_seed = 0);

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_ADAM8_H_
