//===- Checkpoint.cpp - training state on disk, crash-safe ----------------===//

#include "mtprt/torch/Checkpoint.h"
#include "mtprt/torch/Ewc.h"
#include "mtprt/torch/Saps.h"
#include "mtprt/torch/Zero.h"

#include "mtprt/Crc32.h"

#include "mtprt/torch/Distributed.h"
#include "mtprt/torch/Optimizer.h"
#include "mtprt/torch/Trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/archive.h>

#ifdef MTPRT_TORCH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace mtprt {

namespace {

[[noreturn]] void fail(const std::string &path, const std::string &what) {
  throw CheckpointError("mtprt: checkpoint " + path + ": " + what);
}

/// A list of tensors as the archive `key` (entries "0", "1", ...): the
/// sparse update's and EWC's state.
void writeTensors(torch::serialize::OutputArchive &ar, const std::string &key,
                  const std::vector<at::Tensor> &tensors) {
  torch::serialize::OutputArchive list;
  for (size_t i = 0; i < tensors.size(); ++i)
    list.write(std::to_string(i), tensors[i]);
  ar.write(key, list);
}

/// What writeTensors wrote under `key`; nullopt where the checkpoint has no
/// such archive.
std::optional<std::vector<at::Tensor>>
readTensors(torch::serialize::InputArchive &ar, const std::string &path,
            const std::string &key) {
  torch::serialize::InputArchive list;
  if (!ar.try_read(key, list))
    return std::nullopt;
  std::vector<at::Tensor> tensors(list.keys().size());
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!list.try_read(std::to_string(i), tensors[i]))
      fail(path, "its " + key + " state lacks tensor " + std::to_string(i));
  return tensors;
}

/// LibTorch's message without the C++ backtrace c10 appends to it.
std::string torchMessage(const std::exception &e) {
  if (const auto *c = dynamic_cast<const c10::Error *>(&e))
    return c->what_without_backtrace();
  return e.what();
}

