// The model's parameter files (SaveParams, LoadParams; see transformer.h):
// a little-endian header naming the configuration, the fp32 values, and an
// FNV-1a checksum.

#include "gpu_worker/model/transformer.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {
namespace model {
namespace {

// ---------------------------------------------------------------------------
// Parameter file helpers.

constexpr char kMagic[8] = {'Z', 'F', 'M', 'O', 'D', 'E', 'L', '\0'};
constexpr uint32_t kFileVersion = 1;
constexpr size_t kHeaderBytes = 56;
constexpr size_t kChecksumBytes = 8;

void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint32_t GetU32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetU64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t Fnv1a64(const unsigned char* p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ULL;
  }
  return h;
}

}  // namespace

// ---------------------------------------------------------------------------
// Parameter files.

absl::Status SaveParams(const std::string& path, const ModelConfig& cfg,
                        const float* params, size_t n) {
  ZF_ASSIGN_OR_RETURN(const size_t expected, NumParams(cfg));
  if (n != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("SaveParams: config has ", expected,
                     " parameters but ", n, " were given"));
  }
  if (params == nullptr && n > 0) {
    return absl::InvalidArgumentError("SaveParams: null params");
  }
  std::string buf;
  buf.reserve(kHeaderBytes + n * sizeof(float) + kChecksumBytes);
  buf.append(kMagic, sizeof(kMagic));
  PutU32(&buf, kFileVersion);
  for (int v : {cfg.vocab, cfg.layers, cfg.width, cfg.heads, cfg.context,
                cfg.mlp_mult}) {
    PutU32(&buf, static_cast<uint32_t>(v));
  }
  PutU32(&buf, 0);  // Reserved.
  PutU64(&buf, cfg.seed);
  PutU64(&buf, n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &params[i], sizeof(bits));
    PutU32(&buf, bits);
  }
  PutU64(&buf, Fnv1a64(reinterpret_cast<const unsigned char*>(buf.data()),
                       buf.size()));

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::UnavailableError(
          absl::StrCat("SaveParams: cannot open ", tmp, " for writing"));
    }
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::UnavailableError(
          absl::StrCat("SaveParams: write to ", tmp, " failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("SaveParams: cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> LoadParams(const std::string& path,
                                              ModelConfig* cfg_out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("LoadParams: cannot open ", path));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string buf = ss.str();
  const auto* p = reinterpret_cast<const unsigned char*>(buf.data());
  if (buf.size() < sizeof(kMagic) ||
      std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadParams: ", path, " is not a ZenFlow model file"));
  }
  if (buf.size() < kHeaderBytes + kChecksumBytes) {
    return absl::DataLossError(absl::StrCat(
        "LoadParams: ", path, " is truncated (", buf.size(), " bytes)"));
  }
  const uint32_t version = GetU32(p + 8);
  if (version != kFileVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadParams: ", path, " has unsupported version ",
                     version, " (expected ", kFileVersion, ")"));
  }
  ModelConfig cfg;
  cfg.vocab = static_cast<int32_t>(GetU32(p + 12));
  cfg.layers = static_cast<int32_t>(GetU32(p + 16));
  cfg.width = static_cast<int32_t>(GetU32(p + 20));
  cfg.heads = static_cast<int32_t>(GetU32(p + 24));
  cfg.context = static_cast<int32_t>(GetU32(p + 28));
  cfg.mlp_mult = static_cast<int32_t>(GetU32(p + 32));
  cfg.seed = GetU64(p + 40);
  const uint64_t n = GetU64(p + 48);
  const uint64_t max_n = (buf.size() - kHeaderBytes - kChecksumBytes) / 4;
  if (n > max_n ||
      buf.size() != kHeaderBytes + n * sizeof(float) + kChecksumBytes) {
    return absl::DataLossError(absl::StrCat(
        "LoadParams: ", path, " size mismatch: header declares ", n,
        " parameters (", kHeaderBytes + n * 4 + kChecksumBytes,
        " bytes) but the file has ", buf.size(), " bytes"));
  }
  const size_t body = buf.size() - kChecksumBytes;
  const uint64_t stored = GetU64(p + body);
  const uint64_t actual = Fnv1a64(p, body);
  if (stored != actual) {
    return absl::DataLossError(
        absl::StrCat("LoadParams: ", path, " checksum mismatch (corrupted)"));
  }
  if (absl::Status s = cfg.Validate(); !s.ok()) {
    return absl::DataLossError(absl::StrCat(
        "LoadParams: ", path, " holds an invalid config: ", s.message()));
  }
  ZF_ASSIGN_OR_RETURN(const size_t expected, NumParams(cfg));
  if (n != expected) {
    return absl::DataLossError(
        absl::StrCat("LoadParams: ", path, " declares ", n,
                     " parameters but its config needs ", expected));
  }
  std::vector<float> params(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = GetU32(p + kHeaderBytes + 4 * i);
    std::memcpy(&params[i], &bits, sizeof(bits));
  }
  if (cfg_out != nullptr) *cfg_out = cfg;
  return params;
}

}  // namespace model
}  // namespace zenflow
