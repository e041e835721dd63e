//===- HumanUnits.h - Byte counts as people read them -----------*- C++ -*-===//
//
// The sizes the compiler's tools print (dflashc --summary, dflash-reference's
// estimate): one way of writing them, so that the two agree.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_SUPPORT_HUMANUNITS_H
#define DFLASH_COMPILER_SUPPORT_HUMANUNITS_H

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace dflash {

/// `bytes` in binary units with one decimal: "57.1 GiB", "96.0 KiB".
inline std::string humanBytes(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (bytes >= 1024 && i < 5) {
    bytes /= 1024;
    ++i;
  }
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%.1f ", bytes) << units[i];
  return s;
}

} // namespace dflash

#endif // DFLASH_COMPILER_SUPPORT_HUMANUNITS_H
