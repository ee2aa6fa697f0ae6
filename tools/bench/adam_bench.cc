// adam_bench: measures whether the AdamW kernel runs at memory-stream speed.
//
// On the same buffers, thread pool and column partition it times:
//   adam        AdamWUpdate (best SIMD level) over all params, column by
//   column; stream      a kernel with exactly AdamW's traffic (read g;
//   read+write p, m,
//               v in place: 28 bytes/param) but trivial arithmetic
//               (p += g; m += g; v += g*g, keeping v >= 0 for the AdamW runs);
//   copy        memcpy of a 4*params-byte buffer;
//   accumulate  DecodeAdd(kBF16) of params bf16 values into fp32;
//   adam8       Adam8Update (common/adam8.h: m and v in 8 bits, blocks of
//               256 with a scale each; 16 bytes/param of traffic) over its
//               own master and 8-bit state, column by column, same
//               gradients: adam8_vs_fp32 = adam8 / adam params per second.
// Each is run --iters times (after one untimed warm-up); the median time is
// reported. Results go to a JSON file (--out) and a summary on stdout.
//
// Flags (--name=value): --params (default 67108864), --rows (4096),
// --threads (2), --iters (10), --out (bench-results/adam.json).

#include "common/simd.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "common/adam8.h"
#include "common/adamw.h"
#include "common/codec.h"
#include "common/json_writer.h"
#include "common/random.h"
#include "common/thread_pool.h"

ABSL_FLAG(int64_t, params, int64_t{64} * 1024 * 1024, "parameters updated per pass");
ABSL_FLAG(int64_t, rows, 4096, "rows per column (the daemon's column-major layout)");
ABSL_FLAG(int, threads, 2, "threads (the AdamW pool's participants)");
ABSL_FLAG(int, iters, 10, "timed passes (the median is reported)");
ABSL_FLAG(std::string, out, "bench-results/adam.json", "where the JSON goes");

namespace zenflow {
namespace {

struct Flags {
  size_t params = size_t{64} * 1024 * 1024;
  size_t rows = 4096;
  int threads = 2;
  int iters = 10;
  std::string out = "bench-results/adam.json";
};

// The flags, checked; false (with a message) when one is out of range.
bool ReadFlags(Flags* flags) {
  const int64_t params = absl::GetFlag(FLAGS_params), rows = absl::GetFlag(FLAGS_rows);
  flags->threads = absl::GetFlag(FLAGS_threads);
  flags->iters = absl::GetFlag(FLAGS_iters);
  flags->out = absl::GetFlag(FLAGS_out);
  if (params <= 0 || rows <= 0 || flags->threads < 1 || flags->threads > 1024 ||
      flags->iters < 1 || flags->iters > 100000 || flags->out.empty()) {
    std::fprintf(stderr,
                 "adam_bench: --params and --rows must be positive, --threads in [1, 1024], "
                 "--iters in [1, 100000], --out non-empty\n");
    return false;
  }
  flags->params = static_cast<size_t>(params);
  flags->rows = static_cast<size_t>(rows);
  return true;
}

// Page-aligned buffer of T, left uninitialized (first touch happens in the
// parallel initialization so pages land near the threads that use them).
template <typename T>
class Buffer {
 public:
  explicit Buffer(size_t n) {
    constexpr size_t kAlign = 4096;
    const size_t bytes = ((n * sizeof(T) + kAlign - 1) / kAlign) * kAlign;
    data_ = static_cast<T*>(std::aligned_alloc(kAlign, bytes));
    if (data_ == nullptr) {
      std::fprintf(stderr, "allocation of %zu bytes failed\n", bytes);
      std::exit(1);
    }
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() { return data_; }

 private:
  T* data_;
};

// Stream kernels: p += g; m += g; v += g*g (same traffic as AdamW; v stays
// non-negative so the interleaved AdamW runs never see NaNs).
void StreamScalar(const float* g, float* p, float* m, float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i] * g[i];
  }
}

__attribute__((target("avx2"))) void StreamAvx2(const float* g, float* p,
                                                float* m, float* v, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), x));
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), x));
    _mm256_storeu_ps(
        v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), _mm256_mul_ps(x, x)));
  }
  StreamScalar(g + i, p + i, m + i, v + i, n - i);
}

