//===- DFlashDialect.cpp - dflash dialect registration --------------------===//

#include "dialect/DFlashDialect.h"
#include "dialect/DFlashOps.h"

#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::dflash;

#include "dialect/DFlashDialect.cpp.inc"
#include "dialect/DFlashEnums.cpp.inc"
#include "dialect/DFlashInterfaces.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/DFlashAttrs.cpp.inc"

void DFlashDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialect/DFlashOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialect/DFlashAttrs.cpp.inc"
      >();
}
