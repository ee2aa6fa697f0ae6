// PackDTypeSize and the argument checks shared by the backends; see
// backend_common.h.
#include "gpu_worker/kernels/backend_common.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gpu_worker/backend.h"

namespace zenflow::worker {

// A backend without streams (the CPU one) has nothing to order.
namespace {
absl::Status NoStreams(const Backend& b, uintptr_t stream, const char* op) {
  if (stream == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": the ", b.name(), " backend has no streams to order with, but was given stream ",
      stream, "; pass 0 with host memory (a CUDA stream goes with device memory)"));
}
}  // namespace

absl::Status Backend::WaitForStream(uintptr_t stream) {
  return NoStreams(*this, stream, "WaitForStream");
}

absl::Status Backend::SignalStream(uintptr_t stream) {
  return NoStreams(*this, stream, "SignalStream");
}

size_t PackDTypeSize(PackDType d) {
  switch (d) {
    case PackDType::kF32:
      return 4;
    case PackDType::kBF16:
    case PackDType::kF16:
      return 2;
    case PackDType::kInt8:
      return 1;
  }
  return 0;
}

namespace internal {
namespace {

absl::Status Invalid(const char* op, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

absl::Status CheckNonNegative(const char* op, const char* name, int64_t value) {
  if (value < 0) return Invalid(op, absl::StrCat(name, " must be >= 0, got ", value));
  return absl::OkStatus();
}

// rows * cols must fit int64 (and hence any byte count derived from it).
absl::Status CheckShape(const char* op, int64_t rows, int64_t cols) {
  if (rows < 0) return Invalid(op, absl::StrCat("rows must be >= 0, got ", rows));
  if (cols < 0) return Invalid(op, absl::StrCat("cols must be >= 0, got ", cols));
  if (cols > kMaxCols) {
    return Invalid(op, absl::StrCat("cols must be <= 2^31 (column indices are int32), got ", cols));
  }
  constexpr int64_t kMaxElements = std::numeric_limits<int64_t>::max() / 8;
  if (cols > 0 && rows > kMaxElements / cols) {
    return Invalid(op,
                   absl::StrCat("rows * cols overflows (rows = ", rows, ", cols = ", cols, ")"));
  }
  return absl::OkStatus();
}

// A selection of `ncols` columns of a rows x cols tensor: the shape, the
// count, and that rows * ncols elements can be indexed.
absl::Status CheckColumnSelection(const char* op, int64_t rows, int64_t cols, int64_t ncols) {
  ZF_RETURN_IF_ERROR(CheckShape(op, rows, cols));
  ZF_RETURN_IF_ERROR(CheckNonNegative(op, "ncols", ncols));
  if (ncols > 0 && cols == 0) {
    return Invalid(
        op, absl::StrCat("ncols = ", ncols, " columns requested from a tensor with 0 columns"));
  }
  if (ncols > 0 && rows > std::numeric_limits<int64_t>::max() / 8 / ncols) {
    return Invalid(op,
                   absl::StrCat("rows * ncols overflows (rows = ", rows, ", ncols = ", ncols, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckPointer(const char* op, const char* name, const void* p, bool needed) {
  if (needed && p == nullptr) return Invalid(op, absl::StrCat(name, " is null"));
  return absl::OkStatus();
}

bool ValidDType(PackDType d) {
  switch (d) {
    case PackDType::kF32:
    case PackDType::kBF16:
    case PackDType::kF16:
    case PackDType::kInt8:
      return true;
  }
  return false;
}

}  // namespace

const char* PackDTypeName(PackDType d) {
  switch (d) {
    case PackDType::kF32:
      return "f32";
    case PackDType::kBF16:
      return "bf16";
    case PackDType::kF16:
      return "f16";
    case PackDType::kInt8:
      return "int8";
  }
  return "invalid";
}

absl::Status CheckImportanceArgs(const float* grad, int64_t rows, int64_t cols, Importance kind,
                                 const float* out) {
  constexpr const char* kOp = "ColumnImportance";
  ZF_RETURN_IF_ERROR(CheckShape(kOp, rows, cols));
  if (kind != Importance::kL1 && kind != Importance::kL2Squared) {
    return Invalid(kOp, absl::StrCat("unknown Importance kind ", static_cast<int>(kind),
                                     " (expected kL1 or kL2Squared)"));
  }
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "grad", grad, rows > 0 && cols > 0));
  return CheckPointer(kOp, "out", out, cols > 0);
}

absl::Status CheckTopKArgs(const float* scores, int64_t cols, int64_t k, const int32_t* out) {
  constexpr const char* kOp = "TopK";
  ZF_RETURN_IF_ERROR(CheckNonNegative(kOp, "cols", cols));
  if (cols > kMaxCols) {
    return Invalid(kOp,
                   absl::StrCat("cols must be <= 2^31 (column indices are int32), got ", cols));
  }
  if (k < 0 || k > cols) {
    return Invalid(kOp, absl::StrCat("k must be in [0, cols] = [0, ", cols, "], got ", k));
  }
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "scores", scores, k > 0));
  return CheckPointer(kOp, "out", out, k > 0);
}

absl::Status CheckColumnsArgs(const char* op, const float* w, int64_t rows, int64_t cols,
                              const int32_t* columns, int64_t ncols, PackDType dtype,
                              const void* data, const float* scales) {
  ZF_RETURN_IF_ERROR(CheckShape(op, rows, cols));
  ZF_RETURN_IF_ERROR(CheckNonNegative(op, "ncols", ncols));
  if (!ValidDType(dtype)) {
    return Invalid(op, absl::StrCat("unknown PackDType ", static_cast<int>(dtype),
                                    " (expected kF32, kBF16, kF16 or kInt8)"));
  }
  if (ncols > 0 && cols == 0) {
    return Invalid(
        op, absl::StrCat("ncols = ", ncols, " columns requested from a tensor with 0 columns"));
  }
  if (ncols > 0 && rows > std::numeric_limits<int64_t>::max() / 8 / ncols) {
    return Invalid(op,
                   absl::StrCat("rows * ncols overflows (rows = ", rows, ", ncols = ", ncols, ")"));
  }
  const bool touches = ncols > 0 && rows > 0;
  ZF_RETURN_IF_ERROR(CheckPointer(op, "columns", columns, ncols > 0));
  ZF_RETURN_IF_ERROR(CheckPointer(op, "w", w, touches));
  ZF_RETURN_IF_ERROR(CheckPointer(op, "packed data", data, touches));
  if (dtype == PackDType::kInt8) {
    return CheckPointer(op, "scales (required for kInt8)", scales, ncols > 0);
  }
  return absl::OkStatus();
}

absl::Status CheckAdamWArgs(const AdamWHyper& h, float grad_scale, const float* w, int64_t rows,
                            int64_t cols, const int32_t* columns, int64_t ncols,
                            const int64_t* steps, const float* grad, const float* m,
                            const float* v, const char* op) {
  const char* const kOp = op;
  ZF_RETURN_IF_ERROR(CheckColumnSelection(kOp, rows, cols, ncols));
  if (!(h.beta1 >= 0.0f && h.beta1 < 1.0f)) {
    return Invalid(kOp, absl::StrCat("beta1 must be in [0, 1), got ", h.beta1));
  }
  if (!(h.beta2 >= 0.0f && h.beta2 < 1.0f)) {
    return Invalid(kOp, absl::StrCat("beta2 must be in [0, 1), got ", h.beta2));
  }
  if (!std::isfinite(h.lr) || h.lr < 0.0f) {
    return Invalid(kOp, absl::StrCat("lr must be finite and >= 0, got ", h.lr));
  }
  if (!std::isfinite(h.eps) || h.eps < 0.0f) {
    return Invalid(kOp, absl::StrCat("eps must be finite and >= 0, got ", h.eps));
  }
  if (!std::isfinite(h.weight_decay)) {
    return Invalid(kOp, absl::StrCat("weight_decay must be finite, got ", h.weight_decay));
  }
  if (!std::isfinite(grad_scale)) {
    return Invalid(kOp, absl::StrCat("grad_scale must be finite, got ", grad_scale));
  }
  const bool touches = ncols > 0 && rows > 0;
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "columns", columns, ncols > 0));
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "steps", steps, ncols > 0));
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "w", w, touches));
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "grad", grad, touches));
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "m", m, touches));
  return CheckPointer(kOp, "v", v, touches);
}

