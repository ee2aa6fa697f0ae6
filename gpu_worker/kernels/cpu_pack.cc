// The CPU backend's PackColumns; see cpu_pack.h.
//
// PackColumns to bf16 / f16 / f32 has an AVX-512 fast path (the worker's hot
// gather): 16 columns x 32 rows at a time are loaded straight from W,
// compacted (one permute per row), converted, transposed in registers as
// 32-bit row pairs and written with full-cache-line (non-temporal when
// aligned) stores. Each thread walks its rows strip by strip (4 KiB of each
// row), 32 rows and 256 source columns (a chunk) at a time, prefetching the
// next chunk while it packs one. Columns whose 16-wide
// group spans 32 or more source columns, rows left over after the 32-row
// steps, int8, and CPUs without AVX-512 take the portable path: tiles
// gathered through a small transposition buffer and encoded with the
// vectorized codec (common/codec.h). Both paths produce identical bytes (the
// codec's round-to-nearest-even rules; bf16 denormals, which the hardware
// bf16 instruction would flush, are rounded in integer arithmetic).

#include "gpu_worker/kernels/cpu_pack.h"

#include "common/simd.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/codec.h"
#include "gpu_worker/kernels/backend_common.h"
#include "gpu_worker/kernels/cpu_tiles.h"

