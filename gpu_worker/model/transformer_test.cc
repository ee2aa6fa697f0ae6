// Tests of the reference transformer (gradient check, thread determinism,
// training progress, parameter files) and of TextData.

#include "gpu_worker/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/model/text_data.h"
#include "gtest/gtest.h"

namespace zenflow {
namespace model {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::vector<uint8_t> RandomTokens(int batch, int seq, int vocab,
                                  uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> t(static_cast<size_t>(batch) * (seq + 1));
  for (uint8_t& x : t) x = static_cast<uint8_t>(rng() % vocab);
  return t;
}

// Initializes params and then perturbs every tensor (gains, biases
// included) so that every backward term carries a sizable gradient.
std::vector<float> PerturbedParams(const Transformer& model, uint32_t seed,
                                   float scale) {
  std::vector<float> p(model.num_params());
  model.InitParams(p.data());
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  for (float& x : p) x += nd(rng);
  return p;
}

ModelConfig TinyConfig() {
  ModelConfig cfg;
  cfg.vocab = 256;
  cfg.layers = 2;
  cfg.width = 16;
  cfg.heads = 2;
  cfg.context = 8;
  cfg.mlp_mult = 4;
  cfg.seed = 7;
  return cfg;
}

TEST(ModelConfigTest, Validate) {
  EXPECT_TRUE(ModelConfig().Validate().ok());
  ModelConfig c;
  c.heads = 5;
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
  c = ModelConfig();
  c.vocab = 300;
  EXPECT_FALSE(c.Validate().ok());
  c = ModelConfig();
  c.context = 0;
  EXPECT_FALSE(c.Validate().ok());
  EXPECT_FALSE(Transformer::Create(c, 1).ok());
  EXPECT_FALSE(Transformer::Create(ModelConfig(), 0).ok());
}

TEST(TransformerTest, LayoutIsContiguousAndNamed) {
  ModelConfig cfg;
  auto model = Transformer::Create(cfg, 1).value();
  const auto& t = model->tensors();
  size_t offset = 0;
  for (const TensorInfo& ti : t) {
    EXPECT_EQ(ti.offset, offset) << ti.name;
    offset += ti.numel();
  }
  EXPECT_EQ(offset, model->num_params());
  EXPECT_EQ(NumParams(cfg).value(), model->num_params());
  const int d = cfg.width;
  auto shape = [&](const std::string& name) {
    const int i = model->FindTensor(name);
    EXPECT_GE(i, 0) << name;
    return i >= 0 ? t[i].shape : std::vector<int64_t>{};
  };
  EXPECT_EQ(shape("tok_emb"), (std::vector<int64_t>{256, d}));
  EXPECT_EQ(shape("pos_emb"), (std::vector<int64_t>{cfg.context, d}));
  EXPECT_EQ(shape("layers.1.attn.wqkv"), (std::vector<int64_t>{3 * d, d}));
  EXPECT_EQ(shape("layers.1.attn.bqkv"), (std::vector<int64_t>{3 * d}));
  EXPECT_EQ(shape("layers.0.attn.wo"), (std::vector<int64_t>{d, d}));
  EXPECT_EQ(shape("layers.0.mlp.w1"), (std::vector<int64_t>{4 * d, d}));
  EXPECT_EQ(shape("layers.0.mlp.w2"), (std::vector<int64_t>{d, 4 * d}));
  EXPECT_EQ(shape("layers.0.ln2.g"), (std::vector<int64_t>{d}));
  EXPECT_EQ(shape("ln_f.b"), (std::vector<int64_t>{d}));
  EXPECT_EQ(shape("head"), (std::vector<int64_t>{256, d}));
  EXPECT_EQ(model->FindTensor("nope"), -1);
}

// BuildParamOffsets (the table both models index their buffers with) names
// every tensor once, in the layout's documented order.
TEST(TransformerTest, ParamOffsetsFollowLayout) {
  ModelConfig cfg;
  cfg.layers = 3;
  const ParamOffsets off = BuildParamOffsets(cfg);
  ASSERT_EQ(off.layers.size(), 3u);
  std::vector<size_t> got = {off.tok_emb, off.pos_emb};
  for (const LayerOffsets& o : off.layers) {
    got.insert(got.end(), {o.ln1_g, o.ln1_b, o.wqkv, o.bqkv, o.wo, o.bo,
                           o.ln2_g, o.ln2_b, o.w1, o.b1, o.w2, o.b2});
  }
  got.insert(got.end(), {off.lnf_g, off.lnf_b, off.head});
  std::vector<size_t> want;
  for (const TensorInfo& t : BuildTensorLayout(cfg)) want.push_back(t.offset);
  EXPECT_EQ(got, want);
}

TEST(TransformerTest, InitIsDeterministicAndTyped) {
  ModelConfig cfg = TinyConfig();
  auto a = Transformer::Create(cfg, 1).value();
  auto b = Transformer::Create(cfg, 2).value();
  std::vector<float> pa(a->num_params()), pb(b->num_params());
  a->InitParams(pa.data());
  b->InitParams(pb.data());
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * 4), 0);
  for (const TensorInfo& t : a->tensors()) {
    const float* p = pa.data() + t.offset;
    const size_t n = t.numel();
    if (t.shape.size() == 2) {
      double ss = 0;
      for (size_t i = 0; i < n; ++i) ss += double(p[i]) * p[i];
      const double sd = std::sqrt(ss / n);
      EXPECT_GT(sd, 0.015) << t.name;
      EXPECT_LT(sd, 0.025) << t.name;
    } else {
      const bool gain = t.name.size() > 2 &&
                        t.name.compare(t.name.size() - 2, 2, ".g") == 0;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(p[i], gain ? 1.0f : 0.0f) << t.name;
      }
    }
  }
  cfg.seed = 8;
  auto c = Transformer::Create(cfg, 1).value();
  std::vector<float> pc(c->num_params());
  c->InitParams(pc.data());
  EXPECT_NE(std::memcmp(pa.data(), pc.data(), pa.size() * 4), 0);
}

