// A test binary that links :counting_new has its global operator new and
// delete replaced by ones that count, per thread, every allocation made
// through operator new (malloc's direct callers are not seen). The
// allocation tests (server:shard_alloc_test, common:ucx_alloc_test) assert
// with it that a hot path allocates nothing per message once warm:
//
//   const int64_t before = ThisThreadAllocations();
//   ...  // the path under test, on this thread
//   EXPECT_EQ(ThisThreadAllocations() - before, 0);
#ifndef ZENFLOW_TESTS_TESTING_COUNTING_NEW_H_
#define ZENFLOW_TESTS_TESTING_COUNTING_NEW_H_

#include <cstdint>

namespace zenflow {

// Allocations through operator new made so far by the calling thread.
int64_t ThisThreadAllocations();

// While on, each allocation of the calling thread writes its stack to
// stderr (to find where an unexpected allocation comes from).
void TraceThisThreadAllocations(bool on);

}  // namespace zenflow

#endif  // ZENFLOW_TESTS_TESTING_COUNTING_NEW_H_
