#include "common/huge_pages.h"

#include <sys/mman.h>

namespace zenflow {

size_t AdviseHugePages(void* p, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  const uintptr_t end = (begin + bytes) & ~(uintptr_t{kHugePageBytes} - 1);
  if (p == nullptr || end <= first) return 0;
  const size_t len = static_cast<size_t>(end - first);
  return madvise(reinterpret_cast<void*>(first), len, MADV_HUGEPAGE) == 0 ? len : 0;
}

}  // namespace zenflow