void writeAll(int fd, const char *p, size_t n, const std::string &path) {
  while (n) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      fail(path, std::string("write failed: ") + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

/// Reads and checks the file (mtprt/CheckpointFormat.h); returns the
/// header and the payload.
std::pair<CheckpointHeader, std::string> readVerified(const std::string &path) {
  std::string payload;
  CheckpointHeader h = readCheckpointFile(path, &payload);
  return {h, std::move(payload)};
}

at::Generator cpuGenerator() { return at::detail::getDefaultCPUGenerator(); }

torch::serialize::InputArchive openArchive(const std::string &path,
                                           const std::string &payload) {
  torch::serialize::InputArchive ar;
  try {
    ar.load_from(payload.data(), payload.size());
  } catch (const std::exception &e) {
    fail(path, "its checksum matches but LibTorch cannot read the archive "
               "(written by another LibTorch?): " +
                   torchMessage(e));
  }
  return ar;
}

/// AdamW's state whole: every parameter's step count and the two moments
/// laid end to end in the optimizer's group order (the order ZeRO's layout
/// cuts into runs: mtprt/Zero.h).
struct WholeAdamW {
  std::vector<int64_t> steps;
  at::Tensor avg, sq;
};

std::vector<at::Tensor> optimizerParams(torch::optim::AdamW &opt) {
  std::vector<at::Tensor> ps;
  for (const auto &group : opt.param_groups())
    for (const at::Tensor &p : group.params())
      ps.push_back(p);
  return ps;
}

WholeAdamW wholeFromOptimizer(torch::optim::AdamW &opt) {
  WholeAdamW w;
  std::vector<at::Tensor> avg, sq;
  for (const at::Tensor &p : optimizerParams(opt)) {
    torch::optim::AdamWParamState &st = adamwState(opt, p);
    w.steps.push_back(st.step());
    avg.push_back(st.exp_avg().detach().reshape({-1}).to(at::kFloat).cpu());
    sq.push_back(st.exp_avg_sq().detach().reshape({-1}).to(at::kFloat).cpu());
  }
  w.avg = avg.empty() ? at::zeros({0}) : at::cat(avg);
  w.sq = sq.empty() ? at::zeros({0}) : at::cat(sq);
  return w;
}

void wholeToOptimizer(const WholeAdamW &w, torch::optim::AdamW &opt,
                      const std::string &path) {
  const std::vector<at::Tensor> ps = optimizerParams(opt);
  int64_t total = 0;
  for (const at::Tensor &p : ps)
    total += p.numel();
  if (w.steps.size() != ps.size() || w.avg.numel() != total)
    fail(path, "its optimizer state has " + std::to_string(w.steps.size()) +
                   " parameters and " + std::to_string(w.avg.numel()) +
                   " values, the model " + std::to_string(ps.size()) +
                   " and " + std::to_string(total));
  int64_t off = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const at::Tensor &p = ps[i];
    torch::optim::AdamWParamState &st = adamwState(opt, p);
    st.step(w.steps[i]);
    st.exp_avg(w.avg.narrow(0, off, p.numel()).view(p.sizes()).to(
        p.options().requires_grad(false)).clone());
    st.exp_avg_sq(w.sq.narrow(0, off, p.numel()).view(p.sizes()).to(
        p.options().requires_grad(false)).clone());
    off += p.numel();
  }
}

/// ZeRO's state of every rank its layout names, put together: the runs
/// end to end. `own` is the state already read from files[self].
WholeAdamW wholeFromShards(const std::vector<std::string> &files, size_t self,
                           const std::vector<at::Tensor> &own) {
  auto layoutOf = [](const std::vector<at::Tensor> &z,
                     const std::string &path) {
    if (z.size() != 4 || z[0].numel() != 4 || z[0].scalar_type() != at::kLong)
      fail(path, "its ZeRO state is malformed");
    return z[0].cpu();
  };
  const at::Tensor layout = layoutOf(own, files[self]);
  const int64_t world = layout[1].item<int64_t>(),
                total = layout[2].item<int64_t>(),
                shard = layout[3].item<int64_t>();
  if (world < 1 || size_t(world) > files.size() || total < 0 || shard < 0 ||
      shard * world < total)
    fail(files[self], "its ZeRO layout (" + std::to_string(world) +
                          " rank(s), " + std::to_string(total) +
                          " values, runs of " + std::to_string(shard) +
                          ") does not describe this run's checkpoint files");
  WholeAdamW w;
  std::vector<at::Tensor> avg, sq;
  for (int64_t q = 0; q < world; ++q) {
    std::vector<at::Tensor> z = own;
    if (size_t(q) != self) {
      auto [h, payload] = readVerified(files[q]);
      torch::serialize::InputArchive ar = openArchive(files[q], payload);
      std::optional<std::vector<at::Tensor>> read =
          readTensors(ar, files[q], "zero");
      if (!read)
        fail(files[q], "holds no ZeRO state, while " + files[self] + " does");
      z = std::move(*read);
    }
    if (!at::equal(layoutOf(z, files[q]), layout))
      fail(files[q], "its ZeRO layout differs from " + files[self] +
                         "'s: are they checkpoints of one run?");
    if (z[2].numel() != shard || z[3].numel() != shard)
      fail(files[q], "its ZeRO runs are not " + std::to_string(shard) +
                         " values long");
    const at::Tensor steps = z[1].to(at::kLong).cpu().contiguous();
    if (q == 0)
      w.steps.assign(steps.data_ptr<int64_t>(),
                     steps.data_ptr<int64_t>() + steps.numel());
    else if (int64_t(w.steps.size()) != steps.numel() ||
             !std::equal(w.steps.begin(), w.steps.end(),
                         steps.data_ptr<int64_t>()))
      fail(files[q], "its step counts differ from rank 0's");
    avg.push_back(z[2].reshape({-1}).to(at::kFloat).cpu());
    sq.push_back(z[3].reshape({-1}).to(at::kFloat).cpu());
  }
  w.avg = at::cat(avg).narrow(0, 0, total);
  w.sq = at::cat(sq).narrow(0, 0, total);
  return w;
}

} // namespace

std::string checkpointPath(const std::string &dir, int64_t step, int rank) {
  char name[64];
  std::snprintf(name, sizeof name, "step-%09lld.rank%d.ckpt",
                static_cast<long long>(step), rank);
  return dir + "/" + name;
}

std::vector<std::pair<int64_t, std::string>>
listCheckpoints(const std::string &dir, int rank) {
  std::vector<std::pair<int64_t, std::string>> out;
  DIR *d = opendir(dir.c_str());
  if (!d)
    return out;
  const std::string suffix = ".rank" + std::to_string(rank) + ".ckpt";
  while (dirent *e = readdir(d)) {
    const std::string name = e->d_name;
    long long step;
    int r, end = 0;
    const bool named =
        rank >= 0
            ? name.size() > suffix.size() &&
                  name.compare(name.size() - suffix.size(), suffix.size(),
                               suffix) == 0
            : std::sscanf(name.c_str(), "step-%*lld.rank%d.ckpt%n", &r,
                          &end) == 1 &&
                  size_t(end) == name.size();
    if (name.rfind("step-", 0) == 0 && named &&
        std::sscanf(name.c_str(), "step-%lld.", &step) == 1)
      out.emplace_back(step, dir + "/" + name);
  }
  closedir(d);
  std::sort(out.begin(), out.end(),
            [](auto &a, auto &b) { return a.first > b.first; });
  return out;
}

