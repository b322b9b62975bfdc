//===- Driver.cpp - the training program around a step --------------------===//

#include "mtprt/Driver.h"
#include "mtprt/EvalMetrics.h"
#include "mtprt/Format.h"
#include "mtprt/Limits.h"
#include "mtprt/Memory.h"
#include "mtprt/Threads.h"
#include "mtprt/kernels/Specialized.h"

#include "mtprt/Runtime.h"
#include "mtprt/torch/Checkpoint.h"
#include "mtprt/torch/Data.h"
#include "mtprt/torch/Evaluate.h"
#include "mtprt/torch/Distributed.h"
#include "mtprt/torch/Pipeline.h"
#include "mtprt/torch/Zero.h"
#include "mtprt/torch/Pretrained.h"
#include "mtprt/torch/Saps.h"
#include "mtprt/HfNames.h"
#include "mtprt/torch/Trainer.h"
#include "mtprt/torch/UnitProfile.h"

#include "JsonLine.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/serialize.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <unordered_set>
#include <stdexcept>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char **environ;

namespace mtprt {

namespace {

volatile std::sig_atomic_t interrupted = 0;
extern "C" void onInterrupt(int) { interrupted = 1; }

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A rank other than 0 leaving with rank 0's error, which rank 0 prints
/// (the ranks agreed on it: one message, not one per rank).
struct QuietExit {
  int code;
};

struct Options {
  int64_t steps = 0, batchSize = 0, logEvery = 1;
  std::string data = "synthetic";
  std::string evalData, predict, predictOut, keepBest;
  int64_t evalEvery = 0;
  double relatedness = 0.5;
  std::string metrics, checkpointDir;
  int64_t checkpointEvery = 0, keep = 3;
  bool checkpointEveryGiven = false;
  bool resume = false, resumeFallback = false;
  int nproc = 1;
  int timeoutS = 120;
  std::optional<int> rank, worldSize, masterPort;
  std::optional<std::string> masterAddr;
  std::optional<std::string> device, precision;
  uint64_t seed = 0;
  bool compress = false;
  double topK = defaults::kTopK, decay = defaults::kResidualDecay;
  int64_t block = defaults::kQuantBlock, bucket = 1 << 20;
  std::string progress = "auto";
  int threads = 0; ///< 0: auto
  std::string offloadUpdate = "auto";
  std::string writeShard;
  std::string dumpInit;
  std::string exportDir;
  std::string dumpHidden;
  std::string profileUnits;
  int64_t measureCorrelation = 0;
  std::string profile;
  bool profileMemory = false;
  bool resources = false;
  bool batchGiven = false; ///< --batch-size (fixes a dynamic batch)
  /// The training data is read (a prediction alone does not need it).
  bool trainingDataNeeded = true;
  std::optional<int64_t> cosineEvery;
};

/// The flag table: name, value placeholder (empty = no value), help.
struct Flag {
  const char *name, *value, *help;
};
const Flag kFlags[] = {
    {"--steps", "N",
     "optimizer steps to reach in total (a resumed run "
     "continues to N; one already there exits 0)"},
    {"--batch-size", "B",
     "global batch size, split evenly over the ranks (fixed: it replaces "
     "the plan's dynamic batch schedule)"},
    {"--data", "PATH",
     "JSON Lines file or binary shard (docs/runtime-services.md), or "
     "'synthetic' (default)"},
    {"--eval-data", "PATH",
     "held-out data (a shard from mtpc prepare, or JSON Lines; synthetic:N "
     "for N held-out records of the synthetic tasks): per-task metrics and "
     "the peak memory every --eval-every steps and at the end, to the "
     "metrics file (an \"eval\" record), the progress line and the summary"},
    {"--eval-every", "N",
     "with --eval-data: evaluate every N steps (default: the spec's "
     "eval_every; 0 = at the end only)"},
    {"--keep-best", "TASK.METRIC",
     "with held-out data and --checkpoint-dir: keep the state with the best "
     "TASK.METRIC (mean.METRIC: the mean over the tasks that have it; lower "
     "is better for loss, mse and perplexity) as a checkpoint in DIR/best, "
     "described by "
     "DIR/best/best.json"},
    {"--predict", "PATH",
     "no training: the model (from --checkpoint-dir's newest checkpoint, or "
     "as initialized) predicts every record of PATH; with --out"},
    {"--out", "FILE",
     "--predict's output: one JSON object per record, each task's "
     "prediction (label names where the data names them)"},
    {"--relatedness", "X",
     "synthetic data: how much the tasks share, 0..1 "
     "(default 0.5)"},
    {"--write-shard", "OUT",
     "convert the --data JSON Lines file into a binary "
     "shard at OUT and exit"},
    {"--metrics", "FILE", "append one JSON Lines record per logged step"},
    {"--log-every", "N", "log metrics every N steps (default 1)"},
    {"--checkpoint-dir", "DIR",
     "where checkpoints go (one file per rank "
     "and step)"},
    {"--checkpoint-every", "N",
     "checkpoint every N steps (0: only at the "
     "end and on Ctrl-C; default 0)"},
    {"--keep", "K",
     "keep the newest K checkpoints per rank (default 3; 0 = "
     "all)"},
    {"--resume", "",
     "continue from the newest checkpoint in "
     "--checkpoint-dir (fresh start when there is none)"},
    {"--resume-fallback", "",
     "with --resume: skip a corrupt newest "
     "checkpoint and use the previous good one"},
    {"--nproc", "N",
     "start N processes on this machine (rendezvous on "
     "127.0.0.1)"},
    {"--rank", "R", "this process's rank in a launched run (else $RANK)"},
    {"--world-size", "W", "processes in the run (else $WORLD_SIZE, or 1)"},
    {"--master-addr", "ADDR",
     "rendezvous host (else $MASTER_ADDR, or "
     "127.0.0.1)"},
    {"--master-port", "PORT",
     "rendezvous port (else $MASTER_PORT, or 29500; "
     "with --nproc, 0 picks a free one)"},
    {"--timeout", "S",
     "seconds a rank waits to join, for a collective, or for its launcher's "
     "heartbeat before it fails (default 120)"},
    {"--device", "DEV", "cpu or cuda[:N] (default: the program's)"},
    {"--precision", "P", "fp32, bf16 or fp16 (fp16: cuda only)"},
    {"--seed", "S", "seed for the model, the data and dropout (default 0)"},
    {"--compress", "",
     "GSC-compressed gradient exchange (top-k, 8-bit "
     "blocks, error feedback)"},
    {"--no-compress", "", "plain all-reduce of fp32 gradients"},
    {"--compress-topk", "F", "kept fraction per bucket (default 0.15)"},
    {"--compress-decay", "D", "residual feedback decay (default 0.8)"},
    {"--compress-block", "N", "values per quantization block (default 256)"},
    {"--compress-bucket", "N", "values per bucket (default 1048576)"},
    {"--threads", "N|auto",
     "intra-op CPU threads; auto (the default on CPU) times steps from "
     "LibTorch's count down to 1 and keeps the fastest, probing again when the "
     "machine's load changes; N pins it (runs that must repeat bit for bit)"},
    {"--offload-update", "auto|beside|inline",
     "where the optimizer offload's host update runs: beside the next "
     "step's forward (each unit waits for its own values) or inline in the "
     "step; auto: beside a GPU, and on the CPU where the ranks' threads "
     "leave as many cores free (docs/zero.md)"},
    {"--cosine-every", "M",
     "measure the task-gradient cosine matrix every M steps (0: never; "
     "without it DGFG keeps uniform weights; default 1)"},
    {"--profile", "FILE",
     "profile every step after the first with LibTorch's profiler (CPU ops and "
     "their input shapes; rank 0, and with a pipeline plan every stage: rank N "
     "writes FILE.rankN) and write it to FILE as a Chrome trace (Perfetto, "
     "chrome://tracing; bench/compare_profiles.py sums two by op)"},
    {"--profile-memory", "",
     "with --profile: also every allocation and free ([memory] events: bytes, "
     "running total), to find where a step peaks"},
    {"--profile-units", "FILE",
     "time the step's segments on this device at the micro batch (layer 1's "
     "attention and MLP blocks forward, backward and their tensor-grain "
     "re-run, the embeddings, each head with its loss, the host link) and "
     "write them to FILE as JSON for `mtpc plan --costs FILE`; with --steps 0 "
     "nothing trains"},
    {"--measure-correlation", "N",
     "measure how related the tasks are: the cosines of their gradients on "
     "the topmost layer every task reads through (as DGFG's matrix and EWC's "
     "conflict detector: eval mode, nothing changes), averaged over the "
     "first micro-batch of each of the first N batches, on the weights the "
     "run starts from (before a --resume), printed as `correlate A ~ B = R` "
     "lines for the spec (task-granular checkpointing's groups, adapters' "
     "share); with --steps 0 nothing trains"},
    {"--export", "DIR",
     "when training ends (with --steps 0: the loaded, initial or resumed "
     "state), write the backbone to DIR as a Hugging Face model directory "
     "(config.json and model.safetensors under the original names: "
     "transformers' from_pretrained reads it) and the task heads to "
     "DIR/heads.safetensors (docs/pretrained.md); gpt2 and pretrained "
     "backbones"},
    {"--dump-hidden", "FILE",
     "write the backbone's output at every layer (eval mode) on the first "
     "batch, and the parameters' gradients of a fixed random probe of them, "
     "to FILE (safetensors; the tests compare them with transformers')"},
    {"--dump-init", "DIR",
     "write the initial parameters, the first batch and the "
     "settings to DIR (torch.load / JSON; bench/peer.py reads them); "
     "with --steps 0 nothing trains"},
    {"--resources", "",
     "at the end, print the resident set's peak above its level after "
     "initialization and the steps' CPU time (bench/run's measures)"},
    {"--progress", "MODE",
     "auto (live line on a terminal, plain lines "
     "otherwise), plain or off"},
    {"--help", "", "this text"},
};

void printHelp(const std::string &name) {
  std::printf("usage: %s [flags]\n\nTrains the program's multi-task model "
              "(mtprt runtime).\n\n",
              name.c_str());
  for (const Flag &f : kFlags) {
    std::string left = std::string(f.name) + (*f.value ? " " : "") + f.value;
    std::printf("  %-24s %s\n", left.c_str(), f.help);
  }
  std::printf("\nExit codes: 0 done, 1 error, 2 bad command line, 130 "
              "interrupted (checkpoint saved).\n");
}

int64_t toInt(const std::string &flag, const std::string &v, int64_t lo,
              int64_t hi) {
  char *end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || errno || x < lo || x > hi)
    throw UsageError(flag + " expects an integer in [" + std::to_string(lo) +
                     ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

/// N of `synthetic:N` (held-out synthetic records).
int64_t heldOutRecords(const std::string &v) {
  return toInt("synthetic:N", v.substr(std::strlen("synthetic:")), 1,
               int64_t(1) << 30);
}

double toDouble(const std::string &flag, const std::string &v, double lo,
                double hi) {
  char *end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !(x >= lo && x <= hi))
    throw UsageError(flag + " expects a number in [" + std::to_string(lo) +
                     ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

/// The run in one paragraph: each task's loss at the start and the end (the
/// mean of the first and the last few steps), the measured peak against the
/// plan's prediction, throughput.
struct RunSummary {
  static constexpr size_t kWindow = 5;
  std::vector<std::string> tasks;
  std::vector<std::vector<double>> head, tail; ///< per task
  int64_t steps = 0, peak = 0, samples = 0, batchMin = INT64_MAX, batchMax = 0;
  void add(const StepStats &s) {
    samples += s.batchSize;
    batchMin = std::min(batchMin, s.batchSize);
    batchMax = std::max(batchMax, s.batchSize);
    if (tasks.empty()) {
      tasks = s.tasks;
      head.resize(tasks.size());
      tail.resize(tasks.size());
    }
    ++steps;
    peak = std::max(peak, s.measuredPeakBytes);
    for (size_t t = 0; t < tasks.size() && t < s.loss.size(); ++t) {
      if (!std::isfinite(s.loss[t]))
        continue;
      if (head[t].size() < kWindow)
        head[t].push_back(s.loss[t]);
      tail[t].push_back(s.loss[t]);
      if (tail[t].size() > kWindow)
        tail[t].erase(tail[t].begin());
    }
  }
  std::string paragraph(const std::string &name, double seconds,
                        int64_t batch, int64_t plannedBatch, int64_t predicted,
                        int64_t processes, int64_t plannedProcesses) const {
    if (!steps)
      return "summary: no steps run";
    auto mean = [](const std::vector<double> &v) {
      double x = 0;
      for (double d : v)
        x += d;
      return v.empty() ? std::nan("") : x / double(v.size());
    };
    std::ostringstream os;
    os << "summary: model '" << name << "', " << steps << " steps in "
       << std::fixed << std::setprecision(1) << seconds << " s ("
       << std::setprecision(double(samples) / seconds < 10 ? 2 : 0)
       << double(samples) / seconds << " samples/s"
       << (batchMin != batchMax ? ", batches of " + std::to_string(batchMin) +
                                      " to " + std::to_string(batchMax)
                                : std::string())
       << "). Loss (mean of the first and last "
       << std::min<int64_t>(steps, kWindow) << " steps):";
    for (size_t t = 0; t < tasks.size(); ++t) {
      os << (t ? "," : "") << " " << tasks[t] << " ";
      if (head[t].empty())
        os << "(no labels)";
      else
        os << std::setprecision(3) << mean(head[t]) << " -> " << mean(tail[t]);
    }
    os << ". Peak device memory " << peak << " B measured";
    if (predicted > 0)
      os << " vs " << predicted << " B predicted (" << std::showpos
         << std::setprecision(1)
         << 100.0 * double(peak - predicted) / double(predicted) << "%"
         << std::noshowpos << ")";
    if (predicted > 0 && batch != plannedBatch)
      os << " (the plan is for a batch of " << plannedBatch << ", this run "
         << "used " << batch << ")";
    else if (predicted > 0 && batchMax > 0 && batchMax < plannedBatch)
      os << " (the plan is for the schedule's largest batch, " << plannedBatch
         << "; this run's steps reached " << batchMax << ")";
    if (predicted > 0 && processes != plannedProcesses)
      os << " (the plan is for " << plannedProcesses << " process(es), this "
         << "run has " << processes
         << ": the prediction counts the gradient exchange of "
         << plannedProcesses << ")";
    // (Silent when none applied: GFM off and one process.)
    if (const kernels::Specialized &k = kernels::specialized();
        *k.what && kernels::specializedLaunches() > 0)
      os << ". The program's specialized kernels (" << k.what << ") ran "
         << kernels::specializedLaunches() << " times";
    os << ".";
    return os.str();
  }
};

/// Parses argv; returns false for --help.
bool parse(int argc, char **argv, const Program &p, Options &o) {
  bool nprocGiven = false;
  o.steps = p.steps;
  o.seed = p.seed;
  o.logEvery = p.logEvery;
  o.checkpointEvery = p.checkpointEvery;
  o.data = p.data;
  o.evalData = p.evalData;
  o.evalEvery = p.evalEvery;
  o.batchSize = p.batchSize;
  o.compress = p.compress;
  o.topK = p.compressTopK;
  o.decay = p.compressDecay;
  o.block = p.compressBlock;
  std::set<std::string> given; // the flags on the command line
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    const size_t eq = arg.find('=');
    bool inlineValue = false;
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inlineValue = true;
    }
    const Flag *flag = nullptr;
    for (const Flag &f : kFlags)
      if (arg == f.name)
        flag = &f;
    if (!flag)
      throw UsageError("unknown flag '" + arg + "'");
    given.insert(arg);
    if (*flag->value && !inlineValue) {
      if (i + 1 >= argc)
        throw UsageError(arg + " needs a value (" + flag->value + ")");
      value = argv[++i];
    } else if (!*flag->value && inlineValue) {
      throw UsageError(arg + " takes no value");
    }
    // An empty value is no value (`--export ""` exported nothing); but
    // `--eval-data ""` switches off the spec's `train { eval }`.
    if (*flag->value && value.empty() && arg != "--eval-data")
      throw UsageError(arg + " needs a value (" + flag->value +
                       "), got an empty one");
    const int64_t big = int64_t(1) << 40;
    if (arg == "--help")
      return false;
    if (arg == "--steps")
      o.steps = toInt(arg, value, 0, big);
    else if (arg == "--batch-size") {
      o.batchSize = toInt(arg, value, limits::kGlobalBatch.lo,
                          limits::kGlobalBatch.hi);
      o.batchGiven = true;
    }
    else if (arg == "--data")
      o.data = value;
    else if (arg == "--eval-data")
      o.evalData = value;
    else if (arg == "--eval-every")
      o.evalEvery = toInt(arg, value, 0, big);
    else if (arg == "--predict")
      o.predict = value;
    else if (arg == "--keep-best")
      o.keepBest = value;
    else if (arg == "--out")
      o.predictOut = value;
    else if (arg == "--relatedness")
      o.relatedness = toDouble(arg, value, 0, 1);
    else if (arg == "--write-shard")
      o.writeShard = value;
    else if (arg == "--metrics")
      o.metrics = value;
    else if (arg == "--log-every")
      o.logEvery = toInt(arg, value, 1, big);
    else if (arg == "--checkpoint-dir")
      o.checkpointDir = value;
    else if (arg == "--checkpoint-every") {
      o.checkpointEvery = toInt(arg, value, 0, big);
      o.checkpointEveryGiven = true;
    } else if (arg == "--keep")
      o.keep = toInt(arg, value, 0, big);
    else if (arg == "--resume")
      o.resume = true;
    else if (arg == "--resume-fallback")
      o.resumeFallback = true;
    else if (arg == "--nproc") {
      o.nproc = static_cast<int>(toInt(arg, value, 1, 4096));
      nprocGiven = true;
    }
    else if (arg == "--rank")
      o.rank = static_cast<int>(toInt(arg, value, 0, 1 << 20));
    else if (arg == "--world-size")
      o.worldSize = static_cast<int>(toInt(arg, value, limits::kWorldSize.lo,
                                           limits::kWorldSize.hi));
    else if (arg == "--master-addr")
      o.masterAddr = value;
    else if (arg == "--master-port")
      o.masterPort = static_cast<int>(toInt(arg, value, 0, 65535));
    else if (arg == "--timeout")
      o.timeoutS = static_cast<int>(toInt(arg, value, 1, 7 * 24 * 3600));
    else if (arg == "--device") {
      if (value != "cpu" && value.rfind("cuda", 0) != 0)
        throw UsageError("--device expects cpu or cuda[:N], got '" + value +
                         "'");
      o.device = value;
    } else if (arg == "--precision") {
      if (value != "fp32" && value != "bf16" && value != "fp16")
        throw UsageError("--precision expects fp32, bf16 or fp16, got '" +
                         value + "'");
      o.precision = value;
    } else if (arg == "--seed")
      o.seed = static_cast<uint64_t>(toInt(arg, value, 0, big));
    else if (arg == "--compress")
      o.compress = true;
    else if (arg == "--no-compress")
      o.compress = false;
    else if (arg == "--compress-topk")
      o.topK = toDouble(arg, value, 1e-6, 1);
    else if (arg == "--compress-decay")
      o.decay = toDouble(arg, value, 0, 1);
    else if (arg == "--compress-block")
      o.block = toInt(arg, value, 1, 1 << 20);
    else if (arg == "--compress-bucket")
      o.bucket = toInt(arg, value, 1, big);
    else if (arg == "--threads") {
      try {
        o.threads =
            value == "auto" ? 0 : static_cast<int>(toInt(arg, value, 1, 1024));
      } catch (const UsageError &) {
        throw UsageError("--threads expects auto or an integer in [1, 1024], "
                         "got '" + value + "'");
      }
    } else if (arg == "--offload-update") {
      if (value != "auto" && value != "beside" && value != "inline")
        throw UsageError(
            "--offload-update expects auto, beside or inline, got '" + value +
            "'");
      o.offloadUpdate = value;
    } else if (arg == "--cosine-every")
      o.cosineEvery = toInt(arg, value, 0, big);
    else if (arg == "--profile")
      o.profile = value;
    else if (arg == "--dump-init")
      o.dumpInit = value;
    else if (arg == "--export")
      o.exportDir = value;
    else if (arg == "--dump-hidden")
      o.dumpHidden = value;
    else if (arg == "--profile-units")
      o.profileUnits = value;
    else if (arg == "--measure-correlation")
      o.measureCorrelation = toInt(arg, value, 1, big);
    else if (arg == "--resources")
      o.resources = true;
    else if (arg == "--profile-memory")
      o.profileMemory = true;
    else if (arg == "--progress") {
      if (value != "auto" && value != "plain" && value != "off")
        throw UsageError("--progress expects auto, plain or off");
      o.progress = value;
    }
  }
  if ((o.resume || (o.checkpointEveryGiven && o.checkpointEvery > 0)) &&
      o.checkpointDir.empty())
    throw UsageError(std::string(o.resume ? "--resume" : "--checkpoint-every") +
                     " needs --checkpoint-dir");
  if (!o.writeShard.empty() && o.data == "synthetic")
    throw UsageError("--write-shard needs --data FILE.jsonl");
  if (o.predict.empty() != o.predictOut.empty())
    throw UsageError(o.predict.empty() ? "--out goes with --predict PATH"
                                       : "--predict needs --out FILE");
  if (o.evalData == "synthetic" || o.predict == "synthetic")
    throw UsageError("--eval-data and --predict read a data file (synthetic "
                     "data has no held-out records; synthetic:N draws N "
                     "held-out records of the synthetic tasks)");
  for (const std::string *held : {&o.evalData, &o.predict})
    if (held->rfind("synthetic:", 0) == 0)
      heldOutRecords(*held);
  if (!o.keepBest.empty()) {
    if (o.evalData.empty() || o.checkpointDir.empty())
      throw UsageError("--keep-best needs held-out data (--eval-data, or the "
                       "spec's eval) and --checkpoint-dir");
    const size_t dot = o.keepBest.find('.');
    const std::string task = o.keepBest.substr(0, dot),
                      metric = dot == std::string::npos
                                   ? ""
                                   : o.keepBest.substr(dot + 1);
    bool known = false;
    for (const char *m : metrics::kNames)
      known |= metric == m;
    bool isTask = task == "mean";
    for (const HeadConfig &h : p.heads)
      isTask |= h.name == task;
    // The task (for mean: some task) must report the metric, or nothing is
    // ever kept.
    std::string reported;
    bool reports = false;
    for (const HeadConfig &h : p.heads) {
      if (task != "mean" && h.name != task)
        continue;
      reports |= metrics::reports(h, metric);
      if (task != "mean")
        for (const char *m : metrics::namesFor(h))
          reported += (reported.empty() ? "" : ", ") + std::string(m);
    }
    if (known && isTask && !reports)
      throw UsageError("--keep-best " + o.keepBest + ": " +
                       (task == "mean" ? std::string("no task reports ") + metric
                                       : task + " reports " + reported +
                                             ", not " + metric));
    if (!known || !isTask) {
      std::string tasks;
      for (const HeadConfig &h : p.heads)
        tasks += (tasks.empty() ? "" : ", ") + h.name;
      throw UsageError("--keep-best " + o.keepBest +
                       ": expected TASK.METRIC with TASK one of " + tasks +
                       " or mean, METRIC one of accuracy, macro_f1, mse, "
                       "pearson, spearman, token_accuracy, entity_f1, "
                       "exact_match, token_f1, loss, ...");
    }
  }
  // A file written must not be one read (--predict F --out F would replace
  // the records by their predictions), nor a device, FIFO or directory that
  // a write-and-rename would replace; a symbolic link is written through.
  {
    std::vector<std::pair<const char *, std::string>> inputs = {
        {"--data", o.data}, {"--eval-data", o.evalData}, {"--predict", o.predict}};
    if (const char *plan = std::getenv("MTPRT_RUN_PLAN"))
      inputs.emplace_back("--plan", plan);
    const std::pair<const char *, std::string *> outputs[] = {
        {"--out", &o.predictOut}, {"--write-shard", &o.writeShard},
        {"--profile-units", &o.profileUnits}, {"--profile", &o.profile},
        {"--metrics", &o.metrics}};
    namespace fs = std::filesystem;
    for (const auto &[flag, path] : outputs) {
      std::error_code ec;
      if (path->empty() || !fs::exists(fs::symlink_status(*path, ec)))
        continue;
      for (const auto &[from, in] : inputs)
        if (!in.empty() && fs::equivalent(*path, in, ec) && !ec)
          throw UsageError(std::string(flag) + " " + *path + " is the file " +
                           from + " reads; name another file");
      const fs::file_status st = fs::status(*path, ec);
      // Only --out is written aside and renamed over its name (a rename
      // would replace a FIFO or device); the others write in place, so
      // /dev/stdout, a FIFO or a process substitution serve.
      const bool renamed = path == &o.predictOut;
      if (!ec && (fs::is_directory(st) ||
                  (renamed && !fs::is_regular_file(st))))
        throw UsageError(std::string(flag) + " " + *path +
                         " is not a regular file (" +
                         (fs::is_directory(st) ? "a directory" : "a device, "
                                                                 "FIFO or socket") +
                         "); name a file");
      for (int hops = 0; hops < 40 && renamed &&
                         fs::is_symlink(fs::symlink_status(*path, ec));
           ++hops) {
        fs::path target = fs::read_symlink(*path, ec);
        if (ec)
          break;
        if (target.is_relative())
          target = fs::path(*path).parent_path() / target;
        *path = target.string();
      }
    }
  }
  // A prediction evaluates nothing (the spec's `train { eval }` unread).
  if (!o.predict.empty())
    o.evalData.clear();
  // A prediction reads the training data only for what dumps a batch of it.
  o.trainingDataNeeded = o.predict.empty() || !o.dumpHidden.empty() ||
                         !o.dumpInit.empty() || !o.profileUnits.empty() ||
                         given.count("--data");
  // A prediction continues from the newest checkpoint where there is one;
  // a directory that is not there is a typo, not the initial weights.
  if (!o.predict.empty() && !o.checkpointDir.empty()) {
    o.resume = true;
    if (!std::filesystem::is_directory(o.checkpointDir))
      throw UsageError("--predict: --checkpoint-dir " + o.checkpointDir +
                       " is not a directory, so there is no checkpoint to "
                       "predict with; drop --checkpoint-dir to predict with "
                       "the initial (or pretrained) weights");
  }
  // A prediction trains nothing: what only training does is refused, not
  // ignored.
  if (!o.predict.empty())
    for (const char *f : {"--steps", "--metrics", "--export", "--eval-data",
                          "--eval-every", "--keep-best", "--checkpoint-every"})
      if (given.count(f))
        throw UsageError(std::string("--predict trains nothing, so ") + f +
                         " would do nothing; run them apart");
  if (o.measureCorrelation > 0 && !o.predict.empty())
    throw UsageError("--measure-correlation reads --data's batches and "
                     "--predict trains nothing; run them apart");
  if (o.resumeFallback && !o.resume)
    throw UsageError("--resume-fallback needs --resume");
  if (o.profileMemory && o.profile.empty())
    throw UsageError("--profile-memory needs --profile FILE");
  if (o.nproc > 1 && (o.rank || o.worldSize))
    throw UsageError("--nproc starts its own ranks; drop --rank/--world-size");
  // A pipeline plan needs its processes: started here unless the command
  // line or a launcher (RANK / WORLD_SIZE) says how many.
  if (p.pipeline.active() && !nprocGiven && !o.rank && !o.worldSize &&
      !std::getenv("WORLD_SIZE") && !std::getenv("MTPRT_STORE_SERVED"))
    o.nproc = static_cast<int>(std::max<int64_t>(p.plannedProcesses,
                                                 p.pipeline.size()));
  return true;
}

//===----------------------------------------------------------------------===//
// Before training: what would otherwise fail late
//===----------------------------------------------------------------------===//

/// --checkpoint-dir: created when missing (with its parents), then probed by
/// creating and removing a file, so a read-only or uncreatable directory is
/// an error before the first step, not at the first save (possibly the end
/// of the run). Throws naming the path and the reason.
void prepareCheckpointDir(const std::string &dir) {
  auto fail = [&](const std::string &why) {
    throw std::runtime_error("--checkpoint-dir " + dir + ": " + why +
                             "; checkpoints could not be saved");
  };
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/')
      continue;
    const std::string prefix = dir.substr(0, i);
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        fail(prefix == dir
                 ? "exists and is not a directory"
                 : "cannot be created: " + prefix + " is not a directory");
      continue;
    }
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      fail("cannot be created: mkdir " + prefix + ": " + std::strerror(errno));
  }
  const std::string probe = dir + "/.mtprt-probe." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0)
    fail(std::string("is not writable: cannot create a file in it: ") +
         std::strerror(errno));
  const bool wrote = ::write(fd, "1", 1) == 1;
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote)
    fail(std::string("is not writable: ") + std::strerror(err));
}