namespace zenflow::worker::cpu {
namespace {

// ---------------------------------------------------------------------------
// PackColumns: portable path.
// ---------------------------------------------------------------------------

// Packs columns[0..count) (count <= kTileCols) for rows [r_begin, r_end)
// into dst_group, the packed data of the first of those columns.
void PackGroupPortable(DType codec, size_t esize, const float* w, int64_t cols,
                       const int32_t* columns, int64_t count, int64_t r_begin, int64_t r_end,
                       char* dst_group, int64_t rows) {
  alignas(64) float buf[kTileCols * kTileRows];
  int64_t idx[kTileCols];
  for (int64_t c = 0; c < count; ++c) idx[c] = columns[c];
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kTileRows) {
    const int64_t rn = std::min(kTileRows, r_end - r0);
    GatherTile(w, cols, idx, count, r0, rn, buf, kTileRows);
    for (int64_t c = 0; c < count; ++c) {
      Encode(codec, buf + c * kTileRows, static_cast<size_t>(rn),
             dst_group + static_cast<size_t>(c * rows + r0) * esize);
    }
  }
}

// ---------------------------------------------------------------------------
// PackColumns: AVX-512 path.
// ---------------------------------------------------------------------------

// GCC 12 reports its own _mm512_undefined_*() placeholders inside the
// inlined intrinsics as uninitialized (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define ZF_TARGET_PACK __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c")))
#define ZF_TARGET_PACK_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c,avx512bf16")))
#define ZF_ALWAYS_INLINE inline __attribute__((always_inline))

// Rows per block (the unit the threads split; each packed column receives
// kPackRows values per block, whole cache lines) and rows per register step.
constexpr int64_t kPackRows = 32;
constexpr int64_t kPackStep = 32;
static_assert(kPackRows % kPackStep == 0, "a block is whole register steps");
// Source columns per chunk: the unit of software prefetch (the next chunk's
// kPackRows rows, about 32 KiB, are fetched into L1 while one is packed).
constexpr int64_t kStageSpan = 256;
// Chunks per strip: a thread packs a strip (4 KiB, one page, of each source
// row) for all of its row blocks before moving to the next, so the source
// pages and packed columns in use fit the TLB and rows are read in long runs.
constexpr int64_t kStripChunks = 4;

// kTileCols (16) consecutive packed columns.
struct PackGroup {
  int32_t min_col = 0;          // Smallest source column of the group.
  int32_t count = 0;            // Columns in the group (16 except maybe the last).
  bool window = false;          // All source columns lie in [min_col, min_col + 32).
  int32_t rel[kTileCols] = {};  // Source column - min_col; 0 for unused lanes.
};

// A run of window groups whose source columns all lie in
// [base, base + kStageSpan), or one non-window group.
struct PackChunk {
  int64_t first_group = 0;
  int64_t end_group = 0;
  int32_t base = 0;   // First source column read.
  int32_t width = 0;  // Source columns read.
  bool window = false;
};

struct PackPlan {
  std::vector<PackGroup> groups;
  std::vector<PackChunk> chunks;
};

PackPlan MakePackPlan(const int32_t* columns, int64_t ncols, int64_t cols) {
  PackPlan plan;
  const int64_t n = CeilDiv(ncols, kTileCols);
  plan.groups.resize(static_cast<size_t>(n));
  for (int64_t g = 0; g < n; ++g) {
    PackGroup& grp = plan.groups[static_cast<size_t>(g)];
    const int32_t* c = columns + g * kTileCols;
    grp.count = static_cast<int32_t>(std::min(kTileCols, ncols - g * kTileCols));
    int32_t lo = c[0];
    int32_t hi = c[0];
    for (int32_t k = 1; k < grp.count; ++k) {
      lo = std::min(lo, c[k]);
      hi = std::max(hi, c[k]);
    }
    grp.min_col = lo;
    grp.window = hi - lo < 32;
    for (int32_t k = 0; k < grp.count; ++k) grp.rel[k] = c[k] - lo;
    PackChunk* last = plan.chunks.empty() ? nullptr : &plan.chunks.back();
    const int32_t end_col = static_cast<int32_t>(std::min<int64_t>(cols, int64_t{hi} + 1));
    if (grp.window && last != nullptr && last->window && lo >= last->base &&
        hi < last->base + kStageSpan) {
      last->end_group = g + 1;
      last->width = std::max(last->width, end_col - last->base);
    } else {
      PackChunk chunk;
      chunk.first_group = g;
      chunk.end_group = g + 1;
      chunk.base = lo;
      chunk.width = end_col - lo;
      chunk.window = grp.window;
      plan.chunks.push_back(chunk);
    }
  }
  return plan;
}

bool CpuHasAvx512Pack() { return simd::HasAvx512Pack(); }

bool CpuHasAvx512Bf16() { return simd::HasAvx512Bf16(); }

// In-register transpose of a 16x16 matrix of 32-bit lanes: r[i] lane j
// becomes r[j] lane i.
ZF_TARGET_PACK ZF_ALWAYS_INLINE void Transpose16x16(__m512 r[16]) {
  __m512 a[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m512 b[16];
  for (int i = 0; i < 4; ++i) {
    const __m512d a0 = _mm512_castps_pd(a[4 * i]);
    const __m512d a1 = _mm512_castps_pd(a[4 * i + 1]);
    const __m512d a2 = _mm512_castps_pd(a[4 * i + 2]);
    const __m512d a3 = _mm512_castps_pd(a[4 * i + 3]);
    b[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  // b[4i + k], 128-bit lane L, holds column 4L + k of rows 4i..4i+3.
  for (int k = 0; k < 4; ++k) {
    const __m512 c0 = _mm512_shuffle_f32x4(b[k], b[4 + k], 0x88);
    const __m512 c1 = _mm512_shuffle_f32x4(b[k], b[4 + k], 0xDD);
    const __m512 d0 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0x88);
    const __m512 d1 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0xDD);
    r[k] = _mm512_shuffle_f32x4(c0, d0, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(c0, d0, 0xDD);
    r[4 + k] = _mm512_shuffle_f32x4(c1, d1, 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(c1, d1, 0xDD);
  }
}

// fp32 -> bf16 in integer arithmetic, the codec's rule (round to nearest
// even; NaN kept quiet with its top payload bits).
ZF_TARGET_PACK ZF_ALWAYS_INLINE __m256i Bf16Round(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_or_epi32(rounded, nan, hi, _mm512_set1_epi32(0x40)));
}

// Lanes 2j and 2j+1 of the result are lane j of the low and the high 256-bit
// half of the input: two rows of 16 values become 16 (row a, row b) pairs.
ZF_TARGET_PACK ZF_ALWAYS_INLINE __m512i InterleaveHalves16(__m512i ab) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, ab);
}

// Loads the 16 selected values of one source row: lane k = row[rel[k]].
// Lanes outside [0, lo) / [16, 16 + hi) of the 32-float window (past the end
// of the row) are not read; they are never selected.
ZF_TARGET_PACK ZF_ALWAYS_INLINE __m512 LoadSelected(const float* row, __m512i rel, __mmask16 lo,
                                                    __mmask16 hi) {
  return _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(lo, row), rel,
                                _mm512_maskz_loadu_ps(hi, row + 16));
}

