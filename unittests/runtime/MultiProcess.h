//===- MultiProcess.h - run worker processes of this test binary -*- C++
//-*-===//
//
// A test starts `world` copies of this binary running one DISABLED_ worker
// test each, with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set
// and a TCPStore served by the test process; workers write tensors to a
// temporary directory; run() kills everything after the timeout.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_UNITTESTS_MULTIPROCESS_H
#define MTPRT_UNITTESTS_MULTIPROCESS_H

#include "mtprt/torch/Distributed.h"

#include <ATen/ATen.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace mp {

inline std::string path(const std::string &dir, const std::string &name,
                        int rank) {
  return dir + "/" + name + "." + std::to_string(rank);
}

/// Worker side: a flat tensor as raw bytes (dtype, count, data).
inline void saveTensor(const std::string &name, int rank, const at::Tensor &t) {
  const char *dir = std::getenv("MTPRT_TEST_DIR");
  if (!dir)
    throw std::runtime_error("MTPRT_TEST_DIR is not set");
  at::Tensor c = t.contiguous().cpu();
  std::ofstream out(path(dir, name, rank), std::ios::binary);
  const int32_t type = static_cast<int32_t>(c.scalar_type());
  const int64_t n = c.numel();
  out.write(reinterpret_cast<const char *>(&type), sizeof type);
  out.write(reinterpret_cast<const char *>(&n), sizeof n);
  out.write(static_cast<const char *>(c.data_ptr()), c.nbytes());
}

inline at::Tensor loadTensor(const std::string &file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw std::runtime_error("no worker output " + file);
  int32_t type = 0;
  int64_t n = 0;
  in.read(reinterpret_cast<char *>(&type), sizeof type);
  in.read(reinterpret_cast<char *>(&n), sizeof n);
  at::Tensor t = at::empty({n}, static_cast<at::ScalarType>(type));
  in.read(static_cast<char *>(t.data_ptr()), t.nbytes());
  return t;
}

//===----------------------------------------------------------------------===//
// Other processes, seen through /proc: a launcher's ranks and their fate
//===----------------------------------------------------------------------===//

/// The processes whose parent is `parent` (/proc/<pid>/stat, field 4).
inline std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> out;
  DIR *d = opendir("/proc");
  if (!d)
    return out;
  while (dirent *e = readdir(d)) {
    char *end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 0)
      continue;
    std::ifstream f("/proc/" + std::string(e->d_name) + "/stat");
    std::string stat;
    std::getline(f, stat);
    // pid (comm) state ppid ...; comm may hold spaces: parse after ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos)
      continue;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent)
      out.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return out;
}

/// The value of `name` in the environment `pid` started with ("" if none).
inline std::string environOf(pid_t pid, const std::string &name) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ",
                  std::ios::binary);
  std::string entry;
  while (std::getline(f, entry, '\0'))
    if (entry.rfind(name + "=", 0) == 0)
      return entry.substr(name.size() + 1);
  return "";
}

/// Whether `pid` still runs: not gone, not a zombie (an orphan's zombie may
/// wait for a parent that never reaps it). Reaps it when it is our child.
inline bool alive(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, WNOHANG) == pid)
    return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat))
    return false;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() &&
         stat[close + 2] != 'Z';
}

class Launch {
public:
  Launch(std::string test, int world, std::vector<std::string> env = {},
         std::vector<std::string> args = {})
      : test_(std::move(test)), world_(world), env_(std::move(env)),
        args_(std::move(args)) {
    // (No std::filesystem: libtorch.so exports an incompatible copy of it.)
    const char *tmp = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(tmp && *tmp ? tmp : "/tmp") + "/mtprt-mp-XXXXXX";
    if (!mkdtemp(tmpl.data()))
      throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~Launch() {
    kill();
    if (DIR *d = opendir(dir_.c_str())) {
      while (dirent *e = readdir(d))
        if (e->d_name[0] != '.')
          ::unlink((dir_ + "/" + e->d_name).c_str());
      closedir(d);
    }
    ::rmdir(dir_.c_str());
  }

  const std::string &dir() const { return dir_; }

  /// Starts the workers (each with its own log) and waits up to timeoutS;
  /// true when all exited 0.
  bool run(int timeoutS) {
    start();
    return wait(timeoutS);
  }

  void start() {
    server_ = std::make_unique<mtprt::StoreServer>(0, 60);
    char buf[4096];
    const ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (len <= 0)
      throw std::runtime_error("cannot read /proc/self/exe");
    const std::string self(buf, len);
    for (int r = 0; r < world_; ++r) {
      std::vector<std::string> argv = {self, "--gtest_filter=" + test_,
                                       "--gtest_also_run_disabled_tests"};
      argv.insert(argv.end(), args_.begin(), args_.end());
      std::vector<std::string> envs;
      // Not the runner's GTEST_* settings (lit shards the suite: a worker
      // in shard mode might select no test at all).
      for (char **e = environ; *e; ++e)
        if (std::string(*e).rfind("GTEST_", 0) != 0)
          envs.push_back(*e);
      for (const std::string &e :
           {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
            "WORLD_SIZE=" + std::to_string(world_),
            std::string("MASTER_ADDR=127.0.0.1"),
            "MASTER_PORT=" + std::to_string(server_->port()),
            "MTPRT_TEST_DIR=" + dir_})
        envs.push_back(e);
      envs.insert(envs.end(), env_.begin(), env_.end());
      std::vector<char *> av, ev;
      for (std::string &s : argv)
        av.push_back(s.data());
      av.push_back(nullptr);
      for (std::string &s : envs)
        ev.push_back(s.data());
      ev.push_back(nullptr);
      const std::string log = path(dir_, "log", r);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const pid_t pid = fork();
      if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        execve(av[0], av.data(), ev.data());
        _exit(127);
      }
      ::close(fd);
      pids_.push_back(pid);
      status_.push_back(-1);
    }
  }

  /// Waits up to timeoutS for every worker; kills the rest after that.
  bool wait(int timeoutS) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(timeoutS);
    for (;;) {
      bool all = true;
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (pids_[i] <= 0)
          continue;
        int st = 0;
        if (waitpid(pids_[i], &st, WNOHANG) == pids_[i]) {
          status_[i] = st;
          pids_[i] = 0;
        } else {
          all = false;
        }
      }
      if (all)
        break;
      if (std::chrono::steady_clock::now() > deadline) {
        timedOut_ = true;
        kill();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (int st : status_)
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return false;
    return true;
  }

  void kill() {
    for (pid_t &p : pids_)
      if (p > 0) {
        ::kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        p = 0;
      }
  }

  /// Worker r's process id (0 once it has been waited for).
  pid_t pid(int r) const { return pids_.at(r); }

  at::Tensor load(const std::string &name, int rank) const {
    return loadTensor(path(dir_, name, rank));
  }

  std::string log() const {
    std::ostringstream os;
    if (timedOut_)
      os << "timed out\n";
    for (int r = 0; r < world_; ++r) {
      std::ifstream in(path(dir_, "log", r));
      os << "--- rank " << r << " ---\n" << in.rdbuf() << "\n";
    }
    return os.str();
  }

private:
  std::string test_;
  int world_;
  std::vector<std::string> env_, args_;
  std::string dir_;
  std::unique_ptr<mtprt::StoreServer> server_;
  std::vector<pid_t> pids_;
  std::vector<int> status_;
  bool timedOut_ = false;
};

} // namespace mp

#endif // MTPRT_UNITTESTS_MULTIPROCESS_H
