//===- PlanFrame.h - the plan file's framing: version, length, CRC -*- C++ -*-===//
//
// A plan file (`mtpc plan --format=fb`, and what a generated binary embeds)
// is a 24-byte frame, then the flatbuffer (runtime/schema/plan.fbs):
//
//   offset  0  8 bytes  "MTPPLAN\n"
//           8  u32 LE   the plan version (kPlanVersion; plan.fbs's too)
//          12  u32 LE   CRC-32 (mtprt/Crc32.h) of the flatbuffer's bytes
//          16  u64 LE   the flatbuffer's length; the file is 24 + that long
//          24  ...      the flatbuffer ('MTPP' at its offset 4), 8-aligned
//
// A flipped byte anywhere is refused before the flatbuffers verifier runs:
// in the frame by its fields, in the flatbuffer by the CRC. Version 1 plans
// were the bare flatbuffer (no frame): they are refused by name.
//
// Header-only, torch-free, LLVM-free and exception-free: the compiler's plan
// writer and `mtpc inspect`, the runtime's readPlan and the fuzz targets all
// use it.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_PLANFRAME_H
#define MTPRT_PLANFRAME_H

#include "mtprt/Crc32.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace mtprt {

inline constexpr char kPlanMagic[8] = {'M', 'T', 'P', 'P', 'L', 'A', 'N', '\n'};
inline constexpr size_t kPlanFrameBytes = 24;
/// The plan version this tree writes and reads (= plan.fbs PlanVersion).
inline constexpr uint32_t kPlanVersion = 4;

namespace detail {
inline uint64_t readLe(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = v << 8 | p[i];
  return v;
}
inline void writeLe(char *p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i, v >>= 8)
    p[i] = static_cast<char>(v & 0xFF);
}
} // namespace detail

/// The plan file for a flatbuffer: the frame, then the bytes.
inline std::string framePlan(const void *flatbuffer, size_t size) {
  std::string out(kPlanFrameBytes, '\0');
  std::memcpy(out.data(), kPlanMagic, 8);
  detail::writeLe(out.data() + 8, kPlanVersion, 4);
  detail::writeLe(out.data() + 12, crc32(flatbuffer, size), 4);
  detail::writeLe(out.data() + 16, size, 8);
  out.append(static_cast<const char *>(flatbuffer), size);
  return out;
}

/// Whether `size` bytes at `data` begin like a plan file of any version
/// (framed, or a bare version-1 flatbuffer): a file to check as a plan,
/// not a binary to look for an embedded one in.
inline bool looksLikePlan(const void *data, size_t size) {
  const auto *p = static_cast<const char *>(data);
  return (size >= 8 && std::memcmp(p, kPlanMagic, 8) == 0) ||
         (size >= 8 && std::memcmp(p + 4, "MTPP", 4) == 0);
}

/// Checks the frame of the `size` bytes at `data`. Returns "" and sets
/// `flatbuffer` and `flatbufferSize` when it is whole and its CRC matches;
/// otherwise what is wrong and what to do.
inline std::string checkPlanFrame(const void *data, size_t size,
                                  const uint8_t **flatbuffer,
                                  size_t *flatbufferSize) {
  const auto *p = static_cast<const uint8_t *>(data);
  const std::string again =
      "; write it again with `mtpc plan SPEC --format=fb -o PLAN`";
  if (size < 8 || std::memcmp(p, kPlanMagic, 8) != 0) {
    if (size >= 8 && std::memcmp(p + 4, "MTPP", 4) == 0)
      return "plan version 1 (a bare flatbuffer, written before plans "
             "carried a checksum); this mtpc and runtime read version " +
             std::to_string(kPlanVersion) +
             ": re-plan the spec with `mtpc plan SPEC --format=fb -o PLAN`";
    return "not an mtpc plan (no 'MTPPLAN' header); write one with "
           "`mtpc plan SPEC --format=fb -o PLAN`";
  }
  if (size < kPlanFrameBytes)
    return "truncated: " + std::to_string(size) + " bytes, less than the " +
           std::to_string(kPlanFrameBytes) + "-byte header" + again;
  const uint64_t version = detail::readLe(p + 8, 4);
  const uint32_t crc = static_cast<uint32_t>(detail::readLe(p + 12, 4));
  const uint64_t length = detail::readLe(p + 16, 8);
  if (version != kPlanVersion)
    return "plan version " + std::to_string(version) +
           "; this mtpc and runtime read version " +
           std::to_string(kPlanVersion) +
           ": re-plan the spec with the matching mtpc";
  const uint64_t have = size - kPlanFrameBytes;
  if (length > have)
    return "truncated: the header says " + std::to_string(length) +
           " plan bytes, the file has " + std::to_string(have) + again;
  if (length < have)
    return "trailing bytes after the plan (the header says " +
           std::to_string(length) + " plan bytes, the file has " +
           std::to_string(have) + ")" + again;
  const uint32_t got = crc32(p + kPlanFrameBytes, length);
  if (got != crc) {
    char buf[96];
    std::snprintf(buf, sizeof buf,
                  "checksum mismatch (crc32 %08x, header %08x): the file is "
                  "damaged",
                  got, crc);
    return buf + again;
  }
  *flatbuffer = p + kPlanFrameBytes;
  *flatbufferSize = static_cast<size_t>(length);
  return "";
}

} // namespace mtprt

#endif // MTPRT_PLANFRAME_H
