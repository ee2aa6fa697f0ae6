// Propagation macros for absl::Status / absl::StatusOr, which Abseil 20220623
// does not ship.
//
//   ZF_RETURN_IF_ERROR(Validate(req));
//   ZF_ASSIGN_OR_RETURN(auto job, registry.Find(id));
#ifndef ZENFLOW_COMMON_STATUS_MACROS_H_
#define ZENFLOW_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ZF_STATUS_CONCAT_INNER_(a, b) a##b
#define ZF_STATUS_CONCAT_(a, b) ZF_STATUS_CONCAT_INNER_(a, b)

#define ZF_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status zf_status_ = (expr);           \
    if (!zf_status_.ok()) return zf_status_;      \
  } while (0)

#define ZF_ASSIGN_OR_RETURN(lhs, expr) \
  ZF_ASSIGN_OR_RETURN_IMPL_(ZF_STATUS_CONCAT_(zf_statusor_, __LINE__), lhs, expr)

#define ZF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

#endif  // ZENFLOW_COMMON_STATUS_MACROS_H_
