// The model's configuration checks and its parameter layout (the tensors,
// their shapes and offsets in the flat parameter buffer; see transformer.h).

#include "gpu_worker/model/transformer.h"

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zenflow {
namespace model {

// ---------------------------------------------------------------------------
// Config and layout.

absl::Status ModelConfig::Validate() const {
  if (vocab < 2 || vocab > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab must be in [2, 256] (byte tokens), got ", vocab));
  }
  if (layers < 1 || layers > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers must be in [1, 256], got ", layers));
  }
  if (width < 1 || width > 16384) {
    return absl::InvalidArgumentError(
        absl::StrCat("width must be in [1, 16384], got ", width));
  }
  if (heads < 1 || heads > width || width % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heads must divide width; got width ", width, ", heads ", heads));
  }
  if (context < 1 || context > 8192) {
    return absl::InvalidArgumentError(
        absl::StrCat("context must be in [1, 8192], got ", context));
  }
  if (mlp_mult < 1 || mlp_mult > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("mlp_mult must be in [1, 16], got ", mlp_mult));
  }
  return absl::OkStatus();
}

size_t TensorInfo::numel() const {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

std::vector<TensorInfo> BuildTensorLayout(const ModelConfig& cfg) {
  std::vector<TensorInfo> out;
  size_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.offset = offset;
    offset += t.numel();
    out.push_back(std::move(t));
  };
  const int64_t v = cfg.vocab, d = cfg.width, f = int64_t{cfg.mlp_mult} * d;
  add("tok_emb", {v, d});
  add("pos_emb", {cfg.context, d});
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "ln1.g", {d});
    add(p + "ln1.b", {d});
    add(p + "attn.wqkv", {3 * d, d});
    add(p + "attn.bqkv", {3 * d});
    add(p + "attn.wo", {d, d});
    add(p + "attn.bo", {d});
    add(p + "ln2.g", {d});
    add(p + "ln2.b", {d});
    add(p + "mlp.w1", {f, d});
    add(p + "mlp.b1", {f});
    add(p + "mlp.w2", {d, f});
    add(p + "mlp.b2", {d});
  }
  add("ln_f.g", {d});
  add("ln_f.b", {d});
  add("head", {v, d});
  return out;
}

absl::StatusOr<size_t> NumParams(const ModelConfig& cfg) {
  ZF_RETURN_IF_ERROR(cfg.Validate());
  const std::vector<TensorInfo> t = BuildTensorLayout(cfg);
  return t.back().offset + t.back().numel();
}

ParamOffsets BuildParamOffsets(const ModelConfig& cfg) {
  const std::vector<TensorInfo> layout = BuildTensorLayout(cfg);
  auto off = [&layout](const std::string& name) -> size_t {
    for (const TensorInfo& t : layout) {
      if (t.name == name) return t.offset;
    }
    return 0;  // Unreachable: the layout defines every name asked for below.
  };
  ParamOffsets out;
  out.tok_emb = off("tok_emb");
  out.pos_emb = off("pos_emb");
  out.lnf_g = off("ln_f.g");
  out.lnf_b = off("ln_f.b");
  out.head = off("head");
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    LayerOffsets o;
    o.ln1_g = off(p + "ln1.g");
    o.ln1_b = off(p + "ln1.b");
    o.wqkv = off(p + "attn.wqkv");
    o.bqkv = off(p + "attn.bqkv");
    o.wo = off(p + "attn.wo");
    o.bo = off(p + "attn.bo");
    o.ln2_g = off(p + "ln2.g");
    o.ln2_b = off(p + "ln2.b");
    o.w1 = off(p + "mlp.w1");
    o.b1 = off(p + "mlp.b1");
    o.w2 = off(p + "mlp.w2");
    o.b2 = off(p + "mlp.b2");
    out.layers.push_back(o);
  }
  return out;
}

}  // namespace model
}  // namespace zenflow