__attribute__((target("avx512f"))) void StreamAvx512(const float* g, float* p,
                                                     float* m, float* v,
                                                     size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 x0 = _mm512_loadu_ps(g + i);
    const __m512 x1 = _mm512_loadu_ps(g + i + 16);
    _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), x0));
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), x0));
    _mm512_storeu_ps(
        v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), _mm512_mul_ps(x0, x0)));
    _mm512_storeu_ps(p + i + 16,
                     _mm512_add_ps(_mm512_loadu_ps(p + i + 16), x1));
    _mm512_storeu_ps(m + i + 16,
                     _mm512_add_ps(_mm512_loadu_ps(m + i + 16), x1));
    _mm512_storeu_ps(v + i + 16, _mm512_add_ps(_mm512_loadu_ps(v + i + 16),
                                               _mm512_mul_ps(x1, x1)));
  }
  StreamScalar(g + i, p + i, m + i, v + i, n - i);
}

void Stream(SimdLevel level, const float* g, float* p, float* m, float* v,
            size_t n) {
  switch (level) {
    case SimdLevel::kAvx512:
      StreamAvx512(g, p, m, v, n);
      return;
    case SimdLevel::kAvx2:
      StreamAvx2(g, p, m, v, n);
      return;
    case SimdLevel::kScalar:
      break;
  }
  StreamScalar(g, p, m, v, n);
}

