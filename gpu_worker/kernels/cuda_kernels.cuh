// The CUDA backend's device code: the encodings and the kernels of every
// ZenFlow operation (see cuda_backend.cu, the only file that includes this
// one: nvcc compiles it as part of that translation unit, so the kernels
// are launched from where they are defined).
//
// Numerics: see cuda_backend.cu (the same -fmad=false build).
#ifndef ZENFLOW_GPU_WORKER_KERNELS_CUDA_KERNELS_CUH_
#define ZENFLOW_GPU_WORKER_KERNELS_CUDA_KERNELS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/float16.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/kernels/backend_common.h"

namespace zenflow::worker::cuda_kernels {

using internal::kImportanceRowBlock;

// Bits of the device error word.
enum ErrorBit : unsigned int {
  kErrPackIndex = 1u << 0,
  kErrApplyIndex = 1u << 1,
  kErrApplyDuplicate = 1u << 2,
  kErrAdamIndex = 1u << 3,
  kErrAdamDuplicate = 1u << 4,
  kErrAdamStep = 1u << 5,
  kErrApply16Index = 1u << 6,
  kErrApply16Duplicate = 1u << 7,
  kErrAdam16Index = 1u << 8,
  kErrAdam16Duplicate = 1u << 9,
  kErrAdam16Step = 1u << 10,
  kErrFactoredIndex = 1u << 11,
  kErrFactoredDuplicate = 1u << 12,
};

// ---------------------------------------------------------------------------
// Device encodings: bf16 / fp16 through common/float16.h, the code of the
// codec's scalar path; int8 through the shared quantizer.
// ---------------------------------------------------------------------------

template <PackDType kDType>
__device__ __forceinline__ void DevStore(void* dst, int64_t i, float x, float scale) {
  if constexpr (kDType == PackDType::kF32) {
    static_cast<float*>(dst)[i] = x;
  } else if constexpr (kDType == PackDType::kBF16) {
    static_cast<uint16_t*>(dst)[i] = FloatToBf16(x);
  } else if constexpr (kDType == PackDType::kF16) {
    static_cast<uint16_t*>(dst)[i] = FloatToF16(x);
  } else {
    static_cast<int8_t*>(dst)[i] = internal::QuantizeInt8(x, scale);
  }
}

template <PackDType kDType>
__device__ __forceinline__ float DevLoad(const void* src, int64_t i, float scale) {
  if constexpr (kDType == PackDType::kF32) {
    return static_cast<const float*>(src)[i];
  } else if constexpr (kDType == PackDType::kBF16) {
    return Bf16ToFloat(static_cast<const uint16_t*>(src)[i]);
  } else if constexpr (kDType == PackDType::kF16) {
    return F16ToFloat(static_cast<const uint16_t*>(src)[i]);
  } else {
    return __fmul_rn(static_cast<float>(static_cast<const int8_t*>(src)[i]), scale);
  }
}

// fp32 -> the 16-bit parameter dtype kW (kBF16 or kF16), nearest even.
template <PackDType kW>
__device__ __forceinline__ uint16_t DevRound16(float x) {
  if constexpr (kW == PackDType::kBF16) {
    return FloatToBf16(x);
  } else {
    return FloatToF16(x);
  }
}

// ---------------------------------------------------------------------------
// Kernels.
// ---------------------------------------------------------------------------

constexpr int kThreads = 256;
// Column kernels work on kTile x kTile tiles with kTile x kTileY threads.
constexpr int kTile = 32;
constexpr int kTileY = 8;
constexpr int kMaxGridY = 65535;

int GridFor(int64_t n, int64_t per_block, int64_t cap) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(cap, (n + per_block - 1) / per_block)));
}

// Phase 1 of ColumnImportance: block b's sum of column j over rows
// [b * kImportanceRowBlock, ...) in row order, fp32.
template <Importance kKind>
__global__ void ImportancePartialKernel(const float* __restrict__ grad, int64_t rows, int64_t cols,
                                        int64_t blocks, float* __restrict__ partials) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    const int64_t r_end = min(rows, (b + 1) * kImportanceRowBlock);
    float acc = 0.0f;
    for (int64_t r = b * kImportanceRowBlock; r < r_end; ++r) {
      const float g = grad[r * cols + j];
      acc = __fadd_rn(acc, kKind == Importance::kL1 ? fabsf(g) : __fmul_rn(g, g));
    }
    partials[b * cols + j] = acc;
  }
}

