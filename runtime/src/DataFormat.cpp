//===- DataFormat.cpp - JSON Lines and binary shards, read and checked ----===//
//
// Torch-free (the fuzz targets link it alone). The JSON Lines reader is
// schema-directed: it parses a record as the object it must be, checking
// each value where it stands, so it neither recurses nor builds a document
// tree, and whatever is not the record's shape is refused where it starts.
//
//===----------------------------------------------------------------------===//

#include "mtprt/DataFormat.h"

#include "mtprt/Limits.h"

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <istream>
#include <ostream>
#include <string_view>
#include <unordered_map>

namespace mtprt {

namespace {

int64_t targetVocab(const HeadConfig &c, const ModelConfig &m) {
  return c.targetVocab > 0 ? c.targetVocab : m.vocab;
}

/// A name from the file as an error shows it: at most 64 bytes, control
/// characters as '?'.
std::string shown(std::string_view s) {
  std::string out(s.substr(0, 64));
  for (char &c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      c = '?';
  return s.size() > 64 ? out + "..." : out;
}

std::string str(int64_t v) { return std::to_string(v); }

/// Token types a record may hold: the backbone's (BERT's 2), at least 1
/// (type 0 everywhere), at most what a byte stores.
int64_t typeLimit(const ModelConfig &m) {
  return std::clamp<int64_t>(m.typeVocab, 1, 256);
}

/// Why a label name cannot be one ("" when it can): 1..kMaxNameBytes bytes,
/// no control characters (a NUL would cut it short in every C string).
std::string badLabelName(std::string_view name) {
  if (name.empty() || name.size() > size_t(limits::kMaxNameBytes))
    return "a label name must have 1 to " + str(limits::kMaxNameBytes) +
           " bytes";
  for (char c : name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return "label name '" + shown(name) + "' has a control character";
  return "";
}

/// Label names a head may have: one per class of a classifier (cross
/// entropy) or tagger, none for the other kinds.
int64_t maxLabelNames(const HeadConfig &c) {
  return (c.kind == HeadKind::Classify && c.loss != LossKind::Mse) ||
                 c.kind == HeadKind::Tag
             ? c.classes
             : 0;
}

//===----------------------------------------------------------------------===//
// JSON Lines
//===----------------------------------------------------------------------===//

/// Reads one line into `line` (without the '\n'), storing at most
/// `limit + 1` bytes: a longer line comes back longer than `limit` and the
/// caller refuses it. False at the end of the stream.
bool readLine(std::istream &in, std::string &line, size_t limit) {
  line.clear();
  std::streambuf *sb = in.rdbuf();
  if (!sb)
    return false;
  bool any = false;
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof())
      return any;
    any = true;
    if (c == '\n')
      return true;
    line.push_back(static_cast<char>(c));
    if (line.size() > limit)
      return true;
  }
}

/// One record's parser: a JSON object {"tokens": [...], "labels": {...}},
/// checked value by value against the model and the heads. Staging vectors
/// are kept between records (no allocation per record once warm).
class RecordParser {
public:
  RecordParser(const std::string &path, const ModelConfig &m,
               const std::vector<HeadConfig> &h, Records &out)
      : path_(path), m_(m), h_(h), out_(out), staged_(h.size()),
        has_(h.size()), seen_(h.size()) {
    for (size_t t = 0; t < h.size(); ++t)
      byName_.emplace(h[t].name, t);
  }

