//===- Safetensors.cpp - safetensors headers, read and checked ------------===//
//
// Torch-free (the fuzz targets link it alone). The JSON is parsed by
// nlohmann-json after a linear scan has bounded its nesting, and nothing is
// allocated from a header field before it is checked against the file.
//
//===----------------------------------------------------------------------===//

#include "mtprt/Safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <istream>
#include <limits>

namespace mtprt::safetensors {

namespace {

using Json = nlohmann::json;

[[noreturn]] void fail(const std::string &path, const std::string &what) {
  throw PretrainedError("mtprt: pretrained " + path + ": " + what);
}

/// A name as an error shows it: at most 80 bytes, unprintable bytes as '?'.
std::string shown(const std::string &s) {
  std::string out = s.substr(0, 80);
  for (char &c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      c = '?';
  return s.size() > 80 ? out + "..." : out;
}

/// Refuses JSON nested deeper than `limit` before the parser sees it (a
/// header is an object of objects holding arrays: three levels).
void boundNesting(const std::string &text, int limit, const std::string &path,
                  const char *what) {
  if (size_t at = nestingPast(text, limit); at != std::string_view::npos)
    fail(path, std::string(what) + " nests deeper than " +
                   std::to_string(limit) + " levels at byte " +
                   std::to_string(at) + "; not a safetensors " + what);
}

Json parse(const std::string &text, const std::string &path,
           const char *what) {
  try {
    return Json::parse(text);
  } catch (const Json::exception &e) {
    // nlohmann's messages name the byte: "parse error at line 1, column 9".
    fail(path, std::string(what) + " is not valid JSON: " + e.what());
  }
}

const char *kindOf(const Json &j) { return j.type_name(); }

} // namespace

const char *name(Dtype dtype) {
  switch (dtype) {
  case Dtype::F64: return "F64";
  case Dtype::F32: return "F32";
  case Dtype::F16: return "F16";
  case Dtype::BF16: return "BF16";
  case Dtype::I64: return "I64";
  case Dtype::I32: return "I32";
  case Dtype::I16: return "I16";
  case Dtype::I8: return "I8";
  case Dtype::U8: return "U8";
  case Dtype::Bool: return "BOOL";
  }
  return "?";
}

int64_t elementBytes(Dtype dtype) {
  switch (dtype) {
  case Dtype::F64:
  case Dtype::I64:
    return 8;
  case Dtype::F32:
  case Dtype::I32:
    return 4;
  case Dtype::F16:
  case Dtype::BF16:
  case Dtype::I16:
    return 2;
  case Dtype::I8:
  case Dtype::U8:
  case Dtype::Bool:
    return 1;
  }
  return 1;
}

std::optional<Dtype> parseDtype(const std::string &s) {
  for (Dtype d : {Dtype::F64, Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::I64,
                  Dtype::I32, Dtype::I16, Dtype::I8, Dtype::U8, Dtype::Bool})
    if (s == name(d))
      return d;
  return std::nullopt;
}

int64_t Entry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

const Entry *Header::find(const std::string &n) const {
  for (const Entry &e : tensors)
    if (e.name == n)
      return &e;
  return nullptr;
}

Header readHeader(std::istream &in, uint64_t fileSize,
                  const std::string &path) {
  if (fileSize < 8)
    fail(path, "file of " + std::to_string(fileSize) +
                   " bytes is shorter than the 8-byte header length; not a "
                   "safetensors file (truncated?)");
  unsigned char len[8];
  if (!in.read(reinterpret_cast<char *>(len), 8))
    fail(path, "cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | len[i];
  if (n > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(n) + " exceeds " +
                   std::to_string(kMaxHeaderBytes) +
                   " bytes; not a safetensors file");
  if (n > fileSize - 8)
    fail(path, "header length " + std::to_string(n) + " runs past the end of "
               "the file (" + std::to_string(fileSize) +
                   " bytes); the file is truncated");
  std::string text(n, '\0');
  if (n && !in.read(text.data(), static_cast<std::streamsize>(n)))
    fail(path, "cannot read the " + std::to_string(n) + "-byte header");
  boundNesting(text, 3, path, "header");
  const Json root = parse(text, path, "header");
  if (!root.is_object())
    fail(path, std::string("header is a JSON ") + kindOf(root) +
                   ", not an object of tensors");

  Header h;
  h.dataStart = 8 + n;
  const uint64_t dataBytes = fileSize - h.dataStart;
  for (const auto &[key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        fail(path, "__metadata__ must be an object of strings");
      for (const auto &[mk, mv] : value.items()) {
        if (!mv.is_string())
          fail(path, "__metadata__ \"" + shown(mk) + "\" must be a string, "
                     "got a " + kindOf(mv));
        h.metadata.emplace_back(mk, mv.get<std::string>());
      }
      continue;
    }
    const std::string where = "tensor \"" + shown(key) + "\"";
    if (!value.is_object())
      fail(path, where + " must be an object, got a " + kindOf(value));
    Entry e;
    e.name = key;
    const auto dt = value.find("dtype");
    if (dt == value.end() || !dt->is_string())
      fail(path, where + ": missing the string field 'dtype'");
    const std::optional<Dtype> d = parseDtype(dt->get<std::string>());
    if (!d)
      fail(path, where + ": unsupported dtype \"" +
                     shown(dt->get<std::string>()) +
                     "\" (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
    e.dtype = *d;
    const auto sh = value.find("shape");
    if (sh == value.end() || !sh->is_array())
      fail(path, where + ": missing the array field 'shape'");
    if (sh->size() > 8)
      fail(path, where + ": shape has " + std::to_string(sh->size()) +
                     " dimensions (at most 8)");
    // The element count, overflow-checked against what the file can hold.
    uint64_t elements = 1;
    for (const Json &dim : *sh) {
      if (!dim.is_number_unsigned())
        fail(path, where + ": shape holds " +
                       (dim.is_number_integer() ? std::string("a negative")
                                                : std::string("a ") +
                                                      kindOf(dim)) +
                       " dimension");
      const uint64_t v = dim.get<uint64_t>();
      if (v > dataBytes || (v && elements > dataBytes / v))
        fail(path, where + ": shape needs more bytes than the file's " +
                       std::to_string(dataBytes) + " bytes of data");
      elements *= v;
      e.shape.push_back(static_cast<int64_t>(v));
    }
    const auto off = value.find("data_offsets");
    if (off == value.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      fail(path, where + ": 'data_offsets' must be [begin, end], two "
                         "non-negative integers");
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > dataBytes)
      fail(path, where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                     std::to_string(e.end) + "] are not within the " +
                     std::to_string(dataBytes) +
                     " bytes of data after the header (truncated file?)");
    const uint64_t eb = static_cast<uint64_t>(elementBytes(e.dtype));
    if (elements > dataBytes / eb || e.end - e.begin != elements * eb)
      fail(path, where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                     std::to_string(e.end) + "] hold " +
                     std::to_string(e.end - e.begin) + " bytes, but its " +
                     name(e.dtype) + " shape needs " +
                     std::to_string(elements * eb));
    h.tensors.push_back(std::move(e));
  }
  // The format's rules: the tensors tile the data, no overlap, no hole.
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const Entry &a, const Entry &b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t next = 0;
  for (const Entry &e : h.tensors) {
    if (e.begin != next)
      fail(path, "tensor \"" + shown(e.name) + "\" starts at data byte " +
                     std::to_string(e.begin) + ", expected " +
                     std::to_string(next) +
                     (e.begin < next ? " (it overlaps the tensor before)"
                                     : " (a hole before it)"));
    next = e.end;
  }
  if (next != dataBytes)
    fail(path, "the tensors end at data byte " + std::to_string(next) +
                   " but the file holds " + std::to_string(dataBytes) +
                   " bytes of data");
  return h;
}

std::string
writeHeader(std::vector<Entry> &tensors,
            const std::vector<std::pair<std::string, std::string>> &metadata) {
  // nlohmann's ordered_json keeps the data order in the file, as the
  // reference writer does (sorted by dtype there; any order is valid).
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto &[k, v] : metadata)
      meta[k] = v;
    root["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (Entry &e : tensors) {
    e.begin = offset;
    e.end = offset + static_cast<uint64_t>(e.numel()) *
                         static_cast<uint64_t>(elementBytes(e.dtype));
    offset = e.end;
    root[e.name] = {{"dtype", name(e.dtype)},
                    {"shape", e.shape},
                    {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = root.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8)
    out[i] = static_cast<char>(n & 0xff);
  return out + text;
}

std::vector<std::pair<std::string, std::string>>
readIndex(std::istream &in, const std::string &path) {
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxHeaderBytes)
      fail(path, "index exceeds " + std::to_string(kMaxHeaderBytes) +
                     " bytes; not a safetensors index");
  }
  boundNesting(text, 2, path, "index");
  const Json root = parse(text, path, "index");
  if (!root.is_object())
    fail(path, std::string("index is a JSON ") + kindOf(root) +
                   ", not an object");
  const auto map = root.find("weight_map");
  if (map == root.end() || !map->is_object())
    fail(path, "index has no object 'weight_map' (tensor name -> shard "
               "file)");
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto &[k, v] : map->items()) {
    if (!v.is_string())
      fail(path, "weight_map \"" + shown(k) + "\" must name a file, got a " +
                     kindOf(v));
    const std::string file = v.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos || file == "." || file == "..")
      fail(path, "weight_map \"" + shown(k) + "\" names \"" + shown(file) +
                     "\": a shard must be a file name in the index's "
                     "directory");
    out.emplace_back(k, file);
  }
  return out;
}

} // namespace mtprt::safetensors
