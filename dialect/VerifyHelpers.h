//===- VerifyHelpers.h - The checks op verifiers share ----------*- C++ -*-===//
//
// Dialect-internal: the shape, rank and type checks of the verifiers in
// DFlashOps.cpp and DFlashMoeOps.cpp. Every message starts with the
// constraint it checks, "(Cn) ...", so that the negative tests can pin it.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_DIALECT_VERIFYHELPERS_H
#define DFLASH_DIALECT_VERIFYHELPERS_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mlir::dflash::verify {

inline std::string shapeString(ArrayRef<int64_t> shape) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "[";
  llvm::interleave(shape, os, "x");
  os << "]";
  return s;
}

/// A double as "%g" writes it ("-1", "1e-06"), for messages.
inline std::string formatDouble(double v) {
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%g", v);
  return s;
}

inline RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// Emits "(Cn) <what> must have shape [..] but has [..]" unless `v` has
/// exactly `shape`.
inline LogicalResult expectShape(Operation *op, StringRef c, StringRef what,
                                 Value v, ArrayRef<int64_t> shape) {
  ArrayRef<int64_t> actual = tensorType(v).getShape();
  if (actual == shape)
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " must have shape "
                           << shapeString(shape) << " but has "
                           << shapeString(actual);
}

inline LogicalResult expectRank(Operation *op, StringRef c, StringRef what,
                                Value v, int64_t rank) {
  int64_t actual = tensorType(v).getRank();
  if (actual == rank)
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " must have rank "
                           << rank << " but has rank " << actual;
}

inline LogicalResult expectSameType(Operation *op, StringRef c, StringRef what,
                                    Value a, StringRef whatB, Value b) {
  if (a.getType() == b.getType())
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " (" << a.getType()
                           << ") and " << whatB << " (" << b.getType()
                           << ") must have the same type";
}

inline LogicalResult expectSameElementType(Operation *op, StringRef c,
                                           StringRef what, Value a,
                                           StringRef whatB, Value b) {
  if (tensorType(a).getElementType() == tensorType(b).getElementType())
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " and " << whatB
                           << " must have the same element type";
}

inline LogicalResult expectAtLeast(Operation *op, StringRef c, StringRef what,
                                   int64_t value, int64_t min) {
  if (value >= min)
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " is " << value
                           << " but must be at least " << min;
}

/// A unary transform's attributes (docs/semantics.md section 13, "Unary
/// logits"): multiplier > 0, softcap 0 (none) or positive.
inline LogicalResult expectUnaryTransform(Operation *op, StringRef c,
                                          double multiplier, double softcap) {
  if (!(multiplier > 0))
    return op->emitOpError()
           << "(" << c << ") multiplier is " << formatDouble(multiplier)
           << " but must be positive";
  if (!(softcap >= 0))
    return op->emitOpError()
           << "(" << c << ") softcap is " << formatDouble(softcap)
           << " but must be 0 (none) or positive";
  return success();
}

} // namespace mlir::dflash::verify

#endif // DFLASH_DIALECT_VERIFYHELPERS_H
