//===- PlanFile.h - the plan as a flatbuffer ---------------------*- C++ -*-===//
//
// The binary plan (runtime/schema/plan.fbs inside the frame of
// runtime/include/mtprt/PlanFrame.h) that `mtpc plan --format=fb` writes, the
// generated binary embeds and `mtpc inspect` prints. Reading always goes
// through the runtime's own checks (mtprt::checkPlan): the frame's version,
// length and CRC-32, the flatbuffers verifier, and every field.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_PLANFILE_H
#define MTPC_PASSES_PLANFILE_H

#include "passes/MemoryAnalysis.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mtp {
namespace fb {
struct Plan;
enum class Decision : int8_t;
enum class BackboneKind : int8_t;
enum class AttentionKind : int8_t;
enum class PointwiseKind : int8_t;
enum class HeadKind : int8_t;
enum class LossKind : int8_t;
enum class ScheduleKind : int8_t;
enum class Precision : int8_t;
enum class UnitKind : int8_t;
enum class GradientScope : int8_t;
enum class CollectivePolicy : int8_t;
} // namespace fb

/// The planned model as a plan file (frame + flatbuffer); `source` names the
/// spec.
std::string serializePlan(ModelOp model, const MemoryReport &report,
                          llvm::StringRef source);

/// Verifies `bytes` as the runtime would (frame, CRC, structure, version,
/// fields): success means getPlan(bytes) may be read. The error says what is
/// wrong with the file and what to do.
llvm::Error verifyPlanFile(llvm::StringRef bytes);

/// The flatbuffer inside a plan file verifyPlanFile accepted.
const fb::Plan *getPlan(llvm::StringRef verified);

/// A plan enum's name, as the spec and the IR spell it (`auto`, `tag`, ...).
llvm::StringRef planName(fb::Decision v);
llvm::StringRef planName(fb::BackboneKind v);
llvm::StringRef planName(fb::AttentionKind v);
llvm::StringRef planName(fb::PointwiseKind v);
llvm::StringRef planName(fb::HeadKind v);
llvm::StringRef planName(fb::LossKind v);
llvm::StringRef planName(fb::ScheduleKind v);
llvm::StringRef planName(fb::Precision v);
llvm::StringRef planName(fb::UnitKind v);
llvm::StringRef planName(fb::GradientScope v);
llvm::StringRef planName(fb::CollectivePolicy v);

/// Verifies `bytes` (as verifyPlanFile) and prints the plan.
/// The error says what is wrong with the file and what to do.
llvm::Error printPlanFile(llvm::StringRef bytes, llvm::raw_ostream &os);

} // namespace mtp

#endif // MTPC_PASSES_PLANFILE_H
