//===- Codegen.h - C++ step programs and build projects ---------*- C++ -*-===//
//
// What `mtpc build`, `mtpc --emit=cpp` and `mtp-translate --mtp-to-cpp`
// emit: the step program (the planned step lowered to EmitC, printed by
// MLIR's C++ emitter), the kernels specialized with the spec's constants (a
// CPU twin and CUDA C++), the embedded plan, and the CMake project that
// builds them against the prebuilt runtime.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_CODEGEN_CODEGEN_H
#define MTPC_CODEGEN_CODEGEN_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mtp {

class ModelOp;

/// Lowers the planned, materialized steps of `module` (a clone; `module` is
/// left as it is) with --mtp-lower-step-to-emitc and prints the C++.
mlir::LogicalResult emitStepCpp(mlir::ModuleOp module, llvm::raw_ostream &os,
                                llvm::StringRef source = {});

/// The embedded plan: a 16-byte header ("MTPCPLAN" + the plan's size as a
/// little-endian uint64) and the flatbuffer, 16-byte aligned in the binary.
constexpr llvm::StringLiteral kEmbeddedPlanMarker = "MTPCPLAN";
/// The C++ source of the array `mtp_embedded_plan` holding `plan`.
std::string embedPlanSource(llvm::StringRef plan);
/// Finds an embedded plan in a binary's bytes: the flatbuffer, or an empty
/// ref when there is none.
llvm::StringRef findEmbeddedPlan(llvm::StringRef binary);

/// The kernels specialized with the model's constants, as CPU C++ and as
/// CUDA C++ (each a complete translation unit).
std::string emitKernelsCpu(ModelOp model);
std::string emitKernelsCuda(ModelOp model);
/// The fused pointwise CPU kernels with the hidden size as row width.
std::string emitKernelsVec(ModelOp model);

struct ProjectFiles {
  std::string modelName;
  std::string stepCpp;    ///< emitStepCpp's output
  std::string planBytes;  ///< the flatbuffer plan
  std::string kernelsCpu, kernelsCuda, kernelsVec;
  std::string source;     ///< the spec file, for comments
  bool cuda = false;      ///< build the .cu with nvcc and link CUDA + NCCL
};

/// Writes the CMake project into `dir` (created): CMakeLists.txt, step.cpp,
/// main.cpp, plan.cpp, kernels_cpu.cpp, kernels.cu, plan.mtpplan, README.
/// `runtimeDir` is the runtime's build tree (its mtprtConfig.cmake).
llvm::Error writeProject(llvm::StringRef dir, const ProjectFiles &files,
                         llvm::StringRef runtimeDir);

} // namespace mtp

#endif // MTPC_CODEGEN_CODEGEN_H
