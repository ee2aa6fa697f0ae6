// Transparent huge pages for a job's large state buffers: the fp32 master,
// m, v and the round's sums, megabytes each, which the shard path's add and
// the round update stream through end to end. On 4 KiB pages such a stream
// takes a TLB miss every 1,024 floats and the hardware prefetchers stop at
// every page boundary; on 2 MiB pages neither happens. Debian's kernels
// give huge pages only where a process asks (transparent_hugepage
// "madvise"), so a buffer is advised before its pages are first touched:
//
//   std::vector<float> v;
//   AssignOnHugePages(&v, n);  // n zeros, on huge pages where the kernel has them
//
// Where the kernel has none (THP "never", or no free 2 MiB frames) the
// buffer is on ordinary pages: the same bytes, only slower.
#ifndef ZENFLOW_COMMON_HUGE_PAGES_H_
#define ZENFLOW_COMMON_HUGE_PAGES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zenflow {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Advises the kernel to back the whole 2 MiB pages inside [p, p + bytes)
// with huge pages (madvise MADV_HUGEPAGE). Returns the bytes advised (0 for
// a range holding no whole huge page, or when the kernel refused).
size_t AdviseHugePages(void* p, size_t bytes);

// *v becomes n copies of `value`, its storage advised for huge pages before
// the values are written (a buffer of at least kHugePageBytes; a smaller
// one is simply assigned). The storage is a fresh allocation when the old
// one was smaller. Only the whole huge pages inside the storage are
// advised: the buffer's unaligned ends (under 2 MiB each) stay on small
// pages, so it takes no more memory than on small pages.
template <typename T>
void AssignOnHugePages(std::vector<T>* v, size_t n, T value = T()) {
  if (n * sizeof(T) >= kHugePageBytes && v->capacity() < n) {
    std::vector<T>().swap(*v);
    v->reserve(n);
    AdviseHugePages(v->data(), v->capacity() * sizeof(T));
  }
  v->assign(n, value);
}

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_HUGE_PAGES_H_
