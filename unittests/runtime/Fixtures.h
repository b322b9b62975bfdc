//===- Fixtures.h - what the runtime's tests share --------------*- C++ -*-===//
//
// The tiny model and heads the tests train (a test that needs other numbers
// takes these and changes the field, so the difference shows where it is
// made), a temporary directory, reading a file, the driver run in this
// process with its output captured, and a program run as a child process
// with a hang guard.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_UNITTESTS_FIXTURES_H
#define MTPRT_UNITTESTS_FIXTURES_H

#include "Sanitizers.h"

#include "mtprt/Config.h"
#include "mtprt/Driver.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace fixtures {

//===----------------------------------------------------------------------===//
// Models and heads
//===----------------------------------------------------------------------===//

/// The backbone of runtime/tools/mtprt-demo without its dropout: 2 layers,
/// hidden 16, 2 attention heads, ffn 32, a vocabulary of 32, 8 tokens; seed 0.
/// (The data readers and the synthetic data read only vocab and seq.)
inline mtprt::ModelConfig tinyModel() {
  mtprt::ModelConfig m;
  m.vocab = 32;
  m.seq = 8;
  m.layers = 2;
  m.hidden = 16;
  m.heads = 2;
  m.ffn = 32;
  return m;
}

/// One head of each kind, as the tests write them field by field.
inline mtprt::HeadConfig classifyHead(const std::string &name, int64_t tap,
                                      int64_t classes) {
  mtprt::HeadConfig h{name, mtprt::HeadKind::Classify, tap};
  h.classes = classes;
  return h;
}
inline mtprt::HeadConfig tagHead(const std::string &name, int64_t tap,
                                 int64_t tags) {
  mtprt::HeadConfig h{name, mtprt::HeadKind::Tag, tap};
  h.classes = tags;
  return h;
}
inline mtprt::HeadConfig spanHead(const std::string &name, int64_t tap) {
  return {name, mtprt::HeadKind::Span, tap};
}
/// A decoder of one layer (HeadConfig's default) over `targetVocab` ids,
/// teacher-forced on `targetSeq` of them.
inline mtprt::HeadConfig decoderHead(const std::string &name, int64_t tap,
                                     int64_t targetVocab, int64_t targetSeq) {
  mtprt::HeadConfig h{name, mtprt::HeadKind::Decoder, tap};
  h.targetVocab = targetVocab;
  h.targetSeq = targetSeq;
  return h;
}

/// mtprt-demo's first two heads: cls (classify, layer 1, 4 classes) and tag
/// (tag, layer 2, 6 tags).
inline std::vector<mtprt::HeadConfig> twoHeads() {
  return {classifyHead("cls", 1, 4), tagHead("tag", 2, 6)};
}

/// All of mtprt-demo's heads, the ones its data files are written for:
/// twoHeads() and qa (span, layer 2).
inline std::vector<mtprt::HeadConfig> demoHeads() {
  std::vector<mtprt::HeadConfig> h = twoHeads();
  h.push_back(spanHead("qa", 2));
  return h;
}

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

/// A temporary directory under /tmp, removed with all it holds at the end.
/// (No std::filesystem: libtorch.so exports an incompatible copy of it.)
struct TempDir {
  std::string path;
  TempDir() {
    std::string t = "/tmp/mtprt-test-XXXXXX";
    path = mkdtemp(t.data());
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
};

/// The whole file ("" when it cannot be read).
inline std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

//===----------------------------------------------------------------------===//
// The driver in this process
//===----------------------------------------------------------------------===//

/// Runs `fn` with this process's stdout and stderr going to `file`; what
/// `fn` returns.
inline int captured(const std::string &file, const std::function<int()> &fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int out = dup(1), err = dup(2);
  dup2(fd, 1);
  dup2(fd, 2);
  ::close(fd);
  const int rc = fn();
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(out, 1);
  dup2(err, 2);
  ::close(out);
  ::close(err);
  return rc;
}

/// mtprt::runDriver with `args` as its command line (args[0]: the program's
/// name).
inline int runDriverWith(std::vector<std::string> args,
                         const mtprt::Program &p) {
  std::vector<char *> argv;
  for (std::string &a : args)
    argv.push_back(a.data());
  return mtprt::runDriver(static_cast<int>(argv.size()), argv.data(), p);
}

//===----------------------------------------------------------------------===//
// Child processes
//===----------------------------------------------------------------------===//

/// A program (`argv[0]`, a path) as a child process, its stdout and stderr
/// to `outFile`; killed with SIGKILL when this goes out of scope.
class Child {
public:
  /// The child's environment is this process's without the variables named
  /// in `unset`, then `env` ("NAME=VALUE" each). `addressSpace` > 0: the
  /// child runs under that RLIMIT_AS (bytes), so a reader that allocates
  /// without bound fails instead of exhausting the machine (not under
  /// AddressSanitizer: Sanitizers.h).
  Child(std::vector<std::string> argv, const std::string &outFile,
        const std::vector<std::string> &env = {}, uint64_t addressSpace = 0,
        const std::vector<std::string> &unset = {})
      : out_(outFile) {
    std::vector<char *> avp;
    for (std::string &s : argv)
      avp.push_back(s.data());
    avp.push_back(nullptr);
    std::vector<std::string> ev;
    for (char **e = environ; *e; ++e) {
      const std::string entry = *e;
      if (std::find(unset.begin(), unset.end(),
                    entry.substr(0, entry.find('='))) == unset.end())
        ev.push_back(entry);
    }
    ev.insert(ev.end(), env.begin(), env.end());
    std::vector<char *> evp;
    for (std::string &s : ev)
      evp.push_back(s.data());
    evp.push_back(nullptr);
    const int fd = ::open(outFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      if (addressSpace && !kAddressSanitizer) {
        rlimit r{addressSpace, addressSpace};
        setrlimit(RLIMIT_AS, &r);
      }
      execve(avp[0], avp.data(), evp.data());
      _exit(127);
    }
    ::close(fd);
  }
  ~Child() { kill(SIGKILL); }
  Child(const Child &) = delete;
  Child &operator=(const Child &) = delete;

  /// Sends `sig`; SIGKILL also reaps the child.
  void kill(int sig) {
    if (pid_ > 0) {
      ::kill(pid_, sig);
      if (sig == SIGKILL) {
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
      }
    }
  }

  /// Waits up to timeoutS × kTimeScale (Sanitizers.h) seconds; returns the
  /// exit code, 128 + the signal that ended it, or -1 when it was killed on
  /// the timeout.
  int wait(int timeoutS = 60) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::seconds(timeoutS * kTimeScale);
    while (pid_ > 0) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        rc_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(SIGKILL);
        rc_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return rc_;
  }

  /// What it wrote so far.
  std::string output() const { return readFile(out_); }
  /// Its process id; -1 once it has been waited for or killed.
  pid_t pid() const { return pid_; }

private:
  pid_t pid_ = -1;
  int rc_ = -1;
  std::string out_;
};

} // namespace fixtures

#endif // MTPRT_UNITTESTS_FIXTURES_H