/// The checks a launcher makes once before starting its ranks (and a rank
/// again, for runs someone else launched): the checkpoint directory, and a
/// compression the runtime cannot run.
void preflight(const Program &p, const Options &o, int world) {
  if (!o.checkpointDir.empty())
    prepareCheckpointDir(o.checkpointDir);
  if (o.compress && world > 1 && p.compressBits != 8)
    throw std::runtime_error(
        "the plan's collective quantizes to " + std::to_string(p.compressBits) +
        " bits per value; this runtime's GSC kernels quantize to 8 bits only: "
        "re-plan with compressed(bits = 8), or run with --no-compress");
  if (p.train.saps && world > 1 && o.compress)
    throw std::runtime_error(
        "the plan updates the backbone sparsely (strategy { saps }): its "
        "ranks exchange the selected entries uncompressed; drop --compress");
}

//===----------------------------------------------------------------------===//
// --nproc: start the ranks, watch them
//===----------------------------------------------------------------------===//

/// "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string describeExit(int status) {
  if (WIFEXITED(status))
    return "exited with code " + std::to_string(WEXITSTATUS(status));
  const int sig = WTERMSIG(status);
  // (sigabbrev_np is glibc 2.32+; the GPU machine's libc may be older.)
  static const std::pair<int, const char *> names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},
      {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},
      {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
      {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
      {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"}};
  for (const auto &[n, name] : names)
    if (n == sig)
      return "was killed by signal " + std::to_string(sig) + " (" + name + ")";
  const char *what = strsignal(sig);
  return "was killed by signal " + std::to_string(sig) +
         (what ? std::string(" (") + what + ")" : std::string());
}

int exitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int launch(const std::string &name, int argc, char **argv, const Program &p,
           const Options &o) {
  preflight(p, o, o.nproc);
  StoreServer server(o.masterPort.value_or(0), o.timeoutS);
  const int port = server.port();
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--nproc" || a == "--master-port") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0 || a.rfind("--master-port=", 0) == 0)
      continue;
    args.push_back(a);
  }
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0)
    throw std::runtime_error("cannot find this executable (/proc/self/exe)");
  self[len] = 0;
  const pid_t launcher = ::getpid();
  struct Rank {
    pid_t pid = 0;
    bool running = false;
  };
  std::vector<Rank> ranks;
  for (int r = 0; r < o.nproc; ++r) {
    std::vector<std::string> env;
    for (char **e = environ; *e; ++e) {
      const std::string s = *e;
      if (s.rfind("RANK=", 0) && s.rfind("WORLD_SIZE=", 0) &&
          s.rfind("LOCAL_RANK=", 0) && s.rfind("LOCAL_WORLD_SIZE=", 0) &&
          s.rfind("MASTER_ADDR=", 0) && s.rfind("MASTER_PORT=", 0) &&
          s.rfind("MTPRT_LAUNCHER_PID=", 0))
        env.push_back(s);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
    env.push_back("WORLD_SIZE=" + std::to_string(o.nproc));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("MTPRT_STORE_SERVED=1");
    env.push_back("MTPRT_LAUNCHER_PID=" + std::to_string(launcher));
    std::vector<std::string> av = args;
    std::vector<char *> avp, envp;
    for (std::string &s : av)
      avp.push_back(s.data());
    avp.push_back(nullptr);
    for (std::string &s : env)
      envp.push_back(s.data());
    envp.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      // A rank dies with its launcher (the setting survives execve): a
      // SIGKILLed launcher leaves no orphans training on. A launcher that
      // died before this line has already left the rank to another parent.
      // (A stopped or hung launcher is the ranks' LauncherWatch's business.)
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher)
        _exit(1);
      execve(self, avp.data(), envp.data());
      _exit(127);
    }
    if (pid < 0) {
      for (Rank &k : ranks)
        ::kill(k.pid, SIGKILL);
      throw std::runtime_error(std::string("fork failed: ") +
                               std::strerror(errno));
    }
    ranks.push_back({pid, true});
  }
  // Ctrl-C reaches every rank through the terminal's process group; a signal
  // sent to the launcher alone is forwarded. A rank that fails stops the
  // others (they would wait on it until the timeout): the first failure is
  // named, and its code is the launcher's.
  using Clock = std::chrono::steady_clock;
  const auto beatEvery = std::chrono::milliseconds(
      std::clamp<int64_t>(int64_t(o.timeoutS) * 1000 / 8, 20, 500));
  const auto grace = std::chrono::seconds(std::min(o.timeoutS, 5));
  auto lastBeat = Clock::now() - beatEvery;
  std::optional<Clock::time_point> killAt;
  int code = 0;
  size_t left = ranks.size();
  bool forwarded = false;
  while (left) {
    if (interrupted && !forwarded) {
      for (const Rank &k : ranks)
        if (k.running)
          ::kill(k.pid, SIGINT);
      forwarded = true;
    }
    if (Clock::now() - lastBeat >= beatEvery) {
      try {
        server.beat();
      } catch (const std::exception &) {
        // The store is ours; a failed beat shows as a missed one.
      }
      lastBeat = Clock::now();
    }
    // Everything that ended since the last look. Among ranks that ended
    // together, one killed by a signal is the cause: the others fail on its
    // broken connections.
    int failed = -1, failedStatus = 0;
    bool reaped = false;
    for (;;) {
      int st = 0;
      const pid_t done = waitpid(-1, &st, WNOHANG);
      if (done <= 0)
        break;
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (ranks[r].pid != done || !ranks[r].running)
          continue;
        ranks[r].running = false;
        --left;
        reaped = true;
        if (exitCode(st) != 0 &&
            (failed < 0 || (WIFSIGNALED(st) && !WIFSIGNALED(failedStatus)))) {
          failed = static_cast<int>(r);
          failedStatus = st;
        }
      }
    }
    if (failed >= 0 && code == 0) {
      code = exitCode(failedStatus);
      // 130: the ranks agreed to stop on Ctrl-C, each saving its checkpoint.
      if (code != 130) {
        std::fprintf(stderr,
                     "%s: error: rank %d of %d (pid %d) %s; stopping the "
                     "other ranks\n",
                     name.c_str(), failed, o.nproc,
                     static_cast<int>(ranks[failed].pid),
                     describeExit(failedStatus).c_str());
        for (const Rank &k : ranks)
          if (k.running)
            ::kill(k.pid, SIGTERM);
        killAt = Clock::now() + grace;
      }
    }
    if (killAt && Clock::now() >= *killAt) {
      for (const Rank &k : ranks)
        if (k.running)
          ::kill(k.pid, SIGKILL);
      killAt.reset();
    }
    if (!reaped)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return code;
}

