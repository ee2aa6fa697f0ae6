// x86 SIMD plumbing in one place, for files compiled without -march flags:
// <immintrin.h> (with GCC 12's AVX-512 header warning silenced), a target
// attribute for single functions, and the CPU feature sets the kernels use,
// each checked once per process.
//
//   ZF_TARGET("avx2,fma") void KernelAvx2(...);
//   if (simd::HasAvx2Fma()) KernelAvx2(...); else KernelScalar(...);
#ifndef ZENFLOW_COMMON_SIMD_H_
#define ZENFLOW_COMMON_SIMD_H_

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_*() helpers (GCC bug 105593); silence it for the header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Compiles one function for `features` (a string literal, GCC's syntax).
#define ZF_TARGET(features) __attribute__((target(features)))

namespace zenflow::simd {

bool HasAvx2();         // avx2
bool HasAvx2Fma();      // avx2, fma
bool HasAvx2F16c();     // avx2, f16c
bool HasAvx512Fma();    // avx512f, avx2, fma
bool HasAvx512Codec();  // avx512f, avx512bw, avx512vl, avx2, f16c
bool HasAvx512Pack();   // avx512f, avx512bw, avx512dq, avx512vl, f16c
bool HasAvx512Bf16();   // HasAvx512Pack and avx512bf16

}  // namespace zenflow::simd

#endif  // ZENFLOW_COMMON_SIMD_H_
