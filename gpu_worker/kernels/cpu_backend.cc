// The CPU Backend: host memory and multithreaded ZenFlow kernels.
//
// The column kernels (PackColumns, ApplyColumns, SelectiveAdamW) touch
// strided columns of a row-major tensor and contiguous column-major packed
// data. They work in tiles of a few columns by a block of rows: the strided
// side is gathered (or scattered) row by row through a small transposition
// buffer that stays in L1, and the contiguous side is encoded / decoded with
// the vectorized codec (common/codec.h) or updated with the SIMD AdamW
// kernel (common/adamw.h).
//
// PackColumns (the worker's hot gather) lives in cpu_pack.cc, with its
// AVX-512 fast path; the tiles it shares with the kernels here are in
// cpu_tiles.h.
//
// Determinism: ColumnImportance and SquaredNorm partition their sums by fixed
// block sizes (backend_common.h), never by thread, so results are identical
// for every thread count; everything else is element-wise and exact.

#include "common/simd.h"
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/kernels/backend_common.h"
#include "gpu_worker/kernels/cpu_pack.h"
#include "gpu_worker/kernels/cpu_tiles.h"
#include "common/adamw.h"

namespace zenflow::worker {
namespace {

using cpu::CeilDiv;
using cpu::CodecDType;
using cpu::GatherTile;
using cpu::GatherTile16;
using cpu::kTileCols;
using cpu::kTileRows;
using cpu::ScatterTile;
using cpu::ScatterTile16;
using internal::kImportanceRowBlock;
using internal::kNormChunk;

// Allocations of at least kHugeAlign bytes are 2 MiB aligned and advised for
// transparent huge pages: the column kernels stride through rows, and huge
// pages keep that walk from thrashing the TLB.
constexpr size_t kAlign = 64;
constexpr size_t kHugeAlign = size_t{2} << 20;

// Copies larger than this are split over the thread pool.
constexpr size_t kParallelCopyBytes = size_t{4} << 20;

// SelectiveAdamW tiles are taller so that each AdamWUpdate call (which
// recomputes its bias corrections) covers many elements.
constexpr int64_t kAdamTileRows = 512;
constexpr int64_t kAdamTileCols = 16;

// ColumnImportance column chunk: one fp32 partial row of this many columns
// (8 KiB) stays in L1 while the block's rows stream past.
constexpr int64_t kImportanceColChunk = 2048;

absl::StatusOr<void*> AllocZeroed(size_t bytes) {
  const size_t align = bytes >= kHugeAlign ? kHugeAlign : kAlign;
  const size_t rounded = std::max<size_t>(align, (bytes + align - 1) / align * align);
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CPU backend: allocation of ", bytes, " bytes failed (out of host memory?)"));
  }
#ifdef MADV_HUGEPAGE
  if (align == kHugeAlign) madvise(p, rounded, MADV_HUGEPAGE);  // Advisory only.
#endif
  std::memset(p, 0, rounded);
  return p;
}

// Importance accumulation: acc[j] += |g[j]| or g[j]*g[j], no FMA (the CUDA
// backend does the same fp32 operations, so both agree bit for bit).
void AccumulateL1(const float* __restrict g, float* __restrict acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += std::fabs(g[j]);
}

void AccumulateL2(const float* __restrict g, float* __restrict acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float sq = g[j] * g[j];
    acc[j] += sq;
  }
}

// sum of (double)x^2 over n values with 8 interleaved accumulators, combined
// in a fixed tree: deterministic for a given n.
double ChunkSquaredNorm(const float* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) {
      const double d = static_cast<double>(x[i + k]);
      acc[k] += d * d;
    }
  }
  for (int k = 0; i < n; ++i, ++k) {
    const double d = static_cast<double>(x[i]);
    acc[k] += d * d;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// FactoredStep on one gathered column: x[r] (rows r0.. of the column,
// contiguous) with its gradient g[r] and row moments rv[r]. The element is
// backend_common.h's; the AVX2 form computes the same IEEE operations
// (multiply, divide, sqrt, add, subtract, each correctly rounded) eight at a
// time, so both give the same bits.
void FactoredColumnScalar(float* x, const float* g, const float* rv, float cv, float v_mean,
                          float lr, float eps, int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    x[r] = internal::FactoredStepElement(x[r], g[r], rv[r], cv, v_mean, lr, eps);
  }
}