//===----------------------------------------------------------------------===//
// One rank
//===----------------------------------------------------------------------===//

std::string human(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0)
    return "?";
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

int envLocalRank(int rank) {
  const char *v = std::getenv("LOCAL_RANK");
  return v && *v ? std::atoi(v) : rank;
}

//===----------------------------------------------------------------------===//
// --dump-init and --rss: what the benchmarks' PyTorch peer needs
//===----------------------------------------------------------------------===//

nlohmann::ordered_json jsonLr(const LrConfig &c) {
  return {{"lr", c.lr},
          {"schedule", toString(c.schedule)},
          {"warmup", c.warmupSteps},
          {"total", c.totalSteps}};
}

void writeFile(const std::string &path, const std::vector<char> &bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f)
    throw std::runtime_error("--dump-init: cannot write " + path);
}

/// The labels the files carry, checked when they are read: a task the
/// training data never labels does not train (warned), held-out data with
/// no labels evaluates nothing, and --keep-best must name a metric the
/// held-out file can give (refused, as at its parsing).
void checkLabels(const Options &o, const std::vector<HeadConfig> &heads,
                 const DataSource &data, const DataSource *evalSet,
                 bool rank0) {
  const std::vector<int64_t> train = data.labelledRecords();
  const bool trains =
      o.predict.empty() && (o.steps > 0 || o.measureCorrelation > 0);
  for (size_t t = 0; t < train.size() && trains && rank0; ++t)
    if (train[t] == 0)
      std::fprintf(stderr,
                   "mtprt: warning: %s: no record has labels of task '%s': "
                   "its head does not train (the summary reports no loss "
                   "for it)\n",
                   o.data.c_str(), heads[t].name.c_str());
  if (!evalSet)
    return;
  const std::vector<int64_t> held = evalSet->labelledRecords();
  if (!held.empty() && std::count(held.begin(), held.end(), 0) ==
                           int64_t(held.size()))
    throw UsageError("--eval-data " + o.evalData +
                     ": no record has labels of any task, so there is "
                     "nothing to evaluate; --predict writes a file's "
                     "predictions");
  std::vector<std::vector<std::string>> names = evalSet->labelNames();
  names.resize(heads.size());
  for (size_t t = 0; t < heads.size() && rank0; ++t)
    if (!held.empty() && held[t] == 0)
      std::fprintf(stderr,
                   "mtprt: note: --eval-data %s has no labels of task '%s': "
                   "it is not evaluated\n",
                   o.evalData.c_str(), heads[t].name.c_str());
  if (o.keepBest.empty())
    return;
  // The metric parsed already (TASK.METRIC, reported by such a head).
  const size_t dot = o.keepBest.find('.');
  const std::string task = o.keepBest.substr(0, dot),
                    metric = o.keepBest.substr(dot + 1);
  const bool entity = metric.rfind("entity_", 0) == 0;
  for (size_t t = 0; t < heads.size(); ++t)
    if ((task == "mean" || heads[t].name == task) &&
        metrics::reports(heads[t], metric) &&
        (held.empty() || held[t] > 0) &&
        !(entity && heads[t].kind == HeadKind::Tag &&
          !metrics::namesEntities(names[t])))
      return;
  throw UsageError(
      "--keep-best " + o.keepBest + ": --eval-data " + o.evalData +
      (entity ? " names no tags as BIO tags (B-X, I-X, O; a shard from `mtpc "
                "prepare` carries them), which entity metrics need"
              : " has no labels of " +
                    (task == "mean" ? std::string("a task reporting ") + metric
                                    : "task '" + task + "'")) +
      ", so nothing would be kept");
}

/// --measure-correlation N: the tasks' gradient cosines (taskSimilarity, on
/// this rank's rows, averaged over the ranks) over the first N batches,
/// averaged per pair over the batches where both have labels, printed as
/// the spec's `correlate` lines.
template <typename MineOf>
void measureCorrelation(TrainerCore &core, DataSource &data, MineOf mineOf,
                        const Schedule &schedule, const Options &o,
                        const char *refused, bool rank0,
                        const std::function<bool()> &stopAgreed) {
  if (refused)
    throw std::runtime_error(
        std::string("--measure-correlation: not with ") + refused +
        " (the measurement runs the whole model in one process); measure "
        "with the spec's plan at zero = 0 and without a pipeline");
  const auto &heads = core.model().heads();
  const int64_t n = static_cast<int64_t>(heads.size());
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<double>> sum(n, std::vector<double>(n, 0.0));
  std::vector<std::vector<int64_t>> count(n, std::vector<int64_t>(n, 0));
  int64_t layer = 0, measured = 0;
  const bool tty = o.progress == "auto" && isatty(STDERR_FILENO);
  for (int64_t i = 0; i < o.measureCorrelation; ++i, ++measured) {
    // Ctrl-C ends the measurement with what it has, and the run (exit 130);
    // the ranks agree first: each batch's measurement is a collective.
    if (stopAgreed())
      break;
    if (rank0 && (tty || o.progress != "off") && i > 0 && i % 10 == 0)
      std::fprintf(stderr, "%s--measure-correlation: %lld of %lld batches%s",
                   tty ? "\r" : "", static_cast<long long>(i),
                   static_cast<long long>(o.measureCorrelation),
                   tty ? "" : "\n");
    const std::vector<std::vector<double>> cos = core.taskSimilarity(
        mineOf(data.batch(i, o.batchSize)), schedule, all, &layer);
    if (cos.empty())
      break; // fewer than two tasks, or the layer is frozen
    for (int64_t a = 0; a < n; ++a)
      for (int64_t b = a + 1; b < n; ++b)
        if (std::isfinite(cos[a][b]))
          sum[a][b] += cos[a][b], ++count[a][b];
  }
  if (!rank0)
    return;
  if (tty && measured > 10)
    std::fprintf(stderr, "\n");
  if (n < 2 || core.model().config().frozen(layer)) {
    std::printf("mtprt: --measure-correlation: %s\n",
                n < 2 ? "one task: nothing to correlate"
                      : "the layer every task reads through is frozen: no "
                        "shared gradient to compare");
    return;
  }
  std::printf("# task gradient similarity: cosines on layer %lld's parameters "
              "over %lld batches, the first micro-batch of each (paste into "
              "the spec)%s\n",
              static_cast<long long>(layer), static_cast<long long>(measured),
              measured < o.measureCorrelation ? "; interrupted" : "");
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = a + 1; b < n; ++b) {
      if (!count[a][b]) {
        std::printf("# %s ~ %s: no batch had both tasks' labels\n",
                    heads[a].name.c_str(), heads[b].name.c_str());
        continue;
      }
      std::printf("correlate %s ~ %s = %.2f\n", heads[a].name.c_str(),
                  heads[b].name.c_str(),
                  std::clamp(sum[a][b] / double(count[a][b]), -1.0, 1.0));
    }
  std::fflush(stdout);
}

