//===- UnitProfile.cpp - the step's segments timed on the device ----------===//

#include "mtprt/torch/UnitProfile.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>

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
double fastestSeconds(const at::Device &device, int reps,
                     const std::function<void()> &setup,
                     const std::function<void()> &timed) {
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
  return *std::min_element(times.begin(), times.end());
}

void dropGrads(const Model &m, const at::Tensor &input = {}) {
  for (const at::Tensor &p : m.parameters())
    const_cast<at::Tensor &>(p).mutable_grad() = at::Tensor();
  if (input.defined())
    const_cast<at::Tensor &>(input).mutable_grad() = at::Tensor();
}

} // namespace

void writeUnitProfile(const Model &m, const Batch &batch,
                      const std::string &path, int reps) {
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
  out["model"] = {{"hidden", c.hidden}, {"heads", c.heads}, {"ffn", c.ffn},
                  {"seq", c.seq},       {"vocab", c.vocab}, {"layers", c.layers},
                  {"micro_batch", b.tokens.size(0)}};

  // The embeddings, from the tokens.
  at::Tensor y;
  out["embed"]["fwd_s"] =
      fastestSeconds(device, reps, [] {}, [&] { y = m.unit(0, b.tokens); });
  out["embed"]["bwd_s"] = fastestSeconds(
      device, reps, [&] { y = m.unit(0, b.tokens); },
      [&] { torch::autograd::backward({y}, {at::ones_like(y)}); });
  const at::Tensor x = y.detach().requires_grad_(true);
  dropGrads(m);

  // Layer 1's blocks: every layer has their shapes.
  for (int64_t u : {1, 2}) {
    Json &j = out[u == 1 ? "attention" : "mlp"];
    at::Tensor gy;
    j["fwd_s"] = fastestSeconds(device, reps, [] {}, [&] { y = m.unit(u, x); });
    j["bwd_s"] = fastestSeconds(
        device, reps,
        [&] {
          dropGrads(m, x); // accumulating into x's gradient would add time
          y = m.unit(u, x);
          gy = at::ones_like(y);
        },
        [&] { torch::autograd::backward({y}, {gy}); });
    j["chain_s"] =
        fastestSeconds(device, reps, [] {}, [&] { m.projections(u, x); });
    dropGrads(m);
  }

  // Each head with its loss, on a tap of the backbone's shape.
  for (int64_t h = 0; h < m.numHeads(); ++h) {
    const at::Tensor &labels = b.labels.at(h);
    if (!labels.defined())
      continue;
    Json &j = out["heads"][m.heads()[h].name];
    at::Tensor loss;
    j["fwd_s"] = fastestSeconds(device, reps, [] {}, [&] {
      loss = m.loss(h, m.head(h, x, labels), labels);
    });
    j["bwd_s"] = fastestSeconds(
        device, reps,
        [&] {
          dropGrads(m, x);
          loss = m.loss(h, m.head(h, x, labels), labels);
        },
        [&] { torch::autograd::backward({loss}); });
    dropGrads(m);
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
