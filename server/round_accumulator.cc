// A job's rounds as they arrive; see round_accumulator.h.
#include "server/round_accumulator.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/huge_pages.h"
#include "common/simd.h"

namespace zenflow {
namespace {

// The tail of a block (and the scalar level): element i into lane i % 32.
// One float at i, as FoldAvx2 below: total + parts in order, the total
// stored (only when there are parts). The parts are only read: each rank's
// first add of a round stores (RoundAccumulator::first_add_stores).
inline float FoldScalar(float* total, float* const* parts, int nparts, size_t i) {
  float x = total[i];
  for (int r = 0; r < nparts; ++r) x += parts[r][i];
  if (nparts > 0) total[i] = x;
  return x;
}

void FoldSquaresScalar(float* total, float* const* parts, int nparts, size_t begin, size_t n,
                       double* lane, float* largest) {
  float big = *largest;
  for (size_t i = begin; i < n; ++i) {
    const float x = FoldScalar(total, parts, nparts, i);
    lane[i % kSquareLanes] += static_cast<double>(x) * static_cast<double>(x);
    big = std::max(big, std::fabs(x));
  }
  *largest = big;
}

// The vector levels' largest magnitudes (one per vector lane) into *largest.
void MaxInto(const float* lanes, int n, float* largest) {
  float m = *largest;
  for (int i = 0; i < n; ++i) m = std::max(m, lanes[i]);
  *largest = m;
}

// 8 floats at i: total + parts in order (only read), total stored. With
// no parts (shared sums, or rank-ordered sums folded at the closes) the
// total is only read: storing it back would make every line of the round's
// sums dirty and write them to memory for nothing (the update's first pass
// then moved twice the bytes it needs).
ZF_TARGET("avx2,fma") inline __m256 FoldAvx2(float* total, float* const* parts, int nparts,
                                             size_t i) {
  __m256 x = _mm256_loadu_ps(total + i);
  for (int r = 0; r < nparts; ++r) x = _mm256_add_ps(x, _mm256_loadu_ps(parts[r] + i));
  if (nparts > 0) _mm256_storeu_ps(total + i, x);
  return x;
}

ZF_TARGET("avx2,fma")
void FoldSquaresAvx2(float* total, float* const* parts, int nparts, size_t n, double* lane,
                     float* largest) {
  __m256d acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_pd();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 big = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + kSquareLanes <= n; i += kSquareLanes) {
    for (int q = 0; q < 4; ++q) {
      const __m256 x = FoldAvx2(total, parts, nparts, i + 8 * q);
      big = _mm256_max_ps(big, _mm256_and_ps(x, abs_mask));
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
      const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
      acc[2 * q] = _mm256_fmadd_pd(lo, lo, acc[2 * q]);
      acc[2 * q + 1] = _mm256_fmadd_pd(hi, hi, acc[2 * q + 1]);
    }
  }
  for (int k = 0; k < 8; ++k) _mm256_storeu_pd(lane + 4 * k, acc[k]);
  alignas(32) float b[8];
  _mm256_store_ps(b, big);
  MaxInto(b, 8, largest);
  FoldSquaresScalar(total, parts, nparts, i, n, lane, largest);
}

// 16 floats at i, as FoldAvx2.
ZF_TARGET("avx512f,avx2,fma") inline __m512 FoldAvx512(float* total, float* const* parts,
                                                       int nparts, size_t i) {
  __m512 x = _mm512_loadu_ps(total + i);
  for (int r = 0; r < nparts; ++r) x = _mm512_add_ps(x, _mm512_loadu_ps(parts[r] + i));
  if (nparts > 0) _mm512_storeu_ps(total + i, x);
  return x;
}

ZF_TARGET("avx512f,avx2,fma")
void FoldSquaresAvx512(float* total, float* const* parts, int nparts, size_t n, double* lane,
                       float* largest) {
  __m512d acc[4];
  for (int k = 0; k < 4; ++k) acc[k] = _mm512_setzero_pd();
  __m512 big = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + kSquareLanes <= n; i += kSquareLanes) {
    for (int q = 0; q < 2; ++q) {
      const __m512 x = FoldAvx512(total, parts, nparts, i + 16 * q);
      big = _mm512_max_ps(big, _mm512_abs_ps(x));
      const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
      const __m512d hi =
          _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, _mm512_castps_pd(x), 1)));
      acc[2 * q] = _mm512_fmadd_pd(lo, lo, acc[2 * q]);
      acc[2 * q + 1] = _mm512_fmadd_pd(hi, hi, acc[2 * q + 1]);
    }
  }
  for (int k = 0; k < 4; ++k) _mm512_storeu_pd(lane + 8 * k, acc[k]);
  alignas(64) float b[16];
  _mm512_store_ps(b, big);
  MaxInto(b, 16, largest);
  FoldSquaresScalar(total, parts, nparts, i, n, lane, largest);
}

// The fold alone (the close path, before the update needs any squares):
// the same per-element adds as FoldSquares', in rank order.
void FoldPartsScalar(float* total, float* const* parts, int nparts, size_t begin, size_t n) {
  for (size_t i = begin; i < n; ++i) FoldScalar(total, parts, nparts, i);
}

ZF_TARGET("avx2,fma")
void FoldPartsAvx2(float* total, float* const* parts, int nparts, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) FoldAvx2(total, parts, nparts, i);
  FoldPartsScalar(total, parts, nparts, i, n);
}

