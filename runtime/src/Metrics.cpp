//===- Metrics.cpp - a step's measurements as one JSON Lines record -------===//

#include "mtprt/Runtime.h"

#include "JsonLine.h"

#include <algorithm>
#include <cmath>

namespace mtprt {

namespace {

Json perTask(const std::vector<std::string> &tasks,
             const std::vector<double> &v) {
  Json out = Json::object();
  for (size_t i = 0; i < tasks.size() && i < v.size(); ++i)
    out[tasks[i]] = jsonNumber(v[i]);
  return out;
}

} // namespace

std::string toJsonLine(const StepStats &s) {
  Json j;
  j["step"] = s.step;
  j["loss"] = perTask(s.tasks, s.loss);
  j["alpha"] = perTask(s.tasks, s.alpha);
  Json cos = nullptr;
  if (!s.gradientCosineSimMatrix.empty()) {
    cos = Json::array();
    for (const auto &row : s.gradientCosineSimMatrix) {
      Json r = Json::array();
      for (double v : row)
        r.push_back(jsonNumber(v));
      cos.push_back(std::move(r));
    }
  }
  j["gradient_cosine_sim_matrix"] = std::move(cos);
  j["activation_reuse_ratio"] = jsonNumber(s.activationReuseRatio);
  j["checkpoint_hit_rate"] = jsonNumber(s.checkpointHitRate);
  j["offload_hits"] = s.offloadHits;
  j["offload_misses"] = s.offloadMisses;
  j["offload_wait_s"] = jsonNumber(s.offloadWaitS);
  j["measured_peak_bytes"] = s.measuredPeakBytes;
  if (!s.rankPeakBytes.empty())
    j["measured_peak_bytes_by_rank"] = s.rankPeakBytes;
  if (!s.rankPredictedPeakBytes.empty())
    j["predicted_peak_bytes_by_rank"] = s.rankPredictedPeakBytes;
  if (s.pipelineWaitS >= 0)
    j["pipeline_wait_s"] = s.pipelineWaitS;
  if (s.commS >= 0)
    j["comm_s"] = s.commS;
  j["predicted_peak_bytes"] =
      s.predictedPeakBytes < 0 ? Json(nullptr) : Json(s.predictedPeakBytes);
  j["host_pool_bytes"] = s.hostPoolBytes;
  j["bytes_sent"] = s.bytesSent;
  j["bytes_sent_uncompressed"] = s.bytesSentUncompressed;
  j["step_time_s"] = jsonNumber(s.stepTimeS);
  j["samples_per_s"] = jsonNumber(s.samplesPerS);
  if (s.batchSize > 0)
    j["batch_size"] = s.batchSize;
  if (s.lossScale != 1.0)
    j["loss_scale"] = jsonNumber(s.lossScale);
  if (s.skipped)
    j["skipped"] = true;
  if (s.phase >= 0)
    j["phase"] = s.phase;
  if (s.ewcPenalty >= 0)
    j["ewc_penalty"] = jsonNumber(s.ewcPenalty);
  if (s.sapsTurnover >= 0)
    j["saps_turnover"] = jsonNumber(s.sapsTurnover);
  if (s.gateSeparation >= 0)
    j["gate_separation"] = jsonNumber(s.gateSeparation);
  return jsonLine(j);
}

double cosineMatrixStd(const StepStats &s) {
  const auto &m = s.gradientCosineSimMatrix;
  double sum = 0, sq = 0;
  int64_t n = 0;
  for (const auto &row : m)
    for (double v : row) {
      sum += v;
      sq += v * v;
      ++n;
    }
  if (n == 0)
    return std::nan("");
  const double mean = sum / n;
  return std::sqrt(std::max(0.0, sq / n - mean * mean));
}

bool needsGateRecalibration(const StepStats &s, double reuseThreshold,
                            double stdThreshold) {
  const double sd = cosineMatrixStd(s);
  return std::isfinite(sd) && s.activationReuseRatio < reuseThreshold &&
         sd > stdThreshold;
}

namespace {
/// A matrix of cosines as rows of JSON numbers (non-finite: null).
Json matrixJson(const std::vector<std::vector<double>> &m) {
  Json rows = Json::array();
  for (const std::vector<double> &row : m) {
    Json r = Json::array();
    for (double v : row)
      r.push_back(jsonNumber(v));
    rows.push_back(r);
  }
  return rows;
}
} // namespace

std::string conflictJsonLine(int64_t step, int64_t phase,
                             const std::vector<std::string> &tasks,
                             const std::vector<std::vector<double>> &cosines,
                             double largest, double threshold, bool protect) {
  Json j;
  j["event"] = "ewc_conflict";
  j["step"] = step;
  j["phase"] = phase;
  j["tasks"] = tasks;
  j["similarity"] = matrixJson(cosines);
  j["largest"] = jsonNumber(largest);
  j["threshold"] = jsonNumber(threshold);
  j["protect"] = protect;
  return jsonLine(j);
}

std::string regroupJsonLine(int64_t step, const std::vector<std::string> &tasks,
                            const std::vector<std::vector<double>> &cosines,
                            double threshold,
                            const std::vector<int64_t> &before,
                            const std::vector<int64_t> &after) {
  auto groups = [&](const std::vector<int64_t> &owner) {
    Json out = Json::array();
    for (size_t o = 0; o < owner.size(); ++o) {
      if (owner[o] != int64_t(o))
        continue;
      Json g = Json::array();
      for (size_t h = 0; h < owner.size(); ++h)
        if (owner[h] == int64_t(o) && h < tasks.size())
          g.push_back(tasks[h]);
      out.push_back(g);
    }
    return out;
  };
  Json j;
  j["event"] = "adapter_regroup";
  j["step"] = step;
  j["tasks"] = tasks;
  j["similarity"] = matrixJson(cosines);
  j["threshold"] = jsonNumber(threshold);
  j["groups_before"] = groups(before);
  j["groups"] = groups(after);
  return jsonLine(j);
}

std::string recalibrationJsonLine(const StepStats &s) {
  Json j;
  j["event"] = "dgfg_recalibrated";
  j["step"] = s.step;
  j["activation_reuse_ratio"] = jsonNumber(s.activationReuseRatio);
  j["cosine_std"] = jsonNumber(cosineMatrixStd(s));
  return jsonLine(j);
}

} // namespace mtprt