/// DIR/params.pt (name -> tensor, Model::namedParameters order), DIR/batch.pt
/// (tokens, label.<task>: the first global batch) and DIR/config.json (the
/// model, heads, training settings and data this run uses). torch.load reads
/// the .pt files.
void dumpInit(const std::string &dir, TrainerCore &core,
              const ModelConfig &mc, const TrainConfig &tc, const Options &o,
              DataSource &data) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw std::runtime_error("--dump-init: cannot create the directory " +
                             dir + (ec ? ": " + ec.message() : std::string(
                                             ": a file of that name exists")));
  c10::Dict<std::string, at::Tensor> params;
  for (const auto &[name, t] : core.model().namedParameters())
    params.insert(name, t.detach().cpu().clone());
  writeFile(dir + "/params.pt", torch::pickle_save(params));
  const Batch b = data.batch(0, o.batchSize);
  c10::Dict<std::string, at::Tensor> batch;
  batch.insert("tokens", b.tokens.cpu());
  const std::vector<HeadConfig> &heads = core.model().heads();
  for (size_t t = 0; t < heads.size() && t < b.labels.size(); ++t)
    if (b.labels[t].defined())
      batch.insert("label." + heads[t].name, b.labels[t].cpu());
  writeFile(dir + "/batch.pt", torch::pickle_save(batch));

  Json config;
  config["model"] = {{"vocab", mc.vocab},     {"seq", mc.seq},
                     {"layers", mc.layers},   {"hidden", mc.hidden},
                     {"heads", mc.heads},     {"ffn", mc.ffn},
                     {"dropout", mc.dropout}, {"seed", mc.seed},
                     {"attention", toString(mc.attention)},
                     {"pointwise", toString(mc.pointwise)},
                     // A pretrained family and its directory: the
                     // benchmarks' transformers peer loads the same.
                     {"kind", hf::modelType(mc.kind)},
                     {"weights", mc.weights}};
  // The frozen layers [first, last] (0: the embeddings), or null.
  config["model"]["freeze"] =
      mc.freezeFirst < 0 ? Json() : Json::array({mc.freezeFirst, mc.freezeLast});
  Json headList = Json::array();
  for (const HeadConfig &h : heads)
    headList.push_back(
        {{"name", h.name},
         {"kind", toString(h.kind)},
         {"tap", h.tap},
         {"loss", toString(h.loss)},
         {"classes", h.classes},
         {"weight", h.weight}});
  config["heads"] = std::move(headList);
  Json headLr = Json::array();
  for (const LrConfig &lr : tc.headLr)
    headLr.push_back(jsonLr(lr));
  config["train"] = {{"precision", toString(tc.precision)},
                     {"micro_batches", tc.microBatches},
                     {"scope", toString(tc.scope)},
                     {"gfm_keep", tc.gfmKeep},
                     {"clip_norm", tc.clipNorm},
                     {"gate", tc.gate},
                     {"weight_decay", tc.weightDecay},
                     {"beta1", tc.beta1},
                     {"beta2", tc.beta2},
                     {"eps", tc.eps},
                     {"backbone_lr", jsonLr(tc.backboneLr)},
                     {"head_lr", std::move(headLr)}};
  config["batch_size"] = o.batchSize;
  config["steps"] = o.steps;
  config["data"] = o.data;
  config["data_seed"] = o.seed;
  config["relatedness"] = o.relatedness;
  std::ofstream js(dir + "/config.json");
  js << config.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
  if (!js)
    throw std::runtime_error("--dump-init: cannot write " + dir +
                             "/config.json");
}

/// VmRSS and VmHWM of this process, in bytes.
std::pair<int64_t, int64_t> residentSet() {
  std::ifstream f("/proc/self/status");
  std::string line;
  int64_t rss = -1, hwm = -1;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0)
      rss = std::atoll(line.c_str() + 6) * 1024;
    else if (line.rfind("VmHWM:", 0) == 0)
      hwm = std::atoll(line.c_str() + 6) * 1024;
  }
  return {rss, hwm};
}

/// User + system CPU time of this process (every thread), in seconds.
double cpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// Resets VmHWM to the current VmRSS (Linux: "5" to clear_refs).
bool resetResidentPeak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

/// The parameter of `core` that is not finite (empty when all are), found
/// with one device-to-host read for all of them.
std::string nonFiniteParameter(TrainerCore &core) {
  // ZeRO 3: the sharded parameters are checked as the ranks' runs (every
  // rank calls this at the same step), the whole ones as they are.
  ZeroOptimizer *zero = core.zero();
  const bool sharded = zero && zero->shardsParameters();
  if (sharded && !zero->runFinite())
    return "of the sharded backbone (ZeRO 3)";
  std::vector<at::Tensor> finite;
  // By name: the values, every update's arrived (ZeRO 1–2).
  for (const auto &[name, t] : core.model().namedParameters())
    if (!sharded || t.storage().nbytes() > 0)
      finite.push_back(at::isfinite(t).all());
  if (finite.empty() || at::stack(finite).all().item<bool>())
    return "";
  for (const auto &[name, t] : core.model().namedParameters())
    if ((!sharded || t.storage().nbytes() > 0) &&
        !at::isfinite(t).all().item<bool>())
      return name;
  return "?";
}

/// Bytes as a person reads them (B, KiB, ..., TiB).
std::string sized(double bytes) { return formatBytes(bytes, 1); }

