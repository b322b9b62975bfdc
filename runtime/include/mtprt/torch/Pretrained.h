//===- Pretrained.h - Hugging Face weights in, trained weights out -*- C++ -*-===//
//
// A Hugging Face model directory (config.json + model.safetensors, or a
// sharded set behind model.safetensors.index.json) loaded into a Model's
// backbone by the names of mtprt/HfNames.h, and the trained backbone written
// back under the same names so `transformers.AutoModel.from_pretrained`
// reads it; the task heads go to a file of their own. docs/pretrained.md.
//
// Internal API: includes LibTorch.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_PRETRAINED_H
#define MTPRT_TORCH_PRETRAINED_H

#include "mtprt/torch/Model.h"

#include <map>
#include <string>
#include <vector>

namespace mtprt {

struct PretrainedLoad {
  std::vector<std::string> files; ///< the safetensors files read
  int64_t tensors = 0;            ///< parameters filled
  /// Stored tensors the backbone has no parameter for (a task model's
  /// heads, a pooler): skipped, reported by name.
  std::vector<std::string> unexpected;
};

/// Replaces the backbone's parameters with `dir`'s (converted from F32,
/// F16, BF16 or F64 to fp32). Every tensor of hf::tensors must be there with
/// its shape; throws PretrainedError naming the file and the tensors missing
/// or mismatched, and what to check.
PretrainedLoad loadPretrained(Model &model, const std::string &dir);

/// Writes `dir`/config.json (the family's Hugging Face config: `source`'s
/// config.json where given, with this model's dimensions), `dir`/
/// model.safetensors (the backbone, fp32, Hugging Face names) and `dir`/
/// heads.safetensors (every head's parameters by Model::namedParameters
/// name; metadata `format` = "mtprt-heads", `heads` = their configs as
/// JSON). Each file is written beside and renamed into place. Throws
/// std::runtime_error naming the file it cannot write. `values`, where
/// given, holds every parameter's values by that name instead of the
/// model's own tensors (ZeRO 3's runs put together one at a time).
void exportPretrained(
    const Model &model, const std::string &dir, const std::string &source = "",
    const std::map<std::string, at::Tensor> *values = nullptr);

/// The backbone checked against another implementation: runs it in eval
/// mode on `batch` (its padding and token types too: `attention_mask`,
/// `token_type_ids` where it has them) and writes to `path` (safetensors)
/// `tokens`, every
/// layer's output `hidden.<l>` (0 = the embeddings; the last through the
/// final norm where there is one), fixed random `probe.<l>` of the same
/// shapes, and the gradient of sum over l of (hidden.<l> * probe.<l>).sum()
/// with respect to every backbone parameter: `grad.<Hugging Face name>` in
/// the stored layout where the family has names, else `grad.<parameter>`.
void writeHiddenStates(Model &model, const Batch &batch,
                       const std::string &path);

/// Reads a safetensors file (all of it) as name -> fp32 CPU tensor, checked
/// as loadPretrained checks. For tests and tools.
std::vector<std::pair<std::string, at::Tensor>>
readSafetensors(const std::string &path);
/// Writes name -> tensor (any float or integer dtype), renamed into place.
void writeSafetensors(
    const std::string &path,
    const std::vector<std::pair<std::string, at::Tensor>> &tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata = {});

} // namespace mtprt

#endif // MTPRT_TORCH_PRETRAINED_H
