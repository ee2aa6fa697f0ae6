// CPU feature checks; see simd.h.
#include "common/simd.h"

namespace zenflow::simd {
namespace {

// __builtin_cpu_supports needs literal names, hence one function per set.
// Safe from static initializers of other files (hence no namespace-scope
// flag): the first check initializes the CPU model.
bool Init() {
  static const bool done = (__builtin_cpu_init(), true);
  return done;
}

}  // namespace

bool HasAvx2() {
  static const bool ok = Init() && __builtin_cpu_supports("avx2");
  return ok;
}
bool HasAvx2Fma() {
  static const bool ok = HasAvx2() && __builtin_cpu_supports("fma");
  return ok;
}
bool HasAvx2F16c() {
  static const bool ok = HasAvx2() && __builtin_cpu_supports("f16c");
  return ok;
}
bool HasAvx512Fma() {
  static const bool ok = HasAvx2Fma() && __builtin_cpu_supports("avx512f");
  return ok;
}
bool HasAvx512Codec() {
  static const bool ok = HasAvx2F16c() && __builtin_cpu_supports("avx512f") &&
                         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return ok;
}
bool HasAvx512Pack() {
  static const bool ok = Init() && __builtin_cpu_supports("avx512f") &&
                         __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
  return ok;
}
bool HasAvx512Bf16() {
  static const bool ok = HasAvx512Pack() && __builtin_cpu_supports("avx512bf16");
  return ok;
}

}  // namespace zenflow::simd
