// Byte-level text corpus with deterministic batch sampling. See text_data.h.

#include "gpu_worker/model/text_data.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/random.h"

namespace zenflow {
namespace model {

absl::StatusOr<TextData> TextData::FromBytes(std::string bytes,
                                             double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction <= 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("val_fraction must be in [0, 0.5], got ", val_fraction));
  }
  if (bytes.size() < kMinFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("text has ", bytes.size(), " bytes; need at least ",
                     kMinFileBytes));
  }
  const size_t val =
      static_cast<size_t>(static_cast<double>(bytes.size()) * val_fraction);
  const size_t train = bytes.size() - val;
  return TextData(std::move(bytes), train);
}

absl::StatusOr<TextData> TextData::FromFile(const std::string& path,
                                            double val_fraction) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<TextData> data = FromBytes(ss.str(), val_fraction);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat(path, ": ", data.status().message()));
  }
  return data;
}

void TextData::SampleBatch(bool validation, int batch, int seq, uint64_t step,
                           uint64_t seed, std::vector<uint8_t>* out) const {
  const size_t width = static_cast<size_t>(seq) + 1;
  out->resize(static_cast<size_t>(batch) * width);
  size_t begin = 0;
  size_t size = train_size_;
  if (validation && val_size() > 0) {
    begin = train_size_;
    size = val_size();
  }
  const uint8_t* data = reinterpret_cast<const uint8_t*>(bytes_.data()) + begin;
  // Window starts in [0, size - width] when the split is long enough.
  const size_t starts = size >= width ? size - width + 1 : size;
  uint64_t state = Mix64(seed ^ 0x6A09E667F3BCC909ULL) ^ HashRandom(step) ^
                   (validation ? 0xBB67AE8584CAA73BULL : 0);
  for (int b = 0; b < batch; ++b) {
    const size_t start = static_cast<size_t>(NextRandom(&state) % starts);
    uint8_t* row = out->data() + static_cast<size_t>(b) * width;
    for (size_t i = 0; i < width; ++i) row[i] = data[(start + i) % size];
  }
}

std::string DefaultTextPath() {
  static const char* const kCandidates[] = {
      "/usr/share/common-licenses/GPL-3",
      "/usr/share/common-licenses/GPL-2",
      "/usr/share/common-licenses/Apache-2.0",
      "/usr/share/common-licenses/LGPL-2.1",
  };
  for (const char* path : kCandidates) {
    std::ifstream in(path, std::ios::binary);
    if (in) return path;
  }
  return "";
}

}  // namespace model
}  // namespace zenflow
