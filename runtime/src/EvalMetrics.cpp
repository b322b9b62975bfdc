//===- EvalMetrics.cpp - per-task evaluation metrics ----------------------===//

#include "mtprt/EvalMetrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <tuple>

namespace mtprt::metrics {

namespace {

void sameSize(size_t a, size_t b, const char *what) {
  if (a != b)
    throw std::invalid_argument(std::string("mtprt: ") + what +
                                ": gold and predictions differ in length");
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Average ranks (1-based), ties sharing their mean rank.
std::vector<double> ranks(const std::vector<double> &x) {
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]])
      ++j;
    const double mean = 0.5 * double(i + j) + 1.0;
    for (size_t k = i; k <= j; ++k)
      r[order[k]] = mean;
    i = j + 1;
  }
  return r;
}

} // namespace

double accuracy(const std::vector<int64_t> &gold,
                const std::vector<int64_t> &pred) {
  sameSize(gold.size(), pred.size(), "accuracy");
  if (gold.empty())
    return kNaN;
  int64_t right = 0;
  for (size_t i = 0; i < gold.size(); ++i)
    right += gold[i] == pred[i];
  return double(right) / double(gold.size());
}

double macroF1(const std::vector<int64_t> &gold,
               const std::vector<int64_t> &pred) {
  sameSize(gold.size(), pred.size(), "macro-F1");
  if (gold.empty())
    return kNaN;
  std::map<int64_t, int64_t> tp, fp, fn;
  std::set<int64_t> labels(gold.begin(), gold.end());
  labels.insert(pred.begin(), pred.end());
  for (size_t i = 0; i < gold.size(); ++i) {
    if (gold[i] == pred[i]) {
      ++tp[gold[i]];
    } else {
      ++fp[pred[i]];
      ++fn[gold[i]];
    }
  }
  double sum = 0;
  for (int64_t l : labels) {
    const double d = 2.0 * double(tp[l]) + double(fp[l]) + double(fn[l]);
    sum += d > 0 ? 2.0 * double(tp[l]) / d : 0.0;
  }
  return sum / double(labels.size());
}

double meanSquaredError(const std::vector<double> &gold,
                        const std::vector<double> &pred) {
  sameSize(gold.size(), pred.size(), "MSE");
  if (gold.empty())
    return kNaN;
  double s = 0;
  for (size_t i = 0; i < gold.size(); ++i)
    s += (pred[i] - gold[i]) * (pred[i] - gold[i]);
  return s / double(gold.size());
}

double pearson(const std::vector<double> &x, const std::vector<double> &y) {
  sameSize(x.size(), y.size(), "Pearson");
  if (x.size() < 2)
    return kNaN;
  const double n = double(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n,
               my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (sxx == 0 || syy == 0)
    return kNaN;
  // Clipped as scipy clips it: rounding may step past ±1.
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

double spearman(const std::vector<double> &x, const std::vector<double> &y) {
  sameSize(x.size(), y.size(), "Spearman");
  return pearson(ranks(x), ranks(y));
}

bool Entity::operator<(const Entity &o) const {
  return std::tie(type, first, last) < std::tie(o.type, o.first, o.last);
}
bool Entity::operator==(const Entity &o) const {
  return type == o.type && first == o.first && last == o.last;
}

namespace {

bool endOfChunk(char prev, char tag, const std::string &prevType,
                const std::string &type) {
  if (prev == 'E' || prev == 'S')
    return true;
  if ((prev == 'B' || prev == 'I') && (tag == 'B' || tag == 'S' || tag == 'O'))
    return true;
  return prev != 'O' && prev != '.' && prevType != type;
}

bool startOfChunk(char prev, char tag, const std::string &prevType,
                  const std::string &type) {
  if (tag == 'B' || tag == 'S')
    return true;
  if ((prev == 'E' || prev == 'S' || prev == 'O') && (tag == 'E' || tag == 'I'))
    return true;
  return tag != 'O' && tag != '.' && prevType != type;
}

} // namespace

std::vector<Entity>
entities(const std::vector<std::vector<std::string>> &tags) {
  std::vector<std::string> seq;
  for (const auto &sentence : tags) {
    seq.insert(seq.end(), sentence.begin(), sentence.end());
    seq.push_back("O");
  }
  seq.push_back("O");
  std::vector<Entity> out;
  char prev = 'O';
  std::string prevType;
  int64_t begin = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    const std::string &chunk = seq[i];
    const char tag = chunk.empty() ? 'O' : chunk[0];
    // seqeval: the type is what follows the first '-' after the prefix
    // character (the whole rest when there is none), '_' when empty.
    std::string rest = chunk.size() > 1 ? chunk.substr(1) : "";
    const size_t dash = rest.find('-');
    std::string type = dash == std::string::npos ? rest : rest.substr(dash + 1);
    if (type.empty())
      type = "_";
    if (endOfChunk(prev, tag, prevType, type))
      out.push_back({prevType, begin, int64_t(i) - 1});
    if (startOfChunk(prev, tag, prevType, type))
      begin = int64_t(i);
    prev = tag;
    prevType = type;
  }
  return out;
}

PRF entityF1(const std::vector<std::vector<std::string>> &gold,
             const std::vector<std::vector<std::string>> &pred) {
  sameSize(gold.size(), pred.size(), "entity F1");
  for (size_t i = 0; i < gold.size(); ++i)
    sameSize(gold[i].size(), pred[i].size(), "entity F1 (a sentence)");
  const std::vector<Entity> g = entities(gold), p = entities(pred);
  const std::set<Entity> gs(g.begin(), g.end()), ps(p.begin(), p.end());
  int64_t tp = 0;
  for (const Entity &e : ps)
    tp += gs.count(e);
  PRF r;
  r.precision = ps.empty() ? 0.0 : double(tp) / double(ps.size());
  r.recall = gs.empty() ? 0.0 : double(tp) / double(gs.size());
  const double d = r.precision + r.recall;
  r.f1 = d > 0 ? 2.0 * r.precision * r.recall / d : 0.0;
  return r;
}

double tokenF1(const std::vector<int64_t> &gold,
               const std::vector<int64_t> &pred) {
  if (gold.empty() || pred.empty())
    return gold.empty() && pred.empty() ? 1.0 : 0.0;
  std::map<int64_t, int64_t> count;
  for (int64_t t : gold)
    ++count[t];
  int64_t common = 0;
  for (int64_t t : pred)
    if (count[t]-- > 0)
      ++common;
  if (common == 0)
    return 0.0;
  const double precision = double(common) / double(pred.size()),
               recall = double(common) / double(gold.size());
  return 2.0 * precision * recall / (precision + recall);
}

} // namespace mtprt::metrics
