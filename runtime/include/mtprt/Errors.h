//===- Errors.h - the runtime's errors about the files it reads -*- C++ -*-===//
//
// Every file the runtime reads (a plan, a data file, a checkpoint) is checked
// before anything is allocated from what it says; a bad one throws one of
// these, whose message names the file, where in it (line, record, field,
// section, offset) and what to do. They are the runtime's own types so a
// caller can tell a bad file from a bug (`--resume-fallback` skips a bad
// checkpoint and nothing else). Torch-free and LLVM-free.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_ERRORS_H
#define MTPRT_ERRORS_H

#include <stdexcept>
#include <string>

namespace mtprt {

/// A file the runtime reads is unusable.
struct FileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A JSON Lines file or a binary shard (`mtprt: data file ...`).
struct DataError : FileError {
  using FileError::FileError;
};

/// A checkpoint (`mtprt: checkpoint ...`).
struct CheckpointError : FileError {
  using FileError::FileError;
};

/// A pretrained model directory: its config.json, a safetensors file or
/// its sharded index (`mtprt: pretrained <file>: ...`), or tensors missing
/// from it or of the wrong shape.
struct PretrainedError : FileError {
  using FileError::FileError;
};

/// A plan file or a binary's embedded plan: `mtprt: plan <name>: <reason>`.
struct PlanError : FileError {
  PlanError(const std::string &name, const std::string &reason)
      : FileError("mtprt: plan " + name + ": " + reason), reason_(reason) {}
  /// What is wrong and what to do, without the file's name.
  const std::string &reason() const { return reason_; }

private:
  std::string reason_;
};

} // namespace mtprt

#endif // MTPRT_ERRORS_H
