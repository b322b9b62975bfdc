//===- HfNames.h - Hugging Face tensor names of a backbone ------*- C++ -*-===//
//
// Which tensors a Hugging Face checkpoint of a backbone family holds, their
// stored shapes, and which runtime parameter (or rows of one) each fills —
// the one map the compiler's `mtpc check` (shapes against the file's header)
// and the runtime's loader and exporter share. Names are the base model's
// (GPT2Model's `h.0.attn.c_attn.weight`); a task model's prefix
// (GPT2LMHeadModel's `transformer.`) is stripped on reading. Header-only,
// torch-free and LLVM-free.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_HFNAMES_H
#define MTPRT_HFNAMES_H

#include "mtprt/Config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mtprt::hf {

/// One stored tensor.
struct Tensor {
  std::string name;           ///< the base model's name
  std::vector<int64_t> shape; ///< as stored
  std::string param;          ///< the runtime's parameter (Model::namedParameters)
  /// Stored [in, out] (GPT-2's Conv1D), the parameter [out, in].
  bool transposed = false;
  /// Rows [rowOffset, rowOffset + shape[0]) of the parameter (Llama's q, k
  /// and v in the fused QKV projection, gate and up in the MLP's); -1: all.
  int64_t rowOffset = -1;
};

/// The `model_type` of config.json for a family ("" for mtpc's own).
inline const char *modelType(BackboneKind kind) {
  switch (kind) {
  case BackboneKind::Gpt2:
    return "gpt2";
  case BackboneKind::Llama:
    return "llama";
  case BackboneKind::Bert:
    return "bert";
  case BackboneKind::Transformer:
    break;
  }
  return "";
}

/// The base model's tensors for `c`, in the order the exporter writes them.
inline std::vector<Tensor> tensors(const ModelConfig &c) {
  std::vector<Tensor> out;
  const int64_t h = c.hidden, f = c.ffn;
  if (c.kind == BackboneKind::Llama) {
    const int64_t d = h / c.heads, q = c.heads * d, kv = c.kvHeadCount() * d;
    out.push_back({"embed_tokens.weight", {c.vocab, h}, "embed.tok"});
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string n = "layers." + std::to_string(l) + ".";
      const std::string p = "layer" + std::to_string(l + 1) + ".";
      out.push_back({n + "input_layernorm.weight", {h}, p + "attn.norm.weight"});
      const std::pair<const char *, std::pair<int64_t, int64_t>> qkv[] = {
          {"q_proj", {0, q}}, {"k_proj", {q, kv}}, {"v_proj", {q + kv, kv}}};
      for (const auto &[name, rows] : qkv) {
        out.push_back({n + "self_attn." + name + ".weight", {rows.second, h},
                       p + "attn.qkv.weight", false, rows.first});
        if (c.attentionBias)
          out.push_back({n + "self_attn." + name + ".bias", {rows.second},
                         p + "attn.qkv.bias", false, rows.first});
      }
      out.push_back({n + "self_attn.o_proj.weight", {h, h}, p + "attn.out.weight"});
      if (c.attentionBias)
        out.push_back({n + "self_attn.o_proj.bias", {h}, p + "attn.out.bias"});
      out.push_back({n + "post_attention_layernorm.weight", {h},
                     p + "mlp.norm.weight"});
      out.push_back({n + "mlp.gate_proj.weight", {f, h}, p + "mlp.up.weight",
                     false, 0});
      out.push_back({n + "mlp.up_proj.weight", {f, h}, p + "mlp.up.weight",
                     false, f});
      out.push_back({n + "mlp.down_proj.weight", {h, f}, p + "mlp.down.weight"});
      if (c.mlpBias) {
        out.push_back({n + "mlp.gate_proj.bias", {f}, p + "mlp.up.bias", false, 0});
        out.push_back({n + "mlp.up_proj.bias", {f}, p + "mlp.up.bias", false, f});
        out.push_back({n + "mlp.down_proj.bias", {h}, p + "mlp.down.bias"});
      }
    }
    out.push_back({"norm.weight", {h}, "final.norm.weight"});
    return out;
  }
  if (c.kind == BackboneKind::Bert) {
    const std::string e = "embeddings.";
    out.push_back({e + "word_embeddings.weight", {c.vocab, h}, "embed.tok"});
    out.push_back({e + "position_embeddings.weight", {c.positionRows(), h},
                   "embed.pos"});
    out.push_back({e + "token_type_embeddings.weight",
                   {c.typeVocab > 0 ? c.typeVocab : 1, h}, "embed.type"});
    out.push_back({e + "LayerNorm.weight", {h}, "embed.norm.weight"});
    out.push_back({e + "LayerNorm.bias", {h}, "embed.norm.bias"});
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string n = "encoder.layer." + std::to_string(l) + ".";
      const std::string p = "layer" + std::to_string(l + 1) + ".";
      const char *qkv[] = {"query", "key", "value"};
      for (int i = 0; i < 3; ++i) {
        const std::string a = n + "attention.self." + qkv[i];
        out.push_back({a + ".weight", {h, h}, p + "attn.qkv.weight", false, i * h});
        out.push_back({a + ".bias", {h}, p + "attn.qkv.bias", false, i * h});
      }
      const std::pair<std::string, std::string> linears[] = {
          {"attention.output.dense", "attn.out"},
          {"attention.output.LayerNorm", "attn.norm"},
          {"intermediate.dense", "mlp.up"},
          {"output.dense", "mlp.down"},
          {"output.LayerNorm", "mlp.norm"}};
      for (const auto &[hf, ours] : linears) {
        std::vector<int64_t> w = {h, h}, b = {h};
        if (ours == "mlp.up")
          w = {f, h}, b = {f};
        else if (ours == "mlp.down")
          w = {h, f};
        else if (ours == "attn.norm" || ours == "mlp.norm")
          w = {h};
        out.push_back({n + hf + ".weight", w, p + ours + ".weight"});
        out.push_back({n + hf + ".bias", b, p + ours + ".bias"});
      }
    }
    return out;
  }
  if (c.kind != BackboneKind::Gpt2)
    return out;
  out.push_back({"wte.weight", {c.vocab, h}, "embed.tok"});
  out.push_back({"wpe.weight", {c.positionRows(), h}, "embed.pos"});
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string n = "h." + std::to_string(l) + ".";
    const std::string p = "layer" + std::to_string(l + 1) + ".";
    out.push_back({n + "ln_1.weight", {h}, p + "attn.norm.weight"});
    out.push_back({n + "ln_1.bias", {h}, p + "attn.norm.bias"});
    out.push_back({n + "attn.c_attn.weight", {h, 3 * h}, p + "attn.qkv.weight", true});
    out.push_back({n + "attn.c_attn.bias", {3 * h}, p + "attn.qkv.bias"});
    out.push_back({n + "attn.c_proj.weight", {h, h}, p + "attn.out.weight", true});
    out.push_back({n + "attn.c_proj.bias", {h}, p + "attn.out.bias"});
    out.push_back({n + "ln_2.weight", {h}, p + "mlp.norm.weight"});
    out.push_back({n + "ln_2.bias", {h}, p + "mlp.norm.bias"});
    out.push_back({n + "mlp.c_fc.weight", {h, f}, p + "mlp.up.weight", true});
    out.push_back({n + "mlp.c_fc.bias", {f}, p + "mlp.up.bias"});
    out.push_back({n + "mlp.c_proj.weight", {f, h}, p + "mlp.down.weight", true});
    out.push_back({n + "mlp.c_proj.bias", {h}, p + "mlp.down.bias"});
  }
  out.push_back({"ln_f.weight", {h}, "final.norm.weight"});
  out.push_back({"ln_f.bias", {h}, "final.norm.bias"});
  return out;
}