ZF_TARGET("avx2")
void FactoredColumnAvx2(float* x, const float* g, const float* rv, float cv, float v_mean,
                        float lr, float eps, int64_t n) {
  const __m256 vcv = _mm256_set1_ps(cv);
  const __m256 vmean = _mm256_set1_ps(v_mean);
  const __m256 vlr = _mm256_set1_ps(lr);
  const __m256 veps = _mm256_set1_ps(eps);
  const __m256 zero = _mm256_setzero_ps();
  int64_t r = 0;
  for (; r + 8 <= n; r += 8) {
    const __m256 vh = _mm256_div_ps(_mm256_mul_ps(_mm256_loadu_ps(rv + r), vcv), vmean);
    const __m256 ok = _mm256_cmp_ps(vh, zero, _CMP_GT_OQ);  // false for NaN
    const __m256 step = _mm256_div_ps(_mm256_mul_ps(vlr, _mm256_loadu_ps(g + r)),
                                      _mm256_add_ps(_mm256_sqrt_ps(vh), veps));
    const __m256 xv = _mm256_loadu_ps(x + r);
    _mm256_storeu_ps(x + r, _mm256_blendv_ps(xv, _mm256_sub_ps(xv, step), ok));
  }
  FactoredColumnScalar(x + r, g + r, rv + r, cv, v_mean, lr, eps, n - r);
}

// Thread-compatible (see Backend); the pool's workers are internal.
class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool simd)
      : pool_(std::max(1, threads)),
        simd_(simd),
        adam_simd_(simd ? BestSimdLevel() : SimdLevel::kScalar) {}

  std::string name() const override { return "cpu"; }

  absl::StatusOr<void*> Alloc(size_t bytes) override { return AllocZeroed(bytes); }
  void Free(void* p) override { std::free(p); }
  absl::StatusOr<void*> AllocHost(size_t bytes) override { return AllocZeroed(bytes); }
  void FreeHost(void* p) override { std::free(p); }

  absl::Status CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    return Copy("CopyToDevice", dst, host_src, bytes);
  }
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    return Copy("CopyToHost", host_dst, src, bytes);
  }
  absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes) override {
    return Copy("CopyDeviceToDevice", dst, src, bytes);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status ColumnImportance(const float* grad, int64_t rows, int64_t cols, Importance kind,
                                float* out) override;
  absl::Status TopK(const float* scores, int64_t cols, int64_t k, int32_t* out) override;
  absl::Status PackColumns(const float* w, int64_t rows, int64_t cols, const int32_t* columns,
                           int64_t ncols, PackDType dtype, void* dst, float* scales) override;
  absl::Status ApplyColumns(float* w, int64_t rows, int64_t cols, const int32_t* columns,
                            int64_t ncols, PackDType dtype, const void* src, const float* scales,
                            bool add) override;
  absl::Status SelectiveAdamW(const AdamWHyper& h, float grad_scale, float* w, int64_t rows,
                              int64_t cols, const int32_t* columns, int64_t ncols,
                              const int64_t* steps, const float* grad, float* m, float* v) override;
  absl::Status SquaredNorm(const float* x, int64_t n, double* host_out) override;
  absl::Status ApplyColumns16(void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                              const int32_t* columns, int64_t ncols, PackDType src_dtype,
                              const void* src) override;
  absl::Status SelectiveAdamW16(const AdamWHyper& h, float grad_scale, void* w, PackDType w_dtype,
                                int64_t rows, int64_t cols, const int32_t* columns, int64_t ncols,
                                const int64_t* steps, const float* grad, float* master, float* m,
                                float* v) override;
  absl::Status Convert(const void* src, PackDType src_dtype, void* dst, PackDType dst_dtype,
                       int64_t n) override;
  absl::Status FactoredStep(float lr, float eps, void* w, PackDType w_dtype, int64_t rows,
                            int64_t cols, const int32_t* columns, int64_t ncols, const float* grad,
                            const float* row_v, const float* col_v, float v_mean) override;

 private:
  absl::Status Copy(const char* op, void* dst, const void* src, size_t bytes);

  ThreadPool pool_;
  const bool simd_;            // Use cpu_pack.cc's AVX-512 kernels when the CPU has them.
  const SimdLevel adam_simd_;  // AdamWUpdate level.
  std::vector<float> importance_partials_;  // [row blocks][cols] scratch.
  std::vector<uint64_t> topk_keys_;         // TopK scratch.
};