  void parse(std::string_view text, int64_t line) {
    s_ = text;
    i_ = 0;
    line_ = line;
    std::fill(has_.begin(), has_.end(), false);
    std::fill(seen_.begin(), seen_.end(), false);
    tokens_.clear();
    types_.clear();
    length_ = m_.seq;
    if (kind() != Kind::Object)
      bad("", "a record must be a JSON object");
    ++i_;
    bool sawTokens = false, sawLabels = false, sawLength = false,
         sawTypes = false;
    if (!eat('}')) {
      do {
        if (!at('"'))
          malformed("expected a field name in quotes");
        const std::string key = string();
        if (!eat(':'))
          malformed("expected ':' after the field name");
        if (key == "tokens") {
          if (sawTokens)
            bad("tokens", "appears twice");
          sawTokens = true;
          integers("tokens", m_.seq, m_.vocab, nullptr, &tokens_);
        } else if (key == "labels") {
          if (sawLabels)
            bad("labels", "appears twice");
          sawLabels = true;
          labels();
        } else if (key == "length") {
          if (sawLength)
            bad("length", "appears twice");
          sawLength = true;
          const double x = kind() == Kind::Number ? number() : 0.0;
          if (!(x >= 1 && x <= static_cast<double>(m_.seq) &&
                x == std::floor(x)))
            bad("length", "expected the count of real tokens, in [1, " +
                              str(m_.seq) + "]");
          length_ = static_cast<int32_t>(x);
        } else if (key == "types") {
          if (sawTypes)
            bad("types", "appears twice");
          sawTypes = true;
          integers("types", m_.seq, typeLimit(m_), nullptr, &types_);
        } else {
          bad(shown(key),
              "unknown field (expected tokens, labels, length, types)");
        }
      } while (eat(','));
      if (!eat('}'))
        malformed("expected ',' or '}'");
    }
    ws();
    if (i_ != s_.size())
      malformed("trailing characters after the record");
    if (!sawTokens)
      bad("tokens", "missing");

    // The record is good: commit it. Lengths and types are stored once a
    // record has them (the earlier records' defaults filled in).
    out_.tokens.insert(out_.tokens.end(), tokens_.begin(), tokens_.end());
    if (length_ != m_.seq && out_.lengths.empty())
      out_.lengths.assign(static_cast<size_t>(out_.count),
                          static_cast<int32_t>(m_.seq));
    if (!out_.lengths.empty())
      out_.lengths.push_back(length_);
    if (!types_.empty() && out_.types.empty())
      out_.types.assign(static_cast<size_t>(out_.count * m_.seq), 0);
    if (!out_.types.empty()) {
      if (types_.empty())
        out_.types.insert(out_.types.end(), static_cast<size_t>(m_.seq), 0);
      else
        out_.types.insert(out_.types.end(), types_.begin(), types_.end());
    }
    for (size_t t = 0; t < h_.size(); ++t) {
      out_.present[t].push_back(has_[t] ? 1 : 0);
      std::vector<float> &l = out_.labels[t];
      if (has_[t])
        l.insert(l.end(), staged_[t].begin(), staged_[t].end());
      else
        l.insert(l.end(), static_cast<size_t>(labelWidth(h_[t], m_)), 0.f);
    }
    ++out_.count;
  }

private:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  [[noreturn]] void bad(const std::string &field, const std::string &what) {
    throw DataError("mtprt: data file " + path_ + ", record on line " +
                    str(line_) + (field.empty() ? "" : ", field " + field) +
                    ": " + what);
  }
  [[noreturn]] void malformed(const std::string &what) {
    bad("", "malformed JSON at column " + str(int64_t(i_) + 1) + ": " + what);
  }

  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' ||
                              s_[i_] == '\r' || s_[i_] == '\n'))
      ++i_;
  }
  bool at(char c) {
    ws();
    return i_ < s_.size() && s_[i_] == c;
  }
  bool eat(char c) {
    if (!at(c))
      return false;
    ++i_;
    return true;
  }

  /// The kind of the value that starts here (after whitespace); refuses
  /// what starts no JSON value. Literals are consumed by the caller.
  Kind kind() {
    ws();
    if (i_ >= s_.size())
      malformed("unexpected end of line");
    const char c = s_[i_];
    if (c == '{')
      return Kind::Object;
    if (c == '[')
      return Kind::Array;
    if (c == '"')
      return Kind::String;
    if (c == '-' || (c >= '0' && c <= '9'))
      return Kind::Number;
    if (s_.compare(i_, 4, "null") == 0)
      return Kind::Null;
    if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 5, "false") == 0)
      return Kind::Bool;
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f)
      malformed(std::string("unexpected character '") + c + "'");
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", u);
    malformed(std::string("unexpected byte ") + hex);
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  /// A JSON number (RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?),
  /// nothing else: no hex, no leading '+' or zeros, no NaN or Infinity.
  /// Beyond a double's range: ±inf (overflow) or 0 (underflow).
  double number() {
    const size_t b = i_, n = s_.size();
    const bool negative = s_[i_] == '-';
    if (negative)
      ++i_;
    if (i_ >= n || !digit(s_[i_]))
      malformed("a number needs a digit after '-'");
    if (s_[i_] == '0') {
      ++i_;
      if (i_ < n && (s_[i_] == 'x' || s_[i_] == 'X'))
        malformed("hexadecimal numbers are not JSON (JSON has no 0x...): "
                  "write the value in decimal");
      if (i_ < n && digit(s_[i_]))
        malformed("leading zeros are not JSON (write 10, not 010)");
    } else {
      while (i_ < n && digit(s_[i_]))
        ++i_;
    }
    if (i_ < n && s_[i_] == '.') {
      ++i_;
      if (i_ >= n || !digit(s_[i_]))
        malformed("a number needs a digit after '.'");
      while (i_ < n && digit(s_[i_]))
        ++i_;
    }
    int64_t exponent = 0;
    if (i_ < n && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      bool expNegative = false;
      if (i_ < n && (s_[i_] == '+' || s_[i_] == '-'))
        expNegative = s_[i_++] == '-';
      if (i_ >= n || !digit(s_[i_]))
        malformed("a number needs a digit in its exponent");
      while (i_ < n && digit(s_[i_])) {
        exponent = std::min<int64_t>(exponent * 10 + (s_[i_] - '0'), 1 << 30);
        ++i_;
      }
      if (expNegative)
        exponent = -exponent;
    }
    if (i_ < n && (std::isalnum(static_cast<unsigned char>(s_[i_])) ||
                   s_[i_] == '.' || s_[i_] == '+' || s_[i_] == '-' ||
                   s_[i_] == '_'))
      malformed("'" + shown(s_.substr(b, i_ + 1 - b)) +
                "...' is not a JSON number");
    double v = 0;
    const auto r = std::from_chars(s_.data() + b, s_.data() + i_, v);
    if (r.ec == std::errc::result_out_of_range) {
      // Overflow or underflow: the decimal magnitude of the first non-zero
      // digit says which.
      int64_t magnitude = 0;
      size_t k = b + negative;
      size_t intDigits = 0;
      while (k < i_ && digit(s_[k]))
        intDigits += (intDigits || s_[k] != '0'), ++k;
      if (intDigits) {
        magnitude = int64_t(intDigits) - 1;
      } else if (k < i_ && s_[k] == '.') {
        ++k;
        int64_t zeros = 0;
        while (k < i_ && s_[k] == '0')
          ++zeros, ++k;
        magnitude = -zeros - 1;
      }
      v = magnitude + exponent < 0 ? 0.0 : HUGE_VAL;
      if (negative)
        v = -v;
    } else if (r.ec != std::errc() || r.ptr != s_.data() + i_) {
      malformed("not a JSON number");
    }
    return v;
  }

  static void utf8(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (s_.size() - i_ < 4)
      malformed("a \\u escape needs four hex digits");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (digit(c))
        v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= uint32_t(c - 'A' + 10);
      else
        malformed("a \\u escape needs four hex digits");
    }
    return v;
  }

  /// A JSON string (at '"'). Names are compared with the fields and tasks,
  /// so at most kMaxName + 1 bytes are kept: a longer one matches nothing.
  std::string string() {
    ++i_;
    std::string out;
    for (;;) {
      if (i_ >= s_.size())
        malformed("unterminated string");
      const auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        break;
      }
      if (c < 0x20)
        malformed("a control character inside a string (escape it)");
      if (c != '\\') {
        if (out.size() <= size_t(limits::kMaxNameBytes))
          out += char(c);
        ++i_;
        continue;
      }
      if (++i_ >= s_.size())
        malformed("unterminated string");
      const char e = s_[i_++];
      std::string piece;
      switch (e) {
      case '"': piece = "\""; break;
      case '\\': piece = "\\"; break;
      case '/': piece = "/"; break;
      case 'b': piece = "\b"; break;
      case 'f': piece = "\f"; break;
      case 'n': piece = "\n"; break;
      case 'r': piece = "\r"; break;
      case 't': piece = "\t"; break;
      case 'u': {
        uint32_t cp = hex4();
        if (cp >= 0xDC00 && cp <= 0xDFFF)
          malformed("a \\u escape with an unpaired low surrogate");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (s_.compare(i_, 2, "\\u") != 0)
            malformed("a \\u escape with an unpaired high surrogate");
          i_ += 2;
          const uint32_t lo = hex4();
          if (lo < 0xDC00 || lo > 0xDFFF)
            malformed("a \\u escape with an unpaired high surrogate");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        utf8(piece, cp);
        break;
      }
      default:
        --i_;
        malformed(std::string("unknown escape '\\") + shown({&e, 1}) + "'");
      }
      if (out.size() <= size_t(limits::kMaxNameBytes))
        out += piece;
    }
    return out;
  }

  /// Exactly `n` integers in [0, hi), or kIgnoreLabel too where
  /// `ignorable` (into `f` as floats or `ints`).
  void integers(const std::string &field, int64_t n, int64_t hi,
                std::vector<float> *f, std::vector<int32_t> *ints,
                bool ignorable = false) {
    if (kind() != Kind::Array)
      bad(field, "expected an array of " + str(n) + " integers");
    ++i_;
    int64_t count = 0;
    if (!eat(']')) {
      do {
        const Kind k = kind();
        const double x = k == Kind::Number ? number() : -2.0;
        if (!((x >= 0 || (ignorable && x == kIgnoreLabel)) &&
              x < static_cast<double>(hi) && x == std::floor(x)))
          bad(field + "[" + str(count) + "]",
              "expected an integer in [0, " + str(hi) + ")" +
                  (ignorable ? " or -1 (not scored)" : ""));
        if (count < n) {
          if (f)
            f->push_back(static_cast<float>(x));
          if (ints)
            ints->push_back(static_cast<int32_t>(x));
        }
        ++count;
      } while (eat(','));
      if (!eat(']'))
        malformed("expected ',' or ']'");
    }
    if (count != n)
      bad(field, "has " + str(count) + " values, expected " + str(n));
  }

  void labels() {
    if (kind() != Kind::Object)
      bad("labels", "expected an object (task name -> label)");
    ++i_;
    if (eat('}'))
      return;
    do {
      if (!at('"'))
        malformed("expected a task name in quotes");
      const std::string name = string();
      if (!eat(':'))
        malformed("expected ':' after the task name");
      const auto it = byName_.find(name);
      if (it == byName_.end())
        bad("labels." + shown(name), "no task of that name");
      if (seen_[it->second])
        bad("labels." + shown(name), "appears twice");
      seen_[it->second] = true;
      label(it->second);
    } while (eat(','));
    if (!eat('}'))
      malformed("expected ',' or '}'");
  }

  void label(size_t t) {
    const HeadConfig &c = h_[t];
    const std::string field = "labels." + c.name;
    const Kind k = kind();
    if (k == Kind::Null) {
      i_ += 4;
      has_[t] = false;
      return;
    }
    has_[t] = true;
    std::vector<float> &out = staged_[t];
    out.clear();
    switch (c.kind) {
    case HeadKind::Classify:
      if (c.loss == LossKind::Mse) {
        const std::string expected =
            "expected an array of " + str(c.classes) + " numbers";
        if (k != Kind::Array)
          bad(field, expected);
        ++i_;
        int64_t count = 0;
        if (!eat(']')) {
          do {
            if (kind() != Kind::Number)
              bad(field + "[" + str(count) + "]", "expected a number");
            const double x = number();
            if (!(std::fabs(x) <= FLT_MAX))
              bad(field + "[" + str(count) + "]",
                  "out of the range of a float");
            if (count < c.classes)
              out.push_back(static_cast<float>(x));
            ++count;
          } while (eat(','));
          if (!eat(']'))
            malformed("expected ',' or ']'");
        }
        if (count != c.classes)
          bad(field, expected + ", got " + str(count));
      } else {
        const double x = k == Kind::Number ? number() : -1.0;
        if (!(x >= 0 && x < static_cast<double>(c.classes) &&
              x == std::floor(x)))
          bad(field, "expected a class in [0, " + str(c.classes) + ")");
        out.push_back(static_cast<float>(x));
      }
      break;
    case HeadKind::Tag:
      integers(field, m_.seq, c.classes, &out, nullptr, /*ignorable=*/true);
      break;
    case HeadKind::Span:
      integers(field, 2, m_.seq, &out, nullptr);
      if (out[0] > out[1])
        bad(field, "start is after end");
      break;
    case HeadKind::Decoder:
      integers(field, c.targetSeq, targetVocab(c, m_), &out, nullptr,
               /*ignorable=*/true);
      break;
    }
  }

  const std::string &path_;
  const ModelConfig &m_;
  const std::vector<HeadConfig> &h_;
  Records &out_;
  std::unordered_map<std::string, size_t> byName_;
  std::string_view s_;
  size_t i_ = 0;
  int64_t line_ = 0;
  std::vector<int32_t> tokens_, types_;
  int32_t length_ = 0;
  std::vector<std::vector<float>> staged_;
  std::vector<bool> has_, seen_;
};

