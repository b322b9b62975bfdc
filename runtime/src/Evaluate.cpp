//===- Evaluate.cpp - held-out metrics per task ---------------------------===//

#include "mtprt/torch/Evaluate.h"

#include "mtprt/DataFormat.h"
#include "mtprt/EvalMetrics.h"
#include "mtprt/Memory.h"

#include "JsonLine.h"
#include "Precision.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace mtprt {

namespace {

/// The longest answer a span prediction may take (SQuAD's scripts use 30).
constexpr int64_t kMaxAnswerTokens = 30;

/// What a task's predictions accumulate over the file.
struct Accumulator {
  double lossSum = 0;
  int64_t lossCount = 0, records = 0;
  std::vector<int64_t> gold, pred;              // classes, tags
  std::vector<double> goldValue, predValue;     // mse
  std::vector<std::vector<std::string>> goldTags, predTags; // entities
  int64_t spanExact = 0;
  double spanF1 = 0;
};

} // namespace

double TaskMetrics::get(const std::string &metric) const {
  for (const auto &[k, v] : values)
    if (k == metric)
      return v;
  return std::nan("");
}

std::string EvalReport::jsonLine(int64_t step) const {
  Json byTask = Json::object();
  for (const TaskMetrics &t : tasks) {
    Json m = Json::object();
    for (const auto &[name, v] : t.values)
      m[name] = jsonNumber(v);
    byTask[t.task] = std::move(m);
  }
  // Assigned key by key: a braced list holding an object is ambiguous.
  Json j = Json::object();
  j["step"] = step;
  j["eval"] = std::move(byTask);
  j["eval_records"] = records;
  if (peakBytes >= 0)
    j["peak_bytes"] = peakBytes;
  if (predictedPeakBytes > 0)
    j["predicted_peak_bytes"] = predictedPeakBytes;
  return mtprt::jsonLine(j); // not this member (Json converts to int64_t)
}

std::string EvalReport::summary() const {
  std::ostringstream os;
  for (size_t t = 0; t < tasks.size(); ++t) {
    os << (t ? "; " : "") << tasks[t].task;
    for (const auto &[k, v] : tasks[t].values) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " %s %.4g", k.c_str(), v);
      os << buf;
    }
  }
  return os.str();
}

std::string EvalReport::peakText() const {
  if (peakBytes < 0)
    return "";
  std::string text = "; peak " + std::to_string(peakBytes) + " B";
  if (predictedPeakBytes > 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " (%+.1f%%)",
                  100.0 * double(peakBytes - predictedPeakBytes) /
                      double(predictedPeakBytes));
    text += " vs " + std::to_string(predictedPeakBytes) + " B predicted" + buf;
  }
  return text;
}

double EvalReport::value(const std::string &key) const {
  const size_t dot = key.find('.');
  if (dot == std::string::npos)
    return std::nan("");
  const std::string task = key.substr(0, dot), metric = key.substr(dot + 1);
  double sum = 0;
  int64_t n = 0;
  for (const TaskMetrics &t : tasks) {
    if (task != "mean" && t.task != task)
      continue;
    const double v = t.get(metric);
    if (std::isfinite(v)) {
      sum += v;
      ++n;
    }
  }
  return n ? sum / double(n) : std::nan("");
}