absl::Status CpuBackend::Copy(const char* op, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": null ", dst == nullptr ? "destination" : "source", " for ", bytes, " bytes"));
  }
  if (bytes < kParallelCopyBytes) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  constexpr size_t kGrain = size_t{1} << 20;
  const size_t pieces = (bytes + kGrain - 1) / kGrain;
  pool_.ParallelFor(pieces, 1, [&](size_t b, size_t e) {
    const size_t begin = b * kGrain;
    const size_t end = std::min(bytes, e * kGrain);
    std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
                end - begin);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ColumnImportance(const float* grad, int64_t rows, int64_t cols,
                                          Importance kind, float* out) {
  ZF_RETURN_IF_ERROR(internal::CheckImportanceArgs(grad, rows, cols, kind, out));
  if (cols == 0) return absl::OkStatus();
  if (rows == 0) {
    std::fill(out, out + cols, 0.0f);
    return absl::OkStatus();
  }
  const int64_t blocks = CeilDiv(rows, kImportanceRowBlock);
  const int64_t chunks = CeilDiv(cols, kImportanceColChunk);
  float* partials = out;
  if (blocks > 1) {
    importance_partials_.resize(static_cast<size_t>(blocks * cols));
    partials = importance_partials_.data();
  }
  // Phase 1: partials[b][j] = sum over block b's rows, in row order.
  pool_.ParallelFor(static_cast<size_t>(blocks * chunks), 1, [&](size_t tb, size_t te) {
    for (size_t t = tb; t < te; ++t) {
      const int64_t b = static_cast<int64_t>(t) / chunks;
      const int64_t j0 = (static_cast<int64_t>(t) % chunks) * kImportanceColChunk;
      const int64_t jn = std::min(kImportanceColChunk, cols - j0);
      float* acc = partials + b * cols + j0;
      std::fill(acc, acc + jn, 0.0f);
      const int64_t r_end = std::min(rows, (b + 1) * kImportanceRowBlock);
      for (int64_t r = b * kImportanceRowBlock; r < r_end; ++r) {
        const float* g = grad + r * cols + j0;
        if (kind == Importance::kL1) {
          AccumulateL1(g, acc, jn);
        } else {
          AccumulateL2(g, acc, jn);
        }
      }
    }
  });
  if (blocks == 1) return absl::OkStatus();
  // Phase 2: out[j] = ((p0 + p1) + p2) + ... in block order.
  pool_.ParallelFor(static_cast<size_t>(chunks), 1, [&](size_t cb, size_t ce) {
    const int64_t j0 = static_cast<int64_t>(cb) * kImportanceColChunk;
    const int64_t j1 = std::min(cols, static_cast<int64_t>(ce) * kImportanceColChunk);
    std::copy(partials + j0, partials + j1, out + j0);
    for (int64_t b = 1; b < blocks; ++b) {
      const float* p = partials + b * cols;
      for (int64_t j = j0; j < j1; ++j) out[j] += p[j];
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::TopK(const float* scores, int64_t cols, int64_t k, int32_t* out) {
  ZF_RETURN_IF_ERROR(internal::CheckTopKArgs(scores, cols, k, out));
  if (k == 0) return absl::OkStatus();
  if (k == cols) {
    for (int64_t i = 0; i < cols; ++i) out[i] = static_cast<int32_t>(i);
    return absl::OkStatus();
  }
  topk_keys_.resize(static_cast<size_t>(cols));
  uint64_t* keys = topk_keys_.data();
  pool_.ParallelFor(static_cast<size_t>(cols), 4096, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, scores + i, sizeof(bits));
      keys[i] = internal::TopKKey(bits, static_cast<uint32_t>(i));
    }
  });
  // Keys are unique, so the k largest are exactly the answer.
  std::nth_element(keys, keys + (k - 1), keys + cols, std::greater<uint64_t>());
  for (int64_t i = 0; i < k; ++i) out[i] = static_cast<int32_t>(internal::TopKKeyIndex(keys[i]));
  std::sort(out, out + k);
  return absl::OkStatus();
}

absl::Status CpuBackend::PackColumns(const float* w, int64_t rows, int64_t cols,
                                     const int32_t* columns, int64_t ncols, PackDType dtype,
                                     void* dst, float* scales) {
  ZF_RETURN_IF_ERROR(
      internal::CheckColumnsArgs("PackColumns", w, rows, cols, columns, ncols, dtype, dst, scales));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("PackColumns", columns, ncols, cols,
                                                  /*distinct=*/false));
  if (ncols == 0) return absl::OkStatus();
  return cpu::PackColumns(pool_, simd_, w, rows, cols, columns, ncols, dtype, dst, scales);
}

absl::Status CpuBackend::ApplyColumns(float* w, int64_t rows, int64_t cols, const int32_t* columns,
                                      int64_t ncols, PackDType dtype, const void* src,
                                      const float* scales, bool add) {
  ZF_RETURN_IF_ERROR(internal::CheckColumnsArgs("ApplyColumns", w, rows, cols, columns, ncols,
                                                dtype, src, scales));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("ApplyColumns", columns, ncols, cols,
                                                  /*distinct=*/true));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const int64_t tiles = CeilDiv(ncols, kTileCols);
  const DType codec = CodecDType(dtype);
  const size_t esize = PackDTypeSize(dtype);
  const char* in = static_cast<const char*>(src);
  const int64_t row_blocks = CeilDiv(rows, kTileRows);
  // Split by row blocks: threads write disjoint rows of W.
  pool_.ParallelFor(static_cast<size_t>(row_blocks), 1, [&](size_t bb, size_t be) {
    alignas(64) float buf[kTileCols * kTileRows];
    int64_t idx[kTileCols];
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t c0 = t * kTileCols;
      const int64_t cn = std::min(kTileCols, ncols - c0);
      for (int64_t c = 0; c < cn; ++c) idx[c] = columns[c0 + c];
      for (int64_t b = static_cast<int64_t>(bb); b < static_cast<int64_t>(be); ++b) {
        const int64_t r0 = b * kTileRows;
        const int64_t rn = std::min(kTileRows, rows - r0);
        for (int64_t c = 0; c < cn; ++c) {
          const size_t off = static_cast<size_t>((c0 + c) * rows + r0);
          float* col = buf + c * kTileRows;
          if (dtype == PackDType::kInt8) {
            const int8_t* q = reinterpret_cast<const int8_t*>(in) + off;
            const float scale = scales[c0 + c];
            for (int64_t r = 0; r < rn; ++r) col[r] = internal::DequantizeInt8(q[r], scale);
          } else {
            Decode(codec, in + off * esize, static_cast<size_t>(rn), col);
          }
        }
        ScatterTile(w, cols, idx, cn, r0, rn, buf, kTileRows, add);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SelectiveAdamW(const AdamWHyper& h, float grad_scale, float* w,
                                        int64_t rows, int64_t cols, const int32_t* columns,
                                        int64_t ncols, const int64_t* steps, const float* grad,
                                        float* m, float* v) {
  ZF_RETURN_IF_ERROR(
      internal::CheckAdamWArgs(h, grad_scale, w, rows, cols, columns, ncols, steps, grad, m, v));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("SelectiveAdamW", columns, ncols, cols,
                                                  /*distinct=*/true));
  ZF_RETURN_IF_ERROR(internal::CheckSteps(steps, ncols));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const AdamWHyper hyper{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  const int64_t tiles = CeilDiv(ncols, kAdamTileCols);
  pool_.ParallelFor(static_cast<size_t>(tiles), 1, [&](size_t tb, size_t te) {
    std::vector<float> buf(static_cast<size_t>(kAdamTileCols * kAdamTileRows));
    int64_t idx[kAdamTileCols];
    for (int64_t t = static_cast<int64_t>(tb); t < static_cast<int64_t>(te); ++t) {
      const int64_t c0 = t * kAdamTileCols;
      const int64_t cn = std::min(kAdamTileCols, ncols - c0);
      for (int64_t c = 0; c < cn; ++c) idx[c] = columns[c0 + c];
      for (int64_t r0 = 0; r0 < rows; r0 += kAdamTileRows) {
        const int64_t rn = std::min(kAdamTileRows, rows - r0);
        GatherTile(w, cols, idx, cn, r0, rn, buf.data(), kAdamTileRows);
        for (int64_t c = 0; c < cn; ++c) {
          const size_t off = static_cast<size_t>((c0 + c) * rows + r0);
          AdamWUpdate(adam_simd_, hyper, steps[c0 + c], grad_scale, grad + off,
                      buf.data() + c * kAdamTileRows, m + off, v + off, static_cast<size_t>(rn));
        }
        ScatterTile(w, cols, idx, cn, r0, rn, buf.data(), kAdamTileRows, /*add=*/false);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SquaredNorm(const float* x, int64_t n, double* host_out) {
  ZF_RETURN_IF_ERROR(internal::CheckSquaredNormArgs(x, n, host_out));
  const int64_t chunks = CeilDiv(n, kNormChunk);
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  pool_.ParallelFor(static_cast<size_t>(chunks), 1, [&](size_t cb, size_t ce) {
    for (size_t c = cb; c < ce; ++c) {
      const int64_t begin = static_cast<int64_t>(c) * kNormChunk;
      partial[c] = ChunkSquaredNorm(x + begin, std::min(kNormChunk, n - begin));
    }
  });
  double sum = 0.0;
  for (double p : partial) sum += p;
  *host_out = sum;
  return absl::OkStatus();
}

absl::Status CpuBackend::ApplyColumns16(void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                                        const int32_t* columns, int64_t ncols,
                                        PackDType src_dtype, const void* src) {
  ZF_RETURN_IF_ERROR(internal::CheckApplyColumns16Args(w, w_dtype, rows, cols, columns, ncols,
                                                       src_dtype, src));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("ApplyColumns16", columns, ncols, cols,
                                                  /*distinct=*/true));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const int64_t tiles = CeilDiv(ncols, kTileCols);
  const DType codec = CodecDType(w_dtype);
  const bool same = src_dtype == w_dtype;
  const size_t esize = PackDTypeSize(src_dtype);
  const char* in = static_cast<const char*>(src);
  uint16_t* out = static_cast<uint16_t*>(w);
  const int64_t row_blocks = CeilDiv(rows, kTileRows);
  // As ApplyColumns: threads own row blocks, so they write disjoint rows.
  pool_.ParallelFor(static_cast<size_t>(row_blocks), 1, [&](size_t bb, size_t be) {
    alignas(64) uint16_t buf[kTileCols * kTileRows];
    int64_t idx[kTileCols];
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t c0 = t * kTileCols;
      const int64_t cn = std::min(kTileCols, ncols - c0);
      for (int64_t c = 0; c < cn; ++c) idx[c] = columns[c0 + c];
      for (int64_t b = static_cast<int64_t>(bb); b < static_cast<int64_t>(be); ++b) {
        const int64_t r0 = b * kTileRows;
        const int64_t rn = std::min(kTileRows, rows - r0);
        for (int64_t c = 0; c < cn; ++c) {
          const char* col = in + static_cast<size_t>((c0 + c) * rows + r0) * esize;
          if (same) {
            std::memcpy(buf + c * kTileRows, col, static_cast<size_t>(rn) * 2);
          } else {
            Encode(codec, reinterpret_cast<const float*>(col), static_cast<size_t>(rn),
                   buf + c * kTileRows);
          }
        }
        ScatterTile16(out, cols, idx, cn, r0, rn, buf, kTileRows);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SelectiveAdamW16(const AdamWHyper& h, float grad_scale, void* w,
                                          PackDType w_dtype, int64_t rows, int64_t cols,
                                          const int32_t* columns, int64_t ncols,
                                          const int64_t* steps, const float* grad, float* master,
                                          float* m, float* v) {
  ZF_RETURN_IF_ERROR(internal::CheckAdamW16Args(h, grad_scale, w, w_dtype, rows, cols, columns,
                                                ncols, steps, grad, master, m, v));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("SelectiveAdamW16", columns, ncols, cols,
                                                  /*distinct=*/true));
  ZF_RETURN_IF_ERROR(internal::CheckSteps(steps, ncols, "SelectiveAdamW16"));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const AdamWHyper hyper{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  const DType codec = CodecDType(w_dtype);
  uint16_t* out = static_cast<uint16_t*>(w);
  const int64_t tiles = CeilDiv(ncols, kAdamTileCols);
  // The master is contiguous per column: the AdamW kernel runs on it in
  // place (as the daemon's does on its master), and only the rounded values
  // go through the transposition buffer into W.
  pool_.ParallelFor(static_cast<size_t>(tiles), 1, [&](size_t tb, size_t te) {
    std::vector<uint16_t> buf(static_cast<size_t>(kAdamTileCols * kAdamTileRows));
    int64_t idx[kAdamTileCols];
    for (int64_t t = static_cast<int64_t>(tb); t < static_cast<int64_t>(te); ++t) {
      const int64_t c0 = t * kAdamTileCols;
      const int64_t cn = std::min(kAdamTileCols, ncols - c0);
      for (int64_t c = 0; c < cn; ++c) idx[c] = columns[c0 + c];
      for (int64_t r0 = 0; r0 < rows; r0 += kAdamTileRows) {
        const int64_t rn = std::min(kAdamTileRows, rows - r0);
        for (int64_t c = 0; c < cn; ++c) {
          const size_t off = static_cast<size_t>((c0 + c) * rows + r0);
          AdamWUpdate(adam_simd_, hyper, steps[c0 + c], grad_scale, grad + off, master + off,
                      m + off, v + off, static_cast<size_t>(rn));
          Encode(codec, master + off, static_cast<size_t>(rn), buf.data() + c * kAdamTileRows);
        }
        ScatterTile16(out, cols, idx, cn, r0, rn, buf.data(), kAdamTileRows);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Convert(const void* src, PackDType src_dtype, void* dst,
                                 PackDType dst_dtype, int64_t n) {
  ZF_RETURN_IF_ERROR(internal::CheckConvertArgs(src, src_dtype, dst, dst_dtype, n));
  if (n == 0) return absl::OkStatus();
  if (src_dtype == dst_dtype) {
    return Copy("Convert", dst, src, static_cast<size_t>(n) * PackDTypeSize(src_dtype));
  }
  constexpr int64_t kChunk = int64_t{1} << 14;  // values per task (and per bf16<->f16 buffer)
  const char* in = static_cast<const char*>(src);
  char* out = static_cast<char*>(dst);
  const size_t in_size = PackDTypeSize(src_dtype);
  const size_t out_size = PackDTypeSize(dst_dtype);
  pool_.ParallelFor(static_cast<size_t>(CeilDiv(n, kChunk)), 1, [&](size_t b, size_t e) {
    std::vector<float> f32;
    for (size_t k = b; k < e; ++k) {
      const int64_t i0 = static_cast<int64_t>(k) * kChunk;
      const size_t cn = static_cast<size_t>(std::min(kChunk, n - i0));
      const char* s = in + static_cast<size_t>(i0) * in_size;
      char* d = out + static_cast<size_t>(i0) * out_size;
      if (src_dtype == PackDType::kF32) {
        Encode(CodecDType(dst_dtype), reinterpret_cast<const float*>(s), cn, d);
      } else if (dst_dtype == PackDType::kF32) {
        Decode(CodecDType(src_dtype), s, cn, reinterpret_cast<float*>(d));
      } else {  // bf16 <-> f16 through fp32 (exact, then one rounding)
        f32.resize(cn);
        Decode(CodecDType(src_dtype), s, cn, f32.data());
        Encode(CodecDType(dst_dtype), f32.data(), cn, d);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::FactoredStep(float lr, float eps, void* w, PackDType w_dtype,
                                      int64_t rows, int64_t cols, const int32_t* columns,
                                      int64_t ncols, const float* grad, const float* row_v,
                                      const float* col_v, float v_mean) {
  ZF_RETURN_IF_ERROR(internal::CheckFactoredStepArgs(lr, eps, w, w_dtype, rows, cols, columns,
                                                     ncols, grad, row_v, col_v));
  ZF_RETURN_IF_ERROR(internal::CheckColumnIndices("FactoredStep", columns, ncols, cols,
                                                  /*distinct=*/true));
  if (ncols == 0 || rows == 0) return absl::OkStatus();
  const bool f32 = w_dtype == PackDType::kF32;
  const DType codec = CodecDType(w_dtype);
  const bool avx2 = simd_ && simd::HasAvx2();
  const int64_t tiles = CeilDiv(ncols, kTileCols);
  const int64_t row_blocks = CeilDiv(rows, kTileRows);
  // As ApplyColumns: threads own row blocks, so they write disjoint rows.
  // A tile of W is gathered into a transposition buffer (decoded for 16
  // bits), stepped column by column against the contiguous gradients and
  // row moments, and scattered back (rounded to nearest even for 16 bits).
  pool_.ParallelFor(static_cast<size_t>(row_blocks), 1, [&](size_t bb, size_t be) {
    alignas(64) float buf[kTileCols * kTileRows];
    alignas(64) uint16_t buf16[kTileCols * kTileRows];
    int64_t idx[kTileCols];
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t c0 = t * kTileCols;
      const int64_t cn = std::min(kTileCols, ncols - c0);
      for (int64_t c = 0; c < cn; ++c) idx[c] = columns[c0 + c];
      for (int64_t b = static_cast<int64_t>(bb); b < static_cast<int64_t>(be); ++b) {
        const int64_t r0 = b * kTileRows;
        const int64_t rn = std::min(kTileRows, rows - r0);
        if (f32) {
          GatherTile(static_cast<const float*>(w), cols, idx, cn, r0, rn, buf, kTileRows);
        } else {
          GatherTile16(static_cast<const uint16_t*>(w), cols, idx, cn, r0, rn, buf16, kTileRows);
          for (int64_t c = 0; c < cn; ++c) {
            Decode(codec, buf16 + c * kTileRows, static_cast<size_t>(rn), buf + c * kTileRows);
          }
        }
        for (int64_t c = 0; c < cn; ++c) {
          float* x = buf + c * kTileRows;
          const float* g = grad + static_cast<size_t>((c0 + c) * rows + r0);
          if (avx2) {
            FactoredColumnAvx2(x, g, row_v + r0, col_v[c0 + c], v_mean, lr, eps, rn);
          } else {
            FactoredColumnScalar(x, g, row_v + r0, col_v[c0 + c], v_mean, lr, eps, rn);
          }
        }
        if (f32) {
          ScatterTile(static_cast<float*>(w), cols, idx, cn, r0, rn, buf, kTileRows,
                      /*add=*/false);
        } else {
          for (int64_t c = 0; c < cn; ++c) {
            Encode(codec, buf + c * kTileRows, static_cast<size_t>(rn), buf16 + c * kTileRows);
          }
          ScatterTile16(static_cast<uint16_t*>(w), cols, idx, cn, r0, rn, buf16, kTileRows);
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads, /*simd=*/true);
}

namespace internal {

std::unique_ptr<Backend> MakeCpuBackendForTest(int threads, bool simd) {
  return std::make_unique<CpuBackend>(threads, simd);
}

}  // namespace internal

}  // namespace zenflow::worker