ZF_TARGET_PACK ZF_ALWAYS_INLINE void StoreLine(void* p, __m512i v, bool nt) {
  if (nt) {
    _mm512_stream_si512(static_cast<__m512i*>(p), v);
  } else {
    _mm512_storeu_si512(p, v);
  }
}

// The source of one step: 32 rows, `stride` floats apart, starting at the
// group's smallest column, and the load masks of its 32-float window.
struct StepSource {
  const float* p;
  int64_t stride;
  __mmask16 lo;
  __mmask16 hi;
};

// 16-bit encodings, 32 rows: rows 2i and 2i+1 are encoded into one register
// as 16 (row 2i, row 2i+1) pairs of every column; a 32-bit transpose then
// leaves column c's 32 consecutive values in register c. The bf16 and f16
// versions differ only in the encoding (and in the CPU features they need).
ZF_TARGET_PACK_BF16 void PackStepBf16(StepSource s, const int32_t* rel, int32_t count,
                                      uint16_t* out, int64_t rows, bool nt) {
  const __m512i relv = _mm512_loadu_si512(rel);
  __m512 x[16];
  for (int i = 0; i < 16; ++i) {
    const __m512 a = LoadSelected(s.p + (2 * i) * s.stride, relv, s.lo, s.hi);
    const __m512 b = LoadSelected(s.p + (2 * i + 1) * s.stride, relv, s.lo, s.hi);
    __m512i ab;
    // The bf16 instruction flushes denormal inputs; such row pairs take the
    // integer rounding instead.
    if (__builtin_expect((_mm512_fpclass_ps_mask(a, 0x20) | _mm512_fpclass_ps_mask(b, 0x20)) != 0,
                         0)) {
      ab = _mm512_inserti64x4(_mm512_castsi256_si512(Bf16Round(a)), Bf16Round(b), 1);
    } else {
      ab = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // Low half a, high half b.
    }
    x[i] = _mm512_castsi512_ps(InterleaveHalves16(ab));
  }
  Transpose16x16(x);
  for (int32_t c = 0; c < count; ++c) StoreLine(out + c * rows, _mm512_castps_si512(x[c]), nt);
}

ZF_TARGET_PACK void PackStepF16(StepSource s, const int32_t* rel, int32_t count, uint16_t* out,
                                int64_t rows, bool nt) {
  const __m512i relv = _mm512_loadu_si512(rel);
  __m512 x[16];
  for (int i = 0; i < 16; ++i) {
    const __m512 a = LoadSelected(s.p + (2 * i) * s.stride, relv, s.lo, s.hi);
    const __m512 b = LoadSelected(s.p + (2 * i + 1) * s.stride, relv, s.lo, s.hi);
    const __m512i ab =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT)),
                           _mm512_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT), 1);
    x[i] = _mm512_castsi512_ps(InterleaveHalves16(ab));
  }
  Transpose16x16(x);
  for (int32_t c = 0; c < count; ++c) StoreLine(out + c * rows, _mm512_castps_si512(x[c]), nt);
}

// fp32, 32 rows as two 16x16 transposes.
ZF_TARGET_PACK void PackStepF32(StepSource s, const int32_t* rel, int32_t count, float* out,
                                int64_t rows, bool nt) {
  const __m512i relv = _mm512_loadu_si512(rel);
  for (int half = 0; half < 2; ++half) {
    __m512 x[16];
    for (int i = 0; i < 16; ++i) {
      x[i] = LoadSelected(s.p + (16 * half + i) * s.stride, relv, s.lo, s.hi);
    }
    Transpose16x16(x);
    for (int32_t c = 0; c < count; ++c) {
      StoreLine(out + c * rows + 16 * half, _mm512_castps_si512(x[c]), nt);
    }
  }
}

// Software prefetch of a rows x [c0, c1) region of W, row by row, a few
// cache lines per call: spread over the steps of one chunk, it brings the
// next chunk's source into the cache while this one is packed.
class RegionPrefetcher {
 public:
  RegionPrefetcher() = default;
  RegionPrefetcher(const float* w, int64_t cols, int64_t r0, int64_t rn, int64_t c0, int64_t c1) {
    if (rn <= 0 || c1 <= c0) return;
    const uintptr_t first = reinterpret_cast<uintptr_t>(w + r0 * cols + c0) & ~uintptr_t{63};
    const uintptr_t last = reinterpret_cast<uintptr_t>(w + r0 * cols + c1 - 1) & ~uintptr_t{63};
    base_ = reinterpret_cast<const char*>(first);
    row_bytes_ = cols * static_cast<int64_t>(sizeof(float));
    lines_ = static_cast<int64_t>((last - first) / 64) + 1;
    rows_ = rn;
  }
  int64_t total() const { return rows_ * lines_; }
  void Issue(int64_t n) {
    for (; n > 0 && row_ < rows_; --n) {
      _mm_prefetch(base_ + row_ * row_bytes_ + line_ * 64, _MM_HINT_T0);
      if (++line_ == lines_) {
        line_ = 0;
        ++row_;
      }
    }
  }

