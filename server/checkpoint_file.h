// Checkpoint files: a job's state as named sections in one file, written
// atomically and verified on read. The daemon serializes a job into sections
// and hands them to WriteCheckpoint; a restart reads the newest file that
// verifies (ListCheckpoints, ReadCheckpoint) and PruneCheckpoints keeps the
// directory bounded.
//
//   std::vector<CheckpointSectionView> sections = {{"master", p, n}, ...};
//   ZF_ASSIGN_OR_RETURN(CheckpointWriteStats stats,
//                       WriteCheckpoint(dir, CheckpointFileName("job7.", seq), sections));
//   ZF_RETURN_IF_ERROR(PruneCheckpoints(dir, "job7.", 3));
//
// File format, version 1 (all integers little-endian):
//
//   offset 0, the header:
//     magic          8 bytes  "ZFCKPT\0\1"
//     version        u32      1
//     section count  u32      0..4096
//     per section, 56 bytes:
//       name         32 bytes 1-32 bytes of [a-z0-9_.], zero-padded
//       offset       u64      where its data starts: a multiple of 4096
//       size         u64      its data's length in bytes (0 is allowed)
//       crc32c       u32      CRC-32C of its data
//       pad          u32      zero
//     header crc32c  u32      CRC-32C of every header byte before it
//   zero padding to the next multiple of 4096, then each section's data in
//   order, each at its offset and followed by zero padding to the next
//   multiple of 4096. The file ends there: its size is a multiple of 4096.
//
// The 4096 alignment lets the data move with O_DIRECT straight between the
// disk and the I/O buffers, without going through the page cache (a
// checkpoint is written once and read only after a restart, so caching it
// would only evict the daemon's working set).
//
// Writing: a temporary file in the target directory (named ".<name>.tmp.*",
// which ListCheckpoints never matches), data through io_uring with several
// writes in flight, the header last, fsync, rename over <dir>/<name>, fsync
// of the directory. A crash leaves either the previous file or the new one,
// plus possibly a temporary file nobody lists.

#ifndef ZENFLOW_SERVER_CHECKPOINT_FILE_H_
#define ZENFLOW_SERVER_CHECKPOINT_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zenflow {

// The limits of the format.
inline constexpr size_t kCheckpointMaxSections = 4096;
inline constexpr size_t kCheckpointMaxSectionName = 32;

// One named part of a checkpoint (name: 1-32 bytes of [a-z0-9_.], unique in
// the checkpoint). `data` may be null when `size` is 0.
struct CheckpointSectionView {
  std::string name;
  const void* data;
  size_t size;
};

// A section as read back.
struct CheckpointSection {
  std::string name;
  std::string data;
};

struct CheckpointWriteStats {
  int64_t bytes = 0;       // the file's size (header and padding included)
  double seconds = 0;      // the whole call, from open to the directory's fsync
  bool direct_io = false;  // the data went with O_DIRECT (else the page cache)
  bool io_uring = false;   // through io_uring (else pwrite: io_uring unavailable)
  bool fixed_buffers = false;  // io_uring with registered buffers
};

// Writes `sections` as <dir>/<name> atomically (see above), replacing a file
// of that name. `dir` must exist. INVALID_ARGUMENT for a bad file name (empty,
// over 255 bytes, with '/', or starting with '.', which temporary files use),
// a bad or repeated section name, more than 4096 sections, or null data with
// a nonzero size; otherwise errors carry the errno text and name the path.
absl::StatusOr<CheckpointWriteStats> WriteCheckpoint(
    const std::string& dir, const std::string& name,
    const std::vector<CheckpointSectionView>& sections);

// Reads and verifies the file at `path`: the sections in file order.
// DATA_LOSS naming the file and the reason when it does not verify (bad
// magic, unknown version, truncated, header checksum mismatch, sizes
// inconsistent, a section's checksum mismatch); errno-based errors (such as
// NOT_FOUND) when it cannot be opened or read.
absl::StatusOr<std::vector<CheckpointSection>> ReadCheckpoint(const std::string& path);

// "<prefix><seq as 20 zero-padded digits>.zfck": names that sort by sequence.
std::string CheckpointFileName(const std::string& prefix, uint64_t seq);

// The paths (<dir>/<file>) of the files in `dir` named
// CheckpointFileName(prefix, seq) for some seq, newest (highest seq) first.
// Other files, temporary ones included, are not listed. An unreadable or
// missing directory lists nothing.
std::vector<std::string> ListCheckpoints(const std::string& dir, const std::string& prefix);

// Deletes all but the newest `keep` (>= 1, else INVALID_ARGUMENT) of
// ListCheckpoints(dir, prefix), then fsyncs `dir`. Temporary files of writers
// still at work are never listed, so never deleted.
absl::Status PruneCheckpoints(const std::string& dir, const std::string& prefix, int keep);

// How the I/O is done. The defaults are what the functions above use; tests
// and checkpoint_io_bench choose others to cover the fallbacks.
struct CheckpointIoOptions {
  bool use_io_uring = true;   // false: pwrite/pread, as when io_uring_queue_init fails
  bool try_direct_io = true;  // false: through the page cache, as when O_DIRECT is refused
  // I/O buffers: `buffers` of `buffer_bytes` (a multiple of 4096) each, one
  // I/O in flight per buffer. They are registered with io_uring when the
  // locked-memory limit allows (4 x 1 MiB fits Debian's default of 8 MiB).
  size_t buffer_bytes = size_t{1} << 20;
  int buffers = 4;
};

absl::StatusOr<CheckpointWriteStats> WriteCheckpoint(
    const std::string& dir, const std::string& name,
    const std::vector<CheckpointSectionView>& sections, const CheckpointIoOptions& options);
absl::StatusOr<std::vector<CheckpointSection>> ReadCheckpoint(const std::string& path,
                                                              const CheckpointIoOptions& options);

}  // namespace zenflow

#endif  // ZENFLOW_SERVER_CHECKPOINT_FILE_H_
