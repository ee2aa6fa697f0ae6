// The shard path's ways to check and add a shard, on one thread, for the
// default mode's choice (docs/transport-benchmark.md#where-the-time-goes-the-shard-path):
//
//   bazel run -c opt //common:codec_bench -- [VALUES [REPS]]
//
// For a bf16 shard of VALUES values (default 2M: a 4 MiB shard, the client's
// max_shard_bytes), rewritten before each repetition as a receive leaves it,
// added into fp32 sums of its size; the median of REPS (default 41) in wire
// bytes per second:
//   add only            DecodeAdd (no check: the ceiling)
//   check, then add     AllFinite over the shard, then DecodeAdd (the
//                       default mode: a rejected shard adds nothing)
//   fused, inexact      DecodeAddFinite (skip_nonfinite_rounds: a NaN stops
//                       the add part way, harmless only where the round is
//                       dropped)
//   fused, undoable     block by block: check, keep the sums' old values,
//                       add (what an exact undo of a rejected shard needs)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/codec.h"

namespace zenflow {
namespace {

template <typename Fn>
double MedianBytesPerSecond(const std::vector<char>& wire, std::vector<char>* payload, int reps,
                            Fn&& fn) {
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    std::memcpy(payload->data(), wire.data(), wire.size());
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(static_cast<double>(wire.size()) / std::max(s, 1e-9));
  }
  std::nth_element(rates.begin(), rates.begin() + reps / 2, rates.end());
  return rates[reps / 2];
}

int Main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{2} << 20;
  const int reps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 41;
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
  std::vector<char> wire(2 * n), payload(2 * n);
  Encode(DType::kBF16, g.data(), n, wire.data());
  std::vector<float> sums(n, 0.f), old(n);
  const char* p = payload.data();
  struct Way {
    std::string name;
    double rate;
  };
  std::vector<Way> ways;
  ways.push_back({"add only", MedianBytesPerSecond(wire, &payload, reps, [&] {
                    DecodeAdd(DType::kBF16, p, n, sums.data());
                  })});
  ways.push_back({"check, then add", MedianBytesPerSecond(wire, &payload, reps, [&] {
                    if (AllFinite(DType::kBF16, p, n, nullptr)) {
                      DecodeAdd(DType::kBF16, p, n, sums.data());
                    }
                  })});
  ways.push_back({"check, add back", MedianBytesPerSecond(wire, &payload, reps, [&] {
                    if (AllFinite(DType::kBF16, p, n, nullptr)) {
                      constexpr size_t kChunk = size_t{64} << 10;
                      for (size_t end = n; end > 0;) {
                        const size_t from = end > kChunk ? end - kChunk : 0;
                        DecodeAdd(DType::kBF16, p + 2 * from, end - from, sums.data() + from);
                        end = from;
                      }
                    }
                  })});
  ways.push_back({"fused, inexact", MedianBytesPerSecond(wire, &payload, reps, [&] {
                    size_t at = 0;
                    (void)DecodeAddFinite(DType::kBF16, p, n, sums.data(), &at);
                  })});
  ways.push_back({"fused, undoable", MedianBytesPerSecond(wire, &payload, reps, [&] {
                    for (size_t i = 0; i < n; i += kFusedBlockElements) {
                      const size_t m = std::min(kFusedBlockElements, n - i);
                      if (!AllFinite(DType::kBF16, p + 2 * i, m, nullptr)) break;
                      std::memcpy(old.data() + i, sums.data() + i, m * sizeof(float));
                      DecodeAdd(DType::kBF16, p + 2 * i, m, sums.data() + i);
                    }
                  })});
  std::printf("bf16 shard of %zu values (%zu bytes), %s, median of %d\n", n, 2 * n,
              CodecSimdLevel(), reps);
  for (const Way& w : ways) {
    std::printf("  %-16s %7.2f GB/s  %.2f of add only\n", w.name.c_str(), w.rate / 1e9,
                w.rate / ways[0].rate);
  }
  return std::isfinite(sums[n / 2]) ? 0 : 1;
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) { return zenflow::Main(argc, argv); }