//===----------------------------------------------------------------------===//
// Shards
//===----------------------------------------------------------------------===//

/// a * b, or false when it does not fit 64 bits.
bool mul(uint64_t a, uint64_t b, uint64_t &out) {
  return !__builtin_mul_overflow(a, b, &out);
}

class ShardReader {
public:
  ShardReader(std::istream &in, uint64_t size, const std::string &path)
      : in_(in), size_(size), path_(path) {}

  [[noreturn]] void fail(const std::string &what) {
    throw DataError("mtprt: data file " + path_ + ": " + what);
  }
  [[noreturn]] void failRecord(int64_t record, const std::string &what) {
    throw DataError("mtprt: data file " + path_ + ", record " +
                    std::to_string(record) + ", " + what);
  }
  /// A u32 length, then that many bytes: 1 to kMaxNameBytes of them,
  /// checked against the file before anything is allocated. `field` names
  /// the length in the error ("<where>: <field> N is not in [1, ...]").
  std::string name(const std::string &where, const std::string &field) {
    uint32_t len = 0;
    get(&len, 4, where);
    if (len == 0 || len > uint32_t(limits::kMaxNameBytes))
      fail(where + ": " + field + " " + std::to_string(len) +
           " is not in [1, " + std::to_string(limits::kMaxNameBytes) + "]");
    std::string out(std::min<uint64_t>(len, left()), '\0');
    get(out.data(), len, where);
    return out;
  }
  uint64_t left() const { return size_ - off_; }
  uint64_t offset() const { return off_; }
  void get(void *p, uint64_t n, const std::string &section) {
    if (n > left())
      fail("truncated in " + section);
    in_.read(static_cast<char *>(p), static_cast<std::streamsize>(n));
    if (static_cast<uint64_t>(in_.gcount()) != n)
      fail("truncated in " + section + " (a read error, or the file shrank)");
    off_ += n;
  }

private:
  std::istream &in_;
  uint64_t size_, off_ = 0;
  const std::string &path_;
};

} // namespace