EvalReport evaluate(Model &model, DataSource &data, int64_t batch,
                    Precision precision,
                    const std::function<void(const RecordPrediction &)> &each) {
  const int64_t n = data.size();
  if (n <= 0)
    throw std::invalid_argument("mtprt: evaluation: " + data.describe() +
                                " has no records to evaluate on");
  if (batch < 1)
    throw std::invalid_argument("mtprt: evaluation: batch must be >= 1");
  const std::vector<HeadConfig> &heads = model.heads();
  const size_t nh = heads.size();
  std::vector<std::vector<std::string>> names = data.labelNames();
  names.resize(nh);
  std::vector<Accumulator> acc(nh);

  // A span of its own in --profile traces (scripts/peak-at.py --within).
  RECORD_FUNCTION("mtprt::evaluate", c10::ArrayRef<const c10::IValue>{});
  const bool training = model.training();
  model.setTraining(false);
  at::NoGradGuard noGrad;
  PrecisionGuard autocast(precision, model.device(), /*cacheCasts=*/false);
  struct Restore {
    Model &m;
    bool training;
    ~Restore() {
      m.setInputs({}, {});
      m.setTraining(training);
    }
  } restore{model, training};

  // The evaluation's own high-water mark (the next step starts its own).
  const bool cuda = model.device().is_cuda();
  const int dev = cuda ? std::max<int>(0, model.device().index()) : 0;
  const bool measured = cuda ? cudaMemoryStatsAvailable()
                             : cpuMemoryTrackingInstalled();
  if (measured) {
    if (cuda)
      resetCudaPeak(dev);
    else
      resetCpuPeak();
  }

  int64_t top = 0;
  for (const HeadConfig &h : heads)
    top = std::max(top, h.tap);
  const int64_t lastUnit =
      std::min(Model::tapUnit(top), model.numUnits() - 1);

  for (int64_t first = 0; first < n; first += batch) {
    const int64_t count = std::min(batch, n - first);
    const Batch cpu = data.range(first, count);
    const Batch b = cpu.to(model.device());
    model.setInputs(b.lengths, b.types);
    // Host copies of what the predictions are compared with.
    const at::Tensor lengthsTensor =
        cpu.lengths.defined()
            ? cpu.lengths.contiguous()
            : at::full({count}, model.config().seq, at::kLong);
    const auto lengths = lengthsTensor.accessor<int64_t, 1>();
    const at::Tensor tokensTensor = cpu.tokens.contiguous();
    const auto tokens = tokensTensor.accessor<int64_t, 2>();
    std::vector<RecordPrediction> records(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      records[i].record = first + i;
      records[i].heads.resize(nh);
      records[i].gold.resize(nh);
      const int64_t *row = tokens[i].data();
      records[i].tokens.assign(row, row + lengths[i]);
    }

    auto score = [&](size_t t, const at::Tensor &tap) {
      const HeadConfig &c = heads[t];
      const at::Tensor &labels = b.labels.size() > t ? b.labels[t] : at::Tensor();
      if (c.kind == HeadKind::Decoder && !labels.defined())
        return; // teacher-forced: nothing to predict without targets
      const std::vector<at::Tensor> outs =
          model.head(static_cast<int64_t>(t), tap, labels);
      Accumulator &a = acc[t];
      // The batch's mean loss over its scored labels, weighted by the
      // records that have them (counted below).
      const double loss =
          labels.defined()
              ? model.loss(static_cast<int64_t>(t), outs, labels, true)
                    .item<double>()
              : 0.0;
      const int64_t before = a.records;
      const at::Tensor gold =
          labels.defined() ? cpu.labels[t].contiguous() : at::Tensor();
      switch (c.kind) {
      case HeadKind::Classify: {
        if (c.loss == LossKind::Mse) {
          const at::Tensor pt = outs[0].to(at::kCPU, at::kDouble).contiguous();
          const auto p = pt.accessor<double, 2>();
          for (int64_t i = 0; i < count; ++i) {
            std::vector<double> &out = records[i].heads[t];
            out.assign(p[i].data(), p[i].data() + c.classes);
            if (!gold.defined() || std::isnan(gold.accessor<float, 2>()[i][0]))
              continue;
            ++a.records;
            const auto g = gold.accessor<float, 2>()[i];
            for (int64_t k = 0; k < c.classes; ++k) {
              a.goldValue.push_back(g[k]);
              a.predValue.push_back(out[k]);
              records[i].gold[t].push_back(g[k]);
            }
          }
          break;
        }
        const at::Tensor pt = outs[0].argmax(-1).to(at::kCPU).contiguous();
        const auto p = pt.accessor<int64_t, 1>();
        for (int64_t i = 0; i < count; ++i) {
          records[i].heads[t] = {double(p[i])};
          const int64_t g =
              gold.defined() ? gold.accessor<int64_t, 1>()[i] : kIgnoreLabel;
          if (g == kIgnoreLabel)
            continue;
          ++a.records;
          a.gold.push_back(g);
          a.pred.push_back(p[i]);
          records[i].gold[t] = {double(g)};
        }
        break;
      }
      case HeadKind::Tag: {
        const at::Tensor pt = outs[0].argmax(-1).to(at::kCPU).contiguous();
        const auto p = pt.accessor<int64_t, 2>();
        const bool entities = metrics::namesEntities(names[t]);
        for (int64_t i = 0; i < count; ++i) {
          const int64_t len = lengths[i];
          // This record's gold tags (none: all kIgnoreLabel).
          const int64_t *goldRow =
              gold.defined() ? gold.accessor<int64_t, 2>()[i].data() : nullptr;
          std::vector<double> &out = records[i].heads[t];
          std::vector<std::string> goldSeq, predSeq;
          // A record with gold tags: predictions at its scored positions
          // (first sub-tokens); without: at every real token.
          bool labelled = false;
          for (int64_t s = 0; s < len && goldRow && !labelled; ++s)
            labelled = goldRow[s] != kIgnoreLabel;
          bool any = false;
          for (int64_t s = 0; s < len; ++s) {
            const int64_t ps = p[i][s];
            const int64_t gs = labelled ? goldRow[s] : int64_t(kIgnoreLabel);
            out.push_back(labelled && gs == kIgnoreLabel ? -1.0 : double(ps));
            if (labelled)
              records[i].gold[t].push_back(double(gs));
            if (gs == kIgnoreLabel)
              continue;
            any = true;
            a.gold.push_back(gs);
            a.pred.push_back(ps);
            if (entities) {
              auto name = [&](int64_t id) {
                return id >= 0 && id < int64_t(names[t].size())
                           ? names[t][id]
                           : std::string("O");
              };
              goldSeq.push_back(name(gs));
              predSeq.push_back(name(ps));
            }
          }
          if (!any)
            records[i].gold[t].clear();
          if (any) {
            ++a.records;
            if (entities) {
              a.goldTags.push_back(std::move(goldSeq));
              a.predTags.push_back(std::move(predSeq));
            }
          }
        }
        break;
      }
      case HeadKind::Span: {
        const at::Tensor start = outs[0].to(at::kCPU, at::kFloat).contiguous(),
                         end = outs[1].to(at::kCPU, at::kFloat).contiguous();
        for (int64_t i = 0; i < count; ++i) {
          const int64_t len = lengths[i];
          // The best start <= end within the record and kMaxAnswerTokens.
          const float *st = start[i].data_ptr<float>(),
                      *en = end[i].data_ptr<float>();
          int64_t bs = 0, be = 0;
          float best = -INFINITY;
          for (int64_t s = 0; s < len; ++s)
            for (int64_t e = s; e < std::min(len, s + kMaxAnswerTokens); ++e)
              if (st[s] + en[e] > best) {
                best = st[s] + en[e];
                bs = s;
                be = e;
              }
          records[i].heads[t] = {double(bs), double(be)};
          if (!gold.defined() ||
              gold.accessor<int64_t, 2>()[i][0] == kIgnoreLabel)
            continue;
          ++a.records;
          const int64_t gs = gold.accessor<int64_t, 2>()[i][0],
                        ge = gold.accessor<int64_t, 2>()[i][1];
          records[i].gold[t] = {double(gs), double(ge)};
          const std::vector<int64_t> &tok = records[i].tokens;
          auto slice = [&](int64_t s, int64_t e) {
            e = std::min<int64_t>(e, int64_t(tok.size()) - 1);
            return s <= e ? std::vector<int64_t>(tok.begin() + s,
                                                 tok.begin() + e + 1)
                          : std::vector<int64_t>();
          };
          const std::vector<int64_t> g = slice(gs, ge), pr = slice(bs, be);
          a.spanExact += g == pr;
          a.spanF1 += metrics::tokenF1(g, pr);
        }
        break;
      }
      case HeadKind::Decoder: {
        // Teacher-forced: the most likely token at every scored target.
        const at::Tensor pt = outs[0].argmax(-1).to(at::kCPU).contiguous();
        const auto p = pt.accessor<int64_t, 2>();
        const auto g = gold.accessor<int64_t, 2>();
        for (int64_t i = 0; i < count; ++i) {
          bool any = false;
          for (int64_t s = 0; s < p.size(1); ++s) {
            if (g[i][s] == kIgnoreLabel)
              continue;
            any = true;
            a.gold.push_back(g[i][s]);
            a.pred.push_back(p[i][s]);
          }
          a.records += any;
        }
        break;
      }
      }
      a.lossSum += loss * double(a.records - before);
      a.lossCount += a.records - before;
    };
    // Each head right after its tap, as the step runs them: no layer's
    // output outlives the heads that read it (the plan's evaluation peak).
    at::Tensor x = b.tokens;
    for (int64_t u = 0; u <= lastUnit; ++u) {
      // ZeRO 3 gathers the next unit while this one runs.
      x = model.unit(u, x, u < lastUnit ? u + 1 : -1);
      for (size_t t = 0; t < nh; ++t)
        if (std::min(Model::tapUnit(heads[t].tap), lastUnit) == u)
          score(t, x);
    }
    if (each)
      for (const RecordPrediction &r : records)
        each(r);
  }

  EvalReport report;
  report.records = n;
  if (measured)
    report.peakBytes =
        cuda ? cudaMemoryStats(dev).peakBytes : cpuMemoryStats().peakBytes;
  for (size_t t = 0; t < nh; ++t) {
    const HeadConfig &c = heads[t];
    const Accumulator &a = acc[t];
    if (a.lossCount == 0)
      continue; // no labels for the task in the file
    TaskMetrics m;
    m.task = c.name;
    m.records = a.records;
    switch (c.kind) {
    case HeadKind::Classify:
      if (c.loss == LossKind::Mse) {
        m.values = {{"mse", metrics::meanSquaredError(a.goldValue, a.predValue)},
                    {"pearson", metrics::pearson(a.goldValue, a.predValue)},
                    {"spearman", metrics::spearman(a.goldValue, a.predValue)}};
      } else {
        m.values = {{"accuracy", metrics::accuracy(a.gold, a.pred)},
                    {"macro_f1", metrics::macroF1(a.gold, a.pred)}};
      }
      break;
    case HeadKind::Tag:
      m.values = {{"token_accuracy", metrics::accuracy(a.gold, a.pred)}};
      if (!a.goldTags.empty()) {
        const metrics::PRF r = metrics::entityF1(a.goldTags, a.predTags);
        m.values.push_back({"entity_precision", r.precision});
        m.values.push_back({"entity_recall", r.recall});
        m.values.push_back({"entity_f1", r.f1});
      }
      break;
    case HeadKind::Span:
      m.values = {{"exact_match", a.records ? double(a.spanExact) /
                                                  double(a.records)
                                            : std::nan("")},
                  {"token_f1", a.records ? a.spanF1 / double(a.records)
                                         : std::nan("")}};
      break;
    case HeadKind::Decoder:
      m.values = {{"token_accuracy", metrics::accuracy(a.gold, a.pred)},
                  {"perplexity", std::exp(a.lossSum / double(a.lossCount))}};
      break;
    }
    m.values.push_back({"loss", a.lossSum / double(a.lossCount)});
    report.tasks.push_back(std::move(m));
  }
  return report;
}