// Phase 2: out[j] = ((p0 + p1) + p2) + ... in block order.
__global__ void ImportanceReduceKernel(const float* __restrict__ partials, int64_t cols,
                                       int64_t blocks, float* __restrict__ out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float acc = partials[j];
  for (int64_t b = 1; b < blocks; ++b) acc = __fadd_rn(acc, partials[b * cols + j]);
  out[j] = acc;
}

__global__ void FillZeroKernel(float* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = 0.0f;
  }
}

// ---- TopK ----

struct SelectState {
  unsigned long long prefix;     // High digits of the threshold key found so far.
  unsigned long long remaining;  // Rank of the threshold among keys matching prefix.
  unsigned long long hist[256];
};

__global__ void TopKKeysKernel(const float* __restrict__ scores, int64_t n,
                               unsigned long long* __restrict__ keys) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    keys[i] = internal::TopKKey(__float_as_uint(scores[i]), static_cast<uint32_t>(i));
  }
}

__global__ void SelectInitKernel(SelectState* state, int64_t k) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) state->hist[i] = 0;
  if (threadIdx.x == 0) {
    state->prefix = 0;
    state->remaining = static_cast<unsigned long long>(k);
  }
}

// Histogram of digit (key >> shift) & 255 over keys whose digits above
// `shift` equal the prefix found so far.
__global__ void SelectHistogramKernel(const unsigned long long* __restrict__ keys, int64_t n,
                                      SelectState* state, int shift) {
  __shared__ unsigned int hist[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const unsigned long long high_mask = shift >= 56 ? 0ull : (~0ull << (shift + 8));
  const unsigned long long prefix = state->prefix & high_mask;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const unsigned long long key = keys[i];
    if ((key & high_mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    if (hist[i] != 0) atomicAdd(&state->hist[i], static_cast<unsigned long long>(hist[i]));
  }
}

// Picks the digit holding the remaining-th largest key, then clears the
// histogram for the next pass. One thread.
__global__ void SelectDigitKernel(SelectState* state, int shift) {
  unsigned long long remaining = state->remaining;
  int digit = 0;
  for (int d = 255; d >= 0; --d) {
    const unsigned long long c = state->hist[d];
    if (remaining <= c) {
      digit = d;
      break;
    }
    remaining -= c;
  }
  state->prefix |= static_cast<unsigned long long>(digit) << shift;
  state->remaining = remaining;
  for (int d = 0; d < 256; ++d) state->hist[d] = 0;
}

// Compaction of the keys >= threshold, in index order. Each block owns
// kCompactTile consecutive keys.
constexpr int kCompactItems = 8;
constexpr int64_t kCompactTile = int64_t{kThreads} * kCompactItems;

__global__ void CompactCountKernel(const unsigned long long* __restrict__ keys, int64_t n,
                                   const SelectState* state,
                                   unsigned long long* __restrict__ block_counts) {
  const unsigned long long threshold = state->prefix;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kCompactTile;
  int count = 0;
  for (int s = 0; s < kCompactItems; ++s) {
    const int64_t i = base + s * kThreads + threadIdx.x;
    if (i < n && keys[i] >= threshold) ++count;
  }
  __shared__ int total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  if (count != 0) atomicAdd(&total, count);
  __syncthreads();
  if (threadIdx.x == 0) block_counts[blockIdx.x] = static_cast<unsigned long long>(total);
}

// In-place exclusive scan of n counts with one block (a running carry over
// chunks of blockDim.x).
__global__ void ExclusiveScanKernel(unsigned long long* counts, int64_t n) {
  __shared__ unsigned long long buf[1024];
  __shared__ unsigned long long carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const unsigned long long v = i < n ? counts[i] : 0ull;
    buf[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int off = 1; off < blockDim.x; off <<= 1) {  // Hillis-Steele.
      const unsigned long long add = threadIdx.x >= off ? buf[threadIdx.x - off] : 0ull;
      __syncthreads();
      buf[threadIdx.x] += add;
      __syncthreads();
    }
    if (i < n) counts[i] = carry + buf[threadIdx.x] - v;
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) carry += buf[threadIdx.x];
    __syncthreads();
  }
}

