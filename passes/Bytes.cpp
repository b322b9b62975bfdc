//===- Bytes.cpp - byte counts as a person reads them ---------------------===//

#include "passes/Bytes.h"

#include "mtprt/Format.h"

std::string mtp::formatBytes(double bytes) {
  return mtprt::formatBytes(bytes, 2);
}