 private:
  const char* base_ = nullptr;
  int64_t row_bytes_ = 0;
  int64_t lines_ = 0;
  int64_t rows_ = 0;
  int64_t row_ = 0;
  int64_t line_ = 0;
};

// Packs the groups of one window chunk for rows [r0, r0 + rn), rn a
// multiple of kPackStep, reading W directly, and issues the prefetches of
// `pf` spread over its steps.
void PackChunkAvx512(PackDType dtype, const float* w, int64_t cols, const PackPlan& plan,
                     const PackChunk& chunk, int64_t r0, int64_t rn, RegionPrefetcher pf,
                     char* dst, int64_t rows, bool nt) {
  const size_t esize = PackDTypeSize(dtype);
  const int64_t steps = (chunk.end_group - chunk.first_group) * (rn / kPackStep);
  const int64_t quota = steps > 0 ? CeilDiv(pf.total(), steps) : 0;
  for (int64_t g = chunk.first_group; g < chunk.end_group; ++g) {
    const PackGroup& grp = plan.groups[static_cast<size_t>(g)];
    const int64_t avail = std::min<int64_t>(32, cols - grp.min_col);
    const __mmask16 lo =
        avail >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << avail) - 1u);
    const __mmask16 hi = avail >= 32   ? __mmask16{0xFFFF}
                         : avail <= 16 ? __mmask16{0}
                                       : static_cast<__mmask16>((1u << (avail - 16)) - 1u);
    for (int64_t m = 0; m < rn; m += kPackStep) {
      pf.Issue(quota);
      char* out = dst + static_cast<size_t>(g * kTileCols * rows + r0 + m) * esize;
      const StepSource s{w + (r0 + m) * cols + grp.min_col, cols, lo, hi};
      switch (dtype) {
        case PackDType::kBF16:
          PackStepBf16(s, grp.rel, grp.count, reinterpret_cast<uint16_t*>(out), rows, nt);
          break;
        case PackDType::kF16:
          PackStepF16(s, grp.rel, grp.count, reinterpret_cast<uint16_t*>(out), rows, nt);
          break;
        default:
          PackStepF32(s, grp.rel, grp.count, reinterpret_cast<float*>(out), rows, nt);
          break;
      }
    }
  }
}

// int8 packing, AVX-512. Per group of 16 packed columns: lane k of a row's
// load is the row's value of packed column k (LoadSelected for window
// groups, a gather otherwise; unused lanes read a valid column).
struct Int8Group {
  int32_t idx[kTileCols];  // Window groups: rel (permute index); others: source columns.
  const float* base;  // Row-0 pointer: min_col for window groups, w otherwise.
  __mmask16 lo, hi;
  bool window;
};

ZF_TARGET_PACK ZF_ALWAYS_INLINE __m512 LoadInt8Row(const Int8Group& g, __m512i idx, int64_t r,
                                                   int64_t cols) {
  const float* row = g.base + r * cols;
  if (g.window) return LoadSelected(row, idx, g.lo, g.hi);
  return _mm512_i32gather_ps(idx, row, 4);
}

ZF_TARGET_PACK void MakeInt8Groups(const float* w, int64_t cols, const int32_t* columns,
                                   int64_t ncols, std::vector<Int8Group>& groups) {
  const PackPlan plan = MakePackPlan(columns, ncols, cols);
  groups.resize(plan.groups.size());
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const PackGroup& p = plan.groups[g];
    Int8Group& q = groups[g];
    q.window = p.window;
    if (p.window) {
      std::memcpy(q.idx, p.rel, sizeof(q.idx));
      q.base = w + p.min_col;
      const int64_t avail = cols - p.min_col;
      q.lo = avail >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << avail) - 1u);
      q.hi = avail >= 32   ? __mmask16{0xFFFF}
             : avail <= 16 ? __mmask16{0}
                           : static_cast<__mmask16>((1u << (avail - 16)) - 1u);
    } else {
      for (int k = 0; k < kTileCols; ++k) {
        q.idx[k] = k < p.count ? columns[g * kTileCols + k] : columns[g * kTileCols];
      }
      q.base = w;
      q.lo = q.hi = 0;
    }
  }
}

