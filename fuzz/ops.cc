// The ops the fuzz targets apply to a job; see ops.h.
#include "fuzz/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype_proto.h"
#include "common/ucx_frame.h"
#include "fuzz/check.h"

namespace zenflow {
namespace fuzz {
namespace {

using codec_internal::Isa;

std::string Hex(const void* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[b[i] >> 4]);
    out.push_back(kDigits[b[i] & 15]);
  }
  return out;
}

// Same bits, or both NaN.
bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// The job's state; a job whose state cannot be read any more (deleted) has
// none, and is not compared.
std::map<std::string, std::string> StateOf(const FuzzJob& job) {
  absl::StatusOr<std::map<std::string, std::string>> s = JobState(job.job.get());
  if (!s.ok()) return {};
  return *std::move(s);
}

void CheckUnchanged(const std::map<std::string, std::string>& before, const FuzzJob& job,
                    const char* what, const absl::Status& why) {
  const std::map<std::string, std::string> after = StateOf(job);
  for (const auto& [name, bytes] : before) {
    auto it = after.find(name);
    FUZZ_CHECK(it != after.end() && it->second == bytes, "a rejected ", what,
               " changed section '", name, "' of the job's state; it was rejected with: ",
               why.ToString());
  }
  FUZZ_CHECK(after.size() == before.size(), "a rejected ", what,
             " changed the job's sections: ", why.ToString());
}

void UpOp(const FuzzJob& job, int32_t rank, bool ucx, absl::string_view body) {
  v1::UpMessage up;
  absl::Status read;
  if (ucx) {
    read = Registry()->CheckMessageSize(body.size());
    if (read.ok()) read = ParseFrame(std::string(body), &up);
  } else {
    read = ParseRequest(body, &up);
  }
  if (read.ok() && up.kind_case() == v1::UpMessage::kShard) {
    const v1::DType pd = up.shard().dtype() == v1::DTYPE_UNSPECIFIED ? job.spec.wire_dtype()
                                                                      : up.shard().dtype();
    absl::StatusOr<DType> dt = FromProto(pd, "shard dtype");
    if (dt.ok()) CheckCodec(*dt, up.shard().payload());
  }
  const std::map<std::string, std::string> before = StateOf(job);
  const absl::Status s = Ingest(job, rank, ucx ? Wire::kUcx : Wire::kGrpc, read, up);
  if (!s.ok()) CheckUnchanged(before, job, "up message", s);
}

void HandOffOp(const FuzzJob& job, absl::string_view body) {
  v1::HandOffRequest req;
  if (!ParseRequest(body, &req).ok()) return;
  const std::map<std::string, std::string> before = StateOf(job);
  absl::StatusOr<v1::HandOffResponse> resp = job.job->HandOff(req);
  if (!resp.ok()) {
    CheckUnchanged(before, job, "hand-off", resp.status());
    return;
  }
  for (const v1::ColumnState& given : resp->joining()) {
    const std::vector<int32_t> cols(given.columns().begin(), given.columns().end());
    absl::StatusOr<v1::ColumnState> held = job.job->ReadColumns(given.tensor(), cols);
    FUZZ_CHECK(held.ok(), "hand-off answered for tensor '", given.tensor(),
               "', which the job cannot read: ", held.status().ToString());
    FUZZ_CHECK(held->SerializeAsString() == given.SerializeAsString(),
               "hand-off answered state of tensor '", given.tensor(),
               "' that differs from the job's own");
  }
}

void ImportanceOp(const FuzzJob& job, absl::string_view body, uint64_t call) {
  v1::SubmitImportanceRequest req;
  if (!ParseRequest(body, &req).ok()) return;
  const std::map<std::string, std::string> before = StateOf(job);
  // Answered now (a rejection, or the last rank in), later, or at deletion.
  auto answered = std::make_shared<bool>(false);
  auto status = std::make_shared<absl::Status>();
  job.job->SubmitImportance(req, call, [answered, status](absl::StatusOr<v1::Selection> r) {
    FUZZ_CHECK(!*answered, "a SubmitImportance call was answered twice");
    *answered = true;
    *status = r.status();
  });
  // A call answered with an error before returning was rejected (a call it
  // replaced is answered ABORTED, but that is another call).
  if (*answered && !status->ok()) CheckUnchanged(before, job, "importance", *status);
}

}  // namespace

