//===- EvalMetrics.h - per-task evaluation metrics -------------*- C++ -*-===//
//
// The held-out metrics of docs/data.md, computed as the reference tools
// compute them (each checked against them to 1e-9 in a test):
//
//   classification  accuracy; macro-F1 over the classes in the gold or the
//                   predictions (scikit-learn's f1_score(average="macro"),
//                   a class with no true or predicted instance scoring 0)
//   regression      MSE; Pearson's r; Spearman's rho (Pearson's r of the
//                   average ranks, as scipy.stats.spearmanr); NaN where a
//                   side is constant
//   tagging         token accuracy over the scored tokens; entity-level
//                   precision, recall and F1 over BIO/IOB2/IOBES spans as
//                   seqeval's default (conlleval) mode finds them
//   spans           exact match and token F1 as SQuAD's script computes
//                   them, over the answer's token ids (the bag of tokens
//                   of the predicted span against the gold one's)
//
// Torch-free: plain vectors in, numbers out.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_EVALMETRICS_H
#define MTPRT_EVALMETRICS_H

#include "mtprt/Config.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mtprt::metrics {

/// Every metric an evaluation reports, in the order it reports them (the
/// report's columns, --keep-best's choices).
inline constexpr const char *kNames[] = {
    "accuracy",         "macro_f1",      "mse",       "pearson",
    "spearman",         "token_accuracy", "entity_precision",
    "entity_recall",    "entity_f1",     "exact_match", "token_f1",
    "perplexity",       "loss"};

/// The metrics an evaluation reports for a head (entity_* only when its
/// labels are named BIO tags; loss for every head).
inline std::vector<const char *> namesFor(const HeadConfig &h) {
  switch (h.kind) {
  case HeadKind::Classify:
    if (h.loss == LossKind::Mse)
      return {"mse", "pearson", "spearman", "loss"};
    return {"accuracy", "macro_f1", "loss"};
  case HeadKind::Tag:
    return {"token_accuracy", "entity_precision", "entity_recall", "entity_f1",
            "loss"};
  case HeadKind::Span:
    return {"exact_match", "token_f1", "loss"};
  case HeadKind::Decoder:
    return {"token_accuracy", "perplexity", "loss"};
  }
  return {"loss"};
}

/// Whether an evaluation of head `h` reports `metric` (one of namesFor's).
inline bool reports(const HeadConfig &h, std::string_view metric) {
  for (const char *m : namesFor(h))
    if (metric == m)
      return true;
  return false;
}

/// Whether a tag head's label names are BIO/IOB2/IOBES tags (B-X, I-X, ...):
/// only then does its evaluation find entities.
inline bool namesEntities(const std::vector<std::string> &names) {
  for (const std::string &n : names)
    if (n.size() > 2 && n[1] == '-' &&
        (n[0] == 'B' || n[0] == 'I' || n[0] == 'E' || n[0] == 'S'))
      return true;
  return false;
}

/// Lower is better for the errors (loss, mse, perplexity), higher for the
/// rest.
inline bool lowerIsBetter(std::string_view metric) {
  return metric == "loss" || metric == "mse" || metric == "perplexity";
}

double accuracy(const std::vector<int64_t> &gold,
                const std::vector<int64_t> &pred);
double macroF1(const std::vector<int64_t> &gold,
               const std::vector<int64_t> &pred);
double meanSquaredError(const std::vector<double> &gold,
                        const std::vector<double> &pred);
double pearson(const std::vector<double> &x, const std::vector<double> &y);
double spearman(const std::vector<double> &x, const std::vector<double> &y);

/// An entity: its type and first and last positions in the sequence.
struct Entity {
  std::string type;
  int64_t first = 0, last = 0;
  bool operator<(const Entity &o) const;
  bool operator==(const Entity &o) const;
};

/// The entities of tag sequences, as seqeval's get_entities: sentences are
/// joined with an "O" between them; prefixes B, I, E, S, O (a tag without
/// one counts as its own type with prefix of its first character).
std::vector<Entity> entities(const std::vector<std::vector<std::string>> &tags);

struct PRF {
  double precision = 0, recall = 0, f1 = 0;
};
/// Micro precision/recall/F1 of the predicted entities against the gold.
PRF entityF1(const std::vector<std::vector<std::string>> &gold,
             const std::vector<std::vector<std::string>> &pred);

/// SQuAD's F1 of one answer: the common tokens (as a multiset) over the
/// predicted and the gold tokens; 1 when both are empty.
double tokenF1(const std::vector<int64_t> &gold,
               const std::vector<int64_t> &pred);

} // namespace mtprt::metrics

#endif // MTPRT_EVALMETRICS_H