// Groups ahead whose window rows are prefetched.
constexpr size_t kInt8Ahead = 6;

// Running max |x| over rows [r0, r1) into acc[g] (16 lanes per group). A NaN
// |x| leaves the running value (max_ps returns its second operand), as
// MaxAbsStep does; max is order-independent otherwise.
ZF_TARGET_PACK void Int8MaxRows(const std::vector<Int8Group>& groups, int64_t cols, int64_t r0,
                                int64_t r1, float* acc) {
  constexpr int64_t kBand = 16;
  const size_t n = groups.size();
  for (int64_t b = r0; b < r1; b += kBand) {
    const int64_t be = std::min(r1, b + kBand);
    for (size_t g = 0; g < n; ++g) {
      const Int8Group& grp = groups[g];
      const __m512i idx = _mm512_loadu_si512(grp.idx);
      __m512 m = _mm512_loadu_ps(acc + g * 16);
      for (int64_t r = b; r < be; ++r) {
        m = _mm512_max_ps(_mm512_abs_ps(LoadInt8Row(grp, idx, r, cols)), m);
      }
      _mm512_storeu_ps(acc + g * 16, m);
    }
  }
}

// QuantizeInt8 before the rounding, per lane: clamp(x / scale) or 0.
ZF_TARGET_PACK ZF_ALWAYS_INLINE __m512 Int8Prequant(__m512 x, __m512 scale, __mmask16 ok) {
  const __m512 y = _mm512_div_ps(x, scale);
  const __mmask16 valid = _mm512_mask_cmp_ps_mask(ok, y, y, _CMP_ORD_Q);
  const __m512 c = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  return _mm512_maskz_mov_ps(valid, c);
}

