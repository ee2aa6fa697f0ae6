// Parameters and gradients as a framework hands them over, framework-neutral:
// a data pointer, a shape, strides and an element type, in host memory or on
// a CUDA device, as `__array_interface__` and `__cuda_array_interface__`
// describe arrays (torch, CuPy, Numba and NumPy all export one of them).
// CheckPlacement turns a model's arrays into the engine's ParamSpecs, or
// refuses them with a message that says what to do: mixed placement (some
// on the host, some on a device), non-contiguous arrays, element types the
// engine does not update (fp64), gradients that are not fp32.
//
//   std::vector<ArrayParam> arrays = ...;  // from the framework
//   ZF_ASSIGN_OR_RETURN(Placement where, CheckPlacement(arrays));
//   // where.device: all on a CUDA device (which one: CudaPointerDevice)
#ifndef ZENFLOW_GPU_WORKER_ENGINE_ARRAY_REF_H_
#define ZENFLOW_GPU_WORKER_ENGINE_ARRAY_REF_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_worker/engine/zenflow_optimizer.h"

namespace zenflow {

enum class ElemType { kF32, kBF16, kF16, kF64, kOther };

// The element type an array interface's typestr names: "<f4" fp32, "<f2"
// fp16, "<f8" fp64; bf16, which has no typestr of its own, is "<V2" with a
// descr whose first field is named "bfloat16" (`descr_name`).
ElemType ElemTypeOf(const std::string& typestr, const std::string& descr_name);
const char* ElemTypeName(ElemType t);  // "float32", "bfloat16", ...

// One array. Not owned.
struct ArrayRef {
  uintptr_t data = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in bytes; empty: C-contiguous
  ElemType elem = ElemType::kOther;
  std::string typestr;  // as given, for messages
  bool device = false;  // __cuda_array_interface__ (else host memory)
  bool readonly = false;
};

// The number of elements (the product of the shape; 1 for a scalar).
int64_t ArrayElements(const ArrayRef& a);

struct ArrayParam {
  std::string name;
  ArrayRef param, grad;
};

struct Placement {
  bool device = false;            // every array on a CUDA device
  std::vector<ParamSpec> params;  // shape [n] or [rows, cols]
};

// INVALID_ARGUMENT, naming the parameter and the fix, unless every array is
// in the same kind of memory, C-contiguous, writable and non-null, every
// parameter fp32, bf16 or fp16 with an fp32 gradient of as many elements.
// Which device holds device arrays is the caller's question
// (worker::CudaPointerDevice): this only sees pointers.
absl::StatusOr<Placement> CheckPlacement(const std::vector<ArrayParam>& arrays);

}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_ENGINE_ARRAY_REF_H_