namespace {

/// One head's prediction (or gold label) as --predict writes it.
Json predictionJson(const HeadConfig &c, const std::vector<std::string> &names,
                    const std::vector<double> &v,
                    const std::vector<int64_t> &tokens) {
  auto label = [&](double id) -> Json {
    const int64_t i = static_cast<int64_t>(id);
    if (id < 0)
      return nullptr;
    return i < int64_t(names.size()) ? Json(names[i]) : Json(i);
  };
  switch (c.kind) {
  case HeadKind::Classify:
    if (c.loss == LossKind::Mse) {
      Json out = Json::array();
      for (double x : v)
        out.push_back(jsonNumber(x));
      return out;
    }
    return label(v.empty() ? -1 : v[0]);
  case HeadKind::Tag: {
    Json out = Json::array();
    for (double x : v)
      out.push_back(label(x));
    return out;
  }
  case HeadKind::Span: {
    const int64_t s = int64_t(v[0]), e = int64_t(v[1]);
    Json answer = Json::array();
    for (int64_t k = s; k <= e && k < int64_t(tokens.size()); ++k)
      answer.push_back(tokens[k]);
    Json span = Json::object();
    span["start"] = s;
    span["end"] = e;
    span["tokens"] = std::move(answer);
    return span;
  }
  case HeadKind::Decoder:
    break;
  }
  return nullptr;
}

} // namespace

