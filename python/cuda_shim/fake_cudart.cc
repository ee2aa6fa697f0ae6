// A fake CUDA runtime for tests on machines without a GPU: LD_PRELOADed
// ahead of libcudart, it answers the runtime calls the CUDA backend makes
// (gpu_worker/kernels/cuda_backend.cu) with host memory, runs no kernel and
// writes each call that orders work (streams, events, launches, copies,
// synchronizes) as one line to $ZF_FAKE_CUDA_LOG. Tests check the ORDER of
// those calls (python/cuda_shim/test_cuda_shim.py), never numbers: kernels
// do nothing here.
//
// Device memory is host memory (calloc); "device" pointers from a caller
// are taken as they are, so a test hands over NumPy memory as a CUDA
// array. cudaPointerGetAttributes reports device memory on device
// (pointer >> 56): 0 for real host pointers, so a test can forge a pointer
// "on device 1". Two devices are visible.
#include <cuda_runtime_api.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace {

std::mutex mu;
FILE* log_file = nullptr;
int next_event = 0;
int current_device = 0;
struct Config {
  dim3 grid, block;
  size_t shared = 0;
  void* stream = nullptr;
};
Config pending;

void Log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Log(const char* fmt, ...) {
  std::lock_guard<std::mutex> l(mu);
  if (log_file == nullptr) {
    const char* path = std::getenv("ZF_FAKE_CUDA_LOG");
    if (path == nullptr) return;
    log_file = std::fopen(path, "a");
    if (log_file == nullptr) return;
    std::setvbuf(log_file, nullptr, _IONBF, 0);
  }
  va_list ap;
  va_start(ap, fmt);
  char line[512];
  std::vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  std::fprintf(log_file, "%s\n", line);
}

uintptr_t U(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 2;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  *s = reinterpret_cast<cudaStream_t>(new char[16]);
  Log("cudaStreamCreateWithFlags stream=0x%" PRIxPTR " flags=%u", U(*s), flags);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Log("cudaStreamDestroy stream=0x%" PRIxPTR, U(s));
  delete[] reinterpret_cast<char*>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Log("cudaStreamSynchronize stream=0x%" PRIxPTR, U(s));
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  Log("cudaDeviceSynchronize");
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::calloc(1, bytes == 0 ? 1 : bytes);
  Log("cudaMalloc bytes=%zu", bytes);
  return *p == nullptr ? cudaErrorMemoryAllocation : cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  Log("cudaFree");
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::calloc(1, bytes == 0 ? 1 : bytes);
  Log("cudaMallocHost bytes=%zu", bytes);
  return *p == nullptr ? cudaErrorMemoryAllocation : cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  std::memmove(dst, src, bytes);
  Log("cudaMemcpyAsync kind=%d bytes=%zu stream=0x%" PRIxPTR, static_cast<int>(kind), bytes,
      U(s));
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  std::memset(p, value, bytes);
  Log("cudaMemsetAsync bytes=%zu stream=0x%" PRIxPTR, bytes, U(s));
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorFake"; }
const char* cudaGetErrorString(cudaError_t) { return "an error of the fake CUDA runtime"; }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  int id;
  {
    std::lock_guard<std::mutex> l(mu);
    id = ++next_event;
  }
  *e = reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(id));
  Log("cudaEventCreateWithFlags event=%d flags=%u", id, flags);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Log("cudaEventDestroy event=%d", static_cast<int>(U(e)));
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  Log("cudaEventRecord event=%d stream=0x%" PRIxPTR, static_cast<int>(U(e)), U(s));
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  Log("cudaStreamWaitEvent stream=0x%" PRIxPTR " event=%d flags=%u", U(s),
      static_cast<int>(U(e)), flags);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof(*a));
  a->type = cudaMemoryTypeDevice;
  a->device = static_cast<int>(U(p) >> 56);
  a->devicePointer = const_cast<void*>(p);
  Log("cudaPointerGetAttributes device=%d", a->device);
  return cudaSuccess;
}

// What nvcc's kernel launches call (crt/host_runtime.h): the configuration
// is pushed, popped and launched; the launch runs nothing.
void** __cudaRegisterFatBinary(void*) {
  static void* handle = nullptr;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*,
                            dim3*, int*) {}

cudaError_t __cudaGetKernel(cudaKernel_t* k, const void* fun) {
  *k = reinterpret_cast<cudaKernel_t>(const_cast<void*>(fun));
  return cudaSuccess;
}

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, void* stream) {
  pending = Config{grid, block, shared, stream};
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  *grid = pending.grid;
  *block = pending.block;
  *shared = pending.shared;
  *static_cast<void**>(stream) = pending.stream;
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3 grid, dim3, void**, size_t, cudaStream_t s) {
  Log("cudaLaunchKernel grid=%u stream=0x%" PRIxPTR, grid.x, U(s));
  return cudaSuccess;
}

}  // extern "C"