// Deterministic pseudo-random value in [-scale, scale).
float Noise(size_t i, float scale) {
  const float unit = static_cast<float>(UnitInterval(HashRandom(static_cast<uint64_t>(i))));
  return (2.0f * unit - 1.0f) * scale;
}

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(end - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 == 1 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "AdamW against a stream kernel with the same memory traffic, same threads and buffers; "
      "JSON into --out.");
  absl::ParseCommandLine(argc, argv);
  Flags flags;
  if (!ReadFlags(&flags)) return 2;
  const size_t rows = flags.rows;
  const size_t cols = std::max<size_t>(1, flags.params / rows);
  const size_t params = cols * rows;
  if (params != flags.params) {
    std::printf("note: params rounded to %zu (%zu columns of %zu)\n", params,
                cols, rows);
  }
  const SimdLevel level = BestSimdLevel();
  ThreadPool pool(flags.threads);

  Buffer<float> g(params), p(params), m(params), v(params);
  Buffer<float> copy_src(params), copy_dst(params), acc(params);
  Buffer<uint16_t> bf16(params);
  const size_t scales = cols * static_cast<size_t>(Adam8BlocksPerColumn(static_cast<int64_t>(rows)));
  Buffer<float> p8(params), m8_scale(scales), v8_scale(scales);
  Buffer<uint8_t> m8(params), v8(params);

  // First touch, with the same column partition as the timed loops.
  pool.ParallelFor(cols, 1, [&](size_t cb, size_t ce) {
    for (size_t i = cb * rows; i < ce * rows; ++i) {
      g.get()[i] = Noise(i, 0.01f);
      p.get()[i] = Noise(i + params, 1.0f);
      m.get()[i] = 0.0f;
      v.get()[i] = 0.0f;
      copy_src.get()[i] = static_cast<float>(i);
      copy_dst.get()[i] = 0.0f;
      acc.get()[i] = 0.0f;
      bf16.get()[i] = FloatToBf16(Noise(i + 2 * params, 1.0f));
      p8.get()[i] = p.get()[i];
      m8.get()[i] = 0;
      v8.get()[i] = 0;
    }
    const size_t per = scales / cols;
    for (size_t k = cb * per; k < ce * per; ++k) m8_scale.get()[k] = v8_scale.get()[k] = 0.0f;
  });

  const AdamWHyper hyper{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  int64_t step = 0;
  auto run_adam = [&] {
    ++step;
    pool.ParallelFor(cols, 1, [&](size_t cb, size_t ce) {
      for (size_t c = cb; c < ce; ++c) {
        const size_t off = c * rows;
        AdamWUpdate(level, hyper, step, 1.0f, g.get() + off, p.get() + off,
                    m.get() + off, v.get() + off, rows);
      }
    });
  };
  int64_t step8 = 0;
  auto run_adam8 = [&] {
    ++step8;
    const size_t per = scales / cols;
    pool.ParallelFor(cols, 1, [&](size_t cb, size_t ce) {
      for (size_t c = cb; c < ce; ++c) {
        const size_t off = c * rows;
        const Adam8Columns q{m8.get() + off, m8_scale.get() + c * per, v8.get() + off,
                             v8_scale.get() + c * per};
        Adam8Update(level, hyper, step8, 1.0f, g.get() + off, p8.get() + off, q,
                    static_cast<int64_t>(rows), 1, nullptr, nullptr);
      }
    });
  };
  auto run_stream = [&] {
    pool.ParallelFor(cols, 1, [&](size_t cb, size_t ce) {
      for (size_t c = cb; c < ce; ++c) {
        const size_t off = c * rows;
        Stream(level, g.get() + off, p.get() + off, m.get() + off,
               v.get() + off, rows);
      }
    });
  };
  auto run_copy = [&] {
    pool.ParallelFor(cols, 1, [&](size_t cb, size_t ce) {
      std::memcpy(copy_dst.get() + cb * rows, copy_src.get() + cb * rows,
                  (ce - cb) * rows * sizeof(float));
    });
  };
  auto run_accumulate = [&] {
    pool.ParallelFor(cols, 1, [&](size_t cb, size_t ce) {
      DecodeAdd(DType::kBF16, bf16.get() + cb * rows, (ce - cb) * rows,
                acc.get() + cb * rows);
    });
  };

  // Warm-up, then interleave the kernels so they see the same conditions.
  run_adam();
  run_stream();
  run_copy();
  run_accumulate();
  run_adam8();
  std::vector<double> t_adam, t_stream, t_copy, t_acc, t_adam8;
  for (int it = 0; it < flags.iters; ++it) {
    t_adam.push_back(Seconds(run_adam));
    t_adam8.push_back(Seconds(run_adam8));
    t_stream.push_back(Seconds(run_stream));
    t_copy.push_back(Seconds(run_copy));
    t_acc.push_back(Seconds(run_accumulate));
  }

  const double n = static_cast<double>(params);
  const double adam_pps = n / Median(t_adam);
  const double stream_pps = n / Median(t_stream);
  const double fraction = adam_pps / stream_pps;
  const double copy_bps = 4.0 * n / Median(t_copy);
  const double acc_bps = 2.0 * n / Median(t_acc);
  const double adam_ns = 1e9 / adam_pps;
  const double adam8_pps = n / Median(t_adam8);
  // Keeps the results observable (and sanity-checks for NaNs).
  const double checksum = static_cast<double>(p.get()[params / 3]) +
                          copy_dst.get()[params - 1] + acc.get()[params / 2] +
                          p8.get()[params / 5];

  JsonWriter json;
  json.BeginObject();
  json.Key("params").Int(static_cast<int64_t>(params));
  json.Key("threads").Int(flags.threads);
  json.Key("rows").Int(static_cast<int64_t>(rows));
  json.Key("iters").Int(flags.iters);
  json.Key("statistic").String("median");
  json.Key("simd").String(SimdLevelName(level));
  json.Key("adam_params_per_s").Double(adam_pps);
  json.Key("adam_ns_per_param").Double(adam_ns);
  json.Key("stream_params_per_s").Double(stream_pps);
  json.Key("stream_bytes_per_s").Double(28.0 * stream_pps);
  json.Key("bandwidth_fraction").Double(fraction);
  json.Key("copy_bytes_per_s").Double(copy_bps);
  json.Key("accumulate_bytes_per_s").Double(acc_bps);
  json.Key("adam8_params_per_s").Double(adam8_pps);
  json.Key("adam8_vs_fp32").Double(adam8_pps / adam_pps);
  json.EndObject();
  if (absl::Status s = json.WriteFile(flags.out); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }

  std::printf(
      "adam_bench: %zu params (%zu cols x %zu rows), %d threads, simd=%s "
      "(codec %s), median of %d\n",
      params, cols, rows, flags.threads, SimdLevelName(level), CodecSimdLevel(),
      flags.iters);
  std::printf("  adam        %8.3f Gparam/s  %6.3f ns/param  (%.2f GB/s)\n",
              adam_pps / 1e9, adam_ns, 28.0 * adam_pps / 1e9);
  std::printf("  adam8       %8.3f Gparam/s  (%.2fx fp32)\n", adam8_pps / 1e9,
              adam8_pps / adam_pps);
  std::printf("  stream      %8.3f Gparam/s  (%.2f GB/s)\n", stream_pps / 1e9,
              28.0 * stream_pps / 1e9);
  std::printf("  adam/stream %8.3f\n", fraction);
  std::printf("  copy        %8.2f GB/s copied\n", copy_bps / 1e9);
  std::printf("  accumulate  %8.2f GB/s bf16 input\n", acc_bps / 1e9);
  std::printf("  checksum    %g\n", checksum);
  std::printf("wrote %s\n", flags.out.c_str());
  return 0;
}

}  // namespace
}  // namespace zenflow

int main(int argc, char** argv) { return zenflow::Main(argc, argv); }
