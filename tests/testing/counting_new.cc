// Counting global operator new/delete; see counting_new.h.
#include "tests/testing/counting_new.h"

#include <execinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

thread_local int64_t t_allocations = 0;
thread_local bool t_trace = false;

void Count() {
  ++t_allocations;
  if (t_trace) {
    t_trace = false;  // backtrace may allocate
    void* frames[24];
    const int n = backtrace(frames, 24);
    backtrace_symbols_fd(frames, n, 2);
    (void)!write(2, "----\n", 5);
    t_trace = true;
  }
}

void* Allocate(size_t n) {
  Count();
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* AllocateAligned(size_t n, std::align_val_t al) {
  Count();
  const size_t a = static_cast<size_t>(al);
  void* p = std::aligned_alloc(a, (std::max<size_t>(n, 1) + a - 1) / a * a);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* AllocateNoThrow(size_t n) noexcept {
  try {
    return Allocate(n);
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

namespace zenflow {

int64_t ThisThreadAllocations() { return t_allocations; }

void TraceThisThreadAllocations(bool on) { t_trace = on; }

}  // namespace zenflow

void* operator new(size_t n) { return Allocate(n); }
void* operator new[](size_t n) { return Allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return AllocateNoThrow(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return AllocateNoThrow(n); }
void* operator new(size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void* operator new[](size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
