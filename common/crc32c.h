// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of the
// checkpoint files. It is on the write and read path of every byte of a
// checkpoint, so it runs at memory speed: the SSE4.2 crc32 instruction on
// three interleaved streams when the CPU has it (checked at run time, the
// binaries are built without -march), a slicing-by-8 table otherwise. Both
// give the same value; checkpoint_file_test compares them.
//
//   uint32_t crc = Crc32c(data, n);
//   crc = Crc32cExtend(crc, more, m);  // == Crc32c(data ++ more)
#ifndef ZENFLOW_COMMON_CRC32C_H_
#define ZENFLOW_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace zenflow {

// The CRC-32C of `crc`'s data followed by `n` bytes at `data`
// (Crc32cExtend(0, ...) starts a new one).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

namespace crc32c_internal {

// Whether the SSE4.2 path is used.
bool HasHardware();
// The two implementations, for tests. ExtendHardware requires HasHardware().
uint32_t ExtendScalar(uint32_t crc, const void* data, size_t n);
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n);

}  // namespace crc32c_internal
}  // namespace zenflow

#endif  // ZENFLOW_COMMON_CRC32C_H_