std::string saveCheckpoint(const std::string &dir, int rank, int world,
                           TrainerCore &core, GradExchange *exchange,
                           const CheckpointExtra &extra, int64_t keep,
                           const std::function<void()> &duringWrite) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    fail(dir,
         std::string("cannot create the directory: ") + std::strerror(errno));
  torch::serialize::OutputArchive ar;
  {
    torch::serialize::OutputArchive model;
    // ZeRO 3: each parameter put together from the runs, one at a time;
    // 16-bit weights: their fp32 masters.
    ZeroOptimizer *zero = core.zero();
    const bool sharded = zero && zero->holdsValues();
    for (const auto &[name, p] : core.model().namedParameters())
      model.write(name, sharded ? zero->hostValues(p) : p);
    ar.write("model", model);
  }
  // Which head's adapter each head reads (npd(share)), checked at resume.
  if (const auto &ad = core.model().config().adapters) {
    std::vector<int64_t> owners;
    for (int64_t h = 0; h < core.model().numHeads(); ++h)
      owners.push_back(ad->ownerOf(h));
    ar.write("adapter_owners", at::tensor(owners, at::kLong));
  }
  {
    torch::serialize::OutputArchive opt;
    core.optimizer().save(opt);
    ar.write("optimizer", opt);
  }
  if (const SparseUpdate *saps = core.sparseUpdate())
    writeTensors(ar, "saps", saps->state());
  if (const ElasticConsolidation *ewc = core.consolidation())
    writeTensors(ar, "ewc", ewc->state());
  if (ZeroOptimizer *zero = core.zero())
    writeTensors(ar, "zero", zero->state());
  {
    torch::serialize::OutputArchive gate;
    core.gate().save(gate);
    ar.write("gate", gate);
  }
  if (exchange && exchange->residual().defined())
    ar.write("gsc_residual", exchange->residual());
  ar.write("rng_cpu", cpuGenerator().get_state());
#ifdef MTPRT_TORCH_CUDA
  if (core.model().device().is_cuda())
    ar.write("rng_cuda", at::cuda::detail::getDefaultCUDAGenerator(
                             core.model().device().index() < 0
                                 ? 0
                                 : core.model().device().index())
                             .get_state());
#endif
  ar.write("step", c10::IValue(core.stepsTaken()));
  ar.write("loss_scale", c10::IValue(core.lossScale()));
  ar.write("good_steps", c10::IValue(core.goodSteps()));
  ar.write("data_position", c10::IValue(extra.dataPosition));
  ar.write("data_records", c10::IValue(extra.dataRecords));
  ar.write("batch_size", c10::IValue(extra.batchSize));
  ar.write("world", c10::IValue(int64_t(world)));
  {
    const auto &cos = core.lastCosines();
    const int64_t t = static_cast<int64_t>(cos.size());
    at::Tensor c = at::zeros({t, t}, at::kDouble);
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j)
        c[i][j] = cos[i][j];
    ar.write("last_cosines", c);
  }
  std::ostringstream payloadStream;
  ar.save_to(payloadStream);
  const std::string payload = payloadStream.str();

  const std::string header =
      checkpointHeaderText(core.stepsTaken(), rank, world, payload.size(),
                           crc32(payload.data(), payload.size()));
  const std::string path = checkpointPath(dir, core.stepsTaken(), rank);
  const std::string tmp = dir + "/.tmp-" + path.substr(dir.size() + 1) + "." +
                          std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    fail(tmp, std::string("cannot be created: ") + std::strerror(errno));
  try {
    writeAll(fd, header.data(), header.size(), tmp);
    const size_t half = payload.size() / 2;
    writeAll(fd, payload.data(), half, tmp);
    if (duringWrite)
      duringWrite();
    writeAll(fd, payload.data() + half, payload.size() - half, tmp);
    if (::fsync(fd) != 0)
      fail(tmp, std::string("fsync failed: ") + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    fail(path, std::string("rename failed: ") + std::strerror(errno));
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); dfd >= 0) {
    ::fsync(dfd); // the rename itself is durable
    ::close(dfd);
  }
  // Keep the newest `keep`; remove temporaries a killed writer left behind.
  auto all = listCheckpoints(dir, rank);
  for (size_t i = keep > 0 ? static_cast<size_t>(keep) : all.size();
       i < all.size(); ++i)
    ::unlink(all[i].second.c_str());
  if (DIR *d = opendir(dir.c_str())) {
    const std::string mine = ".rank" + std::to_string(rank) + ".ckpt.";
    while (dirent *e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind(".tmp-step-", 0) == 0 &&
          name.find(mine) != std::string::npos)
        ::unlink((dir + "/" + name).c_str());
    }
    closedir(d);
  }
  return path;
}

