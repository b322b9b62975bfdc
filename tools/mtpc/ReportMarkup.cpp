//===- ReportMarkup.cpp - `mtpc report`: text and numbers in HTML ---------===//

#include "ReportMarkup.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cmath>
#include <cstdint>

using llvm::StringRef;

namespace mtp::report {

std::string esc(StringRef s) {
  std::string out;
  llvm::raw_string_ostream os(out);
  llvm::printHTMLEscaped(s, os);
  return out;
}

std::string num(double v) {
  if (!std::isfinite(v))
    return "null";
  return llvm::formatv("{0}", llvm::format("%.9g", v)).str();
}
std::string num(Opt v) { return v ? num(*v) : std::string("null"); }
std::string px(double v) {
  return llvm::formatv("{0}", llvm::format("%.2f", v)).str();
}
std::string fmtG(double v, int digits) {
  return llvm::formatv("{0}", llvm::format("%.*g", digits, v)).str();
}
std::string jsonString(StringRef s) {
  return llvm::formatv("{0}", llvm::json::Value(s.str())).str();
}
std::string scriptSafe(std::string s) {
  for (size_t at = s.find("</"); at != std::string::npos; at = s.find("</"))
    s.replace(at, 2, "<\\/");
  return s;
}

ByteUnit byteUnitFor(double maxBytes) {
  if (maxBytes >= 1024.0 * 1024 * 1024)
    return {"GiB", 1024.0 * 1024 * 1024};
  if (maxBytes >= 1024.0 * 1024)
    return {"MiB", 1024.0 * 1024};
  if (maxBytes >= 1024.0)
    return {"KiB", 1024.0};
  return {"B", 1};
}

std::string colorOf(unsigned i) { return kPalette[i % 8]; }
std::string dashOf(unsigned i) {
  static const char *const dashes[] = {"", "6 3", "2 2", "8 3 2 3"};
  return dashes[(i / 8) % 4];
}

} // namespace mtp::report