/// The prefixes task models put before the base model's names.
inline std::vector<std::string> prefixes(BackboneKind kind) {
  if (kind == BackboneKind::Gpt2)
    return {"transformer."};
  if (kind == BackboneKind::Llama)
    return {"model."};
  if (kind == BackboneKind::Bert)
    return {"bert.", "roberta."};
  return {};
}

/// Stored names that are not parameters the backbone trains and are
/// skipped without a warning: GPT-2's attention-mask buffers and a language
/// model's output layer (tied to wte).
inline bool ignored(BackboneKind kind, const std::string &name) {
  auto endsWith = [&](const std::string &s) {
    return name.size() >= s.size() &&
           name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (kind == BackboneKind::Gpt2)
    return endsWith(".attn.bias") || endsWith(".attn.masked_bias") ||
           name == "lm_head.weight";
  if (kind == BackboneKind::Llama)
    return endsWith(".rotary_emb.inv_freq") || name == "lm_head.weight";
  if (kind == BackboneKind::Bert)
    return name == "embeddings.position_ids" ||
           name == "embeddings.token_type_ids";
  return false;
}

/// A stored name as the map spells it: old BERT checkpoints' LayerNorm
/// `gamma` / `beta` are `weight` / `bias` (as transformers renames them).
inline std::string canonical(BackboneKind kind, std::string name) {
  if (kind != BackboneKind::Bert)
    return name;
  auto swap = [&](const std::string &from, const std::string &to) {
    if (name.size() >= from.size() &&
        name.compare(name.size() - from.size(), from.size(), from) == 0)
      name = name.substr(0, name.size() - from.size()) + to;
  };
  swap("LayerNorm.gamma", "LayerNorm.weight");
  swap("LayerNorm.beta", "LayerNorm.bias");
  return name;
}

} // namespace mtprt::hf

#endif // MTPRT_HFNAMES_H
