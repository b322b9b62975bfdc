//===- Crc32.h - CRC-32 (IEEE 802.3, zlib's crc32) --------------*- C++ -*-===//
//
// The checksum the checkpoint header and the plan's framing carry. Torch-free
// and LLVM-free, header-only: the compiler (the plan writer, `mtpc inspect`),
// the runtime and the fuzz targets share this one definition. Equal to
// zlib's `crc32` and LLVM's `llvm::crc32`.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_CRC32_H
#define MTPRT_CRC32_H

#include <array>
#include <cstddef>
#include <cstdint>

namespace mtprt {

namespace detail {
inline constexpr std::array<uint32_t, 256> kCrc32Table = [] {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}();
} // namespace detail

/// The CRC-32 of `n` bytes at `data`; pass the previous result as `crc` to
/// continue over a further piece (crc32(b, crc32(a)) == crc32(a + b)).
/// Not instrumented for the fuzzers' coverage: its loop has nothing to find
/// and would take most of their time.
#if defined(__clang__)
__attribute__((no_sanitize("coverage")))
#endif
inline uint32_t crc32(const void *data, size_t n, uint32_t crc = 0) {
  const auto *p = static_cast<const uint8_t *>(data);
  uint32_t c = crc ^ 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i)
    c = detail::kCrc32Table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

} // namespace mtprt

#endif // MTPRT_CRC32_H