__global__ void CompactScatterKernel(const unsigned long long* __restrict__ keys, int64_t n,
                                     const SelectState* state,
                                     const unsigned long long* __restrict__ block_offsets,
                                     int32_t* __restrict__ out) {
  const unsigned long long threshold = state->prefix;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kCompactTile;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  __shared__ int warp_counts[kThreads / 32];
  unsigned long long offset = block_offsets[blockIdx.x];
  for (int s = 0; s < kCompactItems; ++s) {
    const int64_t i = base + s * kThreads + threadIdx.x;
    const bool take = i < n && keys[i] >= threshold;
    const unsigned int ballot = __ballot_sync(0xFFFFFFFFu, take);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0;
    int total = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      if (w < warp) before += warp_counts[w];
      total += warp_counts[w];
    }
    if (take) {
      const int rank = before + __popc(ballot & ((1u << lane) - 1u));
      out[offset + rank] = static_cast<int32_t>(i);
    }
    offset += total;
    __syncthreads();  // warp_counts is rewritten next round.
  }
}

// ---- Column kernels (32 x 32 tiles through shared memory) ----

// Column c of a tile is read from W (row-major) along threadIdx.x and written
// to packed data (column-major) along threadIdx.x, so both sides coalesce.
template <PackDType kDType>
__global__ void PackKernel(const float* __restrict__ w, int64_t rows, int64_t cols,
                           const int32_t* __restrict__ columns, int64_t ncols,
                           void* __restrict__ dst, const float* __restrict__ scales,
                           unsigned int* errors) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t my_c = c0 + threadIdx.x;
  int64_t src_col = -1;
  if (my_c < ncols) {
    const int32_t col = columns[my_c];
    if (col >= 0 && col < cols) {
      src_col = col;
    } else if (threadIdx.y == 0 && blockIdx.y == 0) {
      atomicOr(errors, kErrPackIndex);
    }
  }
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
    for (int r = threadIdx.y; r < kTile; r += kTileY) {
      const int64_t row = r0 + r;
      tile[r][threadIdx.x] = (row < rows && src_col >= 0) ? w[row * cols + src_col] : 0.0f;
    }
    __syncthreads();
    const int64_t row = r0 + threadIdx.x;
    for (int c = threadIdx.y; c < kTile; c += kTileY) {
      const int64_t cc = c0 + c;
      if (row < rows && cc < ncols) {
        const float scale = kDType == PackDType::kInt8 ? scales[cc] : 0.0f;
        DevStore<kDType>(dst, cc * rows + row, tile[threadIdx.x][c], scale);
      }
    }
    __syncthreads();
  }
}