int64_t labelWidth(const HeadConfig &c, const ModelConfig &m) {
  switch (c.kind) {
  case HeadKind::Classify:
    return c.loss == LossKind::Mse ? c.classes : 1;
  case HeadKind::Tag:
    return m.seq;
  case HeadKind::Span:
    return 2;
  case HeadKind::Decoder:
    return c.targetSeq;
  }
  return 1;
}

size_t maxJsonLinesLineBytes(const ModelConfig &model,
                             const std::vector<HeadConfig> &heads) {
  uint64_t values = static_cast<uint64_t>(std::max<int64_t>(model.seq, 0));
  for (const HeadConfig &h : heads)
    values += static_cast<uint64_t>(std::max<int64_t>(labelWidth(h, model), 0));
  return static_cast<size_t>((uint64_t(1) << 20) + 64 * values +
                             256 * heads.size());
}

Records readJsonLines(std::istream &in, const std::string &path,
                      const ModelConfig &model,
                      const std::vector<HeadConfig> &heads) {
  Records out;
  out.present.resize(heads.size());
  out.labels.resize(heads.size());
  out.labelNames.resize(heads.size());
  RecordParser parser(path, model, heads, out);
  const size_t limit = maxJsonLinesLineBytes(model, heads);
  std::string line;
  int64_t lineNo = 0;
  while (readLine(in, line, limit)) {
    ++lineNo;
    if (line.size() > limit)
      throw DataError("mtprt: data file " + path + ", line " + str(lineNo) +
                      ": longer than " + str(int64_t(limit)) +
                      " bytes, far more than a record of this model takes; "
                      "a JSON Lines file has one record per line");
    std::string_view text = line;
    if (lineNo == 1 && text.substr(0, 3) == "\xEF\xBB\xBF")
      text.remove_prefix(3); // a UTF-8 byte order mark
    if (text.find_first_not_of(" \t\r") == std::string_view::npos)
      continue; // blank lines are allowed
    parser.parse(text, lineNo);
  }
  if (in.bad())
    throw DataError("mtprt: data file " + path + ": read error after line " +
                    str(lineNo));
  if (out.count == 0)
    throw DataError("mtprt: data file " + path + ": no records");
  return out;
}

