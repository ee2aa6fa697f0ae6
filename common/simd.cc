// CPU feature checks; see simd.h.
#include "common/simd.h"

#include <cpuid.h>

namespace zenflow::simd {
namespace {

// __builtin_cpu_supports needs literal names, hence one function per set.
// Safe from static initializers of other files (hence no namespace-scope
// flag): the first check initializes the CPU model.
bool Init() {
  static const bool done = (__builtin_cpu_init(), true);
  return done;
}

// CPUID.1:ECX.F16C. Not __builtin_cpu_supports("f16c"): clang 14 (the
// fuzz build) does not know that name. Only asked together with AVX2 or
// AVX-512, whose checks include the OS's support for the wide registers.
bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
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
  static const bool ok = HasAvx2() && CpuHasF16c();
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
                         __builtin_cpu_supports("avx512vl") && CpuHasF16c();
  return ok;
}
bool HasAvx512Bf16() {
  static const bool ok = HasAvx512Pack() && __builtin_cpu_supports("avx512bf16");
  return ok;
}

}  // namespace zenflow::simd
