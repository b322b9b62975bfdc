//===- Pretrained.h - a Hugging Face model directory, checked ---*- C++ -*-===//
//
// What `backbone pretrained("DIR")` needs at compile time: the family and
// dimensions from DIR/config.json, and the safetensors headers (one file or
// a sharded set) checked against the tensors that family's names map
// (mtprt/HfNames.h) expects — names and shapes, not data. JSON through
// llvm::json; every header length and offset checked before it is used.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_FRONTEND_PRETRAINED_H
#define MTPC_FRONTEND_PRETRAINED_H

#include "mtprt/Config.h"

#include "llvm/Support/Error.h"

#include <string>

namespace mtp {

/// A directory's config.json as mtpc reads it.
struct PretrainedConfig {
  std::string modelType;     ///< config.json's model_type
  mtprt::ModelConfig model;  ///< kind, dimensions, positions, normEps
  double dropout = 0.1;      ///< the checkpoint's residual dropout
};

/// Reads `dir`/config.json. The error names the file and the field.
llvm::Expected<PretrainedConfig> readPretrainedConfig(llvm::StringRef dir);

/// Checks that `dir`'s safetensors files hold every tensor the family's
/// names map expects for `model`, with its shape and a float dtype. The
/// error names the file and the tensor(s).
llvm::Error checkPretrainedWeights(llvm::StringRef dir,
                                   const mtprt::ModelConfig &model);

} // namespace mtp

#endif // MTPC_FRONTEND_PRETRAINED_H