Records readShard(std::istream &in, uint64_t size, const std::string &path,
                  const ModelConfig &model,
                  const std::vector<HeadConfig> &heads) {
  ShardReader r(in, size, path);
  char magic[8];
  uint32_t version = 0, tasks = 0;
  int64_t records = 0, seq = 0;
  r.get(magic, 8, "the header");
  if (std::memcmp(magic, kShardMagic, 8) != 0)
    r.fail("not an mtprt shard (bad magic); make one with `PROGRAM --data "
           "FILE.jsonl --write-shard FILE.shard`");
  r.get(&version, 4, "the header");
  if (version != 1 && version != kShardVersion)
    r.fail("field version: " + str(version) + ", this runtime reads 1 and " +
           str(kShardVersion) +
           "; write the shard again with --write-shard or mtpc prepare");
  r.get(&tasks, 4, "the header");
  r.get(&records, 8, "the header");
  r.get(&seq, 8, "the header");
  uint32_t flags = 0;
  if (version >= 2) {
    r.get(&flags, 4, "the header");
    if (flags & ~(kShardHasLengths | kShardHasTypes))
      r.fail("field flags: " + str(flags) + " has bits this runtime does not "
             "know (a newer shard, or a damaged header)");
  }
  if (seq != model.seq)
    r.fail("field seq: " + str(seq) + ", the model has " + str(model.seq));
  if (tasks > heads.size())
    r.fail("field tasks: " + str(tasks) + ", but the program has " +
           str(int64_t(heads.size())) +
           " (a shard lists each of its tasks once); a damaged header?");
  // Every task-table entry takes at least 12 bytes and every record at
  // least seq × 4: both against what the file has left, before anything is
  // allocated from them.
  uint64_t tokenBytes = 0;
  if (records <= 0 ||
      !mul(static_cast<uint64_t>(records), static_cast<uint64_t>(seq) * 4,
           tokenBytes) ||
      tokenBytes > r.left())
    r.fail("field records: " + str(records) + " (" + str(seq) +
           " tokens each) does not fit the file's " +
           str(int64_t(size)) + " bytes; a damaged header?");

  std::vector<int64_t> order(tasks);
  std::vector<bool> taken(heads.size(), false);
  std::vector<std::vector<std::string>> names(heads.size());
  for (uint32_t i = 0; i < tasks; ++i) {
    const std::string entry = "the task table (entry " + str(i) + ")";
    const std::string name = r.name(entry, "field name length");
    int64_t width = 0;
    r.get(&width, 8, entry);
    size_t t = 0;
    while (t < heads.size() && heads[t].name != name)
      ++t;
    if (t == heads.size())
      r.fail("task '" + shown(name) + "': no task of that name in the program");
    if (taken[t])
      r.fail("task '" + name + "' appears twice in the task table");
    taken[t] = true;
    const int64_t expected = labelWidth(heads[t], model);
    if (width != expected)
      r.fail("task " + name + ": label width " + str(width) + ", expected " +
             str(expected));
    order[i] = static_cast<int64_t>(t);
    if (version < 2)
      continue;
    uint32_t count = 0;
    r.get(&count, 4, entry);
    if (int64_t(count) > maxLabelNames(heads[t]))
      r.fail("task " + name + ": " + str(count) + " label names, but it has " +
             (maxLabelNames(heads[t])
                  ? str(maxLabelNames(heads[t])) + " classes"
                  : std::string("no named labels")) +
             " (prepare the data for this spec)");
    for (uint32_t k = 0; k < count; ++k) {
      const std::string where = "task " + name + ": label name " + str(k);
      std::string label = r.name(where, "length");
      if (std::string why = badLabelName(label); !why.empty())
        r.fail(where + ": " + why);
      names[t].push_back(std::move(label));
    }
  }
  const bool hasLengths = flags & kShardHasLengths,
             hasTypes = flags & kShardHasTypes;
  // The optional sections, sized by the records (already bounded above).
  const uint64_t lengthBytes = hasLengths ? uint64_t(records) * 4 : 0,
                 typeBytes = hasTypes ? tokenBytes / 4 : 0;

  // The whole layout against the file's length: a short file names the
  // section it ends in, a long one is refused, before the big reads.
  {
    uint64_t end = r.offset() + tokenBytes;
    if (end > size)
      r.fail("truncated in the tokens");
    if ((end += lengthBytes) > size)
      r.fail("truncated in the lengths");
    if ((end += typeBytes) > size)
      r.fail("truncated in the token types");
    for (uint32_t i = 0; i < tasks; ++i) {
      const int64_t width = labelWidth(heads[order[i]], model);
      uint64_t labelBytes = 0, taskBytes = 0;
      if (!mul(static_cast<uint64_t>(records), uint64_t(width) * 4,
               labelBytes) ||
          __builtin_add_overflow(labelBytes, uint64_t(records), &taskBytes) ||
          __builtin_add_overflow(end, taskBytes, &end) || end > size)
        r.fail("truncated in task " + heads[order[i]].name);
    }
    if (end < size)
      r.fail("trailing bytes after the last task (" + str(int64_t(size - end)) +
             " of them)");
  }

  Records out;
  out.count = records;
  out.tokens.resize(static_cast<size_t>(records * seq));
  r.get(out.tokens.data(), tokenBytes, "the tokens");
  for (size_t k = 0; k < out.tokens.size(); ++k)
    if (out.tokens[k] < 0 || out.tokens[k] >= model.vocab)
      r.failRecord(int64_t(k) / seq,
                   "field tokens: id out of [0, " + str(model.vocab) + ")");
  if (hasLengths) {
    out.lengths.resize(static_cast<size_t>(records));
    r.get(out.lengths.data(), lengthBytes, "the lengths");
    for (int64_t k = 0; k < records; ++k)
      if (out.lengths[k] < 1 || out.lengths[k] > seq)
        r.failRecord(k, "field length: " + str(out.lengths[k]) +
                            " is not in [1, " + str(seq) + "]");
  }
  if (hasTypes) {
    out.types.resize(static_cast<size_t>(records * seq));
    r.get(out.types.data(), typeBytes, "the token types");
    for (size_t k = 0; k < out.types.size(); ++k)
      if (out.types[k] >= typeLimit(model))
        r.failRecord(int64_t(k) / seq,
                     "field types: " + str(out.types[k]) + " is not in [0, " +
                         str(typeLimit(model)) +
                         ") (the backbone's token types)");
  }
  out.labelNames = std::move(names);

  out.present.assign(heads.size(), {});
  out.labels.assign(heads.size(), {});
  for (uint32_t i = 0; i < tasks; ++i) {
    const size_t t = static_cast<size_t>(order[i]);
    const HeadConfig &c = heads[t];
    const int64_t width = labelWidth(c, model);
    const std::string section = "task " + c.name;
    std::vector<uint8_t> &present = out.present[t];
    present.resize(static_cast<size_t>(records));
    r.get(present.data(), present.size(), section);
    std::vector<float> &labels = out.labels[t];
    labels.resize(static_cast<size_t>(records * width));
    r.get(labels.data(), labels.size() * 4, section);
    const bool mse = c.kind == HeadKind::Classify && c.loss == LossKind::Mse;
    const int64_t hi = c.kind == HeadKind::Classify || c.kind == HeadKind::Tag
                           ? c.classes
                       : c.kind == HeadKind::Span ? model.seq
                                                  : targetVocab(c, model);
    const bool ignorable =
        c.kind == HeadKind::Tag || c.kind == HeadKind::Decoder;
    for (int64_t rec = 0; rec < records; ++rec) {
      if (present[rec] > 1)
        r.failRecord(rec, "task " + c.name + ": presence flag " +
                              str(present[rec]) + " (expected 0 or 1)");
      if (!present[rec])
        continue;
      const float *l = labels.data() + rec * width;
      for (int64_t k = 0; k < width; ++k) {
        const float x = l[k];
        if (mse ? !std::isfinite(x)
                : !((x >= 0 || (ignorable && x == kIgnoreLabel)) &&
                    x < static_cast<float>(hi) && x == std::floor(x)))
          r.failRecord(rec, "field labels." + c.name +
                                (mse ? ": expected finite numbers"
                                     : ": expected integers in [0, " +
                                           str(hi) + ")" +
                                           (ignorable ? " or -1" : "")));
      }
      if (c.kind == HeadKind::Span && l[0] > l[1])
        r.failRecord(rec, "field labels." + c.name + ": start is after end");
    }
  }
  // The tasks the shard does not have: no labels.
  for (size_t t = 0; t < heads.size(); ++t)
    if (!taken[t]) {
      out.present[t].assign(static_cast<size_t>(records), 0);
      out.labels[t].assign(
          static_cast<size_t>(records * labelWidth(heads[t], model)), 0.f);
    }
  return out;
}