// int8 scales: max |x| of each selected column (NaNs ignored), 32 columns
// per block, rows split over threadIdx.y.
__global__ void Int8ScaleKernel(const float* __restrict__ w, int64_t rows, int64_t cols,
                                const int32_t* __restrict__ columns, int64_t ncols,
                                float* __restrict__ scales) {
  __shared__ float part[kTileY][kTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  float mx = 0.0f;
  if (c < ncols) {
    const int32_t col = columns[c];
    if (col >= 0 && col < cols) {  // Bad indices are reported by PackKernel.
      for (int64_t r = threadIdx.y; r < rows; r += kTileY) {
        mx = internal::MaxAbsStep(mx, w[r * cols + col]);
      }
    }
  }
  part[threadIdx.y][threadIdx.x] = mx;
  __syncthreads();
  if (threadIdx.y == 0 && c < ncols) {
    for (int y = 1; y < kTileY; ++y) mx = internal::MaxAbsStep(mx, part[y][threadIdx.x]);
    scales[c] = internal::Int8Scale(mx);
  }
}

// The W column of this thread's entry of the block's tile of `columns`, or
// -1 past the end or for a bad index (ColumnCheckKernel reports those).
__device__ int64_t TileColumn(const int32_t* columns, int64_t ncols, int64_t cols) {
  const int64_t my_c = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  if (my_c >= ncols) return -1;
  const int32_t col = columns[my_c];
  return col >= 0 && col < cols ? col : -1;
}

template <PackDType kDType>
__global__ void ApplyKernel(float* __restrict__ w, int64_t rows, int64_t cols,
                            const int32_t* __restrict__ columns, int64_t ncols,
                            const void* __restrict__ src, const float* __restrict__ scales,
                            bool add) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t dst_col = TileColumn(columns, ncols, cols);
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
    const int64_t row = r0 + threadIdx.x;
    for (int c = threadIdx.y; c < kTile; c += kTileY) {
      const int64_t cc = c0 + c;
      if (row < rows && cc < ncols) {
        const float scale = kDType == PackDType::kInt8 ? scales[cc] : 0.0f;
        tile[threadIdx.x][c] = DevLoad<kDType>(src, cc * rows + row, scale);
      }
    }
    __syncthreads();
    if (dst_col >= 0) {
      for (int r = threadIdx.y; r < kTile; r += kTileY) {
        const int64_t rr = r0 + r;
        if (rr < rows) {
          float* p = w + rr * cols + dst_col;
          *p = add ? __fadd_rn(*p, tile[r][threadIdx.x]) : tile[r][threadIdx.x];
        }
      }
    }
    __syncthreads();
  }
}

// ApplyKernel for a 16-bit W (kW): the source (kSrc: kF32, rounded, or kW
// itself, copied) is read along rows and W written along columns, through a
// tile of 16-bit values.
template <PackDType kW, PackDType kSrc>
__global__ void Apply16Kernel(uint16_t* __restrict__ w, int64_t rows, int64_t cols,
                              const int32_t* __restrict__ columns, int64_t ncols,
                              const void* __restrict__ src) {
  __shared__ uint16_t tile[kTile][kTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t dst_col = TileColumn(columns, ncols, cols);
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
    const int64_t row = r0 + threadIdx.x;
    for (int c = threadIdx.y; c < kTile; c += kTileY) {
      const int64_t cc = c0 + c;
      if (row < rows && cc < ncols) {
        const int64_t i = cc * rows + row;
        if constexpr (kSrc == kW) {
          tile[threadIdx.x][c] = static_cast<const uint16_t*>(src)[i];
        } else {
          tile[threadIdx.x][c] = DevRound16<kW>(static_cast<const float*>(src)[i]);
        }
      }
    }
    __syncthreads();
    if (dst_col >= 0) {
      for (int r = threadIdx.y; r < kTile; r += kTileY) {
        const int64_t rr = r0 + r;
        if (rr < rows) w[rr * cols + dst_col] = tile[r][threadIdx.x];
      }
    }
    __syncthreads();
  }
}

// FactoredStep (the local step, docs/design.md rule 13) on W of dtype kW
// (kF32, kBF16, kF16): the tile's gradients are read along rows
// (column-major, coalesced) into shared memory, then each thread steps its
// column of W down the tile's rows with backend_common.h's element (the
// same fp32 operations as the CPU backend: -fmad=false, IEEE sqrt and
// division).
template <PackDType kW>
__global__ void FactoredStepKernel(float lr, float eps, void* __restrict__ w, int64_t rows,
                                   int64_t cols, const int32_t* __restrict__ columns,
                                   int64_t ncols, const float* __restrict__ grad,
                                   const float* __restrict__ row_v,
                                   const float* __restrict__ col_v, float v_mean) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t dst_col = TileColumn(columns, ncols, cols);
  const float cv = dst_col >= 0 ? col_v[c0 + threadIdx.x] : 0.0f;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
    const int64_t row = r0 + threadIdx.x;
    for (int c = threadIdx.y; c < kTile; c += kTileY) {
      const int64_t cc = c0 + c;
      if (row < rows && cc < ncols) tile[threadIdx.x][c] = grad[cc * rows + row];
    }
    __syncthreads();
    if (dst_col >= 0) {
      for (int r = threadIdx.y; r < kTile; r += kTileY) {
        const int64_t rr = r0 + r;
        if (rr < rows) {
          const int64_t i = rr * cols + dst_col;
          const float x = DevLoad<kW>(w, i, 0.0f);
          const float y = internal::FactoredStepElement(x, tile[r][threadIdx.x], row_v[rr], cv,
                                                        v_mean, lr, eps);
          DevStore<kW>(w, i, y, 0.0f);
        }
      }
    }
    __syncthreads();
  }
}