ZF_TARGET("avx512f,avx2,fma")
void FoldPartsAvx512(float* total, float* const* parts, int nparts, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) FoldAvx512(total, parts, nparts, i);
  FoldPartsScalar(total, parts, nparts, i, n);
}

}  // namespace

BlockSquares FoldSquares(SimdLevel level, float* total, float* const* parts, int nparts,
                         size_t n) {
  double lane[kSquareLanes] = {};
  float largest = 0;
  switch (level) {
    case SimdLevel::kAvx512:
      FoldSquaresAvx512(total, parts, nparts, n, lane, &largest);
      break;
    case SimdLevel::kAvx2:
      FoldSquaresAvx2(total, parts, nparts, n, lane, &largest);
      break;
    case SimdLevel::kScalar:
      FoldSquaresScalar(total, parts, nparts, 0, n, lane, &largest);
      break;
  }
  BlockSquares out;
  out.largest = largest;
  for (double l : lane) out.sum += l;
  return out;
}

void FoldParts(SimdLevel level, float* total, float* const* parts, int nparts, size_t n) {
  if (nparts <= 0) return;
  switch (level) {
    case SimdLevel::kAvx512:
      FoldPartsAvx512(total, parts, nparts, n);
      break;
    case SimdLevel::kAvx2:
      FoldPartsAvx2(total, parts, nparts, n);
      break;
    case SimdLevel::kScalar:
      FoldPartsScalar(total, parts, nparts, 0, n);
      break;
  }
}

namespace {

std::vector<int64_t> ColumnsOf(const std::vector<TensorStore::Shape>& shapes) {
  std::vector<int64_t> cols;
  for (const TensorStore::Shape& s : shapes) cols.push_back(s.cols);
  return cols;
}

}  // namespace

RoundAccumulator::RoundAccumulator(const std::vector<TensorStore::Shape>& shapes, int world,
                                   bool rank_ordered)
    : sum_ranks_(rank_ordered ? world : 1),
      world_(world),
      tensors_(shapes.size()),
      arrivals_(ColumnsOf(shapes), world) {
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor& x = tensors_[i];
    x.shape = shapes[i];
    const size_t n = static_cast<size_t>(x.shape.rows * x.shape.cols);
    x.sum.resize(sum_ranks_);
    for (auto& parities : x.sum) {
      // Huge pages: every shard's add and the update stream these
      // (common/huge_pages.h).
      AssignOnHugePages(&parities[0], n);
      AssignOnHugePages(&parities[1], n);
    }
  }
}

void RoundAccumulator::FoldInto(SimdLevel level, int t, int64_t round, int64_t first, size_t len,
                                int first_rank, int end_rank) {
  // At most kMaxFoldParts ranks' pointers at a time: a small fixed array,
  // no allocation. Any grouping gives each value the same adds in rank order.
  float* parts[kMaxFoldParts];
  float* const total = sum(t, round, first);
  for (int r = std::max(first_rank, 1); r < end_rank; r += kMaxFoldParts) {
    const int k = std::min(kMaxFoldParts, end_rank - r);
    for (int j = 0; j < k; ++j) parts[j] = sum_of(t, r + j, round, first);
    FoldParts(level, total, parts, k, len);
  }
}

void RoundAccumulator::Fold(SimdLevel level, int t, int64_t round, int64_t first, int64_t n) {
  FoldInto(level, t, round, first, static_cast<size_t>(n * tensors_[t].shape.rows), 1, sum_ranks_);
}

void RoundAccumulator::FoldRanks(SimdLevel level, int64_t round, int first_rank, int end_rank) {
  // One pass over each tensor's total per kMaxFoldParts ranks: each vector
  // of it gets every rank's part added in rank order (the same adds as a
  // fold of them all). The parts are only read.
  end_rank = std::min(end_rank, sum_ranks_);
  for (size_t ti = 0; ti < tensors_.size(); ++ti) {
    const TensorStore::Shape& shape = tensors_[ti].shape;
    FoldInto(level, static_cast<int>(ti), round, 0, static_cast<size_t>(shape.rows * shape.cols),
             first_rank, end_rank);
  }
}

BlockSquares RoundAccumulator::FoldNorm(SimdLevel level, int t, int64_t round, int64_t first,
                                        int64_t n, int first_rank) {
  float* parts[kMaxFoldParts];
  const size_t len = static_cast<size_t>(n * tensors_[t].shape.rows);
  // The ranks before the last kMaxFoldParts (a world that large) are folded
  // first, in rank order; the result is the same sequence of adds.
  int r = std::max(first_rank, 1);
  if (sum_ranks_ - r > kMaxFoldParts) {
    FoldInto(level, t, round, first, len, r, sum_ranks_ - kMaxFoldParts);
    r = sum_ranks_ - kMaxFoldParts;
  }
  int nparts = 0;
  for (; r < sum_ranks_; ++r) parts[nparts++] = sum_of(t, r, round, first);
  return FoldSquares(level, sum(t, round, first), parts, nparts, len);
}

void RoundAccumulator::Clear(int t, int64_t round, int64_t first, int64_t n) {
  if (first_add_stores()) return;  // the next round's first adds store
  for (int r = 0; r < sum_ranks_; ++r) {
    std::memset(sum_of(t, r, round, first), 0,
                static_cast<size_t>(n * tensors_[t].shape.rows) * sizeof(float));
  }
}

void RoundAccumulator::ClearStaging(int t, int64_t elements) {
  std::vector<float>& s = tensors_[t].sum[0][1];
  std::fill(s.begin(), s.begin() + std::min<int64_t>(elements, static_cast<int64_t>(s.size())),
            0.0f);
}

}  // namespace zenflow
