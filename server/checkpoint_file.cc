// Checkpoint files; the format and the write protocol are in checkpoint_file.h.
#include "server/checkpoint_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the checkpoint format is little-endian and is encoded with memcpy");

namespace zenflow {
namespace {

constexpr char kMagic[8] = {'Z', 'F', 'C', 'K', 'P', 'T', '\0', '\1'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kAlign = 4096;
constexpr size_t kFixedBytes = 16;  // magic, version, section count
constexpr size_t kEntryBytes = 56;  // name[32], offset, size, crc32c, pad
constexpr absl::string_view kSuffix = ".zfck";
constexpr size_t kSeqDigits = 20;

uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) & ~(kAlign - 1); }

// The header's bytes, its checksum included.
size_t HeaderBytes(size_t sections) { return kFixedBytes + kEntryBytes * sections + 4; }

template <typename T>
void Store(char* p, T v) {
  std::memcpy(p, &v, sizeof(v));
}
template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

absl::Status Errno(int err, absl::string_view what) { return absl::ErrnoToStatus(err, what); }

std::string JoinPath(const std::string& dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

bool IsSectionName(absl::string_view name) {
  if (name.empty() || name.size() > kCheckpointMaxSectionName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
  });
}

absl::Status ValidateFileName(const std::string& name) {
  if (name.empty() || name.size() > 255 || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos || name[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint file name \"", absl::CEscape(name),
        "\" is invalid: it must be 1-255 bytes without '/' and must not start with '.' "
        "(temporary files do)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSections(const std::vector<CheckpointSectionView>& sections) {
  if (sections.size() > kCheckpointMaxSections) {
    return absl::InvalidArgumentError(absl::StrCat("a checkpoint holds at most ",
                                                   kCheckpointMaxSections, " sections, not ",
                                                   sections.size()));
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    const CheckpointSectionView& s = sections[i];
    if (!IsSectionName(s.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("section ", i, " name \"", absl::CEscape(s.name),
                       "\" is invalid: it must be 1-32 bytes of [a-z0-9_.]"));
    }
    if (s.data == nullptr && s.size > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("section \"", s.name, "\" has ", s.size, " bytes but no data"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (sections[j].name == s.name) {
        return absl::InvalidArgumentError(
            absl::StrCat("section name \"", s.name, "\" is used twice (sections ", j, " and ",
                         i, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const CheckpointIoOptions& o) {
  if (o.buffer_bytes == 0 || o.buffer_bytes % kAlign != 0 || o.buffers < 1 || o.buffers > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint I/O options: buffer_bytes (", o.buffer_bytes,
        ") must be a positive multiple of 4096 and buffers (", o.buffers, ") 1-64"));
  }
  return absl::OkStatus();
}

// Where each section lives in the file.
struct Entry {
  std::string name;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t crc = 0;
};

struct Layout {
  std::vector<Entry> entries;
  uint64_t data_begin = 0;  // the header, padded
  uint64_t file_end = 0;
};

Layout LayOut(const std::vector<CheckpointSectionView>& sections) {
  Layout layout;
  layout.data_begin = AlignUp(HeaderBytes(sections.size()));
  uint64_t at = layout.data_begin;
  for (const CheckpointSectionView& s : sections) {
    layout.entries.push_back({s.name, at, s.size, 0});
    at = AlignUp(at + s.size);
  }
  layout.file_end = at;
  return layout;
}

std::string EncodeHeader(const Layout& layout) {
  const size_t n = layout.entries.size();
  std::string h(layout.data_begin, '\0');
  char* p = h.data();
  std::memcpy(p, kMagic, sizeof(kMagic));
  Store<uint32_t>(p + 8, kVersion);
  Store<uint32_t>(p + 12, static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const Entry& e = layout.entries[i];
    char* q = p + kFixedBytes + kEntryBytes * i;
    std::memcpy(q, e.name.data(), e.name.size());
    Store<uint64_t>(q + 32, e.offset);
    Store<uint64_t>(q + 40, e.size);
    Store<uint32_t>(q + 48, e.crc);
  }
  const size_t covered = kFixedBytes + kEntryBytes * n;
  Store<uint32_t>(p + covered, Crc32c(p, covered));
  return h;
}

// Calls f(section, offset in the section, offset in the range, bytes) for
// each part of the file range [off, off + len) that holds section data, in
// file order. Ranges must be visited in file order: `*next` remembers the
// first section the next range can overlap.
template <typename F>
void ForEachPiece(const std::vector<Entry>& entries, uint64_t off, size_t len, size_t* next,
                  F f) {
  const uint64_t end = off + len;
  size_t s = *next;
  while (s < entries.size() && entries[s].offset + entries[s].size <= off) ++s;
  *next = s;
  for (; s < entries.size() && entries[s].offset < end; ++s) {
    const Entry& e = entries[s];
    const uint64_t lo = std::max(off, e.offset), hi = std::min(end, e.offset + e.size);
    if (lo < hi) f(s, lo - e.offset, lo - off, hi - lo);
  }
}

// Copies and checksums in pieces that stay in the L2 cache, so the data is
// read from memory once for both.
constexpr size_t kCrcPiece = 256 * 1024;

void CopyWithCrc(char* dst, const char* src, size_t n, uint32_t* crc, bool crc_of_dst) {
  for (size_t at = 0; at < n; at += kCrcPiece) {
    const size_t k = std::min(kCrcPiece, n - at);
    if (crc_of_dst) {
      std::memcpy(dst + at, src + at, k);
      *crc = Crc32cExtend(*crc, dst + at, k);
    } else {
      *crc = Crc32cExtend(*crc, src + at, k);
      std::memcpy(dst + at, src + at, k);
    }
  }
}

// Aligned I/O buffers and, unless io_uring is unavailable, a ring with the
// buffers registered (when the locked-memory limit allows). One per call:
// checkpoints are rare, and a private ring needs no locking.
class BlockIo {
 public:
  // Fills or consumes buffer `buf` holding the file range [offset, offset + len);
  // called in file order.
  using Fill = std::function<void(char* buf, uint64_t offset, size_t len)>;
  using Consume = std::function<void(const char* buf, uint64_t offset, size_t len)>;

  static absl::StatusOr<std::unique_ptr<BlockIo>> Create(const CheckpointIoOptions& options) {
    ZF_RETURN_IF_ERROR(ValidateOptions(options));
    auto io = std::unique_ptr<BlockIo>(new BlockIo(options));
    const size_t total = options.buffer_bytes * options.buffers;
    io->mem_ = static_cast<char*>(std::aligned_alloc(kAlign, total));
    if (io->mem_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("checkpoint I/O buffers: allocation of ", total, " bytes failed"));
    }
    // io_uring_queue_init fails where io_uring is blocked (seccomp in
    // containers, kernel.io_uring_disabled): pwrite/pread do the same job.
    if (options.use_io_uring &&
        io_uring_queue_init(2 * options.buffers, &io->ring_, 0) == 0) {
      io->ring_ok_ = true;
      std::vector<iovec> iov(options.buffers);
      for (int i = 0; i < options.buffers; ++i) iov[i] = {io->Buf(i), options.buffer_bytes};
      // Registration pins the pages once instead of per I/O; it counts
      // against RLIMIT_MEMLOCK, and without it the I/O still works.
      io->fixed_ = io_uring_register_buffers(&io->ring_, iov.data(), iov.size()) == 0;
    }
    return io;
  }

  ~BlockIo() {
    if (ring_ok_) io_uring_queue_exit(&ring_);  // unregisters the buffers too
    std::free(mem_);
  }

  bool uses_io_uring() const { return ring_ok_; }
  bool fixed() const { return fixed_; }

  // Writes [begin, end) of `fd` from buffers that `fill` fills, one write in
  // flight per buffer.
  absl::Status Write(int fd, const std::string& path, uint64_t begin, uint64_t end,
                     const Fill& fill) {
    return Transfer(/*write=*/true, fd, path, begin, end, fill, nullptr);
  }

  // Reads [begin, end) of `fd` and hands the buffers to `consume` in file
  // order, with one read in flight per buffer.
  absl::Status Read(int fd, const std::string& path, uint64_t begin, uint64_t end,
                    const Consume& consume) {
    return Transfer(/*write=*/false, fd, path, begin, end, nullptr, consume);
  }

  absl::Status Sync(int fd, const std::string& path) {
    if (ring_ok_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_fsync(sqe, fd, 0);
      io_uring_sqe_set_data64(sqe, 0);
      ++prepared_;
      absl::Status error;
      Submit(path, &error);
      if (inflight_ > 0) {
        int i, res;
        Wait(&i, &res);
        if (error.ok() && res < 0) error = Errno(-res, absl::StrCat("fsync of ", path));
      }
      return error;
    }
    if (fsync(fd) != 0) return Errno(errno, absl::StrCat("fsync of ", path));
    return absl::OkStatus();
  }

 private:
  struct Slot {
    uint64_t offset = 0;  // of the buffer's range in the file
    size_t len = 0;
    size_t done = 0;  // bytes transferred so far (short transfers continue)
    bool complete = false;
  };

  explicit BlockIo(const CheckpointIoOptions& options)
      : options_(options), slots_(options.buffers) {}

  char* Buf(int i) const { return mem_ + options_.buffer_bytes * i; }

  // Queues the rest of buffer i's transfer. The ring has two entries per
  // buffer and each buffer has at most one I/O queued, so a slot is free.
  void Prep(bool write, int fd, int i) {
    const Slot& s = slots_[i];
    char* p = Buf(i) + s.done;
    const unsigned len = static_cast<unsigned>(s.len - s.done);
    const uint64_t off = s.offset + s.done;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (write) {
      if (fixed_) {
        io_uring_prep_write_fixed(sqe, fd, p, len, off, i);
      } else {
        io_uring_prep_write(sqe, fd, p, len, off);
      }
    } else if (fixed_) {
      io_uring_prep_read_fixed(sqe, fd, p, len, off, i);
    } else {
      io_uring_prep_read(sqe, fd, p, len, off);
    }
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(i));
    ++prepared_;
  }

  // Hands the queued entries to the kernel. An error leaves them unsubmitted
  // (the ring is not used again) and sets *error if it is the first.
  void Submit(const std::string& path, absl::Status* error) {
    if (prepared_ == 0) return;
    int r;
    do {
      r = io_uring_submit(&ring_);
    } while (r == -EINTR);
    if (r < 0) {
      if (error->ok()) *error = Errno(-r, absl::StrCat("io_uring_submit for ", path));
      prepared_ = 0;
      return;
    }
    inflight_ += r;
    prepared_ -= r;
    if (prepared_ > 0 && error->ok()) {
      *error = absl::InternalError(absl::StrCat("io_uring_submit for ", path, " took ", r,
                                                " of ", r + prepared_, " requests"));
    }
    prepared_ = 0;
  }

  // Waits for one completion: its buffer and result (bytes or -errno).
  void Wait(int* i, int* res) {
    io_uring_cqe* cqe = nullptr;
    int r;
    do {
      r = io_uring_wait_cqe(&ring_, &cqe);
    } while (r == -EINTR);
    if (r < 0) {
      // Nothing was lost from the ring; only waiting failed. Report it as the
      // result of the oldest request rather than spin.
      *i = 0;
      *res = r;
      --inflight_;
      return;
    }
    *i = static_cast<int>(io_uring_cqe_get_data64(cqe));
    *res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    --inflight_;
  }

  // The error of a transfer that moved no bytes: a read past the end of the
  // file (it shrank while being read), or a write the kernel did not take.
  static absl::Status NoProgress(bool write, const std::string& path, uint64_t offset) {
    if (write) {
      return absl::InternalError(
          absl::StrCat("write of ", path, " at offset ", offset, " wrote nothing"));
    }
    return absl::DataLossError(absl::StrCat("checkpoint ", path,
                                            ": truncated: the file ends at offset ", offset,
                                            " while being read"));
  }

  static absl::Status Failed(bool write, const std::string& path, uint64_t offset, int err) {
    return Errno(err, absl::StrCat(write ? "write" : "read", " of ", path, " at offset ", offset));
  }

  // Moves [begin, end) in buffer-sized pieces, one in flight per buffer;
  // `fill` before each write, `consume` after each read, both in file order.
  // Short transfers continue where they stopped. After an error no new
  // transfer starts, but those in flight are waited for: the kernel may
  // still be using their buffers.
  absl::Status Transfer(bool write, int fd, const std::string& path, uint64_t begin,
                        uint64_t end, const Fill& fill, const Consume& consume) {
    if (!ring_ok_) return TransferSync(write, fd, path, begin, end, fill, consume);
    std::vector<int> free_list;
    for (int i = options_.buffers - 1; i >= 0; --i) free_list.push_back(i);
    std::deque<int> order;  // buffers in flight or done, in file order
    uint64_t next = begin;
    absl::Status error;
    while (true) {
      while (error.ok() && !order.empty() && slots_[order.front()].complete) {
        const Slot& s = slots_[order.front()];
        if (!write) consume(Buf(order.front()), s.offset, s.len);
        free_list.push_back(order.front());
        order.pop_front();
      }
      while (error.ok() && !free_list.empty() && next < end) {
        const int i = free_list.back();
        free_list.pop_back();
        const size_t len = std::min<uint64_t>(options_.buffer_bytes, end - next);
        slots_[i] = {next, len, 0, false};
        if (write) fill(Buf(i), next, len);
        order.push_back(i);
        Prep(write, fd, i);
        next += len;
      }
      Submit(path, &error);
      if (inflight_ == 0) break;
      int i, res;
      Wait(&i, &res);
      if (!error.ok()) continue;
      Slot& s = slots_[i];
      if (res < 0) {
        error = Failed(write, path, s.offset + s.done, -res);
      } else if (res == 0) {
        error = NoProgress(write, path, s.offset + s.done);
      } else if ((s.done += res) < s.len) {
        Prep(write, fd, i);
      } else {
        s.complete = true;
      }
    }
    return error;
  }

  // Transfer with pwrite/pread and buffer 0.
  absl::Status TransferSync(bool write, int fd, const std::string& path, uint64_t begin,
                            uint64_t end, const Fill& fill, const Consume& consume) {
    char* buf = Buf(0);
    for (uint64_t at = begin; at < end;) {
      const size_t len = std::min<uint64_t>(options_.buffer_bytes, end - at);
      if (write) fill(buf, at, len);
      for (size_t done = 0; done < len;) {
        const ssize_t r = write ? pwrite(fd, buf + done, len - done, at + done)
                                : pread(fd, buf + done, len - done, at + done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return Failed(write, path, at + done, errno);
        if (r == 0) return NoProgress(write, path, at + done);
        done += r;
      }
      if (!write) consume(buf, at, len);
      at += len;
    }
    return absl::OkStatus();
  }

  const CheckpointIoOptions options_;
  char* mem_ = nullptr;
  struct io_uring ring_{};
  bool ring_ok_ = false;
  bool fixed_ = false;
  std::vector<Slot> slots_;
  int prepared_ = 0;  // queued, not yet submitted
  int inflight_ = 0;  // submitted, completion not yet seen
};

absl::Status SyncDir(const std::string& dir) {
  const int fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(errno, absl::StrCat("open of directory ", dir));
  const int r = fsync(fd);
  const int err = errno;
  close(fd);
  if (r != 0) return Errno(err, absl::StrCat("fsync of directory ", dir));
  return absl::OkStatus();
}

// Writes the whole file at `tmp` (data, then the header with the data's
// checksums, then fsync) and closes it. *direct: try O_DIRECT; false on
// return when the file system refused it at open.
absl::Status WriteFile(BlockIo& io, const std::string& tmp, Layout& layout,
                       const std::vector<CheckpointSectionView>& sections, bool* direct) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  int fd = -1;
  if (*direct) {
    fd = open(tmp.c_str(), kFlags | O_DIRECT, 0644);
    if (fd < 0 && errno != EINVAL) return Errno(errno, absl::StrCat("create of ", tmp));
    if (fd < 0) *direct = false;  // the file system has no O_DIRECT (tmpfs before 6.6, ...)
  }
  if (fd < 0) {
    fd = open(tmp.c_str(), kFlags, 0644);
    if (fd < 0) return Errno(errno, absl::StrCat("create of ", tmp));
  }
  auto closer = absl::MakeCleanup([&] {
    if (fd >= 0) close(fd);
  });
  // Reserving the blocks up front fails early on a full disk and spares the
  // file system extending the file write by write. Not every file system
  // can; then the writes allocate.
  if (layout.file_end > 0 && fallocate(fd, 0, 0, layout.file_end) != 0 &&
      errno != EOPNOTSUPP) {
    return Errno(errno, absl::StrCat("fallocate of ", layout.file_end, " bytes for ", tmp));
  }

  size_t next = 0;
  std::vector<Entry>& entries = layout.entries;
  ZF_RETURN_IF_ERROR(io.Write(
      fd, tmp, layout.data_begin, layout.file_end, [&](char* buf, uint64_t off, size_t len) {
        size_t filled = 0;  // the gaps between sections are zeros
        ForEachPiece(entries, off, len, &next, [&](size_t s, uint64_t in_section,
                                                   size_t in_buf, size_t n) {
          std::memset(buf + filled, 0, in_buf - filled);
          CopyWithCrc(buf + in_buf, static_cast<const char*>(sections[s].data) + in_section, n,
                      &entries[s].crc, /*crc_of_dst=*/true);
          filled = in_buf + n;
        });
        std::memset(buf + filled, 0, len - filled);
      }));
  const std::string header = EncodeHeader(layout);
  ZF_RETURN_IF_ERROR(io.Write(fd, tmp, 0, layout.data_begin,
                              [&](char* buf, uint64_t off, size_t len) {
                                std::memcpy(buf, header.data() + off, len);
                              }));
  ZF_RETURN_IF_ERROR(io.Sync(fd, tmp));
  const int r = close(fd);
  fd = -1;
  if (r != 0) return Errno(errno, absl::StrCat("close of ", tmp));
  return absl::OkStatus();
}

std::atomic<uint64_t> temp_counter{0};

// The DATA_LOSS of a file that does not verify.
template <typename... Args>
absl::Status Loss(const std::string& path, const Args&... reason) {
  return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", reason...));
}

absl::Status PreadFully(int fd, const std::string& path, char* buf, size_t len) {
  for (size_t done = 0; done < len;) {
    const ssize_t r = pread(fd, buf + done, len - done, done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno(errno, absl::StrCat("read of ", path));
    if (r == 0) return Loss(path, "truncated: the file ends at offset ", done, " in the header");
    done += r;
  }
  return absl::OkStatus();
}

// Reads and checks the header of a file of `file_size` bytes.
absl::StatusOr<Layout> ReadHeader(int fd, const std::string& path, uint64_t file_size) {
  char fixed[kFixedBytes];
  if (file_size < sizeof(kMagic)) {
    return Loss(path, "truncated: ", file_size, " bytes, shorter than the magic");
  }
  ZF_RETURN_IF_ERROR(PreadFully(fd, path, fixed, std::min<uint64_t>(file_size, kFixedBytes)));
  if (std::memcmp(fixed, kMagic, sizeof(kMagic)) != 0) {
    return Loss(path, "bad magic: not a checkpoint file");
  }
  if (file_size < kFixedBytes) {
    return Loss(path, "truncated: ", file_size, " bytes, inside the header's first ",
                kFixedBytes);
  }
  const uint32_t version = Load<uint32_t>(fixed + 8);
  if (version != kVersion) {
    return Loss(path, "unknown format version ", version, " (this build reads ", kVersion, ")");
  }
  const uint32_t count = Load<uint32_t>(fixed + 12);
  if (count > kCheckpointMaxSections) {
    return Loss(path, "sizes inconsistent: ", count, " sections, over the limit of ",
                kCheckpointMaxSections, " (a corrupt header?)");
  }
  const size_t header_bytes = HeaderBytes(count);
  if (file_size < header_bytes) {
    return Loss(path, "truncated: ", file_size, " bytes, inside the header of ", count,
                " sections (", header_bytes, " bytes)");
  }
  std::string header(header_bytes, '\0');
  ZF_RETURN_IF_ERROR(PreadFully(fd, path, header.data(), header_bytes));
  const size_t covered = header_bytes - 4;
  const uint32_t stored = Load<uint32_t>(header.data() + covered);
  const uint32_t computed = Crc32c(header.data(), covered);
  if (stored != computed) {
    return Loss(path, "header checksum mismatch (stored ",
                absl::StrFormat("0x%08x, computed 0x%08x)", stored, computed));
  }

  Layout layout;
  layout.data_begin = AlignUp(header_bytes);
  uint64_t end = layout.data_begin;  // where the next section may start
  for (uint32_t i = 0; i < count; ++i) {
    const char* q = header.data() + kFixedBytes + kEntryBytes * i;
    Entry e;
    e.name.assign(q, strnlen(q, kCheckpointMaxSectionName));
    e.offset = Load<uint64_t>(q + 32);
    e.size = Load<uint64_t>(q + 40);
    e.crc = Load<uint32_t>(q + 48);
    if (!IsSectionName(e.name)) {
      return Loss(path, "section ", i, " has an invalid name \"", absl::CEscape(e.name), "\"");
    }
    // Sections in file order, each aligned, none overlapping; the bound on
    // offset and size keeps the sums below from overflowing (the size of
    // the file itself is checked after the last section).
    constexpr uint64_t kBound = uint64_t{1} << 62;
    if (e.offset % kAlign != 0 || e.offset < end || e.offset > kBound || e.size > kBound) {
      return Loss(path, "sizes inconsistent: section \"", e.name, "\" at offset ", e.offset,
                  " with ", e.size, " bytes (expected a 4096-aligned offset from ", end, ")");
    }
    end = AlignUp(e.offset + e.size);
    layout.entries.push_back(std::move(e));
  }
  layout.file_end = end;
  if (file_size < end) {
    return Loss(path, "truncated: ", file_size, " bytes, the header says ", end);
  }
  if (file_size > end) {
    return Loss(path, "sizes inconsistent: ", file_size, " bytes, the header says ", end);
  }
  return layout;
}

absl::Status ReadSections(const std::string& path, int fd, const Layout& layout,
                          const CheckpointIoOptions& options,
                          std::vector<CheckpointSection>* out, std::vector<uint32_t>* crcs) {
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<BlockIo> io, BlockIo::Create(options));
  crcs->assign(layout.entries.size(), 0);
  size_t next = 0;
  return io->Read(fd, path, layout.data_begin, layout.file_end,
                  [&](const char* buf, uint64_t off, size_t len) {
                    ForEachPiece(layout.entries, off, len, &next,
                                 [&](size_t s, uint64_t in_section, size_t in_buf, size_t n) {
                                   CopyWithCrc((*out)[s].data.data() + in_section, buf + in_buf,
                                               n, &(*crcs)[s], /*crc_of_dst=*/false);
                                 });
                  });
}

}  // namespace

absl::StatusOr<CheckpointWriteStats> WriteCheckpoint(
    const std::string& dir, const std::string& name,
    const std::vector<CheckpointSectionView>& sections) {
  return WriteCheckpoint(dir, name, sections, CheckpointIoOptions());
}

absl::StatusOr<CheckpointWriteStats> WriteCheckpoint(
    const std::string& dir, const std::string& name,
    const std::vector<CheckpointSectionView>& sections, const CheckpointIoOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  ZF_RETURN_IF_ERROR(ValidateFileName(name));
  ZF_RETURN_IF_ERROR(ValidateSections(sections));
  ZF_ASSIGN_OR_RETURN(std::unique_ptr<BlockIo> io, BlockIo::Create(options));

  const std::string path = JoinPath(dir, name);
  // The temporary name starts with '.', which no checkpoint name does, and
  // is unique per process and call, so concurrent writers never collide.
  const std::string tmp =
      JoinPath(dir, absl::StrCat(".", name.substr(0, 200), ".tmp.", getpid(), ".",
                                 temp_counter.fetch_add(1)));
  bool direct = options.try_direct_io;
  Layout layout = LayOut(sections);
  absl::Status s = WriteFile(*io, tmp, layout, sections, &direct);
  if (!s.ok() && direct && absl::IsInvalidArgument(s)) {
    // Some file systems accept O_DIRECT at open and refuse the I/O (EINVAL):
    // write through the page cache instead.
    unlink(tmp.c_str());
    direct = false;
    layout = LayOut(sections);
    s = WriteFile(*io, tmp, layout, sections, &direct);
  }
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    s = Errno(errno, absl::StrCat("rename of ", tmp, " to ", path));
  }
  if (!s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  ZF_RETURN_IF_ERROR(SyncDir(dir));

  CheckpointWriteStats stats;
  stats.bytes = static_cast<int64_t>(layout.file_end);
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.direct_io = direct;
  stats.io_uring = io->uses_io_uring();
  stats.fixed_buffers = io->fixed();
  return stats;
}

absl::StatusOr<std::vector<CheckpointSection>> ReadCheckpoint(const std::string& path) {
  return ReadCheckpoint(path, CheckpointIoOptions());
}

absl::StatusOr<std::vector<CheckpointSection>> ReadCheckpoint(
    const std::string& path, const CheckpointIoOptions& options) {
  ZF_RETURN_IF_ERROR(ValidateOptions(options));
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno(errno, absl::StrCat("open of ", path));
  auto closer = absl::MakeCleanup([fd] { close(fd); });
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno(errno, absl::StrCat("stat of ", path));
  // The header is small and read through the page cache; the data, all of
  // it 4096-aligned, with O_DIRECT where the file system allows.
  ZF_ASSIGN_OR_RETURN(const Layout layout, ReadHeader(fd, path, st.st_size));

  std::vector<CheckpointSection> out(layout.entries.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].name = layout.entries[i].name;
    out[i].data.resize(layout.entries[i].size);
  }
  std::vector<uint32_t> crcs;
  const int fl = fcntl(fd, F_GETFL);
  const bool direct =
      options.try_direct_io && fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
  absl::Status s = ReadSections(path, fd, layout, options, &out, &crcs);
  if (!s.ok() && direct && absl::IsInvalidArgument(s) && fcntl(fd, F_SETFL, fl) == 0) {
    s = ReadSections(path, fd, layout, options, &out, &crcs);  // O_DIRECT refused at read
  }
  ZF_RETURN_IF_ERROR(s);
  for (size_t i = 0; i < out.size(); ++i) {
    if (crcs[i] != layout.entries[i].crc) {
      return Loss(path, "section \"", out[i].name, "\" checksum mismatch (stored ",
                  absl::StrFormat("0x%08x, computed 0x%08x)", layout.entries[i].crc, crcs[i]));
    }
  }
  return out;
}

std::string CheckpointFileName(const std::string& prefix, uint64_t seq) {
  return absl::StrFormat("%s%020u%s", prefix, seq, kSuffix);
}

std::vector<std::string> ListCheckpoints(const std::string& dir, const std::string& prefix) {
  std::vector<std::pair<uint64_t, std::string>> found;
  DIR* d = opendir(dir.empty() ? "." : dir.c_str());
  if (d == nullptr) return {};
  while (const dirent* ent = readdir(d)) {
    const absl::string_view name = ent->d_name;
    if (name.size() != prefix.size() + kSeqDigits + kSuffix.size() ||
        !absl::StartsWith(name, prefix) || !absl::EndsWith(name, kSuffix)) {
      continue;
    }
    const absl::string_view digits = name.substr(prefix.size(), kSeqDigits);
    uint64_t seq = 0;
    bool ok = true;
    for (char c : digits) {
      const uint64_t d = static_cast<uint64_t>(c - '0');
      // 20 digits can exceed 2^64 - 1; such a name is not ours.
      if (c < '0' || c > '9' || seq > (UINT64_MAX - d) / 10) {
        ok = false;
        break;
      }
      seq = seq * 10 + d;
    }
    if (ok) found.emplace_back(seq, std::string(name));
  }
  closedir(d);
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> paths;
  for (const auto& f : found) paths.push_back(JoinPath(dir, f.second));
  return paths;
}

absl::Status PruneCheckpoints(const std::string& dir, const std::string& prefix, int keep) {
  if (keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PruneCheckpoints keeps at least 1 checkpoint, not ", keep));
  }
  const std::vector<std::string> paths = ListCheckpoints(dir, prefix);
  if (paths.size() <= static_cast<size_t>(keep)) return absl::OkStatus();
  absl::Status first;
  for (size_t i = keep; i < paths.size(); ++i) {
    // Another pruner may have been first: gone is what we wanted.
    if (unlink(paths[i].c_str()) != 0 && errno != ENOENT && first.ok()) {
      first = Errno(errno, absl::StrCat("unlink of ", paths[i]));
    }
  }
  ZF_RETURN_IF_ERROR(first);
  return SyncDir(dir);
}

}  // namespace zenflow