// Elementwise dtype conversion (grid-stride).
template <PackDType kSrc, PackDType kDst>
__global__ void ConvertKernel(const void* __restrict__ src, void* __restrict__ dst, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    DevStore<kDst>(dst, i, DevLoad<kSrc>(src, i, 0.0f), 0.0f);
  }
}

// Range and uniqueness check of the column indices of a writing kernel.
__global__ void ColumnCheckKernel(const int32_t* __restrict__ columns, int64_t ncols, int64_t cols,
                                  unsigned int* __restrict__ seen, unsigned int* errors,
                                  unsigned int range_bit, unsigned int duplicate_bit) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < ncols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t col = columns[i];
    if (col < 0 || col >= cols) {
      atomicOr(errors, range_bit);
      continue;
    }
    const unsigned int bit = 1u << (col & 31);
    if (atomicOr(&seen[col >> 5], bit) & bit) atomicOr(errors, duplicate_bit);
  }
}

struct AdamConsts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, decay, eps, grad_scale;
  double beta1_d, beta2_d, lr_d;
};

// The per-column part of both AdamW kernels: this thread's column of the
// block's tile (-1: none or a bad index, which ColumnCheckKernel reports),
// and per tile column its bias-corrected step size and sqrt(bc2), and
// whether it is updated. Ends with __syncthreads (every thread calls it).
__device__ int64_t AdamColumns(const AdamConsts& k, int64_t cols, const int32_t* columns,
                               int64_t ncols, const int64_t* steps, unsigned int* errors,
                               unsigned int bad_step, float* step_size, float* bc2_sqrt,
                               bool* valid) {
  const int64_t my_c = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  const int64_t col = TileColumn(columns, ncols, cols);
  if (threadIdx.y == 0) {
    bool ok = false;
    if (my_c < ncols) {
      const int64_t t = steps[my_c];
      if (t < 1) {
        if (blockIdx.y == 0) atomicOr(errors, bad_step);
      } else {
        const double td = static_cast<double>(t);
        const double bc1 = 1.0 - pow(k.beta1_d, td);
        const double bc2 = 1.0 - pow(k.beta2_d, td);
        step_size[threadIdx.x] = static_cast<float>(k.lr_d / bc1);
        bc2_sqrt[threadIdx.x] = static_cast<float>(sqrt(bc2));
        ok = col >= 0;
      }
    }
    valid[threadIdx.x] = ok;
  }
  __syncthreads();
  return col;
}

