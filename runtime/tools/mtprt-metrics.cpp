//===- mtprt-metrics.cpp - the evaluation metrics on given predictions ----===//
//
//   mtprt-metrics IN.json
//
// IN.json: a case, or an array of cases (one process for them all: the
// binary links LibTorch, whose start-up dominates a case), each
//          {"classify": {"gold": [int], "pred": [int]},
//           "regress":  {"gold": [num], "pred": [num]},
//           "tags":     {"gold": [[str]], "pred": [[str]]},
//           "spans":    [{"gold": [int], "pred": [int]}]}   (any subset)
// Prints the metrics (EvalMetrics.h) as JSON (an array for an array),
// 17 significant digits.
//
//===----------------------------------------------------------------------===//

#include "mtprt/EvalMetrics.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <iostream>

using namespace mtprt::metrics;
using nlohmann::json;

int main(int argc, char **argv) {
  if (argc != 2) {
    std::cerr << "usage: mtprt-metrics IN.json\n";
    return 2;
  }
  try {
    std::ifstream f(argv[1]);
    if (!f)
      throw std::runtime_error(std::string(argv[1]) + ": cannot be opened");
    const json all = json::parse(f);
    auto one = [](const json &in) {
      json out = json::object();
      auto num = [](double v) {
        return std::isnan(v) ? json(nullptr) : json(v);
      };
      if (in.contains("classify")) {
        const auto g = in["classify"]["gold"].get<std::vector<int64_t>>(),
                   p = in["classify"]["pred"].get<std::vector<int64_t>>();
        out["accuracy"] = num(accuracy(g, p));
        out["macro_f1"] = num(macroF1(g, p));
      }
      if (in.contains("regress")) {
        const auto g = in["regress"]["gold"].get<std::vector<double>>(),
                   p = in["regress"]["pred"].get<std::vector<double>>();
        out["mse"] = num(meanSquaredError(g, p));
        out["pearson"] = num(pearson(g, p));
        out["spearman"] = num(spearman(g, p));
      }
      if (in.contains("tags")) {
        const auto
            g = in["tags"]["gold"].get<std::vector<std::vector<std::string>>>(),
            p = in["tags"]["pred"].get<std::vector<std::vector<std::string>>>();
        const PRF r = entityF1(g, p);
        out["entity_precision"] = r.precision;
        out["entity_recall"] = r.recall;
        out["entity_f1"] = r.f1;
      }
      if (in.contains("spans")) {
        double em = 0, f1 = 0;
        for (const json &s : in["spans"]) {
          const auto g = s["gold"].get<std::vector<int64_t>>(),
                     p = s["pred"].get<std::vector<int64_t>>();
          em += g == p;
          f1 += tokenF1(g, p);
        }
        const double n = double(in["spans"].size());
        out["exact_match"] = num(n ? em / n : NAN);
        out["token_f1"] = num(n ? f1 / n : NAN);
      }
      return out;
    };
    if (all.is_array()) {
      json out = json::array();
      for (const json &c : all)
        out.push_back(one(c));
      std::cout << out.dump() << "\n";
    } else {
      std::cout << one(all).dump() << "\n";
    }
  } catch (const std::exception &e) {
    std::cerr << "mtprt-metrics: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
