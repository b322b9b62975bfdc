//===- UnitProfile.cpp - the step's segments timed on the device ----------===//

#include "mtprt/torch/UnitProfile.h"

#include "Precision.h"
#include "mtprt/torch/Optimizer.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adamw.h>

#ifdef MTPRT_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <vector>

namespace mtprt {

namespace {

/// The fastest of `reps` runs of `timed` (each after `setup`, not timed;
/// one untimed warm-up first; the device synchronized around each): other
/// work on the machine only ever adds time, so the minimum is the segment's.
/// With `median`, the median: what a step of a training run takes.
double fastestSeconds(const at::Device &device, int reps,
                     const std::function<void()> &setup,
                     const std::function<void()> &timed, bool median = false) {
  auto sync = [&] {
#ifdef MTPRT_TORCH_CUDA
    if (device.is_cuda())
      c10::cuda::device_synchronize();
#endif
  };
  std::vector<double> times;
  for (int i = 0; i <= reps; ++i) {
    setup();
    sync();
    const auto start = std::chrono::steady_clock::now();
    timed();
    sync();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (i > 0)
      times.push_back(s);
  }
  std::sort(times.begin(), times.end());
  return median ? times[times.size() / 2] : times.front();
}

void dropGrads(const Model &m, const at::Tensor &input = {}) {
  for (const at::Tensor &p : m.parameters())
    const_cast<at::Tensor &>(p).mutable_grad() = at::Tensor();
  if (input.defined())
    const_cast<at::Tensor &>(input).mutable_grad() = at::Tensor();
}

} // namespace

void writeUnitProfile(const Model &m, const Batch &batch,
                      const std::string &path, Precision precision, int reps) {
  if (reps < 1)
    throw std::invalid_argument("mtprt: --profile-units: reps must be >= 1");
  const at::Device device = m.device();
  const Batch b = batch.to(device);
  using Json = nlohmann::ordered_json;
  Json out;
  const ModelConfig &c = m.config();
  out["schema"] = "mtpc.costs/1";
  out["device"] = device.str();
  out["threads"] = at::get_num_threads();
  out["precision"] = toString(precision);
  out["model"] = {{"hidden", c.hidden}, {"heads", c.heads}, {"ffn", c.ffn},
                  {"seq", c.seq},       {"vocab", c.vocab}, {"layers", c.layers},
                  {"micro_batch", b.tokens.size(0)}};

  // Autocast as the trainer runs it: each forward under its own scope, whose
  // cache of cast weights ends with it (a step's forward casts each weight,
  // a tensor-grain re-run casts again); the backwards outside it.
  auto cast = [&](const std::function<void()> &f) {
    PrecisionGuard guard(precision, device);
    f();
  };

  // The embeddings, from the tokens.
  at::Tensor y;
  auto embed = [&] { cast([&] { y = m.unit(0, b.tokens); }); };
  out["embed"]["fwd_s"] = fastestSeconds(device, reps, [] {}, embed);
  out["embed"]["bwd_s"] = fastestSeconds(
      device, reps, embed,
      [&] { torch::autograd::backward({y}, {at::ones_like(y)}); });
  const at::Tensor x = y.detach().requires_grad_(true);
  dropGrads(m);

  // Layer 1's blocks: every layer has their shapes.
  for (int64_t u : {1, 2}) {
    Json &j = out[u == 1 ? "attention" : "mlp"];
    at::Tensor gy;
    auto forward = [&] { cast([&] { y = m.unit(u, x); }); };
    j["fwd_s"] = fastestSeconds(device, reps, [] {}, forward);
    j["bwd_s"] = fastestSeconds(
        device, reps,
        [&] {
          dropGrads(m, x); // accumulating into x's gradient would add time
          forward();
          gy = at::ones_like(y);
        },
        [&] { torch::autograd::backward({y}, {gy}); });
    j["chain_s"] = fastestSeconds(device, reps, [] {}, [&] {
      cast([&] { m.projections(u, x); });
    });
    dropGrads(m);
  }

  // Each head with its loss, on a tap of the backbone's shape.
  for (int64_t h = 0; h < m.numHeads(); ++h) {
    const at::Tensor &labels = b.labels.at(h);
    if (!labels.defined())
      continue;
    Json &j = out["heads"][m.heads()[h].name];
    at::Tensor loss;
    auto forward = [&] {
      cast([&] { loss = m.loss(h, m.head(h, x, labels), labels); });
    };
    j["fwd_s"] = fastestSeconds(device, reps, [] {}, forward);
    j["bwd_s"] = fastestSeconds(
        device, reps,
        [&] {
          dropGrads(m, x);
          forward();
        },
        [&] { torch::autograd::backward({loss}); });
    dropGrads(m);
  }

  // The whole model, everything kept, every head at its tap: what the
  // segments add up to in a step, where each layer's activations pass
  // through the caches (fewer runs: it is the largest).
  {
    const int wholeReps = std::min(reps, 5);
    std::vector<at::Tensor> losses;
    auto forward = [&] {
      losses.clear();
      std::vector<at::Tensor> taps(c.layers + 1);
      cast([&] {
        at::Tensor h = m.unit(0, b.tokens);
        taps[0] = h;
        for (int64_t u = 1; u <= 2 * c.layers; ++u) {
          h = m.unit(u, h);
          if (u % 2 == 0)
            taps[u / 2] = h;
        }
      });
      for (int64_t i = 0; i < m.numHeads(); ++i) {
        const at::Tensor &labels = b.labels.at(i);
        const int64_t tap = m.heads()[i].tap;
        if (labels.defined() && tap >= 0 && tap <= c.layers)
          cast([&] {
            losses.push_back(m.loss(i, m.head(i, taps[tap], labels), labels));
          });
      }
    };
    out["model_step"]["fwd_s"] = fastestSeconds(
        device, wholeReps, [&] { dropGrads(m); }, forward, /*median=*/true);
    out["model_step"]["bwd_s"] = fastestSeconds(
        device, wholeReps,
        [&] {
          dropGrads(m);
          forward();
        },
        [&] { torch::autograd::backward(losses); }, /*median=*/true);
    losses.clear();
    dropGrads(m);
  }

  // AdamW's update as the trainer runs it (adamwStep), on copies of the
  // parameters with gradients: the model's own are left as they are.
  {
    std::vector<at::Tensor> copies;
    for (const at::Tensor &p : m.parameters()) {
      at::Tensor q = p.detach().clone().requires_grad_(true);
      q.mutable_grad() = at::ones_like(q);
      copies.push_back(q);
    }
    torch::optim::AdamW adamw(
        copies, torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
    out["optimizer_s"] =
        fastestSeconds(device, reps, [] {}, [&] { adamwStep(adamw); },
                       /*median=*/true);
  }

  // The host link, with a block's output: to a host buffer (pinned where the
  // device is a GPU) and back.
  const at::Tensor payload = x.detach();
  const double bytes = double(payload.nbytes());
  at::Tensor host = at::empty(
      payload.sizes(),
      at::TensorOptions().dtype(payload.dtype()).pinned_memory(device.is_cuda()));
  at::Tensor back = at::empty_like(payload);
  const double out_s = fastestSeconds(device, reps, [] {},
                                     [&] { host.copy_(payload); });
  const double in_s =
      fastestSeconds(device, reps, [] {}, [&] { back.copy_(host); });
  out["link"] = {{"bytes", bytes},
                 {"to_host_bytes_per_s", bytes / std::max(out_s, 1e-9)},
                 {"to_device_bytes_per_s", bytes / std::max(in_s, 1e-9)}};

  std::ofstream f(path);
  f << out.dump(1) << "\n";
  if (!f)
    throw std::runtime_error("--profile-units: cannot write " + path +
                             "; give a path in a writable directory");
}

} // namespace mtprt
