// Wire dtype conversion for zenflow tensors.
//
// Gradients and parameters travel over the wire as fp32, bf16 or fp16 and are
// accumulated / stored as fp32 on the server. This file provides the exact
// scalar conversions (round-to-nearest-even, IEEE semantics; defined in
// common/float16.h) plus bulk Encode / Decode / DecodeAdd / AllFinite routines
// that are vectorized with AVX-512 or AVX2 (+F16C) when the CPU supports
// them. The SIMD level is picked once at runtime; the translation unit is
// compiled without -march flags and uses per-function target attributes
// instead.
//
// All functions are stateless and thread-safe. Pointers need not be aligned.

#ifndef ZENFLOW_COMMON_CODEC_H_
#define ZENFLOW_COMMON_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <vector>

// FloatToBf16, Bf16ToFloat, FloatToF16, F16ToFloat: part of this API.
#include "common/float16.h"

namespace zenflow {

// Element type of a tensor on the wire. Its zenflow.v1.DType conversions
// are in common/dtype_proto.h (the numeric values differ).
enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Bytes per element: 4 for kF32, 2 for kBF16 and kF16.
size_t DTypeSize(DType dtype);

// Short lowercase name: "fp32", "bf16", "fp16" ("unknown" otherwise).
const char* DTypeName(DType dtype);

// The scalar conversions (FloatToBf16, Bf16ToFloat, FloatToF16, F16ToFloat)
// live in common/float16.h so that the CUDA kernels compile the same code;
// every path of the bulk routines below produces their bits.

// Converts n floats to `dtype`; dst must hold n * DTypeSize(dtype) bytes.
void Encode(DType dtype, const float* src, size_t n, void* dst);

// Converts n encoded values to floats.
void Decode(DType dtype, const void* src, size_t n, float* dst);

// acc[i] += decode(src[i]) for i in [0, n).
//
// first: the first add into a sum whose old values are stale (the daemon's
// per-rank round sums are not zeroed between rounds:
// server/round_accumulator.h): acc[i] = 0.0f + decode(src[i]), acc not
// read; the same bits as an add into zeros (-0 gives +0). So for every add
// function below.
void DecodeAdd(DType dtype, const void* src, size_t n, float* acc, bool first = false);

// Returns true if all n encoded values are finite. Otherwise returns false and,
// if first_bad is non-null, stores the index of the first NaN or Inf there.
bool AllFinite(DType dtype, const void* src, size_t n, size_t* first_bad);

// acc[i] += float(q[i]) * scale for i in [0, n): the product rounded, then
// the sum (no fused multiply-add), as the scalar expression gives.
void DecodeAddInt8(const int8_t* q, size_t n, float scale, float* acc, bool first = false);

// The shard path's one pass over a shard's values (server/job_rounds.cc):
// the finiteness check and the add fused, block by block of
// kFusedBlockElements values, each block checked while it is in L1 and then
// added, so the encoded bytes come from memory once.
//
// Returns true when all n values are finite: then acc[i] += decode(src[i])
// for every i, bit for bit as DecodeAdd. Otherwise returns false and stores
// the index of the first NaN or Inf in *first_bad (if non-null); the blocks
// before that value's block are added and the rest of acc is untouched.
// So use it where a partial add is harmless (a round that is dropped);
// where acc must stay untouched, check the whole input (AllFinite) first.
constexpr size_t kFusedBlockElements = 2048;
bool DecodeAddFinite(DType dtype, const void* src, size_t n, float* acc, size_t* first_bad,
                     bool first = false);

// True when every q[i] * scale is finite (as DecodeAddInt8 computes it);
// else false, and the first index where it is not in *first_bad (if
// non-null). Reads q only when 128 * scale overflows (see below).
bool Int8AllFinite(const int8_t* q, size_t n, float scale, size_t* first_bad);

// The same for int8 values of one scale (DecodeAddInt8): a value is
// non-finite when q * scale overflows. With a finite scale >= 0 and
// |q| <= 128 that needs 128 * scale to overflow, so only such huge scales
// read the values before adding them.
bool DecodeAddInt8Finite(const int8_t* q, size_t n, float scale, float* acc,
                         size_t* first_bad, bool first = false);

// SIMD level used by the functions above: "avx512", "avx2" or "scalar".
const char* CodecSimdLevel();

// Implementation details exposed for tests and benchmarks only.
namespace codec_internal {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The ISA the public functions dispatch to.
Isa ActiveIsa();

// True if this CPU can run code compiled for `isa`.
bool IsaSupported(Isa isa);

// Every level this CPU can run, scalar first (for tests that try them all).
std::vector<Isa> SupportedIsas();

// Same as the public functions but forced to `isa`, which must be supported.
void EncodeWith(Isa isa, DType dtype, const float* src, size_t n, void* dst);
void DecodeWith(Isa isa, DType dtype, const void* src, size_t n, float* dst);
void DecodeAddWith(Isa isa, DType dtype, const void* src, size_t n, float* acc,
                   bool first = false);
bool AllFiniteWith(Isa isa, DType dtype, const void* src, size_t n,
                   size_t* first_bad);
void DecodeAddInt8With(Isa isa, const int8_t* q, size_t n, float scale, float* acc,
                       bool first = false);
bool DecodeAddFiniteWith(Isa isa, DType dtype, const void* src, size_t n, float* acc,
                         size_t* first_bad, bool first = false);
bool DecodeAddInt8FiniteWith(Isa isa, const int8_t* q, size_t n, float scale, float* acc,
                             size_t* first_bad, bool first = false);

}  // namespace codec_internal
}  // namespace zenflow

#endif  // ZENFLOW_COMMON_CODEC_H_
