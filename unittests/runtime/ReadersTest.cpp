//===- ReadersTest.cpp - every reader bounded, every failure its own ------===//
//
// The runtime's readers of JSON Lines files, binary shards and checkpoint
// headers (the plan's: PlanTest.cpp) fed what damaged or hostile files hold.
// Each must refuse with the runtime's own error naming the file and the
// field (or line, section, offset) — never crash, recurse without bound,
// allocate what the file does not hold, or hang. Inputs that once allocated
// without bound run in a forked child under an address-space limit
// (RLIMIT_AS) and an alarm, so a regression fails the test instead of
// taking the machine down.
//
//===----------------------------------------------------------------------===//

#include "mtprt/CheckpointFormat.h"
#include "mtprt/Crc32.h"
#include "mtprt/DataFormat.h"
#include "mtprt/Safetensors.h"

#include "Fixtures.h"
#include "Sanitizers.h"

#include <gtest/gtest.h>

#include <cctype>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace mtprt;
using namespace fixtures;

namespace {

/// The process's address-space size now (bytes).
uint64_t addressSpace() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

/// Runs `f` in a forked child whose address space may grow by `extra`
/// bytes at most and which gets 60 s. Returns "ok", "FileError: <message>"
/// for the runtime's own errors, "foreign exception: <what>" for anything
/// else thrown, or how the child died ("killed by signal 11").
std::string limited(const std::function<void()> &f,
                    uint64_t extra = uint64_t(256) << 20) {
  int fds[2];
  if (::pipe(fds) != 0)
    return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const uint64_t cap = addressSpace() + extra;
    rlimit r{cap, cap};
    if (!kAddressSanitizer)
      ::setrlimit(RLIMIT_AS, &r);
    ::alarm(60);
    std::string out;
    try {
      f();
      out = "ok";
    } catch (const FileError &e) {
      out = std::string("FileError: ") + e.what();
    } catch (const std::exception &e) {
      out = std::string("foreign exception: ") + e.what();
    } catch (...) {
      out = "foreign exception";
    }
    const char *p = out.data();
    size_t n = out.size();
    while (n) {
      const ssize_t w = ::write(fds[1], p, n);
      if (w <= 0)
        break;
      p += w;
      n -= size_t(w);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    got.append(buf, size_t(n));
  ::close(fds[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (WIFSIGNALED(st))
    return "killed by signal " + std::to_string(WTERMSIG(st));
  return got;
}

std::string fileError(const std::string &message) {
  return "FileError: " + message;
}

//===----------------------------------------------------------------------===//
// JSON Lines
//===----------------------------------------------------------------------===//

/// Every head kind: a class, a regression of 3 outputs, tags, a span, a
/// decoder over a vocabulary of 10.
std::vector<HeadConfig> heads() {
  HeadConfig reg = classifyHead("reg", 1, 3);
  reg.loss = LossKind::Mse;
  return {classifyHead("cls", 1, 4), reg, tagHead("tag", 2, 6),
          spanHead("qa", 2), decoderHead("gen", 2, 10, 4)};
}

const std::string kPath = "d.jsonl";
const std::string kRecord =
    R"({"tokens": [1, 2, 3, 4, 5, 6, 7, 8], "labels": {"cls": 3, "reg": )"
    R"([0.5, -1e-3, 2E+2], "tag": [0, 1, 2, 3, 4, 5, 0, 1], "qa": [2, 5], )"
    R"("gen": [9, 0, 1, 2]}})";

Records readText(const std::string &text) {
  std::istringstream in(text);
  return readJsonLines(in, kPath, tinyModel(), heads());
}

/// The error reading `text` gives, in a limited child.
std::string jsonError(const std::string &text) {
  return limited([&] { readText(text); });
}

std::string atLine(int line, const std::string &rest) {
  return fileError("mtprt: data file " + kPath + ", record on line " +
                   std::to_string(line) + rest);
}

TEST(Readers, JsonLinesReadsEveryHeadKind) {
  Records r = readText(kRecord + "\n\n  \r\n" +
                       R"({"labels": {"gen": null}, "tokens": [0,0,0,0,0,0,0,31]})" +
                       "\r\n");
  ASSERT_EQ(r.count, 2);
  EXPECT_EQ(r.tokens, std::vector<int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0,
                                            0, 0, 0, 0, 31}));
  EXPECT_EQ(r.present[0], std::vector<uint8_t>({1, 0}));
  EXPECT_EQ(r.present[4], std::vector<uint8_t>({1, 0}));
  EXPECT_EQ(r.labels[1], std::vector<float>({0.5f, -1e-3f, 200.f, 0, 0, 0}));
  EXPECT_EQ(r.labels[3], std::vector<float>({2, 5, 0, 0}));
  EXPECT_EQ(r.labels[4], std::vector<float>({9, 0, 1, 2, 0, 0, 0, 0}));
  // JSON's escapes in names, a byte order mark, integral values as reals.
  Records e = readText("\xEF\xBB\xBF" R"({"tok\u0065ns": [1.0, 2e0, 3, 4, 5, )"
                       R"(6, 7, 8], "labels": {"\u0063ls": 0}})");
  EXPECT_EQ(e.present[0], std::vector<uint8_t>({1}));
  EXPECT_EQ(e.tokens[1], 2);
}

TEST(Readers, JsonLinesNestingIsRefusedWithoutRecursion) {
  // 30k '[' (the line that used to overflow the stack): refused where the
  // record's shape is not met, in a child with a small stack so recursion
  // would show as a signal.
  const std::string deep(30000, '[');
  auto smallStack = [](const std::function<void()> &f) {
    return limited([&] {
      rlimit r{256 << 10, 256 << 10};
      ::setrlimit(RLIMIT_STACK, &r);
      f();
    });
  };
  EXPECT_EQ(smallStack([&] { readText(deep); }),
            atLine(1, ": a record must be a JSON object"));
  EXPECT_EQ(smallStack([&] { readText(R"({"tokens": )" + deep); }),
            atLine(1, ", field tokens[0]: expected an integer in [0, 32)"));
  EXPECT_EQ(smallStack([&] {
              readText(R"({"tokens": [1,2,3,4,5,6,7,8], "labels": {"reg": [)" +
                       deep);
            }),
            atLine(1, ", field labels.reg[0]: expected a number"));
  EXPECT_EQ(smallStack([&] {
              readText(kRecord + "\n" + R"({"labels": {"cls": )" + deep);
            }),
            atLine(2, ", field labels.cls: expected a class in [0, 4)"));
}

TEST(Readers, JsonLinesIsStrictJson) {
  const std::string t = R"({"tokens": [1,2,3,4,5,6,7,)";
  const std::string malformed = ": malformed JSON at column ";
  // Item 9 of issue #15: hex used to be read as a token id.
  EXPECT_EQ(jsonError(t + "0x10]}"),
            atLine(1, malformed + "28: hexadecimal numbers are not JSON (JSON "
                                  "has no 0x...): write the value in decimal"));
  EXPECT_EQ(jsonError(t + "010]}"),
            atLine(1, malformed +
                          "28: leading zeros are not JSON (write 10, not 010)"));
  EXPECT_EQ(jsonError(t + "+8]}"), atLine(1, malformed + "27: unexpected "
                                                         "character '+'"));
  EXPECT_EQ(jsonError(t + ".5]}"),
            atLine(1, malformed + "27: unexpected character '.'"));
  EXPECT_EQ(jsonError(t + "8.]}"),
            atLine(1, malformed + "29: a number needs a digit after '.'"));
  EXPECT_EQ(jsonError(t + "8e]}"),
            atLine(1, malformed + "29: a number needs a digit in its exponent"));
  EXPECT_EQ(jsonError(t + "NaN]}"),
            atLine(1, malformed + "27: unexpected character 'N'"));
  EXPECT_EQ(jsonError(t + "Infinity]}"),
            atLine(1, malformed + "27: unexpected character 'I'"));
  EXPECT_EQ(jsonError(t + "-]}"),
            atLine(1, malformed + "28: a number needs a digit after '-'"));
  EXPECT_EQ(jsonError(t + "8abc]}"),
            atLine(1, malformed + "28: '8a...' is not a JSON number"));
  EXPECT_EQ(jsonError(t + "8,]}"),
            atLine(1, malformed + "29: unexpected character ']'"));
  EXPECT_EQ(jsonError(t + "8] // c\n"),
            atLine(1, malformed + "30: expected ',' or '}'"));
  EXPECT_EQ(jsonError("{'tokens': []}"),
            atLine(1, malformed + "2: expected a field name in quotes"));
  EXPECT_EQ(jsonError("{\"tok\tens\": []}"),
            atLine(1, malformed +
                          "6: a control character inside a string (escape it)"));
  EXPECT_EQ(jsonError(R"({"tok\x": []})"),
            atLine(1, malformed + "7: unknown escape '\\x'"));
  EXPECT_EQ(jsonError(R"({"\ud800": []})"),
            atLine(1, malformed + "9: a \\u escape with an unpaired high "
                                  "surrogate"));
  EXPECT_EQ(jsonError(t + "8]} x"),
            atLine(1, malformed + "31: trailing characters after the record"));
  EXPECT_EQ(jsonError(t + "8], \"tokens\": []}"),
            atLine(1, ", field tokens: appears twice"));
  EXPECT_EQ(jsonError(t + R"(8], "labels": {"cls": 1, "cls": 2}})"),
            atLine(1, ", field labels.cls: appears twice"));
  EXPECT_EQ(jsonError(t + R"(8], "labels": {"reg": [1, 2, 1e39]}})"),
            atLine(1, ", field labels.reg[2]: out of the range of a float"));
  EXPECT_EQ(jsonError(t + R"(8], "labels": {"reg": [1, 2]}})"),
            atLine(1, ", field labels.reg: expected an array of 3 numbers, "
                      "got 2"));
  EXPECT_EQ(jsonError(t + R"(8], "labels": {"gen": [1, 2, 3, 10]}})"),
            atLine(1, ", field labels.gen[3]: expected an integer in [0, 10) "
                    "or -1 (not scored)"));
  EXPECT_EQ(jsonError(t + "8, 9]}"),
            atLine(1, ", field tokens: has 9 values, expected 8"));
  EXPECT_EQ(jsonError(t + "1e400]}"),
            atLine(1, ", field tokens[7]: expected an integer in [0, 32)"));
  EXPECT_EQ(jsonError(t + "8], \"labels\": null}"),
            atLine(1, ", field labels: expected an object (task name -> "
                      "label)"));
  EXPECT_EQ(jsonError(t + "\x01]}"),
            atLine(1, malformed + "27: unexpected byte 0x01"));
  EXPECT_EQ(jsonError(""), fileError("mtprt: data file " + kPath +
                                     ": no records"));
}

TEST(Readers, JsonLinesLinesAreBounded) {
  // A file that is not one record per line: refused when the line passes the
  // model's bound, having stored no more than that.
  const size_t limit = maxJsonLinesLineBytes(tinyModel(), heads());
  EXPECT_LT(limit, size_t(2) << 20);
  EXPECT_EQ(limited(
                [&] {
                  std::string text = kRecord + "\n{\"tokens\": [" +
                                     std::string(limit, ' ');
                  std::istringstream in(text);
                  readJsonLines(in, kPath, tinyModel(), heads());
                },
                uint64_t(64) << 20),
            fileError("mtprt: data file " + kPath + ", line 2: longer than " +
                      std::to_string(limit) +
                      " bytes, far more than a record of this model takes; "
                      "a JSON Lines file has one record per line"));
}

//===----------------------------------------------------------------------===//
// Shards
//===----------------------------------------------------------------------===//

std::string shardOf(const Records &r) {
  std::ostringstream out;
  writeShard(out, r, "s.shard", tinyModel(), heads());
  return out.str();
}

Records readShardBytes(const std::string &bytes) {
  std::istringstream in(bytes);
  return readShard(in, bytes.size(), "s.shard", tinyModel(), heads());
}

std::string shardError(const std::string &bytes) {
  return limited([&] { readShardBytes(bytes); });
}

std::string shardFails(const std::string &what) {
  return fileError("mtprt: data file s.shard: " + what);
}

template <typename T> void poke(std::string &bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

TEST(Readers, ShardRoundTripsEveryHeadKind) {
  const Records r =
      readText(kRecord + "\n" + R"({"tokens": [0,0,0,0,0,0,0,31]})");
  const Records s = readShardBytes(shardOf(r));
  EXPECT_EQ(s.count, r.count);
  EXPECT_EQ(s.tokens, r.tokens);
  EXPECT_EQ(s.present, r.present);
  EXPECT_EQ(s.labels, r.labels);
}

TEST(Readers, PaddingTypesIgnoredTagsAndLabelNamesRoundTrip) {
  // A padded record (length 5), token types, a later sub-token's tag not
  // scored (-1); records before and after take the defaults.
  ModelConfig bert = tinyModel();
  bert.typeVocab = 2;
  const std::string text =
      kRecord + "\n" +
      R"({"tokens": [1, 2, 3, 4, 5, 0, 0, 0], "length": 5, )"
      R"("types": [0, 0, 1, 1, 1, 0, 0, 0], )"
      R"("labels": {"tag": [0, 1, -1, 2, -1, -1, -1, -1]}})" +
      "\n" + kRecord;
  std::istringstream in(text);
  Records r = readJsonLines(in, kPath, bert, heads());
  ASSERT_EQ(r.count, 3);
  EXPECT_EQ(r.lengths, std::vector<int32_t>({8, 5, 8}));
  ASSERT_EQ(r.types.size(), 24u);
  EXPECT_EQ(r.types[8 + 2], 1);
  EXPECT_EQ(r.types[0], 0);
  EXPECT_EQ(r.labels[2][8 + 2], float(kIgnoreLabel));
  r.labelNames[0] = {"neg", "neutral", "pos", "mixed"};
  r.labelNames[2] = {"O", "B-PER", "I-PER"};
  std::ostringstream out;
  writeShard(out, r, "s.shard", bert, heads());
  std::istringstream back(out.str());
  const Records s = readShard(back, out.str().size(), "s.shard", bert, heads());
  EXPECT_EQ(s.lengths, r.lengths);
  EXPECT_EQ(s.types, r.types);
  EXPECT_EQ(s.labels, r.labels);
  EXPECT_EQ(s.labelNames, r.labelNames);

  // Refused where they stand.
  auto bad = [&](const std::string &rec) {
    return limited([&] {
      std::istringstream in(rec);
      readJsonLines(in, kPath, bert, heads());
    });
  };
  const std::string t = R"({"tokens": [1, 2, 3, 4, 5, 6, 7, 8], )";
  EXPECT_EQ(bad(t + R"("length": 0})"),
            atLine(1, ", field length: expected the count of real tokens, "
                      "in [1, 8]"));
  EXPECT_EQ(bad(t + R"("length": 9})"),
            atLine(1, ", field length: expected the count of real tokens, "
                      "in [1, 8]"));
  EXPECT_EQ(bad(t + R"("types": [0, 0, 2, 0, 0, 0, 0, 0]})"),
            atLine(1, ", field types[2]: expected an integer in [0, 2)"));
  EXPECT_EQ(bad(t + R"("labels": {"cls": -1}})"),
            atLine(1, ", field labels.cls: expected a class in [0, 4)"));
  EXPECT_EQ(bad(t + R"("labels": {"tag": [0, 0, -2, 0, 0, 0, 0, 0]}})"),
            atLine(1, ", field labels.tag[2]: expected an integer in [0, 6) "
                      "or -1 (not scored)"));
  // Without token types in the backbone, only type 0.
  EXPECT_EQ(jsonError(t + R"("types": [0, 0, 1, 0, 0, 0, 0, 0]})"),
            atLine(1, ", field types[2]: expected an integer in [0, 1)"));

  // A label name with a control character, in a shard.
  Records named = r;
  named.labelNames[0][1] = std::string("neu\0tral", 8);
  std::ostringstream w;
  writeShard(w, named, "s.shard", bert, heads());
  EXPECT_EQ(limited([&] {
              std::istringstream in(w.str());
              readShard(in, w.str().size(), "s.shard", bert, heads());
            }),
            shardFails("task cls: label name 1: label name 'neu?tral' has a "
                       "control character"));
}

TEST(Readers, VersionOneShardsStillRead) {
  // A version 2 shard without names, lengths or types is a version 1 shard
  // plus the flags word and a zero name count per task.
  const Records r =
      readText(kRecord + "\n" + R"({"tokens": [0,0,0,0,0,0,0,31]})");
  std::string v2 = shardOf(r), v1 = v2.substr(0, 32);
  poke<uint32_t>(v1, 8, 1u);
  size_t at = 36;
  for (const HeadConfig &h : heads()) {
    const size_t entry = 4 + h.name.size() + 8;
    v1 += v2.substr(at, entry);
    at += entry + 4;
  }
  v1 += v2.substr(at);
  const Records s = readShardBytes(v1);
  EXPECT_EQ(s.tokens, r.tokens);
  EXPECT_EQ(s.labels, r.labels);
  EXPECT_TRUE(s.lengths.empty());
}

TEST(Readers, ShardHeaderFieldsAreCheckedBeforeAllocating) {
  const std::string good =
      shardOf(readText(kRecord + "\n" + R"({"tokens": [0,0,0,0,0,0,0,31]})"));
  // Offsets: magic 0, version 8, tasks 12, records 16, seq 24, flags 32,
  // table 36 (an entry: name length, name, width, label-name count, names).
  std::string b = good;
  poke<uint32_t>(b, 12, 0x7fff0005); // one flipped byte: once ~34 GB
  EXPECT_EQ(shardError(b),
            shardFails("field tasks: 2147418117, but the program has 5 (a "
                       "shard lists each of its tasks once); a damaged "
                       "header?"));
  b = good;
  poke<int64_t>(b, 16, int64_t(1) << 40);
  EXPECT_EQ(shardError(b),
            shardFails("field records: 1099511627776 (8 tokens each) does not "
                       "fit the file's " +
                       std::to_string(good.size()) +
                       " bytes; a damaged header?"));
  b = good;
  poke<int64_t>(b, 16, -2);
  EXPECT_NE(shardError(b).find("field records: -2 (8 tokens each)"),
            std::string::npos);
  b = good;
  poke<int64_t>(b, 16, 3); // within the file's length, but not its layout
  EXPECT_EQ(shardError(b), shardFails("truncated in task tag"));
  b = good;
  poke<int64_t>(b, 24, 9);
  EXPECT_EQ(shardError(b), shardFails("field seq: 9, the model has 8"));
  b = good;
  poke<uint32_t>(b, 8, 7);
  EXPECT_EQ(shardError(b), shardFails("field version: 7, this runtime reads "
                                      "1 and 2; write the shard again with "
                                      "--write-shard or mtpc prepare"));
  b = good;
  poke<uint32_t>(b, 32, 8u);
  EXPECT_EQ(shardError(b),
            shardFails("field flags: 8 has bits this runtime does not know (a "
                       "newer shard, or a damaged header)"));
  b = good;
  poke<uint32_t>(b, 36 + 4 + 3 + 8, 5u); // cls: 5 label names, 4 classes
  EXPECT_EQ(shardError(b),
            shardFails("task cls: 5 label names, but it has 4 classes "
                       "(prepare the data for this spec)"));
  b = good;
  poke<uint32_t>(b, 36, 0xfffffff0u);
  EXPECT_EQ(shardError(b),
            shardFails("the task table (entry 0): field name length "
                       "4294967280 is not in [1, 4096]"));
  b = good;
  poke<int64_t>(b, 36 + 4 + 3, int64_t(1) << 50); // cls's width
  EXPECT_EQ(shardError(b),
            shardFails("task cls: label width 1125899906842624, expected 1"));
  b = good;
  std::memcpy(b.data() + 36 + 4 + 3 + 8 + 4 + 4, "cls", 3); // reg -> cls
  EXPECT_EQ(shardError(b),
            shardFails("task 'cls' appears twice in the task table"));
  b = good;
  b[good.size() - 2 * 4 * 4 - 2] = 2; // gen's presence flag of record 0
  EXPECT_EQ(shardError(b),
            fileError("mtprt: data file s.shard, record 0, task gen: presence "
                      "flag 2 (expected 0 or 1)"));
  EXPECT_EQ(shardError(good + "x"),
            shardFails("trailing bytes after the last task (1 of them)"));
  EXPECT_EQ(shardError(good.substr(0, 20)), shardFails("truncated in the "
                                                       "header"));
  EXPECT_EQ(shardError("MTPRTSHX" + good.substr(8)),
            shardFails("not an mtprt shard (bad magic); make one with "
                       "`PROGRAM --data FILE.jsonl --write-shard "
                       "FILE.shard`"));
  // Every prefix and every single-byte change: the runtime's own error or a
  // good read, within the limit, in one child.
  EXPECT_EQ(limited([&] {
              for (size_t n = 0; n < good.size(); ++n)
                try {
                  readShardBytes(good.substr(0, n));
                  throw std::logic_error(std::to_string(n) +
                                         "-byte prefix accepted");
                } catch (const DataError &) {
                }
              for (size_t i = 0; i < good.size(); ++i)
                for (uint8_t x : {0x01, 0x80, 0xff}) {
                  std::string f = good;
                  f[i] = char(f[i] ^ x);
                  try {
                    readShardBytes(f);
                  } catch (const DataError &) {
                  }
                }
            }),
            "ok");
}

//===----------------------------------------------------------------------===//
// Checkpoint headers
//===----------------------------------------------------------------------===//

const std::string kPayload = "a payload of some bytes";

std::string checkpoint(const std::string &line,
                       const std::string &payload = kPayload) {
  return "MTPRTCKPT 1\n" + line + "\n" + payload;
}

std::string goodLine(const std::string &payload = kPayload) {
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", crc32(payload.data(), payload.size()));
  return "step 6 rank 1 world 2 bytes " + std::to_string(payload.size()) +
         " crc32 " + crc;
}

std::string headerError(const std::string &file) {
  return limited([&] { verifyCheckpointBytes(file, "c.ckpt"); });
}

std::string ckptFails(const std::string &what) {
  return fileError("mtprt: checkpoint c.ckpt: " + what);
}

TEST(Readers, CheckpointHeaderRoundTrips) {
  const std::string text =
      checkpointHeaderText(6, 1, 2, kPayload.size(),
                           crc32(kPayload.data(), kPayload.size()));
  EXPECT_EQ(text, "MTPRTCKPT 1\n" + goodLine() + "\n");
  const CheckpointHeader h = verifyCheckpointBytes(text + kPayload, "c.ckpt");
  EXPECT_EQ(h.step, 6);
  EXPECT_EQ(h.rank, 1);
  EXPECT_EQ(h.world, 2);
  EXPECT_EQ(h.bytes, kPayload.size());
  EXPECT_EQ(h.headerBytes, text.size());
}

TEST(Readers, CheckpointHeaderFieldsAreCheckedBeforeAllocating) {
  const std::string crc = goodLine().substr(goodLine().size() - 8);
  auto line = [&](const std::string &bytes) {
    return checkpoint("step 6 rank 1 world 2 bytes " + bytes + " crc32 " + crc);
  };
  // Issue #15 item 4: -1 (once basic_string::_M_create), 1e15 (once
  // std::bad_alloc), 18e9 (once 51 s zero-filling 18 GB).
  EXPECT_EQ(headerError(line("-1")),
            ckptFails("malformed header: field bytes: expected a decimal "
                      "number, got '-1'"));
  EXPECT_EQ(headerError(line("1e15")),
            ckptFails("malformed header: field bytes: expected a decimal "
                      "number, got '1e15'"));
  EXPECT_EQ(headerError(line("18000000000")),
            ckptFails("truncated: 23 of 18000000000 payload bytes"));
  EXPECT_EQ(headerError(line("99999999999999999999")),
            ckptFails("malformed header: field bytes: expected a decimal "
                      "number, got '99999999999999999999'"));
  EXPECT_EQ(headerError(line("22")),
            ckptFails("trailing bytes after the payload (the header says 22 "
                      "bytes, the file has 23 after the header)"));
  EXPECT_EQ(headerError(checkpoint("step -6 rank 1 world 2 bytes 23 crc32 " +
                                   crc)),
            ckptFails("malformed header: field step: expected a decimal "
                      "number, got '-6'"));
  EXPECT_EQ(headerError(checkpoint("step 6 rank 2 world 2 bytes 23 crc32 " +
                                   crc)),
            ckptFails("field rank: 2 is not below the world size 2"));
  EXPECT_EQ(headerError(checkpoint("step 6 rank 0 world 0 bytes 23 crc32 " +
                                   crc)),
            ckptFails("field world: 0 is out of [1, 1048576]"));
  EXPECT_EQ(headerError(checkpoint("step 6 rank 1 world 2 bytes 23 crc32 " +
                                   crc.substr(1))),
            ckptFails("malformed header: field crc32: expected 8 lowercase "
                      "hex digits, "
                      "got '" + crc.substr(1) + "'"));
  // A right crc32 with more after it: the extra text is named, not the
  // crc32 (it read as a bad crc32).
  EXPECT_EQ(headerError(checkpoint("step 6 rank 1 world 2 bytes 23 crc32 " +
                                   crc + " ")),
            ckptFails("malformed header: unexpected text after field crc32 "
                      "(the line's last): ' '"));
  EXPECT_EQ(headerError(checkpoint("step 6 rank 1 world 2 bytes 23 crc32 " +
                                   crc + " extra 1")),
            ckptFails("malformed header: unexpected text after field crc32 "
                      "(the line's last): ' extra 1'"));
  EXPECT_EQ(headerError(checkpoint("step 6 rank 1 world 2 size 23 crc32 " +
                                   crc)),
            ckptFails("malformed header: expected 'bytes' at byte 34 of the "
                      "header, got 'size'"));
  EXPECT_EQ(headerError(checkpoint(goodLine(), "A payload of some bytes")),
            ckptFails("checksum mismatch (crc32 " +
                      [] {
                        char b[9];
                        std::snprintf(b, sizeof b, "%08x",
                                      crc32("A payload of some bytes", 23));
                        return std::string(b);
                      }() +
                      ", header " + crc + ")"));
  EXPECT_EQ(headerError("MTPRTCKPT 1\nstep 6 rank 1"),
            ckptFails("truncated header"));
  EXPECT_EQ(headerError("MTPRTCKPT 1\n" + std::string(300, 'x')),
            ckptFails("malformed header: no end of line in its first 256 "
                      "bytes"));
  EXPECT_EQ(headerError("MTPRTCKPT 2\n" + goodLine() + "\n" + kPayload),
            ckptFails("checkpoint format 2, this runtime reads format 1"));
  EXPECT_EQ(headerError("PK\x03\x04 a zip"),
            ckptFails("not an mtprt checkpoint (bad magic)"));
  // Every prefix and every single-byte change: the runtime's own error,
  // within the limit. (The CRC covers the payload: a digit of step, rank or
  // world changed into another reads, and the driver compares those with
  // the file's name and the run.)
  const std::string good = checkpoint(goodLine());
  const size_t numbersEnd = good.find(" bytes");
  EXPECT_EQ(limited([&] {
              for (size_t n = 0; n < good.size(); ++n)
                try {
                  verifyCheckpointBytes(good.substr(0, n), "c.ckpt");
                  throw std::logic_error(std::to_string(n) +
                                         "-byte prefix accepted");
                } catch (const CheckpointError &) {
                }
              for (size_t i = 0; i < good.size(); ++i)
                for (int x = 1; x < 256; ++x) {
                  std::string f = good;
                  f[i] = char(f[i] ^ x);
                  const bool digits = i < numbersEnd &&
                                      std::isdigit((unsigned char)good[i]) &&
                                      std::isdigit((unsigned char)f[i]);
                  try {
                    verifyCheckpointBytes(f, "c.ckpt");
                    if (!digits)
                      throw std::logic_error("a change at byte " +
                                           std::to_string(i) + " accepted");
                  } catch (const CheckpointError &) {
                  }
                }
            }),
            "ok");
}

TEST(Readers, CheckpointFilesAreReadInPieces) {
  // A file claiming 18e9 payload bytes but holding a few: refused from its
  // length, in a child that may grow by 64 MiB.
  char name[] = "/tmp/mtprt-readers-XXXXXX";
  const int fd = ::mkstemp(name);
  ASSERT_GE(fd, 0);
  const std::string file =
      checkpoint("step 6 rank 1 world 2 bytes 18000000000 crc32 00000000");
  ASSERT_EQ(::write(fd, file.data(), file.size()), ssize_t(file.size()));
  ::close(fd);
  EXPECT_EQ(limited([&] {
              std::string payload;
              readCheckpointFile(name, &payload);
            },
                    uint64_t(64) << 20),
            fileError(std::string("mtprt: checkpoint ") + name +
                      ": truncated: 23 of 18000000000 payload bytes"));
  EXPECT_EQ(limited([&] { readCheckpointFile(name); }, uint64_t(64) << 20),
            fileError(std::string("mtprt: checkpoint ") + name +
                      ": truncated: 23 of 18000000000 payload bytes"));
  ::unlink(name);
  EXPECT_EQ(limited([] { readCheckpointFile("/tmp"); }),
            fileError("mtprt: checkpoint /tmp: not a regular file"));
}

} // namespace

//===----------------------------------------------------------------------===//
// Safetensors headers
//===----------------------------------------------------------------------===//

namespace {

/// 8 bytes of little-endian length, then `json`, then `data`.
std::string safetensorsFile(const std::string &json, const std::string &data,
                            uint64_t length) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out + json + data;
}
std::string safetensorsFile(const std::string &json, const std::string &data) {
  return safetensorsFile(json, data, json.size());
}

std::string safetensorsError(const std::string &bytes) {
  return limited([&] {
    std::istringstream in(bytes);
    safetensors::readHeader(in, bytes.size(), "m.safetensors");
  });
}

const std::string kTwoTensors =
    R"({"__metadata__": {"format": "pt"}, )"
    R"("b": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 12]}, )"
    R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";

} // namespace

TEST(Readers, SafetensorsHeaderRoundTrips) {
  std::vector<safetensors::Entry> entries(2);
  entries[0].name = "w";
  entries[0].dtype = safetensors::Dtype::F16;
  entries[0].shape = {3, 2};
  entries[1].name = "b";
  entries[1].dtype = safetensors::Dtype::F32;
  entries[1].shape = {5};
  const std::string header =
      safetensors::writeHeader(entries, {{"format", "pt"}});
  EXPECT_EQ(header.size() % 8, 0u); // the data stays aligned
  EXPECT_EQ(entries[1].begin, 12u);
  const std::string bytes = header + std::string(12 + 20, 'x');
  std::istringstream in(bytes);
  const safetensors::Header h =
      safetensors::readHeader(in, bytes.size(), "m.safetensors");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.dataStart, header.size());
  EXPECT_EQ(h.tensors[0].name, "w");
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(h.tensors[1].dtype, safetensors::Dtype::F32);
  EXPECT_EQ(h.tensors[1].end, 32u);
  ASSERT_EQ(h.metadata.size(), 1u);
  EXPECT_EQ(h.metadata[0].second, "pt");
  EXPECT_NE(h.find("b"), nullptr);
  EXPECT_EQ(h.find("c"), nullptr);
  // Sorted by offset, whatever the JSON's order.
  const std::string two = safetensorsFile(kTwoTensors, std::string(12, 'x'));
  std::istringstream in2(two);
  const safetensors::Header h2 =
      safetensors::readHeader(in2, two.size(), "m.safetensors");
  EXPECT_EQ(h2.tensors[0].name, "a");
  EXPECT_EQ(h2.tensors[1].name, "b");
}

