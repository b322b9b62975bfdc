//===- Metrics.cpp - a step's measurements as one JSON Lines record -------===//

#include "mtprt/Runtime.h"

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <sstream>

namespace mtprt {

namespace {

std::string quote(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string number(double v) {
  if (!std::isfinite(v))
    return "null"; // a task without labels this step
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

std::string perTask(const std::vector<std::string> &tasks,
                    const std::vector<double> &v) {
  std::string out = "{";
  for (size_t i = 0; i < tasks.size() && i < v.size(); ++i)
    out += (i ? "," : "") + quote(tasks[i]) + ":" + number(v[i]);
  return out + "}";
}

} // namespace

std::string toJsonLine(const StepStats &s) {
  std::string out = "{\"step\":" + std::to_string(s.step);
  out += ",\"loss\":" + perTask(s.tasks, s.loss);
  out += ",\"alpha\":" + perTask(s.tasks, s.alpha);
  out += ",\"gradient_cosine_sim_matrix\":";
  if (s.gradientCosineSimMatrix.empty()) {
    out += "null";
  } else {
    out += "[";
    for (size_t i = 0; i < s.gradientCosineSimMatrix.size(); ++i) {
      out += i ? ",[" : "[";
      for (size_t j = 0; j < s.gradientCosineSimMatrix[i].size(); ++j)
        out += (j ? "," : "") + number(s.gradientCosineSimMatrix[i][j]);
      out += "]";
    }
    out += "]";
  }
  out += ",\"activation_reuse_ratio\":" + number(s.activationReuseRatio);
  out += ",\"checkpoint_hit_rate\":" + number(s.checkpointHitRate);
  out += ",\"offload_hits\":" + std::to_string(s.offloadHits);
  out += ",\"offload_misses\":" + std::to_string(s.offloadMisses);
  out += ",\"offload_wait_s\":" + number(s.offloadWaitS);
  out += ",\"measured_peak_bytes\":" + std::to_string(s.measuredPeakBytes);
  out += ",\"predicted_peak_bytes\":" +
         (s.predictedPeakBytes < 0 ? std::string("null")
                                   : std::to_string(s.predictedPeakBytes));
  out += ",\"host_pool_bytes\":" + std::to_string(s.hostPoolBytes);
  out += ",\"bytes_sent\":" + std::to_string(s.bytesSent);
  out += ",\"bytes_sent_uncompressed\":" +
         std::to_string(s.bytesSentUncompressed);
  out += ",\"step_time_s\":" + number(s.stepTimeS);
  out += ",\"samples_per_s\":" + number(s.samplesPerS);
  if (s.lossScale != 1.0)
    out += ",\"loss_scale\":" + number(s.lossScale);
  if (s.skipped)
    out += ",\"skipped\":true";
  return out + "}";
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

std::string recalibrationJsonLine(const StepStats &s) {
  return "{\"event\":\"dgfg_recalibrated\",\"step\":" +
         std::to_string(s.step) +
         ",\"activation_reuse_ratio\":" + number(s.activationReuseRatio) +
         ",\"cosine_std\":" + number(cosineMatrixStd(s)) + "}";
}

} // namespace mtprt
