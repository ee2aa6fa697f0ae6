#include "tools/bench/kernel_rates.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/adamw.h"
#include "common/huge_pages.h"
#include "common/random.h"
#include "server/round_update.h"
#include "tools/bench/cpu_time.h"
#include "tools/bench/median.h"

namespace zenflow {
namespace {

// Uniform in [-scale, scale).
void Fill(uint64_t seed, float scale, std::vector<float>* v) {
  for (float& x : *v) {
    x = scale * static_cast<float>(static_cast<double>(NextRandom(&seed) >> 40) *
                                       (1.0 / (1ull << 23)) -
                                   1.0);
  }
}

// The round update's own kernel function (server/round_update.h): AdamW and
// the delta encode in the daemon's blocks, spread over the pool as
// UpdateRound's second pass spreads them.
struct RoundBuffers {
  std::vector<float> grad, p, m, v;
  std::vector<char> out_values, out_m, out_v;
};

void RunRoundKernels(const RoundKernelJob& job, int64_t step, RoundBuffers* b, ThreadPool* pool) {
  RoundKernelOptions o;
  o.simd = BestSimdLevel();
  o.step = step;
  o.grad_scale = 0.25f;
  o.values = job.value_dtype;
  o.moments = job.moments;
  RoundKernelBuffers k;
  k.grad = b->grad.data();
  k.master = b->p.data();
  k.m = b->m.data();
  k.v = b->v.data();
  k.n = static_cast<size_t>(job.values);
  k.values_out = b->out_values.data();
  k.m_out = job.moments ? b->out_m.data() : nullptr;
  k.v_out = job.moments ? b->out_v.data() : nullptr;
  RunRoundUpdateKernels(o, k, pool);
}

}  // namespace

double AccumulateBytesPerCpuSecond(DType wire, int64_t values, double min_cpu_s) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(1, values));
  std::vector<float> src(n);
  Fill(11, 1e-3f, &src);
  // On huge pages, as zenflowd's sums are (common/huge_pages.h): the
  // ceiling is the kernel at its best.
  std::vector<char> encoded;
  AssignOnHugePages(&encoded, n * DTypeSize(wire));
  Encode(wire, src.data(), n, encoded.data());
  std::vector<float> acc;
  AssignOnHugePages(&acc, n);
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

double AccumulateBytesPerCpuSecondBesideCopy(DType wire, int64_t values, int64_t copy_bytes,
                                             double min_cpu_s) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(int64_t{4} << 20, copy_bytes));
  std::vector<char> from(bytes, 1), to(bytes, 0);
  std::atomic<bool> stop{false};
  std::thread copier([&] {
    constexpr size_t kPiece = size_t{4} << 20;
    while (!stop.load(std::memory_order_relaxed)) {
      for (size_t at = 0; at + kPiece <= bytes && !stop.load(std::memory_order_relaxed);
           at += kPiece) {
        std::memcpy(to.data() + at, from.data() + at, kPiece);
      }
    }
  });
  const double rate = AccumulateBytesPerCpuSecond(wire, values, min_cpu_s);
  stop.store(true);
  copier.join();
  return rate;
}

std::string RoundKernelJob::Describe() const {
  return absl::StrCat(values, " values: RunRoundUpdateKernels (server/round_update.h), AdamWUpdate (fp32 p, m, v) and the Encode of the values as ",
                      DTypeName(value_dtype), moments ? " and of m, v as bf16" : "");
}

double RoundUpdateKernelSeconds(const RoundKernelJob& job, ThreadPool* pool, int reps,
                                double* cpu_s) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(1, job.values));
  // On huge pages, as zenflowd's state and sums are (common/huge_pages.h).
  RoundBuffers b;
  AssignOnHugePages(&b.grad, n);
  AssignOnHugePages(&b.p, n);
  AssignOnHugePages(&b.m, n);
  AssignOnHugePages(&b.v, n);
  Fill(3, 1e-3f, &b.grad);
  Fill(5, 0.02f, &b.p);
  AssignOnHugePages(&b.out_values, n * DTypeSize(job.value_dtype));
  if (job.moments) {
    AssignOnHugePages(&b.out_m, n * 2);
    AssignOnHugePages(&b.out_v, n * 2);
  }
  std::vector<double> seconds, cpu;
  for (int r = 0; r <= std::max(1, reps); ++r) {
    const double c0 = SelfCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    RunRoundKernels(job, r + 1, &b, pool);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) {  // round 0 warms pages and caches
      seconds.push_back(s);
      cpu.push_back(SelfCpuSeconds() - c0);
    }
  }
  if (cpu_s != nullptr) *cpu_s = Median(cpu);
  return Median(seconds);
}

}  // namespace zenflow