CheckpointHeader verifyCheckpoint(const std::string &path) {
  return readCheckpointFile(path);
}

namespace {
/// Restores the checkpoint at `path` into `core`. Every rank's file of the
/// run that wrote it, at its step, is read only where AdamW's state must be
/// put together (the plan lays it out otherwise than that run). `resharded`:
/// that run had another world size than this one's (the per-rank GSC
/// residual is dropped); else its world size must be `world`.
CheckpointExtra restore(const std::string &path, bool resharded, int world,
                        TrainerCore &core, GradExchange *exchange) {
  auto [header, payload] = readVerified(path);
  if (!resharded && header.world != world)
    fail(path, "written by a run of world size " +
                   std::to_string(header.world) + ", this run has " +
                   std::to_string(world));
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  std::vector<std::string> files;
  for (int64_t q = 0; q < header.world; ++q)
    files.push_back(q == header.rank ? path
                                     : checkpointPath(dir, header.step, int(q)));
  const size_t self = size_t(header.rank);
  torch::serialize::InputArchive ar = openArchive(path, payload);
  CheckpointExtra extra;
  try {
    at::NoGradGuard noGrad;
    torch::serialize::InputArchive model;
    ar.read("model", model);
    {
      // Adapters (D13) either way: not LibTorch's "no such tensor", and not
      // a silent resume that drops what the adapters learned.
      const std::string probe =
          "head." + core.model().heads().at(0).name + ".adapter.down.weight";
      at::Tensor v;
      const bool saved = model.try_read(probe, v);
      const bool planned = core.model().config().adapters.has_value();
      if (planned && !saved)
        fail(path, "it was trained without adapters and the plan has them "
                   "(strategy { adapters }): resume it with the plan it was "
                   "trained with, or start afresh");
      if (!planned && saved)
        fail(path, "it was trained with adapters (strategy { adapters }) and "
                   "the plan has none: resume it with the plan it was trained "
                   "with");
      // Shared the same way (npd(share)): every head reads the adapter of
      // the same head (checkpoints from before groups: each its own).
      if (planned && saved) {
        const AdapterConfig &ad = *core.model().config().adapters;
        const auto &heads = core.model().heads();
        at::Tensor was;
        const bool recorded = ar.try_read("adapter_owners", was);
        if (recorded && (was.dim() != 1 || was.scalar_type() != at::kLong ||
                         was.numel() != int64_t(heads.size())))
          fail(path, "its adapter_owners is not one index per head; resume "
                     "it with the plan it was trained with");
        // npd(regroup): the run split its groups; this plan starts from the
        // groups it split, so the same split is made here first (its copies
        // are then read by name, their AdamW state by position below).
        if (recorded && ad.regroup) {
          std::vector<int64_t> then(was.data_ptr<int64_t>(),
                                    was.data_ptr<int64_t>() + was.numel());
          // Not a split of this plan's groups: the located error below.
          if (ad.splitProblem(then, heads.size()).empty() && then != ad.owner)
            core.splitAdapters(then);
        }
        for (int64_t h = 0; h < int64_t(heads.size()); ++h) {
          const int64_t now = ad.ownerOf(h);
          // Unrecorded (written before the owners were): whether the head
          // held an adapter there is all it says.
          at::Tensor held;
          const bool own =
              model.try_read("head." + heads[size_t(h)].name +
                                 ".adapter.down.weight",
                             held);
          const int64_t then = recorded ? was[h].item<int64_t>()
                               : own    ? h
                                        : -1;
          if (then == now || (!recorded && !own && now != h))
            continue;
          auto reads = [&](int64_t o) {
            return o == h ? std::string("its own adapter")
                   : o >= 0 && o < int64_t(heads.size())
                       ? "task '" + heads[size_t(o)].name + "''s adapter"
                   : o == -1 ? std::string("another task's adapter")
                             : "adapter " + std::to_string(o);
          };
          fail(path, "task '" + heads[size_t(h)].name + "' read " +
                         reads(then) + " there and reads " + reads(now) +
                         " in the plan (strategy { adapters = npd(share) }): "
                         "resume it with the plan it was trained with");
        }
      }
    }
    // The same parameters by name first: a task added, removed or renamed
    // is said so, not as LibTorch's "no such serialized tensor".
    {
      const auto named = core.model().namedParameters();
      std::set<std::string> planned, saved;
      for (const auto &[name, p] : named)
        planned.insert(name);
      for (const std::string &k : model.keys())
        saved.insert(k);
      for (const std::string &k : saved)
        if (!planned.count(k))
          fail(path, "it holds parameter " + k + ", which this plan's model "
                     "does not have (a task removed or renamed, another "
                     "backbone?): resume it with the plan it was trained "
                     "with, or start afresh with another --checkpoint-dir");
      for (const std::string &k : planned)
        if (!saved.count(k))
          fail(path, "it lacks parameter " + k + " of this plan's model (a "
                     "task added or renamed?): resume it with the plan it "
                     "was trained with, or start afresh with another "
                     "--checkpoint-dir");
    }
    for (auto &[name, p] : core.model().namedParameters()) {
      at::Tensor v;
      model.read(name, v);
      if (!v.sizes().equals(p.sizes()))
        fail(path, "parameter " + name + " has shape " + c10::str(v.sizes()) +
                       ", the model " + c10::str(p.sizes()) +
                       " (another number of classes, labels or another "
                       "size): resume it with the plan it was trained with");
      // ZeRO 3: a sharded parameter's run of this rank; 16-bit weights:
      // the master's too.
      if (ZeroOptimizer *zero = core.zero(); zero && zero->holdsValues())
        zero->setValues(p, v);
      else
        p.copy_(v);
    }
    // SAPS's and EWC's state before the optimizer's: a checkpoint of the
    // other kind gets these messages, not LibTorch's about group sizes. The
    // loaders check counts, shapes and values before changing anything.
    auto restore = [&](auto *state, const std::string &key,
                       const char *notTrainedWith, const char *planHasNone) {
      std::optional<std::vector<at::Tensor>> saved =
          readTensors(ar, path, key);
      if (state && !saved)
        fail(path, notTrainedWith);
      if (!state && saved)
        fail(path, planHasNone);
      if (!state)
        return;
      try {
        state->loadState(*saved);
      } catch (const std::runtime_error &e) {
        fail(path, e.what());
      }
    };
    restore(core.sparseUpdate(), "saps",
            "it was trained with dense updates and the plan updates the "
            "backbone sparsely (strategy { saps }): resume it with the plan it "
            "was trained with, or start afresh",
            "it was trained with sparse updates (strategy { saps }) and the "
            "plan updates densely: resume it with the plan it was trained with");
    restore(core.consolidation(), "ewc",
            "it was trained without ewc and the plan protects earlier phases "
            "(strategy { ewc }): resume it with the plan it was trained with",
            "it was trained with ewc (strategy { ewc }) and the plan has none: "
            "resume it with the plan it was trained with");
    // AdamW's state: as written where the layouts agree (bit for bit),
    // else whole, then laid out as this run keeps it (docs/zero.md).
    {
      std::optional<std::vector<at::Tensor>> zs = readTensors(ar, path, "zero");
      ZeroOptimizer *zero = core.zero();
      auto sameLayout = [&] {
        if (!zs || !zero || zs->empty() || (*zs)[0].numel() != 4)
          return false;
        const at::Tensor l = (*zs)[0].to(at::kLong).cpu();
        return l[1].item<int64_t>() == zero->worldSize() &&
               l[2].item<int64_t>() == zero->totalValues() &&
               l[3].item<int64_t>() == zero->shardValues();
      };
      torch::serialize::InputArchive opt;
      ar.read("optimizer", opt);
      // LibTorch's refusal of other groups, with what to do (its own words
      // kept: another cause reads as itself).
      auto loadOptimizer = [&] {
        try {
          core.optimizer().load(opt);
        } catch (const c10::Error &e) {
          fail(path, "its optimizer state does not fit this plan's (" +
                         std::string(e.what_without_backtrace()) +
                         "): when the parameter groups differ, what trains "
                         "differs (freeze, or a task's learning-rate group); "
                         "resume it with the plan it was trained with");
        }
      };
      if (!zs && !zero) {
        loadOptimizer();
      } else if (sameLayout()) {
        try {
          zero->loadState(*zs);
        } catch (const std::runtime_error &e) {
          fail(path, e.what());
        }
        loadOptimizer();
      } else {
        loadOptimizer(); // the groups' options
        WholeAdamW whole = zs ? wholeFromShards(files, self, *zs)
                              : wholeFromOptimizer(core.optimizer());
        if (zero) {
          core.optimizer().state().clear();
          try {
            zero->loadWhole(whole.steps, whole.avg, whole.sq);
          } catch (const std::runtime_error &e) {
            fail(path, e.what());
          }
        } else {
          wholeToOptimizer(whole, core.optimizer(), path);
        }
      }
    }
    torch::serialize::InputArchive gate;
    ar.read("gate", gate);
    core.gate().load(gate);
    // The error feedback is one rank's of one world size: resharded, it
    // restarts from zero.
    if (exchange) {
      at::Tensor r;
      if (!resharded && ar.try_read("gsc_residual", r))
        exchange->residual() = r.to(core.model().device());
      else
        exchange->residual() = at::Tensor();
    }
    at::Tensor rng;
    ar.read("rng_cpu", rng);
    at::Generator cpu = cpuGenerator();
    cpu.set_state(rng);
#ifdef MTPRT_TORCH_CUDA
    if (core.model().device().is_cuda()) {
      at::Tensor cr;
      if (ar.try_read("rng_cuda", cr)) {
        at::Generator g = at::cuda::detail::getDefaultCUDAGenerator(
            core.model().device().index() < 0 ? 0
                                              : core.model().device().index());
        g.set_state(cr);
      }
    }
#endif
    c10::IValue step, scale, good, pos;
    ar.read("step", step);
    ar.read("loss_scale", scale);
    ar.read("good_steps", good);
    ar.read("data_position", pos);
    core.restoreCounters(step.toInt(), scale.toDouble(), good.toInt());
    extra.dataPosition = pos.toInt();
    // Absent in checkpoints written before the dynamic batch: fixed.
    if (c10::IValue records; ar.try_read("data_records", records)) {
      if (!records.isInt() || records.toInt() < -1)
        fail(path, "data_records is not a record count");
      extra.dataRecords = records.toInt();
    }
    // Absent before resharding: unknown (-1).
    if (c10::IValue batch; ar.try_read("batch_size", batch)) {
      if (!batch.isInt() || batch.toInt() < -1)
        fail(path, "batch_size is not a batch size");
      extra.batchSize = batch.toInt();
    }
    at::Tensor c;
    ar.read("last_cosines", c);
    auto &cos = core.lastCosines();
    cos.assign(c.size(0), std::vector<double>(c.size(0)));
    for (int64_t i = 0; i < c.size(0); ++i)
      for (int64_t j = 0; j < c.size(0); ++j)
        cos[i][j] = c[i][j].item<double>();
  } catch (const CheckpointError &) {
    throw;
  } catch (const std::exception &e) {
    fail(path, "does not fit this program: " + torchMessage(e));
  }
  return extra;
}
} // namespace

CheckpointExtra loadCheckpoint(const std::string &path, int world,
                               TrainerCore &core, GradExchange *exchange) {
  return restore(path, /*resharded=*/false, world, core, exchange);
}

CheckpointExtra loadResharded(const std::string &dir, int64_t step,
                              int64_t writtenWorld, int rank,
                              TrainerCore &core, GradExchange *exchange) {
  // (The caller checked every file's header: this one names writtenWorld.)
  return restore(checkpointPath(dir, step, int(rank % writtenWorld)),
                 /*resharded=*/true, -1, core, exchange);
}

std::vector<std::pair<std::string, at::Tensor>>
checkpointParameters(const std::string &path) {
  auto [header, payload] = readVerified(path);
  std::vector<std::pair<std::string, at::Tensor>> out;
  try {
    torch::serialize::InputArchive ar;
    ar.load_from(payload.data(), payload.size());
    torch::serialize::InputArchive model;
    ar.read("model", model);
    for (const std::string &k : model.keys()) {
      at::Tensor t;
      model.read(k, t);
      out.emplace_back(k, t);
    }
  } catch (const std::exception &e) {
    fail(path, "unreadable archive: " + torchMessage(e));
  }
  return out;
}

} // namespace mtprt
