// Byte-level text corpus for the reference model: a file split into a
// training part and a validation tail, sampled as deterministic windows.

#ifndef ZENFLOW_GPU_WORKER_MODEL_TEXT_DATA_H_
#define ZENFLOW_GPU_WORKER_MODEL_TEXT_DATA_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace zenflow {
namespace model {

// A text file held in memory; the last `val_fraction` of its bytes is the
// validation split, the rest the training split.
//
// Thread-safe: immutable after construction; const methods may be called
// concurrently.
class TextData {
 public:
  // Files shorter than this are rejected (a few contexts of the largest
  // configuration the experiments use).
  static constexpr size_t kMinFileBytes = 1024;

  // Reads `path`. val_fraction must be in [0, 0.5]; the validation split is
  // floor(size * val_fraction) bytes. Errors: NotFound (cannot open),
  // InvalidArgument (bad fraction, file shorter than kMinFileBytes).
  static absl::StatusOr<TextData> FromFile(const std::string& path,
                                           double val_fraction = 0.1);

  // Same, from bytes already in memory.
  static absl::StatusOr<TextData> FromBytes(std::string bytes,
                                            double val_fraction = 0.1);

  // Fills *out with `batch` windows of seq + 1 consecutive bytes
  // ([batch][seq + 1], row-major) from the chosen split. The window starts
  // are a pure function of (seed, step, validation, batch, seq), drawn from a
  // splitmix64 stream. A split shorter than seq + 1 bytes is read cyclically;
  // an empty validation split falls back to the training split.
  void SampleBatch(bool validation, int batch, int seq, uint64_t step,
                   uint64_t seed, std::vector<uint8_t>* out) const;

  size_t train_size() const { return train_size_; }
  size_t val_size() const { return bytes_.size() - train_size_; }
  const std::string& bytes() const { return bytes_; }

 private:
  TextData(std::string bytes, size_t train_size)
      : bytes_(std::move(bytes)), train_size_(train_size) {}

  std::string bytes_;
  size_t train_size_;
};

// The first existing of a few texts that every Debian system carries
// (base-files installs /usr/share/common-licenses/*), or "" if none exists.
std::string DefaultTextPath();

}  // namespace model
}  // namespace zenflow

#endif  // ZENFLOW_GPU_WORKER_MODEL_TEXT_DATA_H_
