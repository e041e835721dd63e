//===- DFlashAttrs.td - dflash attributes ------------------*- tablegen -*-===//

#ifndef DFLASH_ATTRS_TD
#define DFLASH_ATTRS_TD

include "dialect/DFlashDialect.td"
include "mlir/IR/EnumAttr.td"

def DFlash_ArgRole : I32EnumAttr<"ArgRole", "what a step argument holds", [
  I32EnumAttrCase<"Input", 0, "input">,
  I32EnumAttrCase<"Frozen", 1, "frozen">,
  I32EnumAttrCase<"Parameter", 2, "parameter">
]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::mlir::dflash";
}

def DFlash_ArgAttr : AttrDef<DFlash_Dialect, "Arg"> {
  let mnemonic = "arg";
  let summary = "Role and name of a step function argument";
  let description = [{
    Attached to each argument of `@step` under the key `dflash.arg`. `role`
    says whether the argument is per-step data, a frozen target weight or a
    trainable parameter; `name` is its name in data shards (`input_ids`), in
    the target directory (`embed`, `lm_head`) or in the exported checkpoint
    (`layers.0.self_attn.q_proj.weight`).

    ```mlir
    func.func @step(%fc: tensor<256x512xbf16>
                    {dflash.arg = #dflash.arg<parameter, "fc.weight">})
    ```
  }];
  let parameters = (ins EnumParameter<DFlash_ArgRole>:$role,
                        StringRefParameter<"the argument's name">:$name);
  let assemblyFormat = "`<` $role `,` $name `>`";
}

#endif // DFLASH_ATTRS_TD