void CheckCodec(DType dtype, absl::string_view payload) {
  const size_t esize = DTypeSize(dtype);
  const size_t n = payload.size() / esize;
  if (n == 0) return;
  const char* src = payload.data();
  std::vector<float> ref(n), ref_acc(n);
  codec_internal::DecodeWith(Isa::kScalar, dtype, src, n, ref.data());
  for (size_t i = 0; i < n; ++i) ref_acc[i] = static_cast<float>(i % 5) - 2.0f;
  const std::vector<float> acc0 = ref_acc;
  codec_internal::DecodeAddWith(Isa::kScalar, dtype, src, n, ref_acc.data());
  size_t ref_bad = 0;
  const bool ref_finite = codec_internal::AllFiniteWith(Isa::kScalar, dtype, src, n, &ref_bad);
  FUZZ_CHECK(ref_finite == !std::any_of(ref.begin(), ref.end(),
                                        [](float x) { return !std::isfinite(x); }),
             "scalar AllFinite disagrees with the decoded values");
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!codec_internal::IsaSupported(isa)) continue;
    std::vector<float> out(n);
    codec_internal::DecodeWith(isa, dtype, src, n, out.data());
    std::vector<float> acc = acc0;
    codec_internal::DecodeAddWith(isa, dtype, src, n, acc.data());
    for (size_t i = 0; i < n; ++i) {
      FUZZ_CHECK(SameFloat(out[i], ref[i]), DTypeName(dtype), " Decode at isa ",
                 static_cast<int>(isa), " element ", i, " of ", n, " (bytes ",
                 Hex(src + i * esize, esize), ") gives ", out[i], ", scalar gives ", ref[i]);
      FUZZ_CHECK(SameFloat(acc[i], ref_acc[i]), DTypeName(dtype), " DecodeAdd at isa ",
                 static_cast<int>(isa), " element ", i, " gives ", acc[i], ", scalar gives ",
                 ref_acc[i]);
    }
    size_t bad = 0;
    const bool finite = codec_internal::AllFiniteWith(isa, dtype, src, n, &bad);
    FUZZ_CHECK(finite == ref_finite && (finite || bad == ref_bad), DTypeName(dtype),
               " AllFinite at isa ", static_cast<int>(isa), " says ", finite, " at ", bad,
               ", scalar says ", ref_finite, " at ", ref_bad);
    // Every encoded value is exactly representable as a float, so encoding
    // its decoded value gives back its bits.
    std::string back(n * esize, '\0');
    codec_internal::EncodeWith(isa, dtype, ref.data(), n, back.data());
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(ref[i])) continue;
      FUZZ_CHECK(std::memcmp(back.data() + i * esize, src + i * esize, esize) == 0,
                 DTypeName(dtype), " Encode(Decode(x)) at isa ", static_cast<int>(isa),
                 " element ", i, ": ", Hex(src + i * esize, esize), " came back as ",
                 Hex(back.data() + i * esize, esize));
    }
  }
}

void RunOps(const FuzzJob& job, FuzzInput* in) {
  const int world = job.spec.world_size();
  uint64_t call = 0;
  while (std::optional<FuzzRecord> r = in->Record()) {
    const int32_t rank = static_cast<int32_t>((r->tag / 4) % world);
    switch (static_cast<OpKind>(r->tag % 4)) {
      case kOpGrpcUp:
        UpOp(job, rank, /*ucx=*/false, r->body);
        break;
      case kOpUcxUp:
        UpOp(job, rank, /*ucx=*/true, r->body);
        break;
      case kOpHandOff:
        HandOffOp(job, r->body);
        break;
      case kOpImportance:
        ImportanceOp(job, r->body, ++call);
        break;
    }
  }
}

}  // namespace fuzz
}  // namespace zenflow
