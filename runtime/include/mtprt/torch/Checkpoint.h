//===- Checkpoint.h - training state on disk, crash-safe --------*- C++ -*-===//
//
// One file per rank and step, `<dir>/step-<09 digits>.rank<r>.ckpt`:
//
//   MTPRTCKPT 1\n
//   step <n> rank <r> world <w> bytes <payload bytes> crc32 <8 hex>\n
//   <payload: a torch::serialize archive>
//
// (the header: mtprt/CheckpointFormat.h, torch-free).
//
// The archive holds the model parameters, the AdamW state, the DGFG gate and
// its Adam state, the GSC residual, the CPU (and CUDA) RNG state, the data
// position, the step counters and the last cosine matrix. Written to a
// hidden temporary file in the same directory, fsynced, renamed into place,
// and the directory fsynced: a crash leaves the previous checkpoints intact
// and at most a stray temporary (removed by the next save).
//
// Internal API (LibTorch).
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_CHECKPOINT_H
#define MTPRT_TORCH_CHECKPOINT_H

#include "mtprt/CheckpointFormat.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mtprt {

class TrainerCore;
class GradExchange;

/// What a checkpoint restores besides the trainer.
struct CheckpointExtra {
  int64_t dataPosition = 0;
  /// Records read so far under a dynamic batch schedule (D15); -1: a fixed
  /// batch (the position counts batches).
  int64_t dataRecords = -1;
  /// The global batch the steps took (a fixed batch's position counts
  /// them); -1: unknown (written before it was saved).
  int64_t batchSize = -1;
};

std::string checkpointPath(const std::string &dir, int64_t step, int rank);

/// Writes atomically, then deletes this rank's checkpoints beyond the newest
/// `keep` (0 = keep all). `exchange` may be null. `duringWrite`, if set, is
/// called with half the payload written (the crash test's pause point).
/// Throws std::runtime_error naming the file on I/O errors.
std::string saveCheckpoint(const std::string &dir, int rank, int world,
                           TrainerCore &core, GradExchange *exchange,
                           const CheckpointExtra &extra, int64_t keep,
                           const std::function<void()> &duringWrite = {});

/// This rank's checkpoint files in `dir` (rank < 0: every rank's), newest
/// step first.
std::vector<std::pair<int64_t, std::string>>
listCheckpoints(const std::string &dir, int rank);

/// Checks the header (every field, the payload size against the file's
/// length) and the checksum, streaming (mtprt/CheckpointFormat.h); throws
/// CheckpointError naming the file and what is wrong (truncated, checksum
/// mismatch, not a checkpoint, the field out of range).
CheckpointHeader verifyCheckpoint(const std::string &path);

/// Verifies, then restores everything into `core` (and `exchange`). Throws
/// CheckpointError naming the file when it is bad or does not fit (world
/// size, parameter shapes), with LibTorch's message but not its backtrace.
CheckpointExtra loadCheckpoint(const std::string &path, int world,
                               TrainerCore &core, GradExchange *exchange);

/// Resumes a run written by `writtenWorld` processes (another world size
/// than this run's) from their files at `step` in `dir`: the replicated
/// state (parameters, AdamW's whole state, SAPS, EWC, counters, the data's
/// position) from rank `rank % writtenWorld`'s file, the gate, RNG and
/// cosines from it too, a ZeRO state put together from every rank's runs
/// and cut as this run keeps it; the GSC residual restarts at zero.
CheckpointExtra loadResharded(const std::string &dir, int64_t step,
                              int64_t writtenWorld, int rank,
                              TrainerCore &core, GradExchange *exchange);

/// The model parameters of a checkpoint file by name (tests, tools).
std::vector<std::pair<std::string, at::Tensor>>
checkpointParameters(const std::string &path);

} // namespace mtprt

#endif // MTPRT_TORCH_CHECKPOINT_H