/// The most CPU memory this process can have, and what sets it: the
/// machine's physical memory, the cgroup's limit (as mounted: inside a
/// container, its own), or what the address-space limit (ulimit -v) leaves.
std::pair<double, std::string> cpuMemoryLimit() {
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  double bytes = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * page;
  std::string what = "the machine's physical memory";
  auto consider = [&](double v, const char *why) {
    if (v > 0 && v < bytes) {
      bytes = v;
      what = why;
    }
  };
  for (const char *f : {"/sys/fs/cgroup/memory.max",
                        "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(f);
    double v = 0;
    if (in >> v) // "max" (no limit) does not parse
      consider(v, "the cgroup's memory limit");
  }
  rlimit r{};
  if (::getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
    std::ifstream statm("/proc/self/statm");
    double pages = 0;
    statm >> pages;
    consider(static_cast<double>(r.rlim_cur) - pages * page,
             "what the address-space limit (ulimit -v) leaves");
  }
  return {bytes, what};
}

/// Refuses a --batch-size the CPU's memory certainly cannot hold, before a
/// step allocates it (the OOM killer would end the process instead): from
/// the plan's predicted peak (activations scale with the batch, parameters,
/// gradients and AdamW's moments do not) or, without a plan, from the least
/// a step keeps. Per rank. CUDA's allocator refuses cleanly by itself.
void checkBatchFitsMemory(const Program &p, const Options &o,
                          const ModelConfig &mc, TrainerCore &core,
                          int worldSize) {
  if (mc.device.rfind("cuda", 0) == 0)
    return;
  double paramBytes = 0;
  for (const at::Tensor &t : core.model().parameters())
    paramBytes += static_cast<double>(t.numel() * t.element_size());
  const double fixed = 4 * paramBytes;
  const double rows = static_cast<double>(o.batchSize) / worldSize;
  const bool planned = p.predictedPeakBytes > 0 && p.batchSize > 0;
  double perRow, need;
  std::string basis;
  if (planned) {
    const double plannedRows =
        static_cast<double>(p.batchSize) / std::max<int64_t>(1, p.plannedProcesses);
    if (rows <= plannedRows)
      return;
    perRow = std::max(0.0, double(p.predictedPeakBytes) - fixed) / plannedRows;
    need = fixed + perRow * rows;
    basis = "the plan predicts " + sized(double(p.predictedPeakBytes)) +
            " per process for its batch of " + std::to_string(p.batchSize) +
            ", which scales to about " + sized(need) + " at this batch";
  } else {
    // An embedding output and one layer's, at 2 bytes a value: any step
    // holds at least that at once.
    perRow = 2.0 * double(mc.seq) * double(mc.hidden) * 2;
    need = fixed + perRow * rows;
    basis = "a step at this batch holds at least " + sized(need);
  }
  const auto [limit, what] = cpuMemoryLimit();
  if (need <= limit)
    return;
  const double most =
      perRow > 0 ? std::floor(std::max(0.0, limit - fixed) / perRow) : 0;
  const int64_t fits = std::max<int64_t>(
      1, static_cast<int64_t>(most) * worldSize);
  throw UsageError("--batch-size " + std::to_string(o.batchSize) + ": " +
                   basis + ", more than the " + sized(limit) + " of " + what +
                   "; use --batch-size " + std::to_string(fits) + " or less" +
                   (planned ? " (or re-plan the spec for the batch you want)"
                            : ""));
}

int train(const std::string &name, const Program &p, const Options &o) {
  DistOptions d;
  d = distOptionsFromEnv(d);
  d.timeoutS = o.timeoutS;
  if (o.rank)
    d.rank = *o.rank;
  if (o.worldSize)
    d.worldSize = *o.worldSize;
  if (o.masterAddr)
    d.masterAddr = *o.masterAddr;
  if (o.masterPort)
    d.masterPort = *o.masterPort;
  // A peer lost mid-send closes its socket under gloo's write: that must
  // surface as the collective's error (named, with the rank), not end this
  // process by SIGPIPE without a word.
  if (d.worldSize > 1)
    std::signal(SIGPIPE, SIG_IGN);
  if (d.rank >= d.worldSize)
    throw UsageError("rank " + std::to_string(d.rank) +
                     " is not below the world size " +
                     std::to_string(d.worldSize));
  // docs/pipeline.md: the plan's stages, one process each per replica;
  // the batch splits over the replicas (`dp`), each replica's stages share
  // its rows.
  const PipelineConfig &pipeline = p.pipeline;
  const int64_t stages = pipeline.active() ? pipeline.size() : 1;
  if (pipeline.active()) {
    if (d.worldSize % stages != 0)
      throw UsageError("the plan cuts the backbone into " +
                       std::to_string(stages) +
                       " pipeline stages, one process each: run a multiple "
                       "of " + std::to_string(stages) + " processes (--nproc " +
                       std::to_string(stages) + " or more), not " +
                       std::to_string(d.worldSize));
    for (const std::string *what :
         {&o.evalData, &o.predict, &o.exportDir, &o.dumpHidden,
          &o.profileUnits, &o.keepBest, &o.dumpInit})
      if (!what->empty())
        throw UsageError(
            std::string(what == &o.evalData     ? "--eval-data"
                        : what == &o.predict    ? "--predict"
                        : what == &o.exportDir  ? "--export"
                        : what == &o.dumpHidden ? "--dump-hidden"
                        : what == &o.profileUnits ? "--profile-units"
                        : what == &o.keepBest   ? "--keep-best"
                                                : "--dump-init") +
            " needs the whole model in one process; a pipeline plan's "
            "processes hold one stage each (docs/pipeline.md)");
  }
  const int64_t stage = pipeline.active() ? pipeline.stageOf(d.rank) : 0;
  const int64_t replica = pipeline.active() ? pipeline.replicaOf(d.rank)
                                            : d.rank;
  const int dp = static_cast<int>(d.worldSize / stages);
  if (o.batchSize % dp != 0)
    throw UsageError("--batch-size " + std::to_string(o.batchSize) +
                     " does not split evenly over " + std::to_string(dp) +
                     (pipeline.active() ? " pipeline replicas" : " ranks"));
  const bool rank0 = d.rank == 0;
  preflight(p, o, d.worldSize);
  // Rank 0 reports what every rank found (they agree through a collective);
  // the others leave with the same code, silently.
  auto stopAll = [&](const std::string &why) -> void {
    if (rank0)
      throw std::runtime_error(why);
    throw QuietExit{1};
  };
  // Started by our --nproc launcher: notice it stopping or hanging (its
  // death kills this rank already, PR_SET_PDEATHSIG).
  std::unique_ptr<LauncherWatch> watch;
  if (const char *lp = std::getenv("MTPRT_LAUNCHER_PID");
      lp && *lp && d.worldSize > 1 && std::getenv("MTPRT_STORE_SERVED")) {
    const std::string launcher = lp;
    const int rank = d.rank, world = d.worldSize;
    watch = std::make_unique<LauncherWatch>(
        d.masterAddr, d.masterPort, d.timeoutS,
        [name, launcher, rank, world](const std::string &why) {
          std::fprintf(stderr,
                       "%s: error: rank %d of %d: the launcher (pid %s) %s; "
                       "stopping this rank\n",
                       name.c_str(), rank, world, launcher.c_str(),
                       why.c_str());
          std::fflush(stderr);
          _exit(1);
        });
  }
  if (o.threads > 0)
    at::set_num_threads(o.threads);

  ModelConfig mc = p.model;
  TrainConfig tc = p.train;
  if (o.device)
    mc.device = *o.device;
  if (o.precision)
    tc.precision = *o.precision == "fp32"   ? Precision::Fp32
                   : *o.precision == "bf16" ? Precision::Bf16
                                            : Precision::Fp16;
  mc.seed = p.model.seed + o.seed;
  if (o.cosineEvery)
    tc.cosineEvery = *o.cosineEvery;
  // docs/pipeline.md: measured cosines send every task's processed tap
  // gradients up the pipe; the plan counts that buffer only with the gate.
  if (o.cosineEvery && *o.cosineEvery > 0 && !p.train.gate &&
      p.pipeline.active() && p.pipeline.size() > 1 && d.rank == 0)
    std::fprintf(stderr,
                 "mtprt: warning: --cosine-every %lld without the DGFG gate: "
                 "at measured steps the stages before the last hold every "
                 "task's tap gradients, which the plan does not count (its "
                 "peaks assume no cosines without the gate)\n",
                 static_cast<long long>(*o.cosineEvery));
  // D15: a --batch-size fixes a dynamic batch; the plan's micro batch stays.
  if (p.dynamicBatch && o.batchGiven) {
    const int64_t micro = std::max<int64_t>(
        1, p.batchSize / std::max<int64_t>(1, p.plannedProcesses) /
               std::max<int64_t>(1, p.train.microBatches));
    if (o.batchSize % (micro * d.worldSize) != 0)
      throw UsageError("--batch-size " + std::to_string(o.batchSize) +
                       " is not a whole number of micro-batches of " +
                       std::to_string(micro) + " on each of " +
                       std::to_string(d.worldSize) +
                       " process(es) (the plan's micro batch)");
    tc.microBatches = o.batchSize / (micro * d.worldSize);
  }
  // Dropout differs per rank (different rows), reproducibly.
  {
    at::Generator g = at::detail::getDefaultCPUGenerator();
    g.set_current_seed(o.seed * 7919 + static_cast<uint64_t>(d.rank));
  }

  // One GPU per rank on this machine.
  if (mc.device == "cuda" && d.worldSize > 1)
    mc.device = "cuda:" + std::to_string(envLocalRank(d.rank));
  d.device = mc.device;
  // Before LibTorch tries: its own message is a stack trace.
  if (mc.device.rfind("cuda", 0) == 0 && !cudaMemoryStatsAvailable())
    throw std::runtime_error(
        "this program runs on " + mc.device +
        " but no usable CUDA device is visible (no GPU, a driver older than "
        "the CUDA runtime, or a runtime built without its LibTorch-CUDA "
        "parts); run it on a GPU machine, or pass --device cpu");
  Trainer trainer(mc, p.heads, tc);
  TrainerCore &core = trainer.core();
  if (pipeline.active()) {
    std::vector<bool> mine(p.heads.size(), false);
    for (int64_t t : pipeline.stages[stage].tasks)
      mine[t] = true;
    core.restrictToStage(pipeline.stages[stage].firstUnit,
                         pipeline.stages[stage].lastUnit, mine);
  }
  checkBatchFitsMemory(p, o, mc, core, dp);
  // Our --nproc launcher, or torchrun's agent, already serves the store.
  const char *agentStore = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool served = std::getenv("MTPRT_STORE_SERVED") != nullptr ||
                      (agentStore && std::string(agentStore) == "True");
  Communicator comm(d, /*serveStore=*/!served);
  GscOptions gsc;
  gsc.topK = o.topK;
  gsc.decay = o.decay;
  gsc.block = o.block;
  gsc.bucket = o.bucket;
  if (tc.zeroStage >= 2 && o.compress && d.worldSize > 1)
    throw UsageError("the plan shards gradients (budget { zero = 2 }), which "
                     "sums them uncompressed during the backward: drop --compress, or "
                     "plan with zero = 1 (docs/zero.md)");
  // A pipeline stage exchanges gradients with its replicas only: their own
  // group (its keys prefixed in the same store).
  std::unique_ptr<Communicator> replicas;
  if (pipeline.active() && dp > 1) {
    DistOptions rd = d;
    rd.group = "stage" + std::to_string(stage) + "/";
    rd.rank = static_cast<int>(replica);
    rd.worldSize = dp;
    replicas = std::make_unique<Communicator>(rd, /*serveStore=*/false);
  }
  Communicator *exchangeComm =
      pipeline.active() ? replicas.get() : &comm;
  GradExchange exchange(exchangeComm, o.compress && tc.zeroStage < 2, gsc);
  std::unique_ptr<PipelineRunner> runner;
  if (pipeline.active())
    runner = std::make_unique<PipelineRunner>(core, comm, pipeline, stage);
  exchange.prepare(core.model().trainableParameters());
  if (tc.zeroStage || tc.optimizerOffload)
    core.shardOptimizer(&comm);
  // ZeRO 1–2's broadcasts of the updated values run on into the next
  // step's forward. The small agreements between (each step's report, a
  // stage 2 step's tasks) go over a group of their own: on the world's
  // they would queue behind the broadcasts and wait for all of them.
  std::unique_ptr<Communicator> control;
  if (d.worldSize > 1 && !pipeline.active() &&
      (tc.zeroStage == 1 || tc.zeroStage == 2)) {
    DistOptions cd = d;
    cd.group = "control/";
    control = std::make_unique<Communicator>(cd, /*serveStore=*/false);
    // Its first collective now, while nothing else is in flight (NCCL may
    // create a communicator lazily, and two busy at once can deadlock).
    std::vector<at::Tensor> warm{
        at::zeros({1}, at::kFloat).to(control->device())};
    control->allReduceSum(warm);
    core.zero()->setControl(control.get());
  }
  Communicator &agree = control ? *control : comm;
  GradExchange::Result sent;
  // Under SAPS, the parameters it does not manage (their gradients stay
  // dense); asked at each update (an adapter split adds some).
  auto sapsDense = [&] {
    std::vector<at::Tensor> dense;
    std::unordered_set<const void *> managed;
    for (const at::Tensor &t : core.sparseUpdate()->params())
      managed.insert(t.unsafeGetTensorImpl());
    for (const at::Tensor &t : core.model().trainableParameters())
      if (!managed.count(t.unsafeGetTensorImpl()))
        dense.push_back(t);
    return dense;
  };
  core.beforeUpdate = [&](StepStats &) {
    if (ZeroOptimizer *zero = core.zero(); zero && zero->stage() >= 2) {
      sent.bytesSent = sent.bytesSentUncompressed = zero->sumGradients();
      return;
    }
    SparseUpdate *sparse = core.sparseUpdate();
    if (!sparse || dp == 1) {
      sent = exchange.averageGradients(core.model().trainableParameters());
      return;
    }
    // SAPS: the dense gradients (heads, what it does not manage), then the
    // selected entries' (the ranks select alike: docs/techniques.md D12).
    sent = exchange.averageGradients(sapsDense());
    const int64_t bytes = sparse->averageGradients(core.averageOverRanks);
    sent.bytesSent += bytes;
    sent.bytesSentUncompressed += bytes;
  };

  // EWC's Fisher and conflict measurement on this rank's rows of a batch,
  // averaged over the ranks: the whole batch's, as one process has it, at
  // the plan's micro batch (docs/techniques.md D14).
  if (dp > 1 && !pipeline.active())
    core.averageOverRanks = [&](std::vector<at::Tensor> &ts) {
      comm.allReduceSum(ts);
      for (at::Tensor &t : ts)
        t.div_(double(dp));
    };
  auto mineOf = [&](const Batch &b) {
    const int64_t local = b.size() / dp;
    return b.slice(replica * local, (replica + 1) * local);
  };

  std::unique_ptr<DataSource> data =
      o.data == "synthetic" || !o.trainingDataNeeded
          ? syntheticData(mc, p.heads, o.seed, o.relatedness)
          : loadData(o.data, mc, p.heads);
  // Held-out data is read (and checked) now, not at the first evaluation.
  auto heldOut = [&](const std::string &path) -> std::unique_ptr<DataSource> {
    if (path.empty())
      return nullptr;
    if (path.rfind("synthetic:", 0) == 0)
      return syntheticHeldOut(mc, p.heads, o.seed, o.relatedness,
                              heldOutRecords(path));
    return loadData(path, mc, p.heads);
  };
  std::unique_ptr<DataSource> evalSet = heldOut(o.evalData);
  // The plan's evaluation batch (within the step's peak) where the run is
  // the plan's; else the micro batch.
  const bool asPlanned =
      o.batchSize == p.batchSize && d.worldSize == p.plannedProcesses;
  const int64_t evalBatch =
      asPlanned && p.evalBatch > 0
          ? p.evalBatch
          : std::max<int64_t>(1, o.batchSize / dp /
                                     std::max<int64_t>(1, tc.microBatches));
  std::unique_ptr<DataSource> predictSet =
      heldOut(o.predict);
  checkLabels(o, p.heads, *data, evalSet.get(), rank0);
  // An --export that cannot happen is refused now, not after training.
  if (!o.exportDir.empty() && mc.kind == BackboneKind::Transformer)
    throw std::runtime_error(
        "--export: this model's backbone is mtpc's own transformer, which has "
        "no Hugging Face architecture to export to; declare a gpt2 or "
        "pretrained backbone");
  if (!o.exportDir.empty() && rank0) {
    std::error_code ec;
    std::filesystem::create_directories(o.exportDir, ec);
    if (ec)
      throw std::runtime_error("--export: cannot create " + o.exportDir +
                               " (" + ec.message() + ")");
  }
  if (rank0 && !core.model().pretrainedSummary().empty())
    std::fprintf(stderr, "%s\n", core.model().pretrainedSummary().c_str());
  // ZeRO 3: what reads the parameters outside a step has them whole for
  // the time (every rank gathers, rank 0 writes).
  std::optional<TrainerCore::WholeParameters> whole;
  if (!o.dumpHidden.empty() || !o.dumpInit.empty() || !o.profileUnits.empty())
    whole.emplace(core.zero(), /*masters=*/!o.dumpInit.empty());
  if (!o.dumpHidden.empty() && rank0) {
    writeHiddenStates(core.model(), data->batch(0, o.batchSize),
                      o.dumpHidden);
    std::fprintf(stderr, "wrote the hidden states to %s\n",
                 o.dumpHidden.c_str());
  }
  if (!o.dumpInit.empty() && rank0) {
    dumpInit(o.dumpInit, core, mc, tc, o, *data);
    std::fprintf(stderr, "wrote the initial state to %s\n",
                 o.dumpInit.c_str());
  }
  if (!o.profileUnits.empty() && rank0) {
    const int64_t micro =
        std::max<int64_t>(1, o.batchSize / d.worldSize / tc.microBatches);
    writeUnitProfile(core.model(), data->batch(0, o.batchSize).slice(0, micro),
                     o.profileUnits, tc.precision);
    std::fprintf(stderr, "wrote the segments' costs to %s\n",
                 o.profileUnits.c_str());
  }
  whole.reset();
  // Whether any rank says so (every rank calls it: a collective), for a
  // decision the ranks must take together.
  auto anyRank = [&](bool mine) {
    if (d.worldSize == 1)
      return mine;
    std::vector<at::Tensor> one{
        at::tensor({mine ? 1.0 : 0.0}, at::kDouble).to(agree.device())};
    agree.allReduceSum(one);
    return one[0].cpu().item<double>() > 0;
  };
  bool measureStopped = false;
  auto stopAgreed = [&] { return measureStopped = anyRank(interrupted); };
  if (o.measureCorrelation > 0) {
    measureCorrelation(core, *data, mineOf, p.schedule, o,
                       /*refused=*/pipeline.active()  ? "a pipeline"
                                   : tc.zeroStage > 0 ? "ZeRO"
                                                      : nullptr,
                       rank0, stopAgreed);
    if (measureStopped)
      return 130; // 128 + SIGINT, as the training's interruption
  }

  // Resume: each rank picks its newest good checkpoint; the ranks agree on
  // the oldest of those steps. Checkpoints of a run with another process
  // count are resharded from the newest step all its ranks wrote; a
  // directory where some ranks of this run's size have one and others none
  // is refused: starting fresh there would silently drop the run.
  int64_t position = 0;
  // D15: the plan's schedule sets each step's global batch, in whole
  // micro-batches on every rank (--batch-size fixes it); the data advances
  // by the records the steps took (saved in each checkpoint).
  const std::optional<BatchSchedule> schedule =
      o.batchGiven ? std::nullopt : p.dynamicBatch;
  const int64_t perStep =
      std::max<int64_t>(1, o.batchSize / dp / tc.microBatches) * dp;
  int64_t recordOffset = 0;
  auto extra = [&] {
    return CheckpointExtra{position, schedule ? recordOffset : -1,
                           schedule ? int64_t(-1) : o.batchSize};
  };
  std::string lastGood; // the newest checkpoint of this run's state
  // The data's position is in records under a dynamic batch, in batches
  // otherwise: resuming in the other mode would repeat or skip records; and
  // a fixed batch's position counts steps of one global batch.
  auto checkResumedBatch = [&](const CheckpointExtra &saved,
                               const std::string &path) {
    if (saved.dataRecords >= 0 && !schedule)
      throw std::runtime_error(
          path + " was trained with the plan's dynamic batch schedule; "
                 "resume without --batch-size, from a plan with the same "
                 "schedule");
    if (saved.dataRecords < 0 && schedule && saved.dataPosition > 0)
      throw std::runtime_error(
          path + " was trained with a fixed batch; resume with "
                 "--batch-size B (the plan now has a dynamic batch "
                 "schedule)");
    if (!schedule && saved.dataRecords < 0 && saved.batchSize >= 0 &&
        saved.batchSize != o.batchSize)
      throw std::runtime_error(
          path + " was trained with a global batch of " +
          std::to_string(saved.batchSize) + ", this run's is " +
          std::to_string(o.batchSize) +
          ": its data position (in steps) would resume at other records; "
          "resume with --batch-size " + std::to_string(saved.batchSize) +
          " (or a plan with that global_batch)");
  };
  if (o.resume) {
    int64_t chosen = -1, chosenWorld = -1;
    for (const auto &[step, path] : listCheckpoints(o.checkpointDir, d.rank)) {
      try {
        const CheckpointHeader h = verifyCheckpoint(path);
        if (h.step != step || h.rank != d.rank)
          throw CheckpointError(
              "mtprt: checkpoint " + path + ": its header says step " +
              std::to_string(h.step) + " of rank " + std::to_string(h.rank) +
              ", its name step " + std::to_string(step) + " of rank " +
              std::to_string(d.rank) + " (renamed or copied over?)");
        chosenWorld = h.world;
        chosen = step;
        break;
      } catch (const CheckpointError &e) {
        if (!o.resumeFallback)
          throw std::runtime_error(std::string(e.what()) +
                                   " (--resume-fallback uses the previous "
                                   "good checkpoint)");
        std::fprintf(stderr, "[rank %d] skipping %s\n", d.rank, e.what());
      }
    }
    at::Tensor all =
        at::stack(
            comm.allGather(
                at::tensor({chosen, chosenWorld}, at::kLong).to(comm.device())))
            .cpu();
    auto processes = [](int64_t n) {
      return std::to_string(n) + (n == 1 ? " process" : " processes");
    };
    // Written by another number of processes: resharded (docs/zero.md,
    // "Checkpoints") from the newest step every rank of that run wrote.
    bool otherWorld = false;
    for (int64_t r = 0; r < d.worldSize; ++r)
      otherWorld |= all[r][0].item<int64_t>() >= 0 &&
                    all[r][1].item<int64_t>() != d.worldSize;
    if (otherWorld) {
      if (pipeline.active())
        stopAll("cannot resume " + o.checkpointDir +
                ": it was written by a run of another number of processes, "
                "and a pipeline's checkpoints are per stage; resume with the "
                "processes it was trained with, or start fresh with another "
                "--checkpoint-dir");
      int64_t step = -1, written = -1;
      std::string why = "no step has a checkpoint of every rank";
      for (const auto &[s0, path0] : listCheckpoints(o.checkpointDir, 0)) {
        try {
          const CheckpointHeader h = verifyCheckpoint(path0);
          if (h.world == d.worldSize)
            continue;
          for (int64_t q = 1; q < h.world; ++q) {
            const std::string f = checkpointPath(o.checkpointDir, s0, int(q));
            const CheckpointHeader hq = verifyCheckpoint(f);
            if (hq.step != s0 || hq.rank != q || hq.world != h.world)
              throw CheckpointError("mtprt: checkpoint " + f +
                                    ": its header does not match its name");
          }
          step = s0;
          written = h.world;
          break;
        } catch (const CheckpointError &e) {
          why = e.what();
          if (!o.resumeFallback)
            break;
        }
      }
      at::Tensor found =
          at::stack(comm.allGather(at::tensor({step, written}, at::kLong)
                                       .to(comm.device())))
              .cpu();
      for (int64_t r = 1; r < d.worldSize; ++r)
        if (!at::equal(found[r], found[0]))
          stopAll("cannot resume " + o.checkpointDir +
                  ": the ranks found different checkpoints to reshard "
                  "(is the directory shared and unchanging?)");
      if (step < 0)
        stopAll("cannot resume from " + o.checkpointDir +
                ": it was written by a run of another number of processes, "
                "and resharding it needs every rank's checkpoint of one step: " +
                why + " (--resume-fallback takes an older step)");
      const CheckpointExtra saved = loadResharded(
          o.checkpointDir, step, written, d.rank, core, &exchange);
      // A rank the written run did not have starts its dropout stream
      // afresh (the others continue theirs).
      if (d.rank >= written) {
        at::Generator g = at::detail::getDefaultCPUGenerator();
        g.set_current_seed(
            o.seed * 7919 + static_cast<uint64_t>(d.rank) +
            104729 * static_cast<uint64_t>(step));
      }
      position = saved.dataPosition;
      checkResumedBatch(saved, checkpointPath(o.checkpointDir, step, 0));
      recordOffset = std::max<int64_t>(0, saved.dataRecords);
      if (rank0)
        std::fprintf(stderr,
                     "resumed from %s (step %lld), written by %s: resharded "
                     "to %s (docs/zero.md)\n",
                     checkpointPath(o.checkpointDir, step, 0).c_str(),
                     static_cast<long long>(step), processes(written).c_str(),
                     processes(d.worldSize).c_str());
    }
    int64_t have = 0, none = -1, some = -1;
    for (int64_t r = 0; r < d.worldSize && !otherWorld; ++r) {
      const int64_t step = all[r][0].item<int64_t>();
      if (step >= 0) {
        ++have;
        some = r;
      } else if (none < 0) {
        none = r;
      }
    }
    if (have > 0 && have < d.worldSize)
      stopAll("cannot resume from " + o.checkpointDir + ": rank " +
              std::to_string(some) + " has a checkpoint (" +
              checkpointPath(o.checkpointDir, all[some][0].item<int64_t>(),
                             int(some)) +
              ") but rank " + std::to_string(none) +
              " has none; restore the missing rank's checkpoint files, or "
              "start fresh with another --checkpoint-dir");
    const int64_t agreed =
        otherWorld ? -1 : all.select(1, 0).min().item<int64_t>();
    if (otherWorld) {
      // resharded above
    } else if (agreed >= 0) {
      const std::string path = checkpointPath(o.checkpointDir, agreed, d.rank);
      const CheckpointExtra saved =
          loadCheckpoint(path, d.worldSize, core, &exchange);
      position = saved.dataPosition;
      checkResumedBatch(saved, path);
      recordOffset = std::max<int64_t>(0, saved.dataRecords);
      lastGood = path;
      if (rank0)
        std::fprintf(stderr, "resumed from %s (step %lld)\n", path.c_str(),
                     static_cast<long long>(agreed));
    } else {
      // No rank of this run has one. This rank's files that failed
      // verification (--resume-fallback skipped them), or other ranks' files
      // (a larger run's rank 1, rank 0's lost), are not nothing to resume:
      // refuse, never train from scratch beside them. The ranks agree (their
      // directories may be node-local).
      const bool ownBad = !listCheckpoints(o.checkpointDir, d.rank).empty();
      const auto any = listCheckpoints(o.checkpointDir, -1);
      if (anyRank(ownBad || !any.empty()))
        stopAll(
            "cannot resume from " + o.checkpointDir + ": " +
            (ownBad ? "every checkpoint of rank " + std::to_string(d.rank) +
                          " there failed verification (skipped above)"
             : !any.empty()
                 ? "it holds " + any.back().second +
                       " but no checkpoint of rank 0 of " +
                       processes(d.worldSize)
                 : std::string("another rank found checkpoints there but "
                               "none of its own")) +
            (ownBad ? "; restore a good one"
                    : "; restore rank 0's files, resume with the processes "
                      "that wrote it") +
            ", or start fresh with another --checkpoint-dir");
      if (!o.predict.empty())
        stopAll("--predict: no checkpoint in " + o.checkpointDir +
                " to predict with; train one there first, or drop "
                "--checkpoint-dir to predict with the initial (or "
                "pretrained) weights");
      if (rank0)
        std::fprintf(stderr, "no checkpoint in %s: starting fresh\n",
                     o.checkpointDir.c_str());
    }
  }
  // --export: the backbone as Hugging Face weights, when training ends.
  auto exportBackbone = [&] {
    if (o.exportDir.empty())
      return;
    // Values a parameter at a time where the optimizer holds them (ZeRO 3's
    // runs, 16-bit weights' masters: put together on the host, every rank
    // taking part), not every block gathered on the device at once.
    ZeroOptimizer *z = core.zero();
    const bool held = z && z->holdsValues();
    std::map<std::string, at::Tensor> values;
    if (held)
      for (const auto &[name, t] : core.model().namedParameters()) {
        at::Tensor v = z->hostValues(t);
        if (rank0)
          values.emplace(name, std::move(v));
      }
    if (!rank0)
      return;
    exportPretrained(core.model(), o.exportDir, mc.weights,
                     held ? &values : nullptr);
    std::fprintf(stderr,
                 "exported the backbone to %s (config.json, "
                 "model.safetensors) and the heads to %s/heads.safetensors\n",
                 o.exportDir.c_str(), o.exportDir.c_str());
  };
  if (predictSet) {
    // The plan's evaluation peak is the prediction's: the same forward.
    const int64_t predicted = asPlanned ? p.predictedEvalPeakBytes : 0;
    ZeroOptimizer *z = core.zero();
    if (z && z->shardsParameters()) {
      // ZeRO 3: a block gathered at a time, as an evaluation — every rank
      // runs the forward (the gathers are collectives), rank 0 writes; an
      // output rank 0 cannot write stops every rank before the forward.
      bool unwritable = false;
      if (rank0) {
        const std::string tmp = o.predictOut + ".tmp";
        unwritable = !std::ofstream(tmp, std::ios::app);
        std::remove(tmp.c_str());
      }
      if (anyRank(unwritable))
        stopAll("--out: cannot write " + o.predictOut + ".tmp");
      if (rank0)
        writePredictions(core.model(), *predictSet, evalBatch, tc.precision,
                         o.predictOut, core.stepsTaken(), predicted);
      else
        evaluate(core.model(), *predictSet, evalBatch, tc.precision,
                 [](const RecordPrediction &) {});
      return 0;
    }
    TrainerCore::WholeParameters predicting(z, /*masters=*/false);
    if (rank0)
      writePredictions(core.model(), *predictSet, evalBatch, tc.precision,
                       o.predictOut, core.stepsTaken(), predicted);
    return 0;
  }
  std::ofstream metrics;
  if (rank0 && !o.metrics.empty()) {
    errno = 0;
    metrics.open(o.metrics, std::ios::app);
    if (!metrics)
      throw std::runtime_error("cannot open --metrics file " + o.metrics +
                               (errno ? std::string(": ") + std::strerror(errno)
                                      : std::string()) +
                               "; name a file in a writable directory");
  }
  // A metrics line that cannot be written (a full disk) is said once; the
  // training, its checkpoints and the progress lines go on.
  bool metricsLost = false;
  auto record = [&](const std::string &line) {
    if (!metrics.is_open())
      return;
    errno = 0;
    metrics << line << '\n' << std::flush;
    if (!metrics && !metricsLost) {
      metricsLost = true;
      std::fprintf(stderr,
                   "warning: writing --metrics %s failed%s: later records are "
                   "lost (training goes on; free space or name another file "
                   "when resuming)\n",
                   o.metrics.c_str(),
                   errno ? (std::string(" (") + std::strerror(errno) + ")").c_str()
                         : "");
    }
  };
  const bool tty = o.progress == "auto" && isatty(STDERR_FILENO);
  EvalReport lastEval;
  // --keep-best: the best value so far (rank 0's), lower-is-better metrics.
  double bestValue = std::nan("");
  const bool lowerBetter = metrics::lowerIsBetter(
      o.keepBest.substr(o.keepBest.find('.') + 1));
  auto runEval = [&](int64_t step) {
    if (!evalSet)
      return;
    double better = 0;
    // The offload's update in flight holds gradients the evaluation's plan
    // does not count: finished first.
    if (core.zero() && core.zero()->offloaded())
      core.zero()->settleParameters();
    // Every rank evaluates (the same parameters, the same file): none waits
    // in a collective, under --timeout, while rank 0 alone works through a
    // large held-out set. Rank 0 reports.
    lastEval = evaluate(core.model(), *evalSet, evalBatch, tc.precision);
    // The plan predicts the evaluation at its own micro batch and processes.
    if (asPlanned)
      lastEval.predictedPeakBytes = p.predictedEvalPeakBytes;
    if (rank0) {
      record(lastEval.jsonLine(step));
      std::fprintf(stderr, "%seval at step %lld (%lld records): %s%s\n",
                   tty ? "\n" : "", static_cast<long long>(step),
                   static_cast<long long>(lastEval.records),
                   lastEval.summary().c_str(), lastEval.peakText().c_str());
      const double v = o.keepBest.empty() ? std::nan("")
                                          : lastEval.value(o.keepBest);
      if (std::isfinite(v) &&
          (!std::isfinite(bestValue) ||
           (lowerBetter ? v < bestValue : v > bestValue))) {
        better = 1;
        bestValue = v;
      }
    }
    if (o.keepBest.empty())
      return;
    if (d.worldSize > 1) { // every rank keeps its part of the best state
      std::vector<at::Tensor> one{
          at::tensor({better}, at::kDouble).to(comm.device())};
      comm.allReduceSum(one);
      better = one[0].cpu().item<double>();
    }
    if (better <= 0)
      return;
    const std::string dir = o.checkpointDir + "/best";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw std::runtime_error("--keep-best: cannot create " + dir + " (" +
                               ec.message() + ")");
    const std::string path =
        saveCheckpoint(dir, d.rank, d.worldSize, core, &exchange,
                       extra(), /*keep=*/1);
    if (!rank0)
      return;
    // best.json beside it, replaced whole.
    Json best = Json::object();
    best["metric"] = o.keepBest;
    best["value"] = bestValue;
    best["step"] = step;
    best["checkpoint"] = path;
    std::ofstream(dir + "/best.json.tmp", std::ios::trunc) << jsonLine(best)
                                                           << '\n';
    std::filesystem::rename(dir + "/best.json.tmp", dir + "/best.json");
    std::fprintf(stderr, "best %s %.4g at step %lld: %s\n", o.keepBest.c_str(),
                 bestValue, static_cast<long long>(step), path.c_str());
  };
  if (core.stepsTaken() >= o.steps) {
    runEval(core.stepsTaken());
    if (rank0)
      std::printf("already at step %lld of %lld: nothing to do\n",
                  static_cast<long long>(core.stepsTaken()),
                  static_cast<long long>(o.steps));
    exportBackbone();
    return 0;
  }

  const bool plain = o.progress == "plain" || (o.progress == "auto" && !tty);
  const int64_t plainEvery = std::max<int64_t>(1, o.steps / 10);

  // What a non-finite stop leaves behind.
  auto kept = [&]() {
    if (o.checkpointDir.empty())
      return std::string("no checkpoint was saved (no --checkpoint-dir)");
    if (lastGood.empty())
      return "no checkpoint of this run was saved yet in " + o.checkpointDir;
    return "the last good checkpoint, " + lastGood + ", is kept";
  };
  // The crash test's hook: pause inside the write of step N's checkpoint.
  const char *pauseAt = std::getenv("MTPRT_TEST_PAUSE_IN_CHECKPOINT");
  auto save = [&]() {
    // Never a non-finite state over the last good one (an update can blow
    // the parameters up while the step's loss and gradients were finite).
    if (const std::string bad = nonFiniteParameter(core); !bad.empty())
      stopAll("step " + std::to_string(core.stepsTaken()) + " of " +
              std::to_string(o.steps) + ": the update left parameter " + bad +
              " (and maybe others) not finite (is the learning rate too "
              "large?); stopping without saving this state; " +
              kept());
    std::function<void()> hook;
    if (pauseAt && std::atoll(pauseAt) == core.stepsTaken())
      hook = [&] {
        std::ofstream(o.checkpointDir + "/paused").put('1');
        for (;;)
          ::pause();
      };
    lastGood =
        saveCheckpoint(o.checkpointDir, d.rank, d.worldSize, core, &exchange,
                       extra(), o.keep, hook);
    return lastGood;
  };

  // --resources: the peak above what initialization left resident
  // (parameters, optimizer state, LibTorch) and the steps' CPU time, measured
  // the way bench/peer.py measures them.
  int64_t rssBase = -1, rssFirstPeak = -1, rssWarmBase = -1;
  if (o.resources && resetResidentPeak())
    rssBase = residentSet().first;
  const double cpuStart = cpuSeconds();
  double cpuFirst = -1;
  const int64_t first = core.stepsTaken();
  const auto start = std::chrono::steady_clock::now();
  RunSummary summary;
  int64_t lastSaved = -1;
  // --threads auto on the CPU: the count whose steps are fastest now.
  if (core.zero() && o.offloadUpdate != "auto")
    core.zero()->setUpdateBeside(o.offloadUpdate == "beside");
  std::optional<ThreadTuner> tuner;
  if (o.threads == 0 && mc.device == "cpu" && at::get_num_threads() > 1)
    tuner.emplace(at::get_num_threads());
  // --profile: from the second step (the first grows the allocator and
  // touches every page) to the end.
  // A pipeline's stages differ: each rank writes its own (PATH.rankN
  // after rank 0's PATH).
  const bool profiling =
      (rank0 || pipeline.active()) && !o.profile.empty();
  const std::string profilePath =
      rank0 ? o.profile : o.profile + ".rank" + std::to_string(d.rank);
  if (profiling) {
    std::ofstream probe(profilePath, std::ios::app);
    if (!probe)
      throw std::runtime_error("cannot write the --profile file " +
                               profilePath +
                               "; give a path in a writable directory");
  }
  bool profilerOn = false;
  // The largest prediction of the steps run (phases and SAPS predict per
  // step), for the summary.
  int64_t runPredicted = -1;
  // train { phases }: the phase of step `step` and the step it ends at
  // (steps past the plan's — a larger --steps — continue the last phase).
  auto phaseAt = [&](int64_t step) -> std::pair<int64_t, int64_t> {
    int64_t end = 0;
    for (size_t i = 0; i < p.phases.size(); ++i) {
      end += p.phases[i].steps;
      if (step < end || i + 1 == p.phases.size())
        return {int64_t(i), i + 1 == p.phases.size() ? INT64_MAX : end};
    }
    return {-1, INT64_MAX};
  };
  // Only the phase's tasks keep their labels.
  auto keepPhaseTasks = [&](Batch &b, int64_t phase) {
    if (phase < 0)
      return;
    const std::vector<int64_t> &keep = p.phases[phase].tasks;
    for (int64_t t = 0; t < int64_t(b.labels.size()); ++t)
      if (std::find(keep.begin(), keep.end(), t) == keep.end())
        b.labels[t] = at::Tensor();
  };
  using torch::profiler::impl::ActivityType;
  const std::set<ActivityType> activities{ActivityType::CPU};
  while (core.stepsTaken() < o.steps) {
    int64_t stepBatch = o.batchSize;
    if (schedule) {
      stepBatch = schedule->batch(position, perStep);
      core.setMicroBatches(stepBatch / perStep);
    }
    const int64_t local = stepBatch / dp;
    Batch global = schedule ? data->records(recordOffset, stepBatch)
                            : data->batch(position, o.batchSize);
    const auto [phase, phaseEnd] = phaseAt(core.stepsTaken());
    keepPhaseTasks(global, phase);
    if (std::none_of(global.labels.begin(), global.labels.end(),
                     [](const at::Tensor &l) { return l.defined(); }))
      stopAll(
          data->describe() + ": the batch of step " +
          std::to_string(core.stepsTaken() + 1) + " (" +
          std::to_string(global.size()) + " records) has labels of no " +
          (phase >= 0 ? "task of phase " + std::to_string(phase + 1)
                      : std::string("task")) +
          ": every step needs some task's labels; mix the labelled records "
          "through the file, or drop the unlabelled ones (checkpoints "
          "saved so far are kept)");
    const Batch mine = global.slice(replica * local, (replica + 1) * local);
    if (!runner)
      trainer.setBatch(mine);
    if (profiling && !profilerOn && core.stepsTaken() > first) {
      const torch::profiler::impl::ProfilerConfig config(
          torch::profiler::impl::ProfilerState::KINETO,
          /*report_input_shapes=*/true, /*profile_memory=*/o.profileMemory);
      torch::autograd::profiler::prepareProfiler(config, activities);
      torch::autograd::profiler::enableProfiler(config, activities);
      profilerOn = true;
    }
    const auto stepStart = std::chrono::steady_clock::now();
    const double busyBefore = Communicator::busySeconds();
    StepStats s = runner   ? runner->step(mine)
                  : p.step ? p.step(trainer)
                           : trainer.step(p.schedule);
    if (runner)
      s.pipelineWaitS = runner->lastWaitSeconds();
    // A probe's step carries its own host update, and starts with none in
    // flight: the offload's update runs beside the next forward only at
    // counts that leave cores free, and a probe there would look one update
    // faster (or slower). The count changes with no update running.
    ZeroOptimizer *offloaded =
        core.zero() && core.zero()->offloaded() ? core.zero() : nullptr;
    if (tuner && tuner->probing() && offloaded)
      offloaded->settleParameters();
    if (d.worldSize > 1)
      s.commS = Communicator::busySeconds() - busyBefore;
    if (tuner) {
      // Steps of other batch sizes compared per record (D15).
      if (tuner->record(std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - stepStart)
                            .count() *
                        double(o.batchSize) / double(stepBatch))) {
        if (offloaded)
          offloaded->settleParameters();
        at::set_num_threads(tuner->threads());
      }
      if (tuner->probing() && offloaded)
        offloaded->settleParameters();
      if (tuner->settledAnew() && rank0 && (tty || plain))
        std::fprintf(stderr, "%s--threads auto: %d intra-op thread%s (%s)\n",
                     tty ? "\n" : "", tuner->threads(),
                     tuner->threads() == 1 ? "" : "s", tuner->why().c_str());
    }
    ++position;
    recordOffset += stepBatch;
    s.batchSize = stepBatch;
    s.phase = phase;
    if (cpuFirst < 0) {
      cpuFirst = cpuSeconds();
      // The warm window: from the end of the first step (every kernel's code
      // paged in, the allocator grown; gradients freed with the update) over
      // the later steps — what a peer measured after a warm-up step shows.
      if (o.resources && rssBase >= 0 && core.stepsTaken() < o.steps) {
        rssFirstPeak = residentSet().second;
        if (resetResidentPeak())
          rssWarmBase = residentSet().first;
      }
    }
    // A pipeline rank holds its stage's tasks only: its summary takes the
    // losses joined below.
    if (!pipeline.active())
      summary.add(s);
    s.bytesSent = sent.bytesSent + s.bytesSentParameters;
    s.bytesSentUncompressed =
        sent.bytesSentUncompressed + s.bytesSentParameters;
    // Under SAPS a step that does not re-rank has its own (lower) peak.
    s.predictedPeakBytes =
        p.predictedSteadyPeakBytes > 0 && p.train.saps &&
                !p.train.saps->rerankAt(s.step)
            ? p.predictedSteadyPeakBytes
            : p.predictedPeakBytes;
    // A phase's steps run its tasks alone: their own prediction.
    if (phase >= 0 && p.phases[phase].predictedPeakBytes > 0 &&
        s.predictedPeakBytes > 0)
      s.predictedPeakBytes = p.phases[phase].predictedPeakBytes;
    // npd(regroup): the plan holds room for every split; the groups as they
    // stand lie between that and the unsplit groups' peak.
    if (const std::optional<AdapterConfig> &ad = core.model().config().adapters;
        ad && ad->regroup && s.predictedPeakBytes > 0) {
      // The room the plan holds for the splits not made, off whichever
      // prediction this step has (a SAPS steady step's too).
      const int64_t planned = phase >= 0 ? p.phases[phase].predictedPeakBytes
                                         : p.predictedPeakBytes;
      const int64_t grouped = phase >= 0 ? p.phases[phase].groupedPeakBytes
                                         : p.groupedPeakBytes;
      const std::vector<int64_t> &plannedOwners = p.model.adapters->owner;
      int64_t possible = 0, made = 0;
      for (size_t h = 0; h < ad->owner.size() && h < plannedOwners.size();
           ++h) {
        possible += plannedOwners[h] != int64_t(h);
        made += plannedOwners[h] != int64_t(h) && ad->owner[h] == int64_t(h);
      }
      if (grouped > 0 && grouped <= planned && possible > 0)
        s.predictedPeakBytes -= (planned - grouped) * (possible - made) /
                                possible;
    }
    // A pipeline rank: its stage's.
    if (pipeline.active())
      s.predictedPeakBytes = pipeline.stages[stage].predictedPeakBytes;
    runPredicted = std::max(runPredicted, s.predictedPeakBytes);
    s.samplesPerS *= dp; // the global batch went through
    // Read the Ctrl-C flag once: a signal landing after the ranks agreed
    // must wait for the next step's agreement, or one rank would stop while
    // the other runs into a collective with a peer that is gone.
    bool stop = interrupted;
    // A non-finite loss (of a task with labels) or gradient norm (where the
    // per-task pipeline computed it; fp16's skipped steps are expected)
    // stops the run: host values the step already has, no extra sync.
    const int64_t nt = static_cast<int64_t>(s.loss.size());
    std::vector<bool> present(nt), lossBad(nt), gradBad(nt);
    for (int64_t t = 0; t < nt; ++t) {
      present[t] = static_cast<int64_t>(s.present.size()) == nt
                       ? bool(s.present[t])
                       : std::isfinite(s.loss[t]);
      lossBad[t] = present[t] && !std::isfinite(s.loss[t]);
      gradBad[t] = !s.skipped && t < static_cast<int64_t>(s.gradNorm.size()) &&
                   !std::isfinite(s.gradNorm[t]);
    }
    const std::vector<double> localLoss = s.loss, localNorm = s.gradNorm;
    if (d.worldSize > 1) {
      // Report the global batch's loss: the mean over the ranks that had
      // each task's labels. One small collective also agrees on Ctrl-C and
      // on a non-finite value on any rank.
      // And every rank's measured peak (ZeRO's runs differ per rank).
      at::Tensor v = at::zeros({4 * nt + 1 + d.worldSize}, at::kDouble);
      v[4 * nt + 1 + d.rank] = double(s.measuredPeakBytes);
      for (int64_t t = 0; t < nt; ++t) {
        if (present[t]) {
          v[t] = lossBad[t] ? 0.0 : s.loss[t];
          v[nt + t] = 1.0;
        }
        v[2 * nt + t] = lossBad[t] ? 1.0 : 0.0;
        v[3 * nt + t] = gradBad[t] ? 1.0 : 0.0;
      }
      v[4 * nt] = stop ? 1.0 : 0.0;
      std::vector<at::Tensor> one{v.to(agree.device())};
      agree.allReduceSum(one);
      v = one[0].cpu();
      s.present.assign(nt, false);
      for (int64_t t = 0; t < nt; ++t) {
        const double n = v[nt + t].item<double>();
        present[t] = s.present[t] = n > 0;
        lossBad[t] = v[2 * nt + t].item<double>() > 0;
        gradBad[t] = v[3 * nt + t].item<double>() > 0;
        s.loss[t] =
            n > 0 && !lossBad[t] ? v[t].item<double>() / n : std::nan("");
      }
      stop = v[4 * nt].item<double>() > 0;
      s.rankPeakBytes.clear();
      for (int r = 0; r < d.worldSize; ++r)
        s.rankPeakBytes.push_back(
            static_cast<int64_t>(v[4 * nt + 1 + r].item<double>()));
      if (pipeline.active()) {
        s.rankPredictedPeakBytes.clear();
        for (int r = 0; r < d.worldSize; ++r)
          s.rankPredictedPeakBytes.push_back(
              pipeline.stages[pipeline.stageOf(r)].predictedPeakBytes);
      }
    }
    if (pipeline.active())
      summary.add(s);
    // "task 'cls': loss nan, gradient norm inf; task 'tag': ..."
    std::string nonFinite;
    for (int64_t t = 0; t < nt; ++t) {
      if (!lossBad[t] && !gradBad[t])
        continue;
      auto value = [&](const std::vector<double> &local) {
        if (t >= static_cast<int64_t>(local.size()) || std::isfinite(local[t]))
          return std::string("not finite on another rank");
        return std::string(std::isnan(local[t]) ? "nan"
                           : local[t] > 0       ? "inf"
                                                : "-inf");
      };
      nonFinite +=
          (nonFinite.empty() ? "task '" : "; task '") + s.tasks[t] + "': ";
      if (lossBad[t])
        nonFinite += "loss " + value(localLoss);
      if (gradBad[t])
        nonFinite += std::string(lossBad[t] ? ", " : "") + "gradient norm " +
                     value(localNorm);
    }
    // docs/techniques.md B8: every rank decides alike (the matrix and ratio are per rank
    // but the gate is too); logged by rank 0.
    if (nonFinite.empty() &&
        needsGateRecalibration(s, tc.recalibrateReuse, tc.recalibrateStd)) {
      core.gate().reset();
      const std::string ev = recalibrationJsonLine(s);
      if (rank0) {
        std::fprintf(stderr, "%s%s\n", tty ? "\n" : "", ev.c_str());
        record(ev);
      }
    }
    const int64_t done = core.stepsTaken();
    if (rank0 && (done % o.logEvery == 0 || done == o.steps))
      record(toJsonLine(s));
    const bool phaseEnds = done == phaseEnd && done < o.steps;
    if ((o.evalEvery > 0 && done % o.evalEvery == 0) || done == o.steps ||
        phaseEnds)
      runEval(done);
    // EWC (D14) at a phase's end: the Fisher on the batches that follow,
    // with the ending phase's tasks' labels (read ahead, not consumed: the
    // next phase trains on them with its own tasks').
    bool protect = phaseEnds && tc.ewc && nonFinite.empty();
    if (protect && tc.ewc->detects()) {
      // The conflict detector: the ending phase's tasks against the next
      // one's, on the next batch with every task's labels.
      const std::vector<int64_t> &ending = p.phases[phase].tasks,
                                 &next = p.phases[phase + 1].tasks;
      std::vector<int64_t> tasks = ending;
      for (int64_t t : next)
        if (std::find(tasks.begin(), tasks.end(), t) == tasks.end())
          tasks.push_back(t);
      Batch b = mineOf(schedule ? data->records(recordOffset, o.batchSize)
                                : data->batch(position, o.batchSize));
      int64_t layer = 0;
      const std::vector<std::vector<double>> cos =
          core.taskSimilarity(b, p.schedule, tasks, &layer);
      double largest = std::numeric_limits<double>::quiet_NaN();
      std::string pair;
      for (size_t i = 0; i < cos.size() && i < ending.size(); ++i)
        for (size_t j = ending.size(); j < cos.size(); ++j)
          if (std::isfinite(cos[i][j]) &&
              !(cos[i][j] <= largest)) { // NaN-safe: the first finite wins
            largest = cos[i][j];
            pair = s.tasks[tasks[i]] + " ~ " + s.tasks[tasks[j]];
          }
      // A task in both phases is its own pair (similarity 1): protected.
      for (int64_t t : next)
        if (std::find(ending.begin(), ending.end(), t) != ending.end())
          largest = 1.0, pair = s.tasks[t] + " (in both)";
      const bool measured = std::isfinite(largest);
      protect = !measured || largest > tc.ewc->threshold;
      std::vector<std::string> names;
      for (int64_t t : tasks)
        names.push_back(s.tasks[t]);
      const std::string ev = conflictJsonLine(done, phase, names, cos, largest,
                                              tc.ewc->threshold, protect);
      if (rank0) {
        record(ev);
        if (tty || plain) {
          if (!measured)
            std::fprintf(stderr, "%sewc: phase %lld's tasks and the next's "
                                 "share no trainable layer to compare "
                                 "gradients on; protected regardless\n",
                         tty ? "\n" : "", static_cast<long long>(phase + 1));
          else
            std::fprintf(stderr,
                         "%sewc: at phase %lld's end the largest gradient "
                         "similarity to the next phase's tasks is %.3f (%s, "
                         "layer %lld) %s the threshold %g: %s\n",
                         tty ? "\n" : "", static_cast<long long>(phase + 1),
                         largest, pair.c_str(), static_cast<long long>(layer),
                         protect ? "above" : "not above", tc.ewc->threshold,
                         protect ? "protected" : "not protected");
        }
      }
    }
    if (protect) {
      for (int64_t j = 0; j < tc.ewc->fisherBatches; ++j) {
        Batch b = mineOf(schedule
                             ? data->records(recordOffset + j * o.batchSize,
                                             o.batchSize)
                             : data->batch(position + j, o.batchSize));
        keepPhaseTasks(b, phase);
        core.addFisherSample(b, p.schedule);
      }
      core.consolidate();
      if (rank0 && (tty || plain))
        std::fprintf(stderr, "%sewc: phase %lld ends at step %lld; the Fisher "
                             "of its tasks on %lld batches protects it from "
                             "here on\n",
                     tty ? "\n" : "", static_cast<long long>(phase + 1),
                     static_cast<long long>(done),
                     static_cast<long long>(tc.ewc->fisherBatches));
    }
    // npd(regroup) (D13/D14): every N steps and at a phase's end, the
    // groups split where their members' gradients on the shared adapter
    // fall below share, on the next batch with every task's labels (read
    // ahead, as the conflict detector's).
    if (const std::optional<AdapterConfig> &ad = core.model().config().adapters;
        ad && ad->regroup && nonFinite.empty() && done < o.steps &&
        (done % ad->regroup == 0 || phaseEnds) &&
        [&] { // a group of two or more is left to measure
          for (size_t h = 0; h < ad->owner.size(); ++h)
            if (ad->owner[h] != int64_t(h))
              return true;
          return false;
        }()) {
      const std::vector<int64_t> before = ad->owner;
      const std::vector<at::Tensor> trained =
          core.model().trainableParameters();
      Batch b = mineOf(schedule ? data->records(recordOffset, o.batchSize)
                                : data->batch(position, o.batchSize));
      const std::vector<std::vector<double>> cos =
          core.regroupAdapters(b, p.schedule);
      // The compressed exchange's residual follows the parameters.
      exchange.carryResidual(trained, core.model().trainableParameters());
      const std::vector<int64_t> &after = core.model().config().adapters->owner;
      const std::string ev =
          regroupJsonLine(done, s.tasks, cos, *ad->share, before, after);
      if (rank0) {
        record(ev);
        if ((tty || plain) && before != after) {
          std::string line;
          for (size_t h = 0; h < after.size(); ++h)
            if (after[h] == int64_t(h) && before[h] != int64_t(h)) {
              // The new group: h and whoever now reads its copy.
              std::string members;
              double closest = -2;
              for (size_t k = 0; k < after.size(); ++k) {
                if (after[k] != int64_t(h))
                  continue;
                members += (members.empty() ? "" : ", ") + s.tasks[k];
                for (size_t j = 0; j < after.size(); ++j)
                  if (after[j] != int64_t(h) && before[j] == before[h] &&
                      std::isfinite(cos[k][j]))
                    closest = std::max(closest, cos[k][j]);
              }
              char buf[64];
              std::snprintf(buf, sizeof buf, "%.3f", closest);
              line += (line.empty() ? "" : "; ") + members + " leave" +
                      (members.find(',') == std::string::npos ? "s" : "") +
                      " task '" + s.tasks[size_t(before[h])] +
                      "''s adapter with a copy (the largest gradient cosine "
                      "to the rest of that group " + buf + ")";
            }
          std::fprintf(stderr,
                       "%sadapters: at step %lld the groups split below "
                       "share %g: %s\n",
                       tty ? "\n" : "", static_cast<long long>(done),
                       *ad->share, line.c_str());
        }
      }
    }
    if (rank0 && (tty || plain) &&
        (tty || done % plainEvery == 0 || done == o.steps)) {
      const double el = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - start)
                            .count();
      const double eta = el / double(done - first) * double(o.steps - done);
      std::ostringstream line;
      line << "step " << done << "/" << o.steps << "  loss";
      for (size_t t = 0; t < s.tasks.size(); ++t) {
        char buf[64];
        if (std::isfinite(s.loss[t]))
          std::snprintf(buf, sizeof buf, " %s=%.4f", s.tasks[t].c_str(),
                        s.loss[t]);
        else // no labels for the task in this batch
          std::snprintf(buf, sizeof buf, " %s=-", s.tasks[t].c_str());
        line << buf;
      }
      char buf[96];
      std::snprintf(buf, sizeof buf, "  %.0f samples/s  peak %s  ETA %s",
                    s.samplesPerS, human(double(s.measuredPeakBytes)).c_str(),
                    duration(eta).c_str());
      line << buf;
      if (tty)
        std::fprintf(stderr, "\r\033[K%s", line.str().c_str());
      else
        std::fprintf(stderr, "%s\n", line.str().c_str());
    }
    if (!nonFinite.empty())
      stopAll("step " + std::to_string(done) + " of " +
              std::to_string(o.steps) + " (metrics \"step\": " +
              std::to_string(s.step) + ") is not finite: " + nonFinite +
              "; stopping without saving this state; " + kept());
    if (!o.checkpointDir.empty() &&
        ((o.checkpointEvery > 0 && done % o.checkpointEvery == 0) || stop)) {
      save();
      lastSaved = done;
    }
    if (stop) {
      if (ZeroOptimizer *zero = core.zero())
        zero->settleParameters();
      if (rank0)
        std::fprintf(stderr, "%sinterrupted at step %lld%s\n", tty ? "\n" : "",
                     static_cast<long long>(done),
                     o.checkpointDir.empty()
                         ? " (no --checkpoint-dir: nothing saved)"
                         : "; checkpoint saved");
      return 130;
    }
  }
  if (tty && rank0)
    std::fprintf(stderr, "\n");
  // ZeRO 1–2: the last update's values arrive before anything is written
  // (a failed broadcast is this run's error, not the exit's).
  if (ZeroOptimizer *zero = core.zero())
    zero->settleParameters();
  if (profilerOn) {
    torch::autograd::profiler::disableProfiler()->save(profilePath);
    std::fprintf(stderr, "profile of steps %lld..%lld: %s\n",
                 static_cast<long long>(first + 2),
                 static_cast<long long>(core.stepsTaken()), profilePath.c_str());
  } else if (profiling) {
    std::fprintf(stderr, "--profile: fewer than two steps ran; %s not "
                 "written\n", profilePath.c_str());
  }
  if (!o.checkpointDir.empty() && lastSaved != core.stepsTaken()) {
    const std::string path = save();
    if (rank0)
      std::fprintf(stderr, "saved %s\n", path.c_str());
  }
  exportBackbone();
  if (rank0) {
    std::printf("done: step %lld of %lld\n",
                static_cast<long long>(core.stepsTaken()),
                static_cast<long long>(o.steps));
    const double el =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    std::printf("%s\n", summary.paragraph(p.name, el, o.batchSize,
                                          p.batchSize,
                                          runPredicted > 0 ? runPredicted
                                                           : p.predictedPeakBytes,
                                          d.worldSize, p.plannedProcesses)
                            .c_str());
    if (!lastEval.tasks.empty())
      std::printf("eval on %s (%lld records): %s%s\n", o.evalData.c_str(),
                  static_cast<long long>(lastEval.records),
                  lastEval.summary().c_str(), lastEval.peakText().c_str());
  }
  if (o.resources && rank0) {
    const double cpuEnd = cpuSeconds();
    const auto [rss, hwmNow] = residentSet();
    const int64_t hwm = std::max(hwmNow, rssFirstPeak);
    if (rssBase < 0 || hwm < 0)
      std::printf("rss: unavailable (no /proc/self/clear_refs)\n");
    else
      std::printf("rss: post-init %lld B, peak %lld B, peak above post-init "
                  "%lld B, now %lld B\n",
                  static_cast<long long>(rssBase), static_cast<long long>(hwm),
                  static_cast<long long>(hwm - rssBase),
                  static_cast<long long>(rss));
    if (rssWarmBase >= 0 && hwmNow >= 0)
      std::printf("rss-warm: after the first step %lld B, later peak %lld B, "
                  "above it %lld B\n",
                  static_cast<long long>(rssWarmBase),
                  static_cast<long long>(hwmNow),
                  static_cast<long long>(hwmNow - rssWarmBase));
    const int64_t later = core.stepsTaken() - first - 1;
    std::printf("cpu: first step %.6f s, %lld later steps %.6f s\n",
                cpuFirst - cpuStart, static_cast<long long>(later),
                cpuEnd - cpuFirst);
  }
  return 0;
}

} // namespace

