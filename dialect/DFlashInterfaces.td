//===- DFlashInterfaces.td - dflash op interfaces ----------*- tablegen -*-===//

#ifndef DFLASH_INTERFACES_TD
#define DFLASH_INTERFACES_TD

include "mlir/IR/OpBase.td"

def DFlash_FlopCountOpInterface : OpInterface<"FlopCountOpInterface"> {
  let cppNamespace = "::mlir::dflash";
  let description = [{
    Floating-point operations of one execution of an op, as the benchmarks
    count them: a multiply-add is 2. Attention counts the pairs a query can see
    (docs/dialect.md says how anchors are averaged), elementwise ops count
    their arithmetic. Ops that only move data count 0.
  }];
  let methods = [
    InterfaceMethod<"Floating-point operations of one execution.",
                    "int64_t", "getFlopCount", (ins)>
  ];
}

def DFlash_DifferentiableOpInterface
    : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::mlir::dflash";
  let description = [{
    The vector-Jacobian product of an op, used by `dflash-generate-backward`.
    Given one gradient per result (a null Value where a result gets none,
    which counts as zero), builds the ops that compute the gradient of every
    operand and returns one Value per operand, null for operands that have
    no gradient (indices, flags, frozen tables). Builders may create
    gradients nobody needs; the pass erases them when dead.
  }];
  let methods = [
    InterfaceMethod<"Builds the operand gradients from the result gradients.",
      "::llvm::SmallVector<::mlir::Value>", "buildVJP",
      (ins "::mlir::OpBuilder &":$builder,
           "::llvm::ArrayRef<::mlir::Value>":$resultGradients)>
  ];
}

#endif // DFLASH_INTERFACES_TD
