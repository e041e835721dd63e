//===- GraphBuilding.h - What both importers build the same way -*- C++ -*-===//
//
// The drafter's step (ImportSpec) and the online target (ImportTarget) write
// the same dense ops and declare their function arguments the same way:
// each op's result type is derived from its operands here, and a function's
// arguments are gathered (type, #dflash.arg, location) before it exists.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_IMPORT_GRAPHBUILDING_H
#define DFLASH_COMPILER_IMPORT_GRAPHBUILDING_H

#include "dialect/DFlashOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace dflash::import {

/// x [.., K] w [N, K]^T: [.., N].
inline mlir::Value linear(mlir::OpBuilder &b, mlir::Location l, mlir::Value x,
                          mlir::Value w) {
  auto xt = llvm::cast<mlir::RankedTensorType>(x.getType());
  auto wt = llvm::cast<mlir::RankedTensorType>(w.getType());
  llvm::SmallVector<int64_t> shape(xt.getShape().drop_back());
  shape.push_back(wt.getDimSize(0));
  return mlir::dflash::LinearOp::create(
      b, l, mlir::RankedTensorType::get(shape, xt.getElementType()), x, w);
}

inline mlir::Value rmsNorm(mlir::OpBuilder &b, mlir::Location l, mlir::Value x,
                           mlir::Value w, double eps) {
  return mlir::dflash::RmsNormOp::create(b, l, x.getType(), x, w,
                                         b.getF64FloatAttr(eps));
}

inline mlir::Value reshape(mlir::OpBuilder &b, mlir::Location l, mlir::Value x,
                           llvm::ArrayRef<int64_t> shape) {
  auto xt = llvm::cast<mlir::RankedTensorType>(x.getType());
  return mlir::dflash::ReshapeOp::create(
      b, l, mlir::RankedTensorType::get(shape, xt.getElementType()), x);
}

/// The arguments of a function before it is created, in order.
struct FunctionArguments {
  llvm::SmallVector<mlir::Type> types;
  llvm::SmallVector<mlir::Attribute> roles;
  llvm::SmallVector<mlir::Location> locations;

  /// Declares one; returns its index.
  unsigned add(mlir::MLIRContext &ctx, mlir::Type type,
               mlir::dflash::ArgRole role, llvm::StringRef name,
               mlir::Location l) {
    types.push_back(type);
    roles.push_back(mlir::dflash::ArgAttr::get(&ctx, role, name));
    locations.push_back(l);
    return types.size() - 1;
  }

  /// Gives `func`'s arguments their #dflash.arg and its new entry block's
  /// arguments their locations; returns the entry block.
  mlir::Block *addEntryBlock(mlir::func::FuncOp func) const {
    for (unsigned i = 0; i < roles.size(); ++i)
      func.setArgAttr(i, mlir::dflash::kArgAttrName, roles[i]);
    mlir::Block *entry = func.addEntryBlock();
    for (unsigned i = 0; i < locations.size(); ++i)
      entry->getArgument(i).setLoc(locations[i]);
    return entry;
  }
};

} // namespace dflash::import

#endif // DFLASH_COMPILER_IMPORT_GRAPHBUILDING_H
