// The loopback soak's job model (tools/zf_soak.cc): its shape (Config), the
// selections and importance scores every rank submits, the deterministic
// gradients and initial values, the digests, and the reference state the
// daemon's is compared with bit for bit. Definitions in zf_soak_model.cc.
#ifndef ZENFLOW_TOOLS_ZF_SOAK_MODEL_H_
#define ZENFLOW_TOOLS_ZF_SOAK_MODEL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "tests/testing/adamw_reference.h"

namespace zenflow {
namespace soak {

// ---- The soak's shape ---------------------------------------------------------

struct Config {
  int jobs = 2;
  int ranks = 8;  // per job
  int rounds = 200;
  int interval = 2;
  int tensors = 3;
  int rows = 64;
  int cols = 256;
  float topk = 0.25f;
  int select_every = 25;
};

std::string TensorName(int ti);
int64_t ImportantCount(const Config& c);
int SelectionAt(const Config& c, int64_t round);
int SelectionOf(const Config& c, int64_t round);
int64_t ScoreStride(int64_t cols);
std::vector<float> Scores(const Config& c, int sel, int ti);
std::vector<int32_t> ExpectedImportant(const Config& c, int sel, int ti);
std::vector<int32_t> Complement(const std::vector<int32_t>& important, int cols);
float Grad(int job, int rank, int64_t step, int ti, int64_t r, int64_t c);
float Init(int job, int ti, int64_t r, int64_t c);
float LearningRate(int64_t round);
uint64_t Fnv(uint64_t h, const void* data, size_t n);
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;
uint32_t Bits(float x);

// ---- The reference optimizer ----------------------------------------------------

// One AdamW step of one element, from the tests' reference
// (tests/testing/adamw_reference.h: torch's AdamW with decoupled weight
// decay; bias corrections in double, rounded to float). `fused` evaluates m, v and the denominator the way the daemon's
// vector kernels do (AVX2/AVX-512: fused multiply-adds, sqrt(v) times
// 1/sqrt(bc2)); otherwise in plain float operations in the written order
// (the daemon's scalar kernel). The last operation, p*decay - update, is
// left to the compiler in the daemon's kernels (GCC's default
// -ffp-contract=fast fuses it into one multiply-subtract when the target has
// FMA), so both are kept: `pf` fused, `p` not. Every operation is an exactly
// rounded IEEE one, so one of the two is bit for bit what the daemon holds.
struct RefStep {
  testing::AdamWRefHyper hyper;
  bool fused = true;

  void Apply(float lr, int64_t t, float grad_scale, float grad, float* p, float* pf, float* m,
             float* v) const {
    const testing::AdamWStepFactors f = testing::AdamWFactors(hyper, lr, t);
    const float g = grad * grad_scale;
    const float update = fused ? testing::AdamWMomentsAndUpdateFused(hyper, f, g, m, v)
                               : testing::AdamWMomentsAndUpdate(hyper, f, g, m, v);
    const float decayed = *p * f.decay;
    *p = decayed - update;
    *pf = std::fma(*pf, f.decay, -update);
  }
};

// A job's exact expected state: row-major values (both ways, see RefStep),
// m, v and per-column counts.
struct RefTensor {
  std::vector<float> p, pf, m, v;
  std::vector<int64_t> count;
};

// Counts the parameter values that differ from each of the reference's two
// ways of rounding the last operation; the daemon must match one of them
// everywhere.
struct ValueTally {
  int64_t compared = 0, off_plain = 0, off_fused = 0;
  std::string first_plain, first_fused;  // the first value off, each way

  // `where` is only evaluated when a value is off.
  template <typename Where>
  void Compare(float got, const RefTensor& t, size_t e, Where where) {
    ++compared;
    if (Bits(got) != Bits(t.p[e]) && off_plain++ == 0) {
      first_plain = absl::StrFormat("%s is %.9g, want %.9g", where(), got, t.p[e]);
    }
    if (Bits(got) != Bits(t.pf[e]) && off_fused++ == 0) {
      first_fused = absl::StrFormat("%s is %.9g, want %.9g", where(), got, t.pf[e]);
    }
  }
  bool exact() const { return off_plain == 0 || off_fused == 0; }
  const char* model() const { return off_fused == 0 ? "fused" : off_plain == 0 ? "plain" : "none"; }
};

}  // namespace soak
}  // namespace zenflow

#endif  // ZENFLOW_TOOLS_ZF_SOAK_MODEL_H_
