// Framework-neutral arrays to ParamSpecs; see array_ref.h.
#include "gpu_worker/engine/array_ref.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace zenflow {
namespace {

int64_t ElemBytes(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return 4;
    case ElemType::kBF16:
    case ElemType::kF16:
      return 2;
    case ElemType::kF64:
      return 8;
    case ElemType::kOther:
      break;
  }
  return 0;
}

// Strides that describe C-contiguous memory (size-1 dimensions' strides do
// not matter, as NumPy and torch agree).
bool Contiguous(const ArrayRef& a) {
  if (a.strides.empty()) return true;
  if (a.strides.size() != a.shape.size()) return false;
  int64_t want = ElemBytes(a.elem);
  for (size_t i = a.shape.size(); i-- > 0;) {
    if (a.shape[i] != 1 && a.strides[i] != want) return false;
    want *= a.shape[i];
  }
  return true;
}

std::string Where(const ArrayRef& a) { return a.device ? "on a CUDA device" : "in host memory"; }

// The engine's shape: [n] or [rows, cols]; more dimensions are
// [d0, d1 * d2 * ...] (zenflow.torch's _job_shape).
std::vector<int64_t> JobShape(const std::vector<int64_t>& shape) {
  if (shape.empty()) return {1};
  if (shape.size() == 1) return {shape[0]};
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  return {shape[0], cols};
}

absl::Status CheckArray(const std::string& name, const char* what, const ArrayRef& a) {
  const std::string who = absl::StrCat(what, " of parameter '", name, "'");
  for (int64_t d : a.shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat(who, " has a negative dimension"));
  }
  if (a.elem == ElemType::kOther) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " has element type '", a.typestr,
        "': the engine takes float32, bfloat16 and float16 parameters with float32 gradients"));
  }
  if (!Contiguous(a)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " is not contiguous (shape [", absl::StrJoin(a.shape, ", "),
                     "], strides [", absl::StrJoin(a.strides, ", "),
                     "] bytes): the engine reads and writes it in place as one row-major block; "
                     "make the model's tensor contiguous (torch: p.data = p.data.contiguous()) "
                     "before making the optimizer"));
  }
  if (a.readonly) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " is read-only: the engine writes parameters and reads gradients in place; pass a "
                "writable array"));
  }
  if (a.data == 0 && ArrayElements(a) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, " has a null data pointer"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t ArrayElements(const ArrayRef& a) {
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  return n;
}

ElemType ElemTypeOf(const std::string& typestr, const std::string& descr_name) {
  // "<" little-endian or "|" (not applicable); '=' is native, little here.
  if (typestr.size() < 3 || (typestr[0] != '<' && typestr[0] != '=' && typestr[0] != '|')) {
    return ElemType::kOther;
  }
  const std::string t = typestr.substr(1);
  if (t == "f4") return ElemType::kF32;
  if (t == "f2") return ElemType::kF16;
  if (t == "f8") return ElemType::kF64;
  if (t == "V2" && descr_name == "bfloat16") return ElemType::kBF16;
  return ElemType::kOther;
}

const char* ElemTypeName(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return "float32";
    case ElemType::kBF16:
      return "bfloat16";
    case ElemType::kF16:
      return "float16";
    case ElemType::kF64:
      return "float64";
    case ElemType::kOther:
      break;
  }
  return "other";
}

absl::StatusOr<Placement> CheckPlacement(const std::vector<ArrayParam>& arrays) {
  Placement out;
  if (arrays.empty()) {
    return absl::InvalidArgumentError("no parameters: the optimizer needs at least one");
  }
  const ArrayParam& first = arrays.front();
  out.device = first.param.device;
  for (const ArrayParam& p : arrays) {
    for (const ArrayRef* a : {&p.param, &p.grad}) {
      if (a->device == out.device) continue;
      const char* what = a == &p.param ? "parameter" : "the gradient of parameter";
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", p.name, "' is ", Where(*a), " but parameter '", first.name, "' is ",
          Where(first.param),
          ": one optimizer's parameters and gradients are all on one CUDA device or all in "
          "host memory; move the whole model first (torch: model.to(device)), or make one "
          "optimizer per placement"));
    }
    if (p.param.elem == ElemType::kF64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", p.name, "' is float64: the engine updates float32, bfloat16 and "
          "float16 parameters (16-bit ones with float32 masters); convert the model first "
          "(torch: model.float())"));
    }
    ZF_RETURN_IF_ERROR(CheckArray(p.name, "parameter", p.param));
    ZF_RETURN_IF_ERROR(CheckArray(p.name, "the gradient", p.grad));
    if (p.grad.elem != ElemType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the gradient of parameter '", p.name, "' is ", ElemTypeName(p.grad.elem),
          ": the engine reads float32 gradients (convert a 16-bit gradient into a float32 "
          "buffer before each step, as zenflow.torch does)"));
    }
    if (ArrayElements(p.grad) != ArrayElements(p.param)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the gradient of parameter '", p.name, "' has ", ArrayElements(p.grad),
          " elements and the parameter ", ArrayElements(p.param), ": they must match"));
    }
    ParamSpec s;
    s.name = p.name;
    s.shape = JobShape(p.param.shape);
    s.param = reinterpret_cast<void*>(p.param.data);
    s.grad = reinterpret_cast<float*>(p.grad.data);
    s.dtype = p.param.elem == ElemType::kF32    ? DType::kF32
              : p.param.elem == ElemType::kBF16 ? DType::kBF16
                                                : DType::kF16;
    out.params.push_back(std::move(s));
  }
  return out;
}

}  // namespace zenflow
