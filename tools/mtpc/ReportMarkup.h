//===- ReportMarkup.h - `mtpc report`: text and numbers in HTML -*- C++ -*-===//
//
// What every part of the page writes with: the escaping, the number formats
// (data attributes, coordinates, labels), the unit for a byte axis, the
// series colours, and Markup, the stream the page is written to.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_TOOLS_MTPC_REPORTMARKUP_H
#define MTPC_TOOLS_MTPC_REPORTMARKUP_H

#include "ReportData.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mtp::report {

/// Text for HTML (llvm::printHTMLEscaped): & < > " ' as entities.
std::string esc(llvm::StringRef s);

/// A number for data attributes and JSON: 9 significant digits, as the
/// runtime writes them; null when not finite.
std::string num(double v);
std::string num(Opt v);
/// Coordinates: two decimals are finer than a pixel.
std::string px(double v);
/// A number for a person: `digits` significant digits (%g).
std::string fmtG(double v, int digits = 4);
/// `s` as a JSON string literal.
std::string jsonString(llvm::StringRef s);
/// JSON inside <script>: "</" would end the element.
std::string scriptSafe(std::string s);

/// The unit of a chart's byte axis: the largest binary unit below its top.
struct ByteUnit {
  llvm::StringRef name;
  double scale;
};
ByteUnit byteUnitFor(double maxBytes);

/// Okabe & Ito's colour-blind-safe palette, the yellow last (weak on white).
inline const char *const kPalette[] = {"#0072B2", "#E69F00", "#009E73",
                                       "#D55E00", "#CC79A7", "#56B4E9",
                                       "#000000", "#F0E442"};
/// The colour of series `i` (task i's in every chart).
std::string colorOf(unsigned i);
/// Past eight series the colours repeat with a dash pattern.
std::string dashOf(unsigned i);

/// The page's output stream: doubles print as "%.6g" (raw_ostream writes
/// them as "%e"), everything else as raw_ostream does.
class Markup {
public:
  explicit Markup(llvm::raw_ostream &os) : os(os) {}
  template <typename T> Markup &operator<<(const T &v) {
    os << v;
    return *this;
  }
  Markup &operator<<(double v) {
    os << llvm::format("%.6g", v);
    return *this;
  }

private:
  llvm::raw_ostream &os;
};

} // namespace mtp::report

#endif // MTPC_TOOLS_MTPC_REPORTMARKUP_H
