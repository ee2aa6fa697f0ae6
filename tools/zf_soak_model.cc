#include "tools/zf_soak_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"

namespace zenflow {
namespace soak {

std::string TensorName(int ti) { return absl::StrCat("w", ti); }

// The columns a selection keeps on the workers: ceil(k * cols), as the
// daemon counts it (a product within 1e-6 of an integer is that integer).
int64_t ImportantCount(const Config& c) {
  const double product = static_cast<double>(c.topk) * c.cols;
  const double nearest = std::round(product);
  const double exact = std::fabs(product - nearest) <= 1e-6 ? nearest : product;
  return std::min<int64_t>(c.cols, std::max<int64_t>(0, static_cast<int64_t>(std::ceil(exact))));
}

// Selection i (1-based) happens at round i * select_every, if that is
// before the last round. 0: none at this round.
int SelectionAt(const Config& c, int64_t round) {
  if (c.select_every <= 0 || round == 0 || round % c.select_every != 0) return 0;
  return static_cast<int>(round / c.select_every);
}

// The selection in effect at `round` (0: the initial one, every column remote).
int SelectionOf(const Config& c, int64_t round) {
  return c.select_every <= 0 ? 0 : static_cast<int>(round / c.select_every);
}

// A multiplier coprime with cols, so that column -> score is a permutation
// (no ties: the top-k is unique).
int64_t ScoreStride(int64_t cols) {
  for (int64_t p : {97, 89, 83, 79, 73, 71, 67, 61, 59, 53, 47, 43, 41,
                    37, 31, 29, 23, 19, 17, 13, 11, 7,  5,  3,  1}) {
    int64_t a = p, b = cols;
    while (b != 0) std::swap(a %= b, b);
    if (a == 1) return p;
  }
  return 1;
}

// Every rank submits these scores for selection `sel` (the daemon sums them:
// integers, exact in fp32).
std::vector<float> Scores(const Config& c, int sel, int ti) {
  std::vector<float> s(c.cols);
  const int64_t stride = ScoreStride(c.cols);
  for (int64_t col = 0; col < c.cols; ++col) {
    s[col] = static_cast<float>((col * stride + sel * 31 + ti * 13) % c.cols);
  }
  return s;
}

// The important columns (ascending) after selection `sel` (0: none).
std::vector<int32_t> ExpectedImportant(const Config& c, int sel, int ti) {
  std::vector<int32_t> out;
  if (sel == 0) return out;
  const std::vector<float> s = Scores(c, sel, ti);
  const float cut = static_cast<float>(c.cols - ImportantCount(c));  // scores are a permutation
  for (int32_t col = 0; col < c.cols; ++col) {
    if (s[col] >= cut) out.push_back(col);
  }
  return out;
}

std::vector<int32_t> Complement(const std::vector<int32_t>& important, int cols) {
  std::vector<int32_t> out;
  size_t k = 0;
  for (int32_t col = 0; col < cols; ++col) {
    if (k < important.size() && important[k] == col) {
      ++k;
    } else {
      out.push_back(col);
    }
  }
  return out;
}

// Deterministic gradient of element (r, c) of tensor ti at (job, rank, step):
// a multiple of 2^-23 in [-1, 1), times 0.5, 1, 1.5 or 2 by column.
float Grad(int job, int rank, int64_t step, int ti, int64_t r, int64_t c) {
  const uint64_t a = HashRandom((static_cast<uint64_t>(job) << 32) ^ static_cast<uint64_t>(ti));
  const uint64_t b =
      HashRandom(a ^ ((static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(step)));
  const uint64_t h = HashRandom(b ^ ((static_cast<uint64_t>(r) << 32) ^ static_cast<uint64_t>(c)));
  const int32_t q = static_cast<int32_t>(h >> 40) - (1 << 23);
  return static_cast<float>(q) * (1.0f / (1 << 23)) * (0.5f * static_cast<float>(1 + c % 4));
}

float Init(int job, int ti, int64_t r, int64_t c) {
  const uint64_t h = HashRandom((static_cast<uint64_t>(job) << 48) ^
                                (static_cast<uint64_t>(ti) << 40) ^
                                (static_cast<uint64_t>(r) << 20) ^ static_cast<uint64_t>(c));
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * (0.1f / (1 << 23));
}

float LearningRate(int64_t round) { return 1e-3f * (1.0f + 0.25f * static_cast<float>(round % 4)); }

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

}  // namespace soak
}  // namespace zenflow
