// The one conversion between the codec's DType and zenflow.v1.DType, and
// between the wire dtypes' names ("fp32", "bf16", "fp16", "int8") and
// zenflow.v1.DType, for the daemon, the client, the worker and the tools.
//
//   ZF_ASSIGN_OR_RETURN(DType d, FromProto(shard.dtype(), "shard dtype"));
//   delta.set_dtype(ToProto(d));
#ifndef ZENFLOW_COMMON_DTYPE_PROTO_H_
#define ZENFLOW_COMMON_DTYPE_PROTO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/codec.h"
#include "zenflow/v1/zenflow.pb.h"

namespace zenflow {

inline v1::DType ToProto(DType d) {
  switch (d) {
    case DType::kF32:
      return v1::DTYPE_FP32;
    case DType::kBF16:
      return v1::DTYPE_BF16;
    case DType::kF16:
      return v1::DTYPE_FP16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

// fp32, bf16 or fp16; INVALID_ARGUMENT naming `what` for anything else
// (int8 has no codec dtype: it is a wire encoding with per-column scales).
inline absl::StatusOr<DType> FromProto(v1::DType d, absl::string_view what) {
  switch (d) {
    case v1::DTYPE_FP32:
      return DType::kF32;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_FP16:
      return DType::kF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": unknown dtype ", static_cast<int>(d),
                       " (use DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16)"));
  }
}

// "fp32", "bf16", "fp16" or "int8"; INVALID_ARGUMENT otherwise.
inline absl::StatusOr<v1::DType> WireDTypeFromName(absl::string_view name) {
  if (name == "fp32") return v1::DTYPE_FP32;
  if (name == "bf16") return v1::DTYPE_BF16;
  if (name == "fp16") return v1::DTYPE_FP16;
  if (name == "int8") return v1::DTYPE_INT8;
  return absl::InvalidArgumentError(
      absl::StrCat("wire dtype '", name, "' must be fp32, bf16, fp16 or int8"));
}

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_DTYPE_PROTO_H_
