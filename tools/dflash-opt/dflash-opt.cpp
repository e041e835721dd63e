//===- dflash-opt.cpp - Runs dflash passes on MLIR files ------------------===//

#include "compiler/Pipelines/Pipelines.h"
#include "dialect/DFlashOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::dflash::DFlashDialect, mlir::func::FuncDialect>();
  mlir::registerTransformsPasses();
  dflash::registerDFlashPassesAndPipelines();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "dflash-opt: runs dflash passes on MLIR files\n", registry));
}
