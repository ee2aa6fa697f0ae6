// Tests for common/huge_pages.h: the advised range is exactly the whole
// 2 MiB pages inside the buffer, the kernel records the advice on the
// buffer's mapping (VmFlags "hg" in /proc/self/smaps), and the values are
// what an assign gives, for large and small buffers and on reuse.
#include "common/huge_pages.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zenflow {
namespace {

// The VmFlags of the mapping that holds address p ("" if none is found).
std::string VmFlagsAt(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(' ') != std::string::npos &&
        line.find('-') < line.find(' ')) {
      inside = lo <= a && a < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(HugePages, AdvisesExactlyTheWholeHugePagesInside) {
  EXPECT_EQ(AdviseHugePages(nullptr, 8 << 20), 0u);
  std::vector<char> small(kHugePageBytes / 2);
  EXPECT_EQ(AdviseHugePages(small.data(), small.size()), 0u);  // no whole huge page
  // 3 huge pages and a bit, from an unaligned start: the advice covers the
  // 2 MiB pages that lie wholly inside.
  std::vector<char> big(4 * kHugePageBytes);
  char* const start = big.data() + 4096 + 1;
  const size_t len = 3 * kHugePageBytes + 100;
  const uintptr_t s = reinterpret_cast<uintptr_t>(start);
  const uintptr_t first = (s + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t end = (s + len) / kHugePageBytes * kHugePageBytes;
  EXPECT_EQ(AdviseHugePages(start, len), static_cast<size_t>(end - first));
  EXPECT_GE(end - first, 2 * kHugePageBytes);
}

TEST(HugePages, ALargeBufferIsAdvisedBeforeItsValuesAreWritten) {
  std::vector<float> v;
  const size_t n = 3 * kHugePageBytes / sizeof(float) + 7;
  AssignOnHugePages(&v, n, 1.5f);
  ASSERT_EQ(v.size(), n);
  for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(v[i], 1.5f) << i;
  EXPECT_EQ(v.back(), 1.5f);
  // The first whole huge page inside the buffer is on an advised mapping.
  const uintptr_t a = reinterpret_cast<uintptr_t>(v.data());
  const uintptr_t page = (a + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const std::string flags = VmFlagsAt(reinterpret_cast<const void*>(page + 64));
  ASSERT_FALSE(flags.empty()) << "no mapping found in /proc/self/smaps";
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
  // Reassigned with no more room needed: the same storage, new values.
  const float* const before = v.data();
  AssignOnHugePages(&v, n - 100, -2.0f);
  EXPECT_EQ(v.data(), before);
  ASSERT_EQ(v.size(), n - 100);
  EXPECT_EQ(v.front(), -2.0f);
  EXPECT_EQ(v.back(), -2.0f);
}

TEST(HugePages, ASmallBufferIsAssignedAsUsual) {
  std::vector<int8_t> v{1, 2, 3};
  AssignOnHugePages(&v, 10, int8_t{4});
  EXPECT_EQ(v, std::vector<int8_t>(10, 4));
  AssignOnHugePages(&v, 0, int8_t{4});
  EXPECT_TRUE(v.empty());
}

}  // namespace
}  // namespace zenflow
