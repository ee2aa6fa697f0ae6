// FUZZ_CHECK: a property a fuzz target asserts about the daemon's answer.
// A failure prints what was expected and aborts, which libFuzzer reports as
// a crash (and saves the input) and the regression driver as a failed test.
//
//   FUZZ_CHECK(before == after, "a rejected shard changed the job: ", status);
#ifndef ZENFLOW_FUZZ_CHECK_H_
#define ZENFLOW_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

#define FUZZ_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      const std::string zf_fuzz_why_ = ::absl::StrCat(__VA_ARGS__);                    \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, \
                   #cond, zf_fuzz_why_.c_str());                                       \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

#endif  // ZENFLOW_FUZZ_CHECK_H_
