//===- DFlashDialect.td - The dflash dialect ---------------*- tablegen -*-===//
//
// The dialect in which a DFlash drafter's training step is written: graph-level
// ops on statically shaped tensors (forward, gradient and optimizer ops).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_DIALECT_TD
#define DFLASH_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def DFlash_Dialect : Dialect {
  let name = "dflash";
  let cppNamespace = "::mlir::dflash";
  let summary = "Training steps of DFlash block-diffusion drafters";
  let description = [{
    The `dflash` dialect describes one training step of a DFlash drafter
    (docs: docs/semantics.md) at graph level: value-semantics ops on statically
    shaped tensors. Every shape, block size and attention window is fixed when
    the module is built from a spec, so the step has no dynamic dimension.

    The step is one `func.func @step` whose arguments carry a
    `#dflash.arg<role, "name">` attribute under the key `dflash.arg` saying
    what they are: per-step data (`input`), frozen target weights (`frozen`) or
    trainable drafter weights (`parameter`, named as in the exported
    checkpoint).

    The verifier of each op checks numbered constraints, listed in
    docs/dialect.md; an error names its constraint, e.g. "(C3)".
  }];
  let useDefaultAttributePrinterParser = 1;
  let dependentDialects = ["::mlir::func::FuncDialect"];
}

class DFlash_Op<string mnemonic, list<Trait> traits = []>
    : Op<DFlash_Dialect, mnemonic, traits>;

#endif // DFLASH_DIALECT_TD
