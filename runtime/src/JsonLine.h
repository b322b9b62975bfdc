//===- JsonLine.h - the runtime's JSON records, one per line -----*- C++ -*-===//
//
// Internal to runtime/src: how the metrics file, the predictions and
// best.json are written (nlohmann's ordered JSON: keys in the order put).
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_SRC_JSONLINE_H
#define MTPRT_SRC_JSONLINE_H

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>

namespace mtprt {

using Json = nlohmann::ordered_json;

/// Non-finite values (a task without labels, a constant regression side)
/// are written as null.
inline Json jsonNumber(double v) {
  return std::isfinite(v) ? Json(v) : Json(nullptr);
}

/// One line, no spaces; bytes that are not UTF-8 (a task name cannot hold
/// any, but a path can) become U+FFFD instead of throwing.
inline std::string jsonLine(const Json &j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

} // namespace mtprt

#endif // MTPRT_SRC_JSONLINE_H
