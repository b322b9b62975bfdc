//===- PretrainedTest.cpp - Hugging Face weights in and out ---------------===//
//
// The loader and exporter of torch/Pretrained.h on directories written by
// the runtime's own safetensors writer: a round trip through the Hugging
// Face names is exact, bf16 / f16 files convert, a sharded set loads, and
// every bad directory is refused with a PretrainedError naming the file and
// the tensor. (Against transformers itself: test/pretrained/.)
//
//===----------------------------------------------------------------------===//

#include "mtprt/Errors.h"
#include "mtprt/HfNames.h"
#include "mtprt/torch/Model.h"
#include "mtprt/torch/Pretrained.h"

#include "Fixtures.h"

#include <gtest/gtest.h>

#include <fstream>

using namespace mtprt;
using namespace fixtures;

namespace {

ModelConfig gpt2(uint64_t seed = 0) {
  ModelConfig m = tinyModel();
  m.kind = BackboneKind::Gpt2;
  m.pointwise = PointwiseKind::Aten;
  m.positions = 12;
  m.seed = seed;
  return m;
}

std::vector<HeadConfig> heads() { return {classifyHead("cls", 2, 3)}; }

std::map<std::string, at::Tensor> params(const Model &m) {
  std::map<std::string, at::Tensor> out;
  for (const auto &[n, t] : m.namedParameters())
    out.emplace(n, t.detach().clone());
  return out;
}

/// The message loading `dir` into a gpt2() model throws ("" if none).
std::string loadError(const std::string &dir) {
  ModelConfig c = gpt2();
  c.weights = dir;
  try {
    Model m(c, heads());
  } catch (const PretrainedError &e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST(Pretrained, ExportThenLoadIsExact) {
  TempDir dir;
  Model source(gpt2(/*seed=*/1), heads());
  exportPretrained(source, dir.path + "/out");
  // The names and layout a transformers GPT2Model has.
  const auto stored = readSafetensors(dir.path + "/out/model.safetensors");
  ASSERT_EQ(stored.size(), hf::tensors(source.config()).size());
  EXPECT_EQ(stored[0].first, "wte.weight");
  for (const auto &[name, t] : stored)
    if (name == "h.0.attn.c_attn.weight")
      EXPECT_EQ(t.sizes(), at::IntArrayRef({16, 48})); // [in, out]
  std::ifstream config(dir.path + "/out/config.json");
  std::string text((std::istreambuf_iterator<char>(config)), {});
  EXPECT_NE(text.find("\"model_type\": \"gpt2\""), std::string::npos);
  EXPECT_NE(text.find("\"n_positions\": 12"), std::string::npos);

  ModelConfig c = gpt2(/*seed=*/2);
  c.weights = dir.path + "/out";
  Model loaded(c, heads());
  EXPECT_EQ(loaded.pretrainedSummary(),
            "loaded 28 backbone tensors from " + dir.path + "/out");
  const auto a = params(source), b = params(loaded);
  for (const auto &[name, t] : a) {
    if (name.rfind("head.", 0) == 0) // heads are not in model.safetensors
      continue;
    EXPECT_TRUE(at::equal(t, b.at(name))) << name;
  }
  // The heads' own file, by mtprt's names.
  const auto headFile = readSafetensors(dir.path + "/out/heads.safetensors");
  ASSERT_FALSE(headFile.empty());
  EXPECT_EQ(headFile[0].first.rfind("head.cls.", 0), 0u);
}

TEST(Pretrained, HalfPrecisionShardedAndPrefixedFilesLoad) {
  TempDir dir;
  Model source(gpt2(1), heads());
  exportPretrained(source, dir.path + "/ref");
  auto stored = readSafetensors(dir.path + "/ref/model.safetensors");
  // bf16, in two shards behind an index, with GPT2LMHeadModel's prefix and
  // a tied lm_head and an attention-mask buffer (both skipped silently)
  // and a pooler (skipped, listed).
  std::vector<std::pair<std::string, at::Tensor>> one, two;
  for (size_t i = 0; i < stored.size(); ++i)
    (i < stored.size() / 2 ? one : two)
        .emplace_back("transformer." + stored[i].first,
                      stored[i].second.to(at::kBFloat16));
  two.emplace_back("lm_head.weight", at::zeros({32, 16}));
  two.emplace_back("transformer.h.0.attn.bias", at::zeros({1, 1, 12, 12}));
  two.emplace_back("pooler.dense.weight", at::zeros({16, 16}));
  ASSERT_EQ(std::system(("mkdir -p '" + dir.path + "/sharded'").c_str()), 0);
  writeSafetensors(dir.path + "/sharded/a.safetensors", one);
  writeSafetensors(dir.path + "/sharded/b.safetensors", two);
  std::ofstream index(dir.path + "/sharded/model.safetensors.index.json");
  index << "{\"metadata\": {}, \"weight_map\": {";
  for (size_t i = 0; i < one.size(); ++i)
    index << (i ? ", " : "") << "\"" << one[i].first << "\": \"a.safetensors\"";
  for (const auto &[n, t] : two)
    index << ", \"" << n << "\": \"b.safetensors\"";
  index << "}}";
  index.close();

  ModelConfig c = gpt2(2);
  c.weights = dir.path + "/sharded";
  Model loaded(c, heads());
  EXPECT_EQ(loaded.pretrainedSummary(),
            "loaded 28 backbone tensors from " + dir.path +
                "/sharded; skipped 1 it has no parameter for: "
                "pooler.dense.weight");
  const auto a = params(source), b = params(loaded);
  EXPECT_TRUE(at::equal(b.at("embed.tok"),
                        a.at("embed.tok").to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(at::equal(
      b.at("layer1.attn.qkv.weight"),
      a.at("layer1.attn.qkv.weight").to(at::kBFloat16).to(at::kFloat)));
}

TEST(Pretrained, BadDirectoriesAreRefusedByName) {
  TempDir dir;
  const std::string d = dir.path;
  EXPECT_EQ(loadError(d + "/none"),
            "mtprt: pretrained " + d +
                "/none: has no model.safetensors or "
                "model.safetensors.index.json; point the backbone at a Hugging "
                "Face model directory");

  Model source(gpt2(1), heads());
  exportPretrained(source, d + "/ok");
  auto stored = readSafetensors(d + "/ok/model.safetensors");
  auto writeDir = [&](const std::string &name,
                      std::vector<std::pair<std::string, at::Tensor>> t) {
    ASSERT_EQ(std::system(("mkdir -p '" + d + "/" + name + "'").c_str()), 0);
    writeSafetensors(d + "/" + name + "/model.safetensors", t);
  };
  auto missing = stored;
  missing.erase(missing.begin() + 5);
  writeDir("missing", missing);
  EXPECT_EQ(loadError(d + "/missing"),
            "mtprt: pretrained " + d +
                "/missing: 1 of the backbone's 28 tensors are missing: "
                "h.0.attn.c_attn.bias (is it a gpt2 checkpoint with 2 "
                "layers?)");

  auto shape = stored;
  shape[1].second = at::zeros({13, 16});
  writeDir("shape", shape);
  EXPECT_EQ(loadError(d + "/shape"),
            "mtprt: pretrained " + d +
                "/shape/model.safetensors: tensor \"wpe.weight\" is [13, 16], "
                "the backbone's is [12, 16] (does the spec override a "
                "dimension the checkpoint fixes?)");

  auto ints = stored;
  ints[0].second = at::zeros({32, 16}, at::kLong);
  writeDir("ints", ints);
  EXPECT_EQ(loadError(d + "/ints"),
            "mtprt: pretrained " + d +
                "/ints/model.safetensors: tensor \"wte.weight\" is I64; a "
                "weight must be F32, F16, BF16 or F64");

  // A truncated file: its header runs past the end.
  ASSERT_EQ(std::system(("mkdir -p '" + d + "/cut' && head -c 64 '" + d +
                         "/ok/model.safetensors' > '" + d +
                         "/cut/model.safetensors'")
                            .c_str()),
            0);
  EXPECT_NE(loadError(d + "/cut").find(
                "/cut/model.safetensors: header length"),
            std::string::npos);

  // mtpc's own transformer has no names to load by.
  ModelConfig t = tinyModel();
  t.weights = d + "/ok";
  EXPECT_THROW(Model(t, heads()), PretrainedError);
}

// Llama's names are row ranges of the fused QKV and gate/up weights: the
// export splits them and the load puts them back exactly; without biases
// the parameters have none.
TEST(Pretrained, LlamaRowRangesRoundTrip) {
  TempDir dir;
  ModelConfig c = tinyModel();
  c.kind = BackboneKind::Llama;
  c.pointwise = PointwiseKind::Aten;
  c.dropout = 0.0;
  c.heads = 4;
  c.kvHeads = 2;
  c.attentionBias = false;
  c.mlpBias = false;
  c.ropeTheta = 500000.0;
  c.ropeScaling = {8.0, 1.0, 4.0, 4};
  c.seed = 1;
  Model source(c, heads());
  for (const auto &[name, t] : source.namedParameters())
    if (name.rfind("head.", 0) != 0) // the heads are mtpc's own
      EXPECT_EQ(name.find(".bias"), std::string::npos) << name;
  exportPretrained(source, dir.path + "/out");
  const auto stored = readSafetensors(dir.path + "/out/model.safetensors");
  std::map<std::string, at::Tensor> byName(stored.begin(), stored.end());
  // hidden 16, 4 heads of 4, 2 key/value heads: q 16 rows, k and v 8.
  EXPECT_EQ(byName.at("layers.0.self_attn.q_proj.weight").sizes(),
            at::IntArrayRef({16, 16}));
  EXPECT_EQ(byName.at("layers.0.self_attn.v_proj.weight").sizes(),
            at::IntArrayRef({8, 16}));
  EXPECT_TRUE(at::equal(byName.at("layers.1.mlp.up_proj.weight"),
                        params(source).at("layer2.mlp.up.weight")
                            .narrow(0, 32, 32)));
  EXPECT_EQ(byName.count("norm.weight"), 1u);

  c.seed = 2;
  c.weights = dir.path + "/out";
  Model loaded(c, heads());
  const auto a = params(source), b = params(loaded);
  for (const auto &[name, t] : a)
    if (name.rfind("head.", 0) != 0)
      EXPECT_TRUE(at::equal(t, b.at(name))) << name;
}