TEST(Readers, SafetensorsHeaderFieldsAreCheckedBeforeAllocating) {
  const std::string p = "FileError: mtprt: pretrained m.safetensors: ";
  auto t = [](const std::string &entry) {
    return "{\"t\": " + entry + "}";
  };
  EXPECT_EQ(safetensorsError("1234"),
            p + "file of 4 bytes is shorter than the 8-byte header length; "
                "not a safetensors file (truncated?)");
  // A length that would allocate terabytes is refused before reading.
  EXPECT_EQ(safetensorsError(safetensorsFile("{}", "", uint64_t(1) << 40)),
            p + "header length 1099511627776 exceeds 104857600 bytes; not a "
                "safetensors file");
  EXPECT_EQ(safetensorsError(safetensorsFile("{}", "", 100)),
            p + "header length 100 runs past the end of the file (10 bytes); "
                "the file is truncated");
  EXPECT_NE(safetensorsError(safetensorsFile("{\"t\": [", ""))
                .find("header is not valid JSON"),
            std::string::npos);
  EXPECT_EQ(safetensorsError(safetensorsFile(std::string(50, '[') +
                                                 std::string(50, ']'),
                                             "")),
            p + "header nests deeper than 3 levels at byte 3; not a "
                "safetensors header");
  EXPECT_EQ(safetensorsError(safetensorsFile("[]", "")),
            p + "header is a JSON array, not an object of tensors");
  EXPECT_EQ(safetensorsError(safetensorsFile(
                t(R"({"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]})"),
                "x")),
            p + "tensor \"t\": unsupported dtype \"F8_E4M3\" (F64, F32, F16, "
                "BF16, I64, I32, I16, I8, U8, BOOL)");
  EXPECT_EQ(safetensorsError(safetensorsFile(
                t(R"({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})"),
                "xxxx")),
            p + "tensor \"t\": shape holds a negative dimension");
  EXPECT_EQ(
      safetensorsError(safetensorsFile(
          t(R"({"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]})"),
          "xxxx")),
      p + "tensor \"t\": shape needs more bytes than the file's 4 bytes of "
          "data");
  EXPECT_EQ(safetensorsError(safetensorsFile(
                t(R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})"),
                "xxxx")),
            p + "tensor \"t\": data_offsets [0, 8] are not within the 4 bytes "
                "of data after the header (truncated file?)");
  EXPECT_EQ(safetensorsError(safetensorsFile(
                t(R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]})"),
                "xxxx")),
            p + "tensor \"t\": data_offsets [0, 4] hold 4 bytes, but its F32 "
                "shape needs 8");
  EXPECT_EQ(safetensorsError(safetensorsFile(
                t(R"({"dtype": "F32", "shape": [1], "data_offsets": "0"})"),
                "xxxx")),
            p + "tensor \"t\": 'data_offsets' must be [begin, end], two "
                "non-negative integers");
  EXPECT_EQ(
      safetensorsError(safetensorsFile(
          R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, )"
          R"("b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
          "xxxxxx")),
      p + "tensor \"b\" starts at data byte 2, expected 4 (it overlaps the "
          "tensor before)");
  EXPECT_EQ(safetensorsError(safetensorsFile(
                t(R"({"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})"),
                "xxxxxxxx")),
            p + "tensor \"t\" starts at data byte 4, expected 0 (a hole "
                "before it)");
  EXPECT_EQ(safetensorsError(safetensorsFile(
                t(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})"),
                "xxxxxx")),
            p + "the tensors end at data byte 4 but the file holds 6 bytes of "
                "data");
  EXPECT_EQ(safetensorsError(safetensorsFile(
                R"({"__metadata__": {"format": 1}})", "")),
            p + "__metadata__ \"format\" must be a string, got a number");
}

TEST(Readers, SafetensorsIndexNamesFilesInItsDirectory) {
  auto index = [](const std::string &text) {
    return limited([&] {
      std::istringstream in(text);
      const auto map = safetensors::readIndex(in, "i.json");
      if (map.size() != 2 || map[0].second != "a.safetensors")
        throw std::runtime_error("wrong map");
    });
  };
  EXPECT_EQ(index(R"({"metadata": {}, "weight_map": {"x": "a.safetensors", )"
                  R"("y": "b.safetensors"}})"),
            "ok");
  EXPECT_EQ(index(R"({"weight_map": {"x": "../a.safetensors"}})"),
            "FileError: mtprt: pretrained i.json: weight_map \"x\" names "
            "\"../a.safetensors\": a shard must be a file name in the index's "
            "directory");
  EXPECT_EQ(index(R"({"metadata": {}})"),
            "FileError: mtprt: pretrained i.json: index has no object "
            "'weight_map' (tensor name -> shard file)");
}
