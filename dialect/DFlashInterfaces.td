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

#endif // DFLASH_INTERFACES_TD