TEST(TransformerTest, ForwardArgumentErrors) {
  ModelConfig cfg = TinyConfig();
  cfg.vocab = 16;
  auto model = Transformer::Create(cfg, 1).value();
  std::vector<float> p(model->num_params()), g(p.size());
  model->InitParams(p.data());
  EXPECT_EQ(model->Backward(p.data(), g.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<uint8_t> tok = RandomTokens(2, 8, 16, 1);
  EXPECT_FALSE(model->Forward(p.data(), tok.data(), 2, 9).ok());
  EXPECT_FALSE(model->Forward(p.data(), tok.data(), 0, 8).ok());
  tok[3] = 16;
  EXPECT_EQ(model->Forward(p.data(), tok.data(), 2, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  tok[3] = 15;
  auto loss = model->Forward(p.data(), tok.data(), 2, 8);
  ASSERT_TRUE(loss.ok());
  // Near-uniform predictions at init.
  EXPECT_NEAR(*loss, std::log(16.0), 0.1);
  EXPECT_TRUE(model->Backward(p.data(), g.data()).ok());
}

// Central differences of the double-accumulated loss of the float model
// against Backward for 8 entries of EVERY tensor (232 in all). Returns the
// largest relative error among entries with |gradient| > 1e-3.
double CheckGradients(float eps, double rel_tol, double abs_tol) {
  const ModelConfig cfg = TinyConfig();
  const int batch = 2, seq = 8;
  auto model = Transformer::Create(cfg, 2).value();
  std::vector<float> params = PerturbedParams(*model, 11, 0.3f);
  const std::vector<uint8_t> tokens = RandomTokens(batch, seq, cfg.vocab, 5);
  EXPECT_TRUE(model->Forward(params.data(), tokens.data(), batch, seq).ok());
  std::vector<float> grads(params.size(), 123.0f);
  EXPECT_TRUE(model->Backward(params.data(), grads.data()).ok());

  std::mt19937 rng(3);
  const size_t per_tensor = 8;
  double max_rel = 0.0;
  std::string worst;
  int checked = 0;
  for (const TensorInfo& t : model->tensors()) {
    for (size_t s = 0; s < per_tensor; ++s) {
      size_t idx;
      if (t.name == "tok_emb") {
        // Only rows of input tokens get gradient; sample those.
        const int b = rng() % batch, pos = rng() % seq;
        idx = size_t{tokens[b * (seq + 1) + pos]} * cfg.width +
              rng() % cfg.width;
      } else {
        idx = rng() % t.numel();
      }
      const size_t at = t.offset + idx;
      const float orig = params[at];
      const float hi = orig + eps, lo = orig - eps;
      params[at] = hi;
      EXPECT_TRUE(model->Forward(params.data(), tokens.data(), batch, seq).ok());
      const double loss_hi = model->last_loss();
      params[at] = lo;
      EXPECT_TRUE(model->Forward(params.data(), tokens.data(), batch, seq).ok());
      const double loss_lo = model->last_loss();
      params[at] = orig;
      const double num = (loss_hi - loss_lo) / (double(hi) - double(lo));
      const double ana = grads[at];
      const double mag = std::max(std::fabs(num), std::fabs(ana));
      EXPECT_LE(std::fabs(num - ana), rel_tol * mag + abs_tol)
          << t.name << "[" << idx << "] numeric " << num << " analytic "
          << ana << " (eps " << eps << ")";
      if (mag > 1e-3) {
        const double rel = std::fabs(num - ana) / mag;
        if (rel > max_rel) {
          max_rel = rel;
          worst = t.name;
        }
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 200);
  std::printf(
      "gradient check eps %g: %d parameters, max relative error %.3g (%s)\n",
      eps, checked, max_rel, worst.c_str());
  return max_rel;
}

// eps 1e-3: float rounding of the forward pass (~6e-8 in the loss) limits
// the numeric gradient to ~3e-5 absolute, hence the looser tolerance.
TEST(TransformerTest, GradientMatchesFiniteDifferencesEps1e3) {
  CheckGradients(1e-3f, 2e-2, 1e-4);
}

// eps 1e-2: rounding noise drops ten-fold while the O(eps^2) truncation
// error stays small, so the check can be tight.
TEST(TransformerTest, GradientMatchesFiniteDifferencesEps1e2) {
  EXPECT_LT(CheckGradients(1e-2f, 1e-2, 3e-5), 1e-2);
}

TEST(TransformerTest, ResultsDoNotDependOnThreadCount) {
  ModelConfig cfg;
  cfg.vocab = 200;
  cfg.layers = 2;
  cfg.width = 40;  // Exercises the partial column tile.
  cfg.heads = 4;
  cfg.context = 16;
  const int batch = 3, seq = 13;  // 39 rows: a partial row tile.
  const std::vector<uint8_t> tokens = RandomTokens(batch, seq, cfg.vocab, 9);
  std::vector<float> ref_grads;
  double ref_loss = 0;
  for (int threads : {1, 2, 3}) {
    auto model = Transformer::Create(cfg, threads).value();
    std::vector<float> params = PerturbedParams(*model, 4, 0.1f);
    ASSERT_TRUE(model->Forward(params.data(), tokens.data(), batch, seq).ok());
    std::vector<float> grads(params.size());
    ASSERT_TRUE(model->Backward(params.data(), grads.data()).ok());
    if (threads == 1) {
      ref_loss = model->last_loss();
      ref_grads = grads;
      continue;
    }
    EXPECT_EQ(model->last_loss(), ref_loss) << threads << " threads";
    EXPECT_EQ(std::memcmp(grads.data(), ref_grads.data(), grads.size() * 4),
              0)
        << threads << " threads";
  }
}

TEST(TransformerTest, BackwardOverwritesGradients) {
  const ModelConfig cfg = TinyConfig();
  auto model = Transformer::Create(cfg, 1).value();
  std::vector<float> params = PerturbedParams(*model, 2, 0.1f);
  const std::vector<uint8_t> tokens = RandomTokens(2, 8, cfg.vocab, 2);
  ASSERT_TRUE(model->Forward(params.data(), tokens.data(), 2, 8).ok());
  std::vector<float> a(params.size(), 0.0f), b(params.size(), 7.5f);
  ASSERT_TRUE(model->Backward(params.data(), a.data()).ok());
  ASSERT_TRUE(model->Backward(params.data(), b.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

// Plain AdamW on a repetitive text must drive the loss down clearly.
TEST(TransformerTest, AdamWTrainingReducesLoss) {
  std::string text;
  while (text.size() < 8000) {
    text += "the quick brown fox jumps over the lazy dog. ";
    text += "pack my box with five dozen liquor jugs! ";
  }
  TextData data = TextData::FromBytes(text, 0.1).value();
  ModelConfig cfg;
  cfg.layers = 2;
  cfg.width = 32;
  cfg.heads = 4;
  cfg.context = 32;
  cfg.seed = 3;
  auto model = Transformer::Create(cfg, 2).value();
  std::vector<float> p(model->num_params()), g(p.size()), m(p.size()),
      v(p.size());
  model->InitParams(p.data());
  const int batch = 8, seq = 32, steps = 300;
  const float lr = 3e-3f, b1 = 0.9f, b2 = 0.99f, wd = 0.01f, eps = 1e-8f;
  std::vector<uint8_t> tokens;
  float first = 0, last = 0;
  for (int step = 1; step <= steps; ++step) {
    data.SampleBatch(false, batch, seq, step, 42, &tokens);
    auto loss = model->Forward(p.data(), tokens.data(), batch, seq);
    ASSERT_TRUE(loss.ok());
    ASSERT_TRUE(std::isfinite(*loss));
    if (step == 1) first = *loss;
    if (step > steps - 10) last += *loss / 10;
    ASSERT_TRUE(model->Backward(p.data(), g.data()).ok());
    const float c1 = 1.0f - std::pow(b1, step), c2 = 1.0f - std::pow(b2, step);
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr * ((m[i] / c1) / (std::sqrt(v[i] / c2) + eps) + wd * p[i]);
    }
  }
  data.SampleBatch(true, batch, seq, 0, 42, &tokens);
  const float val = model->Forward(p.data(), tokens.data(), batch, seq).value();
  std::printf("AdamW: first loss %.3f, last-10 mean %.3f, val %.3f\n", first,
              last, val);
  EXPECT_GT(first, 5.0f);
  EXPECT_LT(last, 3.0f);
  EXPECT_LT(val, 3.0f);
}

TEST(ParamsFileTest, RoundTripAndCorruption) {
  const ModelConfig cfg = TinyConfig();
  auto model = Transformer::Create(cfg, 1).value();
  std::vector<float> params = PerturbedParams(*model, 6, 0.5f);
  const std::string path = TempPath("params.zfm");
  ASSERT_TRUE(SaveParams(path, cfg, params.data(), params.size()).ok());
  ModelConfig loaded_cfg;
  loaded_cfg.seed = 99;
  auto loaded = LoadParams(path, &loaded_cfg);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded_cfg == cfg);
  ASSERT_EQ(loaded->size(), params.size());
  EXPECT_EQ(std::memcmp(loaded->data(), params.data(), params.size() * 4), 0);

  EXPECT_EQ(SaveParams(path, cfg, params.data(), params.size() - 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadParams(TempPath("missing.zfm"), nullptr).status().code(),
            absl::StatusCode::kNotFound);

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in),
                 std::istreambuf_iterator<char>());
  }
  auto write = [&](const std::string& name, const std::string& content) {
    const std::string p = TempPath(name);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(content.data(), content.size());
    return p;
  };
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  auto s = LoadParams(write("flipped.zfm", flipped), nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s;

  s = LoadParams(write("short.zfm", bytes.substr(0, bytes.size() - 12)),
                 nullptr)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("size"), std::string::npos) << s;

  s = LoadParams(write("text.zfm", "hello, this is not a model file"),
                 nullptr)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not a ZenFlow model"), std::string::npos) << s;

  std::string version = bytes;
  version[8] = 9;
  s = LoadParams(write("version.zfm", version), nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("version"), std::string::npos) << s;
}

TEST(TextDataTest, SplitSizesAndErrors) {
  std::string text(2000, 'x');
  TextData data = TextData::FromBytes(text, 0.1).value();
  EXPECT_EQ(data.train_size(), 1800u);
  EXPECT_EQ(data.val_size(), 200u);
  EXPECT_EQ(TextData::FromBytes(std::string(500, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(TextData::FromBytes(text, 0.9).ok());
  EXPECT_FALSE(TextData::FromBytes(text, -0.1).ok());
  EXPECT_EQ(TextData::FromFile(TempPath("no_such_text")).status().code(),
            absl::StatusCode::kNotFound);
  const std::string short_path = TempPath("short.txt");
  {
    std::ofstream out(short_path);
    out << "too short";
  }
  EXPECT_EQ(TextData::FromFile(short_path).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string ok_path = TempPath("ok.txt");
  {
    std::ofstream out(ok_path, std::ios::binary);
    out << std::string(3000, 'y');
  }
  auto from_file = TextData::FromFile(ok_path, 0.2);
  ASSERT_TRUE(from_file.ok());
  EXPECT_EQ(from_file->train_size(), 2400u);
  EXPECT_EQ(from_file->val_size(), 600u);
}

TEST(TextDataTest, SampleBatchIsDeterministicAndSplitAware) {
  std::string text;
  for (int i = 0; i < 4500; ++i) text.push_back('a' + i % 26);
  for (int i = 0; i < 500; ++i) text.push_back('0' + i % 10);
  TextData data = TextData::FromBytes(text, 0.1).value();
  ASSERT_EQ(data.val_size(), 500u);
  std::vector<uint8_t> a, b, c;
  data.SampleBatch(false, 6, 64, 17, 1, &a);
  data.SampleBatch(false, 6, 64, 17, 1, &b);
  ASSERT_EQ(a.size(), 6u * 65);
  EXPECT_EQ(a, b);
  data.SampleBatch(false, 6, 64, 18, 1, &c);
  EXPECT_NE(a, c);
  data.SampleBatch(false, 6, 64, 17, 2, &c);
  EXPECT_NE(a, c);
  for (uint8_t x : a) EXPECT_TRUE(x >= 'a' && x <= 'z');
  // Windows are consecutive bytes of the text.
  for (int r = 0; r < 6; ++r) {
    for (int i = 1; i < 65; ++i) {
      EXPECT_EQ(a[r * 65 + i], 'a' + (a[r * 65 + i - 1] - 'a' + 1) % 26);
    }
  }
  data.SampleBatch(true, 6, 64, 17, 1, &c);
  for (uint8_t x : c) EXPECT_TRUE(x >= '0' && x <= '9');
  // A window longer than the validation split wraps around, stays inside.
  data.SampleBatch(true, 2, 600, 3, 1, &c);
  for (uint8_t x : c) EXPECT_TRUE(x >= '0' && x <= '9');
}

TEST(TextDataTest, DefaultTextExists) {
  const std::string path = DefaultTextPath();
  if (path.empty()) GTEST_SKIP() << "no Debian license texts on this system";
  auto data = TextData::FromFile(path);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_GT(data->train_size(), 8000u);
}

}  // namespace
}  // namespace model
}  // namespace zenflow
