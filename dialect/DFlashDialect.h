//===- DFlashDialect.h - The dflash dialect ---------------------*- C++ -*-===//

#ifndef DFLASH_DIALECT_DFLASHDIALECT_H
#define DFLASH_DIALECT_DFLASHDIALECT_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Dialect.h"

#include "dialect/DFlashDialect.h.inc"

#endif // DFLASH_DIALECT_DFLASHDIALECT_H