int runDriver(int argc, char **argv, const Program &program) {
  const std::string name = argc > 0 ? argv[0] : program.name;
  Options o;
  try {
    if (!parse(argc, argv, program, o)) {
      printHelp(name);
      return 0;
    }
  } catch (const UsageError &e) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", name.c_str(),
                 e.what());
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = onInterrupt;
  sa.sa_flags = SA_RESTART; // the collectives' blocking calls carry on
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  try {
    if (!o.writeShard.empty()) {
      writeShard(o.data, o.writeShard, program.model, program.heads);
      std::printf("wrote %s\n", o.writeShard.c_str());
      return 0;
    }
    const bool launcher = o.nproc > 1 && !std::getenv("MTPRT_STORE_SERVED");
    return launcher ? launch(name, argc, argv, program, o)
                    : train(name, program, o);
  } catch (const QuietExit &q) {
    return q.code;
  } catch (const UsageError &e) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", name.c_str(),
                 e.what());
    return 2;
  } catch (const std::bad_alloc &) {
    std::fprintf(stderr,
                 "%s: error: out of memory; lower --batch-size, or re-plan "
                 "the spec for this machine's memory\n",
                 name.c_str());
    return 1;
  } catch (const c10::Error &e) {
    // LibTorch's message, without the C++ backtrace it carries.
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(),
                 e.what_without_backtrace());
    return 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
    return 1;
  }
}

} // namespace mtprt