absl::Status CheckParam16DType(const char* op, PackDType w_dtype) {
  if (w_dtype != PackDType::kBF16 && w_dtype != PackDType::kF16) {
    return Invalid(op, absl::StrCat("the parameter dtype must be kBF16 or kF16, got ",
                                    PackDTypeName(w_dtype),
                                    " (fp32 parameters take ApplyColumns / SelectiveAdamW)"));
  }
  return absl::OkStatus();
}

absl::Status CheckApplyColumns16Args(const void* w, PackDType w_dtype, int64_t rows, int64_t cols,
                                     const int32_t* columns, int64_t ncols, PackDType src_dtype,
                                     const void* src) {
  constexpr const char* kOp = "ApplyColumns16";
  ZF_RETURN_IF_ERROR(CheckParam16DType(kOp, w_dtype));
  if (src_dtype != PackDType::kF32 && src_dtype != w_dtype) {
    return Invalid(kOp, absl::StrCat("the source dtype must be f32 or the parameter's own (",
                                     PackDTypeName(w_dtype), "), got ", PackDTypeName(src_dtype)));
  }
  // The shape, count and pointer checks of ApplyColumns (w only for null).
  return CheckColumnsArgs(kOp, static_cast<const float*>(w), rows, cols, columns, ncols, src_dtype,
                          src, nullptr);
}