EvalReport writePredictions(Model &model, DataSource &data, int64_t batch,
                            Precision precision, const std::string &path,
                            int64_t step, int64_t predictedPeakBytes) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  if (!out)
    throw std::runtime_error("--out: cannot write " + tmp);
  const std::vector<HeadConfig> &heads = model.heads();
  std::vector<std::vector<std::string>> names = data.labelNames();
  names.resize(heads.size());
  EvalReport report =
      evaluate(model, data, batch, precision, [&](const RecordPrediction &r) {
        Json line = Json::object(), gold = Json::object();
        line["record"] = r.record;
        for (size_t t = 0; t < heads.size(); ++t) {
          if (heads[t].kind == HeadKind::Decoder)
            continue;
          line[heads[t].name] =
              predictionJson(heads[t], names[t], r.heads[t], r.tokens);
          if (!r.gold[t].empty())
            gold[heads[t].name] =
                predictionJson(heads[t], names[t], r.gold[t], r.tokens);
        }
        if (!gold.empty())
          line["gold"] = std::move(gold);
        out << jsonLine(line) << '\n';
      });
  out.close();
  if (!out)
    throw std::runtime_error("--out: writing " + tmp + " failed");
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    throw std::runtime_error("--out: cannot rename " + tmp + " to " + path +
                             ": " + ec.message());
  report.predictedPeakBytes = predictedPeakBytes;
  // Fewer records than a batch ran in one smaller batch than the plan's
  // evaluation peak is for: said, not passed off as a miss.
  std::string smaller;
  if (predictedPeakBytes > 0 && report.peakBytes >= 0 &&
      report.records < batch)
    smaller = " (the prediction is for the plan's evaluation batch of " +
              std::to_string(batch) + " records; these ran as one batch of " +
              std::to_string(report.records) + ")";
  std::printf("predicted %lld records of %s at step %lld to %s%s%s\n",
              static_cast<long long>(report.records),
              data.describe().c_str(), static_cast<long long>(step),
              path.c_str(), report.peakText().c_str(), smaller.c_str());
  if (!report.tasks.empty())
    std::printf("metrics over the records with labels: %s\n",
                report.summary().c_str());
  return report;
}

} // namespace mtprt
