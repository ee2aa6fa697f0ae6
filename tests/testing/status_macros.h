// Test support: gtest assertions for absl::Status.
#ifndef ZENFLOW_TESTS_TESTING_STATUS_MACROS_H_
#define ZENFLOW_TESTS_TESTING_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "gtest/gtest.h"

#define ASSERT_OK(expr)                              \
  do {                                               \
    const absl::Status zf_s = (expr);                \
    ASSERT_TRUE(zf_s.ok()) << #expr << ": " << zf_s; \
  } while (0)

#endif  // ZENFLOW_TESTS_TESTING_STATUS_MACROS_H_
