//===- CheckpointFormat.cpp - a checkpoint's header, read and checked -----===//
//
// Torch-free (the fuzz targets link it alone). Nothing is allocated from a
// header field before the field is checked against the file's length.
//
//===----------------------------------------------------------------------===//

#include "mtprt/CheckpointFormat.h"

#include "mtprt/Crc32.h"
#include "mtprt/Limits.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <new>
#include <sys/stat.h>
#include <vector>

namespace mtprt {

namespace {

constexpr std::string_view kMagic = "MTPRTCKPT 1\n";
constexpr std::string_view kMagicStem = "MTPRTCKPT ";

[[noreturn]] void fail(const std::string &path, const std::string &what) {
  throw CheckpointError("mtprt: checkpoint " + path + ": " + what);
}

/// Text from the file as an error shows it: at most 24 bytes of it,
/// unprintable bytes as '?'.
std::string shown(std::string_view s) {
  std::string out(s.substr(0, 24));
  for (char &c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      c = '?';
  return s.size() > 24 ? out + "..." : out;
}

/// The second header line, field by field.
class LineParser {
public:
  LineParser(std::string_view line, const std::string &path)
      : s_(line), path_(path) {}

  void keyword(std::string_view k) {
    if (s_.substr(i_, k.size()) != k || i_ + k.size() >= s_.size() ||
        s_[i_ + k.size()] != ' ')
      fail(path_, "malformed header: expected '" + std::string(k) +
                      "' at byte " + std::to_string(kMagic.size() + i_) +
                      " of the header, got '" + word() + "'");
    i_ += k.size() + 1;
  }

  /// A decimal number in [lo, hi] ending in `end`, spelled as the writer
  /// spells it (no sign, no leading zeros).
  int64_t decimal(const char *field, int64_t lo, int64_t hi, char end) {
    const size_t b = i_;
    uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9' && i_ - b < 19)
      v = v * 10 + uint64_t(s_[i_++] - '0');
    if (i_ == b || i_ >= s_.size() || s_[i_] != end ||
        (s_[b] == '0' && i_ - b > 1)) {
      i_ = b;
      fail(path_, std::string("malformed header: field ") + field +
                      ": expected a decimal number, got '" + word() + "'");
    }
    ++i_;
    if (v < uint64_t(lo) || v > uint64_t(hi))
      fail(path_, std::string("field ") + field + ": " + std::to_string(v) +
                      " is out of [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
    return int64_t(v);
  }

  /// Exactly eight lowercase hex digits ending in `end`.
  uint32_t hex8(const char *field, char end) {
    const size_t b = i_;
    uint32_t v = 0;
    for (; i_ < s_.size() && i_ - b < 8; ++i_) {
      const char c = s_[i_];
      // Lowercase, as written: one spelling per value.
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                           : -1;
      if (d < 0)
        break;
      v = v << 4 | uint32_t(d);
    }
    if (i_ - b == 8 && i_ < s_.size() && s_[i_] == ' ' && end != ' ')
      trailing(field, end);
    if (i_ - b != 8 || i_ >= s_.size() || s_[i_] != end) {
      i_ = b;
      fail(path_, std::string("malformed header: field ") + field +
                      ": expected 8 lowercase hex digits, got '" + word() + "'");
    }
    ++i_;
    return v;
  }

  bool done() const { return i_ == s_.size(); }

private:
  /// A well-formed field followed by more than its line holds.
  [[noreturn]] void trailing(const char *field, char end) const {
    size_t e = i_;
    while (e < s_.size() && s_[e] != '\n')
      ++e;
    fail(path_, std::string("malformed header: unexpected text after field ") +
                    field + (end == '\n' ? " (the line's last)" : "") + ": '" +
                    shown(s_.substr(i_, e - i_)) + "'");
  }

  /// The text from here to the next space or end of line.
  std::string word() const {
    size_t e = i_;
    while (e < s_.size() && s_[e] != ' ' && s_[e] != '\n')
      ++e;
    return shown(s_.substr(i_, e - i_));
  }

  std::string_view s_;
  size_t i_ = 0;
  const std::string &path_;
};

void checkCrc(uint32_t got, const CheckpointHeader &h,
              const std::string &path) {
  if (got == h.crc)
    return;
  char buf[64];
  std::snprintf(buf, sizeof buf, "checksum mismatch (crc32 %08x, header %08x)",
                got, h.crc);
  fail(path, buf);
}

} // namespace

std::string checkpointHeaderText(int64_t step, int64_t rank, int64_t world,
                                 uint64_t bytes, uint32_t crc) {
  char line[160];
  std::snprintf(line, sizeof line,
                "step %lld rank %lld world %lld bytes %llu crc32 %08x\n",
                static_cast<long long>(step), static_cast<long long>(rank),
                static_cast<long long>(world),
                static_cast<unsigned long long>(bytes), crc);
  return std::string(kMagic) + line;
}

CheckpointHeader parseCheckpointHeader(std::string_view head,
                                       uint64_t fileSize,
                                       const std::string &path) {
  if (head.size() > fileSize)
    head = head.substr(0, fileSize);
  if (head.substr(0, kMagic.size()) != kMagic) {
    if (head.size() > kMagicStem.size() &&
        head.substr(0, kMagicStem.size()) == kMagicStem &&
        head[kMagicStem.size()] >= '0' && head[kMagicStem.size()] <= '9')
      fail(path, "checkpoint format " +
                     shown(head.substr(kMagicStem.size(),
                                       head.find('\n') - kMagicStem.size())) +
                     ", this runtime reads format 1");
    fail(path, "not an mtprt checkpoint (bad magic)");
  }
  const size_t nl = head.find('\n', kMagic.size());
  if (nl == std::string_view::npos || nl >= kMaxCheckpointHeaderBytes) {
    if (fileSize < kMaxCheckpointHeaderBytes)
      fail(path, "truncated header");
    fail(path, "malformed header: no end of line in its first " +
                   std::to_string(kMaxCheckpointHeaderBytes) + " bytes");
  }
  LineParser p(head.substr(kMagic.size(), nl + 1 - kMagic.size()), path);
  CheckpointHeader h;
  p.keyword("step");
  h.step = p.decimal("step", 0, limits::kSteps.hi, ' ');
  p.keyword("rank");
  h.rank = p.decimal("rank", 0, limits::kWorldSize.hi - 1, ' ');
  p.keyword("world");
  h.world = p.decimal("world", limits::kWorldSize.lo, limits::kWorldSize.hi,
                      ' ');
  p.keyword("bytes");
  h.bytes = uint64_t(p.decimal("bytes", 0, INT64_MAX, ' '));
  p.keyword("crc32");
  h.crc = p.hex8("crc32", '\n');
  if (h.rank >= h.world)
    fail(path, "field rank: " + std::to_string(h.rank) +
                   " is not below the world size " + std::to_string(h.world));
  h.headerBytes = nl + 1;
  const uint64_t have = fileSize - h.headerBytes;
  if (h.bytes > have)
    fail(path, "truncated: " + std::to_string(have) + " of " +
                   std::to_string(h.bytes) + " payload bytes");
  if (h.bytes < have)
    fail(path, "trailing bytes after the payload (the header says " +
                   std::to_string(h.bytes) + " bytes, the file has " +
                   std::to_string(have) + " after the header)");
  return h;
}

CheckpointHeader verifyCheckpointBytes(std::string_view file,
                                       const std::string &path) {
  const CheckpointHeader h = parseCheckpointHeader(
      file.substr(0, kMaxCheckpointHeaderBytes), file.size(), path);
  checkCrc(crc32(file.data() + h.headerBytes, h.bytes), h, path);
  return h;
}

CheckpointHeader readCheckpointFile(const std::string &path,
                                    std::string *payload) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    fail(path, "cannot be opened");
  if (!S_ISREG(st.st_mode))
    fail(path, "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(path, "cannot be opened");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string head(std::min<uint64_t>(size, kMaxCheckpointHeaderBytes), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (static_cast<size_t>(in.gcount()) != head.size())
    fail(path, "cannot be read (it shrank while it was read?)");
  const CheckpointHeader h = parseCheckpointHeader(head, size, path);
  in.clear();
  in.seekg(static_cast<std::streamoff>(h.headerBytes));
  auto shrank = [&](uint64_t got) {
    fail(path, "truncated: " + std::to_string(got) + " of " +
                   std::to_string(h.bytes) +
                   " payload bytes (the file shrank while it was read)");
  };
  if (payload) {
    try {
      payload->assign(static_cast<size_t>(h.bytes), '\0');
    } catch (const std::bad_alloc &) {
      fail(path, "cannot allocate " + std::to_string(h.bytes) +
                     " bytes to read its payload");
    }
    in.read(payload->data(), static_cast<std::streamsize>(h.bytes));
    if (static_cast<uint64_t>(in.gcount()) != h.bytes)
      shrank(static_cast<uint64_t>(in.gcount()));
    checkCrc(crc32(payload->data(), payload->size()), h, path);
    return h;
  }
  std::vector<char> buf(size_t(1) << 20);
  uint32_t crc = 0;
  for (uint64_t done = 0; done < h.bytes;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), h.bytes - done);
    in.read(buf.data(), static_cast<std::streamsize>(n));
    if (static_cast<uint64_t>(in.gcount()) != n)
      shrank(done + static_cast<uint64_t>(in.gcount()));
    crc = crc32(buf.data(), n, crc);
    done += n;
  }
  checkCrc(crc, h, path);
  return h;
}

} // namespace mtprt