// Quantizes rows [r0, r1) (r1 - r0 a multiple of 64) of every group.
ZF_TARGET_PACK void Int8QuantRows(const std::vector<Int8Group>& groups, const int32_t* counts,
                                  int64_t cols, int64_t r0, int64_t r1, const float* scale,
                                  int8_t* out, int64_t rows, bool nt) {
  const size_t n = groups.size();
  alignas(64) int8_t line[kTileCols][64];
  for (int64_t b = r0; b < r1; b += 64) {
    for (size_t g = 0; g < n; ++g) {
      const Int8Group& grp = groups[g];
      const __m512i idx = _mm512_loadu_si512(grp.idx);
      const __m512 s = _mm512_loadu_ps(scale + g * 16);
      const __mmask16 ok = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ);
      // Software prefetch of a later group's window: 64 concurrent row
      // streams are more than the hardware prefetcher follows.
      const bool pfok = g + kInt8Ahead < n && groups[g + kInt8Ahead].window;
      const float* pfb = pfok ? groups[g + kInt8Ahead].base + b * cols : nullptr;
      for (int q = 0; q < 4; ++q) {
        __m512 x[16];
        if (pfok) {
          for (int i = 0; i < 16; ++i) {
            const float* pr = pfb + (16 * q + i) * cols;
            _mm_prefetch(reinterpret_cast<const char*>(pr), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(pr + 31), _MM_HINT_T0);
          }
        }
        for (int i = 0; i < 16; ++i) {
          x[i] = Int8Prequant(LoadInt8Row(grp, idx, b + 16 * q + i, cols), s, ok);
        }
        Transpose16x16(x);
        for (int c = 0; c < 16; ++c) {
          _mm_store_si128(reinterpret_cast<__m128i*>(&line[c][16 * q]),
                          _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(x[c])));
        }
      }
      const int32_t count = counts[g];
      int8_t* o = out + static_cast<int64_t>(g) * kTileCols * rows + b;
      for (int32_t c = 0; c < count; ++c) {
        StoreLine(o + c * rows, _mm512_load_si512(line[c]), nt);
      }
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

absl::Status PackColumns(ThreadPool& pool, bool simd, const float* w, int64_t rows, int64_t cols,
                         const int32_t* columns, int64_t ncols, PackDType dtype, void* dst,
                         float* scales) {
  const int64_t tiles = CeilDiv(ncols, kTileCols);

  if (dtype == PackDType::kInt8 && simd && CpuHasAvx512Pack() && rows > 0) {
    // Pass 1: per-thread partial max |x| over a share of the rows, reduced
    // (max is order-independent). Pass 2: quantize 64-row bands directly
    // from W, transposing in registers.
    int8_t* out = static_cast<int8_t*>(dst);
    std::vector<Int8Group> groups;
    MakeInt8Groups(w, cols, columns, ncols, groups);
    const int64_t ng = static_cast<int64_t>(groups.size());
    std::vector<int32_t> counts(static_cast<size_t>(ng));
    for (int64_t g = 0; g < ng; ++g) {
      counts[static_cast<size_t>(g)] = static_cast<int32_t>(std::min(kTileCols, ncols - g * kTileCols));
    }
    const int64_t lanes = ng * kTileCols;
    const int64_t parts =
        std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), CeilDiv(rows, 64)));
    const int64_t share = CeilDiv(CeilDiv(rows, 16), parts) * 16;
    std::vector<float> partial(static_cast<size_t>(parts * lanes), 0.0f);
    pool.ParallelFor(static_cast<size_t>(parts), 1, [&](size_t pb, size_t pe) {
      for (int64_t p = static_cast<int64_t>(pb); p < static_cast<int64_t>(pe); ++p) {
        const int64_t r0 = p * share;
        const int64_t r1 = std::min(rows, r0 + share);
        if (r0 < r1) Int8MaxRows(groups, cols, r0, r1, partial.data() + p * lanes);
      }
    });
    std::vector<float> scale(static_cast<size_t>(lanes));
    for (int64_t j = 0; j < lanes; ++j) {
      float mx = partial[static_cast<size_t>(j)];
      for (int64_t p = 1; p < parts; ++p) {
        mx = internal::MaxAbsStep(mx, partial[static_cast<size_t>(p * lanes + j)]);
      }
      scale[static_cast<size_t>(j)] = internal::Int8Scale(mx);
    }
    std::copy(scale.begin(), scale.begin() + ncols, scales);
    const bool nt = reinterpret_cast<uintptr_t>(dst) % 64 == 0 && rows % 64 == 0;
    const int64_t bands = rows / 64;
    const int64_t tail0 = bands * 64;
    pool.ParallelFor(static_cast<size_t>(std::max<int64_t>(bands, 1)), 1,
                      [&](size_t bb, size_t be) {
      if (bands > 0) {
        Int8QuantRows(groups, counts.data(), cols, static_cast<int64_t>(bb) * 64,
                      static_cast<int64_t>(be) * 64, scale.data(), out, rows, nt);
        if (nt) _mm_sfence();
      }
      if (tail0 < rows && bb == 0) {
        for (int64_t c = 0; c < ncols; ++c) {
          const float* src = w + columns[c];
          int8_t* q = out + c * rows;
          for (int64_t r = tail0; r < rows; ++r) {
            q[r] = internal::QuantizeInt8(src[r * cols], scale[static_cast<size_t>(c)]);
          }
        }
      }
    });
    return absl::OkStatus();
  }

  if (dtype == PackDType::kInt8) {
    // Each column needs its max before any value is quantized: split by
    // columns, two passes per column tile.
    int8_t* out = static_cast<int8_t*>(dst);
    pool.ParallelFor(static_cast<size_t>(tiles), 1, [&](size_t tb, size_t te) {
      alignas(64) float buf[kTileCols * kTileRows];
      int64_t idx[kTileCols];
      float scale[kTileCols];
      for (int64_t t = static_cast<int64_t>(tb); t < static_cast<int64_t>(te); ++t) {
        const int64_t c0 = t * kTileCols;
        const int64_t cn = std::min(kTileCols, ncols - c0);
        for (int64_t c = 0; c < cn; ++c) {
          idx[c] = columns[c0 + c];
          scale[c] = 0.0f;
        }
        for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
          const int64_t rn = std::min(kTileRows, rows - r0);
          GatherTile(w, cols, idx, cn, r0, rn, buf, kTileRows);
          for (int64_t c = 0; c < cn; ++c) {
            float mx = scale[c];
            for (int64_t r = 0; r < rn; ++r) mx = internal::MaxAbsStep(mx, buf[c * kTileRows + r]);
            scale[c] = mx;
          }
        }
        for (int64_t c = 0; c < cn; ++c) {
          scale[c] = internal::Int8Scale(scale[c]);
          scales[c0 + c] = scale[c];
        }
        for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
          const int64_t rn = std::min(kTileRows, rows - r0);
          GatherTile(w, cols, idx, cn, r0, rn, buf, kTileRows);
          for (int64_t c = 0; c < cn; ++c) {
            int8_t* q = out + (c0 + c) * rows + r0;
            for (int64_t r = 0; r < rn; ++r) {
              q[r] = internal::QuantizeInt8(buf[c * kTileRows + r], scale[c]);
            }
          }
        }
      }
    });
    return absl::OkStatus();
  }

  // f32 / bf16 / f16: split by blocks of kPackRows rows; each thread sweeps
  // all columns of its rows.
  const DType codec = CodecDType(dtype);
  const size_t esize = PackDTypeSize(dtype);
  char* out = static_cast<char*>(dst);
  const bool fast =
      simd && CpuHasAvx512Pack() && (dtype != PackDType::kBF16 || CpuHasAvx512Bf16());
  // Full-line stores are aligned when every packed column starts on a line.
  const bool nt =
      reinterpret_cast<uintptr_t>(dst) % 64 == 0 && (static_cast<size_t>(rows) * esize) % 64 == 0;
  PackPlan plan;
  if (fast) plan = MakePackPlan(columns, ncols, cols);
  const int64_t row_blocks = CeilDiv(rows, kPackRows);
  // Window chunks, in column order, cut into strips of kStripChunks.
  std::vector<size_t> wchunks;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    if (plan.chunks[i].window) wchunks.push_back(i);
  }
  const size_t strip = static_cast<size_t>(kStripChunks);
  pool.ParallelFor(static_cast<size_t>(row_blocks), 1, [&](size_t bb, size_t be) {
    if (fast && !wchunks.empty()) {
      // (block, chunk) pairs in processing order: strip by strip, and
      // within a strip block by block, so the source pages and packed
      // columns in use stay few.
      struct Item {
        int64_t r0, rn;
        const PackChunk* chunk;
      };
      std::vector<Item> items;
      for (size_t s0 = 0; s0 < wchunks.size(); s0 += strip) {
        const size_t s1 = std::min(wchunks.size(), s0 + strip);
        for (int64_t b = static_cast<int64_t>(bb); b < static_cast<int64_t>(be); ++b) {
          const int64_t r0 = b * kPackRows;
          const int64_t rn = std::min(kPackRows, rows - r0) / kPackStep * kPackStep;
          if (rn == 0) continue;
          for (size_t k = s0; k < s1; ++k) items.push_back({r0, rn, &plan.chunks[wchunks[k]]});
        }
      }
      for (size_t i = 0; i < items.size(); ++i) {
        RegionPrefetcher pf;
        if (i + 1 < items.size()) {
          const Item& n = items[i + 1];
          pf = RegionPrefetcher(w, cols, n.r0, n.rn, n.chunk->base, n.chunk->base + n.chunk->width);
        }
        PackChunkAvx512(dtype, w, cols, plan, *items[i].chunk, items[i].r0, items[i].rn, pf, out,
                        rows, nt);
      }
    }
    for (int64_t b = static_cast<int64_t>(bb); b < static_cast<int64_t>(be); ++b) {
      const int64_t r0 = b * kPackRows;
      const int64_t rn = std::min(kPackRows, rows - r0);
      const int64_t fast_rows = fast ? rn / kPackStep * kPackStep : 0;
      for (int64_t t = 0; t < tiles; ++t) {
        const bool done = fast && plan.groups[static_cast<size_t>(t)].window;
        const int64_t c0 = t * kTileCols;
        PackGroupPortable(codec, esize, w, cols, columns + c0, std::min(kTileCols, ncols - c0),
                          done ? r0 + fast_rows : r0, r0 + rn,
                          out + static_cast<size_t>(c0 * rows) * esize, rows);
      }
    }
    if (fast) _mm_sfence();  // Order the non-temporal stores before returning.
  });
  return absl::OkStatus();
}

}  // namespace zenflow::worker::cpu
