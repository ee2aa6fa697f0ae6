#include "tools/bench/kernel_rates.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/adamw.h"
#include "common/random.h"
#include "tools/bench/cpu_time.h"

namespace zenflow {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Uniform in [-scale, scale).
void Fill(uint64_t seed, float scale, std::vector<float>* v) {
  for (float& x : *v) {
    x = scale * static_cast<float>(static_cast<double>(NextRandom(&seed) >> 40) *
                                       (1.0 / (1ull << 23)) -
                                   1.0);
  }
}

// The round update's kernels over caller buffers: the one call to replace
// by the daemon's own fused kernel function once it takes caller buffers.
struct RoundBuffers {
  std::vector<float> grad, p, m, v;
  std::vector<char> out_values, out_m, out_v;
};

void RunRoundKernels(const RoundKernelJob& job, int64_t step, RoundBuffers* b, ThreadPool* pool) {
  const SimdLevel simd = BestSimdLevel();
  AdamWHyper h;
  const size_t n = static_cast<size_t>(job.values);
  const size_t grain = 1 << 16;  // as the daemon's runs of columns: about 64 Ki values
  pool->ParallelFor(n, grain, [&](size_t begin, size_t end) {
    AdamWUpdate(simd, h, step, 0.25f, b->grad.data() + begin, b->p.data() + begin,
                b->m.data() + begin, b->v.data() + begin, end - begin);
  });
  const size_t vb = DTypeSize(job.value_dtype);
  pool->ParallelFor(n, grain, [&](size_t begin, size_t end) {
    Encode(job.value_dtype, b->p.data() + begin, end - begin, b->out_values.data() + begin * vb);
    if (job.moments) {
      Encode(DType::kBF16, b->m.data() + begin, end - begin, b->out_m.data() + begin * 2);
      Encode(DType::kBF16, b->v.data() + begin, end - begin, b->out_v.data() + begin * 2);
    }
  });
}

}  // namespace

double AccumulateBytesPerCpuSecond(DType wire, int64_t values, double min_cpu_s) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(1, values));
  std::vector<float> src(n);
  Fill(11, 1e-3f, &src);
  std::vector<char> encoded(n * DTypeSize(wire));
  Encode(wire, src.data(), n, encoded.data());
  std::vector<float> acc(n, 0.0f);
  DecodeAdd(wire, encoded.data(), n, acc.data());  // warm-up: pages and caches
  // A sample is at least 16 MiB of wire bytes (several passes over a small
  // buffer), so that the clock's resolution does not matter.
  const int64_t passes = std::max<int64_t>(1, (int64_t{16} << 20) / static_cast<int64_t>(encoded.size()));
  std::vector<double> rates;
  double total = 0;
  while (total < min_cpu_s || rates.size() < 5) {
    const double c0 = ThisThreadCpuSeconds();
    for (int64_t i = 0; i < passes; ++i) DecodeAdd(wire, encoded.data(), n, acc.data());
    const double c = ThisThreadCpuSeconds() - c0;
    total += c;
    if (c > 0) rates.push_back(static_cast<double>(encoded.size()) * static_cast<double>(passes) / c);
    if (rates.size() >= 200) break;
  }
  return Median(rates);
}

std::string RoundKernelJob::Describe() const {
  return absl::StrCat(values, " values: AdamWUpdate (fp32 p, m, v), then Encode of the values as ",
                      DTypeName(value_dtype), moments ? " and of m, v as bf16" : "");
}

double RoundUpdateKernelSeconds(const RoundKernelJob& job, ThreadPool* pool, int reps) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(1, job.values));
  RoundBuffers b;
  b.grad.resize(n);
  b.p.resize(n);
  b.m.assign(n, 0.0f);
  b.v.assign(n, 0.0f);
  Fill(3, 1e-3f, &b.grad);
  Fill(5, 0.02f, &b.p);
  b.out_values.resize(n * DTypeSize(job.value_dtype));
  if (job.moments) {
    b.out_m.resize(n * 2);
    b.out_v.resize(n * 2);
  }
  std::vector<double> seconds;
  for (int r = 0; r <= std::max(1, reps); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    RunRoundKernels(job, r + 1, &b, pool);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) seconds.push_back(s);  // round 0 warms pages and caches
  }
  return Median(seconds);
}

}  // namespace zenflow
