// The CPU backend's tiles: the strided side of a column kernel is gathered
// (or scattered) row by row through a small transposition buffer that stays
// in L1. Shared by cpu_backend.cc and cpu_pack.cc; not an API.
#ifndef ZENFLOW_GPU_WORKER_KERNELS_CPU_TILES_H_
#define ZENFLOW_GPU_WORKER_KERNELS_CPU_TILES_H_

#include <cstdint>

#include "common/codec.h"
#include "gpu_worker/backend.h"

namespace zenflow::worker::cpu {

// Portable tile of the Pack/Apply kernels: kTileCols columns by kTileRows
// rows. The transposition buffer (4 KiB) lives in L1; kTileRows values of a
// packed bf16 column are 128 bytes.
constexpr int64_t kTileRows = 64;
constexpr int64_t kTileCols = 16;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline DType CodecDType(PackDType d) {
  switch (d) {
    case PackDType::kBF16:
      return DType::kBF16;
    case PackDType::kF16:
      return DType::kF16;
    default:
      return DType::kF32;
  }
}

// Gathers a tile: buf[c * stride + r] = w[(r0 + r) * cols + idx[c]] for
// c < cn, r < rn.
inline void GatherTile(const float* w, int64_t cols, const int64_t* idx, int64_t cn, int64_t r0,
                       int64_t rn, float* buf, int64_t stride) {
  for (int64_t r = 0; r < rn; ++r) {
    const float* row = w + (r0 + r) * cols;
    for (int64_t c = 0; c < cn; ++c) buf[c * stride + r] = row[idx[c]];
  }
}

// The inverse: w[(r0 + r) * cols + idx[c]] (+)= buf[c * stride + r].
inline void ScatterTile(float* w, int64_t cols, const int64_t* idx, int64_t cn, int64_t r0,
                        int64_t rn, const float* buf, int64_t stride, bool add) {
  for (int64_t r = 0; r < rn; ++r) {
    float* row = w + (r0 + r) * cols;
    if (add) {
      for (int64_t c = 0; c < cn; ++c) row[idx[c]] += buf[c * stride + r];
    } else {
      for (int64_t c = 0; c < cn; ++c) row[idx[c]] = buf[c * stride + r];
    }
  }
}

// 16-bit W: buf[c * stride + r] = w[(r0 + r) * cols + idx[c]].
inline void GatherTile16(const uint16_t* w, int64_t cols, const int64_t* idx, int64_t cn,
                         int64_t r0, int64_t rn, uint16_t* buf, int64_t stride) {
  for (int64_t r = 0; r < rn; ++r) {
    const uint16_t* row = w + (r0 + r) * cols;
    for (int64_t c = 0; c < cn; ++c) buf[c * stride + r] = row[idx[c]];
  }
}

// 16-bit W: w[(r0 + r) * cols + idx[c]] = buf[c * stride + r].
inline void ScatterTile16(uint16_t* w, int64_t cols, const int64_t* idx, int64_t cn, int64_t r0,
                          int64_t rn, const uint16_t* buf, int64_t stride) {
  for (int64_t r = 0; r < rn; ++r) {
    uint16_t* row = w + (r0 + r) * cols;
    for (int64_t c = 0; c < cn; ++c) row[idx[c]] = buf[c * stride + r];
  }
}


}  // namespace zenflow::worker::cpu

#endif  // ZENFLOW_GPU_WORKER_KERNELS_CPU_TILES_H_