void writeShard(std::ostream &out, const Records &records,
                const std::string &path, const ModelConfig &model,
                const std::vector<HeadConfig> &heads) {
  auto put = [&](const void *p, size_t n) {
    out.write(static_cast<const char *>(p), static_cast<std::streamsize>(n));
  };
  const uint32_t version = kShardVersion,
                 tasks = static_cast<uint32_t>(heads.size()),
                 flags = (records.lengths.empty() ? 0 : kShardHasLengths) |
                         (records.types.empty() ? 0 : kShardHasTypes);
  put(kShardMagic, 8);
  put(&version, 4);
  put(&tasks, 4);
  put(&records.count, 8);
  put(&model.seq, 8);
  put(&flags, 4);
  for (size_t t = 0; t < heads.size(); ++t) {
    const HeadConfig &h = heads[t];
    const uint32_t len = static_cast<uint32_t>(h.name.size());
    const int64_t width = labelWidth(h, model);
    put(&len, 4);
    put(h.name.data(), len);
    put(&width, 8);
    static const std::vector<std::string> none;
    const std::vector<std::string> &names =
        t < records.labelNames.size() ? records.labelNames[t] : none;
    const uint32_t count = static_cast<uint32_t>(names.size());
    put(&count, 4);
    for (const std::string &n : names) {
      const uint32_t nlen = static_cast<uint32_t>(n.size());
      put(&nlen, 4);
      put(n.data(), nlen);
    }
  }
  put(records.tokens.data(), records.tokens.size() * 4);
  put(records.lengths.data(), records.lengths.size() * 4);
  put(records.types.data(), records.types.size());
  for (size_t t = 0; t < heads.size(); ++t) {
    put(records.present[t].data(), records.present[t].size());
    put(records.labels[t].data(), records.labels[t].size() * 4);
  }
  out.flush();
  if (!out)
    throw DataError("mtprt: shard " + path + ": write failed");
}

} // namespace mtprt