absl::Status CheckAdamW16Args(const AdamWHyper& h, float grad_scale, const void* w,
                              PackDType w_dtype, int64_t rows, int64_t cols,
                              const int32_t* columns, int64_t ncols, const int64_t* steps,
                              const float* grad, const float* master, const float* m,
                              const float* v) {
  constexpr const char* kOp = "SelectiveAdamW16";
  ZF_RETURN_IF_ERROR(CheckParam16DType(kOp, w_dtype));
  ZF_RETURN_IF_ERROR(
      CheckAdamWArgs(h, grad_scale, master, rows, cols, columns, ncols, steps, grad, m, v, kOp));
  return CheckPointer(kOp, "w", w, ncols > 0 && rows > 0);
}

absl::Status CheckFactoredStepArgs(float lr, float eps, const void* w, PackDType w_dtype,
                                   int64_t rows, int64_t cols, const int32_t* columns,
                                   int64_t ncols, const float* grad, const float* row_v,
                                   const float* col_v) {
  constexpr const char* kOp = "FactoredStep";
  if (w_dtype != PackDType::kF32 && w_dtype != PackDType::kBF16 && w_dtype != PackDType::kF16) {
    return Invalid(kOp, absl::StrCat("the parameter dtype must be f32, bf16 or f16, got ",
                                     PackDTypeName(w_dtype)));
  }
  ZF_RETURN_IF_ERROR(CheckColumnSelection(kOp, rows, cols, ncols));
  if (!std::isfinite(lr) || lr < 0.0f) {
    return Invalid(kOp, absl::StrCat("lr must be finite and >= 0, got ", lr));
  }
  if (!std::isfinite(eps) || eps < 0.0f) {
    return Invalid(kOp, absl::StrCat("eps must be finite and >= 0, got ", eps));
  }
  const bool touches = ncols > 0 && rows > 0;
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "columns", columns, ncols > 0));
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "w", w, touches));
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "grad", grad, touches));
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "row_v", row_v, touches));
  return CheckPointer(kOp, "col_v", col_v, touches);
}

absl::Status CheckConvertArgs(const void* src, PackDType src_dtype, const void* dst,
                              PackDType dst_dtype, int64_t n) {
  constexpr const char* kOp = "Convert";
  for (PackDType d : {src_dtype, dst_dtype}) {
    if (d != PackDType::kF32 && d != PackDType::kBF16 && d != PackDType::kF16) {
      return Invalid(kOp, absl::StrCat("dtypes must be f32, bf16 or f16, got ", PackDTypeName(d)));
    }
  }
  ZF_RETURN_IF_ERROR(CheckNonNegative(kOp, "n", n));
  if (n > std::numeric_limits<int64_t>::max() / 8) {
    return Invalid(kOp, absl::StrCat("n = ", n, " is too large"));
  }
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "src", src, n > 0));
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "dst", dst, n > 0));
  if (n > 0) {
    const uintptr_t s = reinterpret_cast<uintptr_t>(src);
    const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
    const uintptr_t sb = static_cast<uintptr_t>(n) * PackDTypeSize(src_dtype);
    const uintptr_t db = static_cast<uintptr_t>(n) * PackDTypeSize(dst_dtype);
    if (s < d + db && d < s + sb) return Invalid(kOp, "src and dst overlap");
  }
  return absl::OkStatus();
}

absl::Status CheckSquaredNormArgs(const float* x, int64_t n, const double* host_out) {
  constexpr const char* kOp = "SquaredNorm";
  ZF_RETURN_IF_ERROR(CheckNonNegative(kOp, "n", n));
  ZF_RETURN_IF_ERROR(CheckPointer(kOp, "x", x, n > 0));
  return CheckPointer(kOp, "host_out", host_out, true);
}

absl::Status CheckColumnIndices(const char* op, const int32_t* columns, int64_t ncols, int64_t cols,
                                bool distinct) {
  for (int64_t i = 0; i < ncols; ++i) {
    if (columns[i] < 0 || columns[i] >= cols) {
      return Invalid(op, absl::StrCat("columns[", i, "] = ", columns[i],
                                      " is outside [0, cols) = [0, ", cols, ")"));
    }
  }
  if (!distinct || ncols < 2) return absl::OkStatus();
  std::vector<uint64_t> seen(static_cast<size_t>((cols + 63) / 64), 0);
  for (int64_t i = 0; i < ncols; ++i) {
    const uint32_t c = static_cast<uint32_t>(columns[i]);
    uint64_t& word = seen[c / 64];
    const uint64_t bit = uint64_t{1} << (c % 64);
    if (word & bit) {
      return Invalid(op, absl::StrCat("column ", c, " appears more than once (again at columns[", i,
                                      "]); the indices must be distinct"));
    }
    word |= bit;
  }
  return absl::OkStatus();
}

absl::Status CheckSteps(const int64_t* steps, int64_t ncols, const char* op) {
  for (int64_t i = 0; i < ncols; ++i) {
    if (steps[i] < 1) {
      return Invalid(op,
                     absl::StrCat("steps[", i, "] = ", steps[i],
                                  " but a step count must be >= 1 (it includes this update)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace zenflow::worker