// AdamW on a 32 x 32 tile: p is gathered from W through shared memory so
// both W (along columns) and grad/m/v (along rows) are read coalesced.
__global__ void AdamWKernel(AdamConsts k, float* __restrict__ w, int64_t rows, int64_t cols,
                            const int32_t* __restrict__ columns, int64_t ncols,
                            const int64_t* __restrict__ steps, const float* __restrict__ grad,
                            float* __restrict__ m, float* __restrict__ v, unsigned int* errors) {
  __shared__ float tile[kTile][kTile + 1];
  __shared__ float step_size[kTile];
  __shared__ float bc2_sqrt[kTile];
  __shared__ bool valid[kTile];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t col = AdamColumns(k, cols, columns, ncols, steps, errors, kErrAdamStep, step_size,
                                  bc2_sqrt, valid);
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
    if (col >= 0) {
      for (int r = threadIdx.y; r < kTile; r += kTileY) {
        const int64_t rr = r0 + r;
        if (rr < rows) tile[r][threadIdx.x] = w[rr * cols + col];
      }
    }
    __syncthreads();
    const int64_t row = r0 + threadIdx.x;
    for (int c = threadIdx.y; c < kTile; c += kTileY) {
      if (row < rows && valid[c]) {
        const int64_t i = (c0 + c) * rows + row;
        // The reference formula, in its order (no contraction: -fmad=false).
        const float g = grad[i] * k.grad_scale;
        const float mi = k.beta1 * m[i] + k.one_minus_beta1 * g;
        const float vi = k.beta2 * v[i] + k.one_minus_beta2 * g * g;
        float p = tile[threadIdx.x][c] * k.decay;
        p = p - step_size[c] * mi / (sqrtf(vi) / bc2_sqrt[c] + k.eps);
        m[i] = mi;
        v[i] = vi;
        tile[threadIdx.x][c] = p;
      }
    }
    __syncthreads();
    if (col >= 0 && valid[threadIdx.x]) {
      for (int r = threadIdx.y; r < kTile; r += kTileY) {
        const int64_t rr = r0 + r;
        if (rr < rows) w[rr * cols + col] = tile[r][threadIdx.x];
      }
    }
    __syncthreads();
  }
}

// AdamWKernel on a compact fp32 master (column-major like grad, m, v, so
// every operand is read along rows, coalesced), then the rounded values go
// through a 16-bit tile into W's columns.
template <PackDType kW>
__global__ void AdamW16Kernel(AdamConsts k, uint16_t* __restrict__ w, int64_t rows, int64_t cols,
                              const int32_t* __restrict__ columns, int64_t ncols,
                              const int64_t* __restrict__ steps, const float* __restrict__ grad,
                              float* __restrict__ master, float* __restrict__ m,
                              float* __restrict__ v, unsigned int* errors) {
  __shared__ uint16_t tile[kTile][kTile + 1];
  __shared__ float step_size[kTile];
  __shared__ float bc2_sqrt[kTile];
  __shared__ bool valid[kTile];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t col = AdamColumns(k, cols, columns, ncols, steps, errors, kErrAdam16Step,
                                  step_size, bc2_sqrt, valid);
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
    const int64_t row = r0 + threadIdx.x;
    for (int c = threadIdx.y; c < kTile; c += kTileY) {
      if (row < rows && valid[c]) {
        const int64_t i = (c0 + c) * rows + row;
        // The reference formula, in its order (no contraction: -fmad=false).
        const float g = grad[i] * k.grad_scale;
        const float mi = k.beta1 * m[i] + k.one_minus_beta1 * g;
        const float vi = k.beta2 * v[i] + k.one_minus_beta2 * g * g;
        float p = master[i] * k.decay;
        p = p - step_size[c] * mi / (sqrtf(vi) / bc2_sqrt[c] + k.eps);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        tile[threadIdx.x][c] = DevRound16<kW>(p);
      }
    }
    __syncthreads();
    if (col >= 0 && valid[threadIdx.x]) {
      for (int r = threadIdx.y; r < kTile; r += kTileY) {
        const int64_t rr = r0 + r;
        if (rr < rows) w[rr * cols + col] = tile[r][threadIdx.x];
      }
    }
    __syncthreads();
  }
}

// ---- SquaredNorm: fixed grid (a function of n only), fixed trees. ----

constexpr int kNormMaxBlocks = 1024;

__device__ __forceinline__ double BlockSum(double x, double* shared) {
  shared[threadIdx.x] = x;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  return shared[0];
}

__global__ void NormPartialKernel(const float* __restrict__ x, int64_t n,
                                  double* __restrict__ partials) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double d = static_cast<double>(x[i]);
    acc += d * d;
  }
  const double total = BlockSum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void NormFinalKernel(const double* __restrict__ partials, int count,
                                double* __restrict__ out) {
  __shared__ double shared[kNormMaxBlocks];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const double total = BlockSum(acc, shared);
  if (threadIdx.x == 0) *out = total;
}

}  // namespace zenflow::worker::cuda_kernels

#endif  // ZENFLOW_GPU_WORKER_KERNELS_CUDA_KERNELS_CUH_
