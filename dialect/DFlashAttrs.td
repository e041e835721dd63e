//===- DFlashAttrs.td - dflash attributes ------------------*- tablegen -*-===//

#ifndef DFLASH_ATTRS_TD
#define DFLASH_ATTRS_TD

include "dialect/DFlashDialect.td"
include "mlir/IR/EnumAttr.td"

def DFlash_ArgRole : I32EnumAttr<"ArgRole",
    "what a step argument or result holds", [
  I32EnumAttrCase<"Input", 0, "input">,
  I32EnumAttrCase<"Frozen", 1, "frozen">,
  I32EnumAttrCase<"Parameter", 2, "parameter">,
  I32EnumAttrCase<"Gradient", 3, "gradient">,
  I32EnumAttrCase<"Master", 4, "master">,
  I32EnumAttrCase<"Moment1", 5, "moment1">,
  I32EnumAttrCase<"Moment2", 6, "moment2">,
  I32EnumAttrCase<"Counter", 7, "counter">,
  I32EnumAttrCase<"Metric", 8, "metric">
]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::mlir::dflash";
}

def DFlash_ArgAttr : AttrDef<DFlash_Dialect, "Arg"> {
  let mnemonic = "arg";
  let summary = "Role and name of a step function argument or result";
  let description = [{
    Attached to each argument and result of `@step` under the key
    `dflash.arg`, so that the runtime can bind buffers by meaning. `role` says
    what the value holds:
    - `input`: per-step data (`input_ids`, `loss_mask`, `target_hidden`,
      `anchors`, `keep`), or `loss_sum_grad`, the seed of the backward pass;
    - `frozen`: a target weight (`embed`, `lm_head`);
    - `parameter`: a trainable bf16 weight, named as in the exported
      checkpoint (`layers.0.self_attn.q_proj.weight`);
    - `gradient`: a parameter's gradient (result of the backward pass);
    - `master`, `moment1`, `moment2`: its fp32 master copy and Adam moments;
    - `counter`: `step` (0-based optimizer step) and `total_steps`;
    - `metric`: a reported scalar (`loss`, `acc`, `grad_norm`, `lr`, or the
      forward sums `loss_sum`, `weight_sum`, `correct`, `count`).

    ```mlir
    func.func @step(%fc: tensor<256x512xbf16>
                    {dflash.arg = #dflash.arg<parameter, "fc.weight">})
    ```
  }];
  let parameters = (ins EnumParameter<DFlash_ArgRole>:$role,
                        StringRefParameter<"the argument's name">:$name);
  let assemblyFormat = "`<` $role `,` $name `>`";
}

def DFlash_OptimizerAttr : AttrDef<DFlash_Dialect, "Optimizer"> {
  let mnemonic = "optimizer";
  let summary = "AdamW hyperparameters and learning-rate schedule of a step";
  let description = [{
    Attached to the module under `dflash.optimizer` by the importer, from the
    spec's [optimizer] table; `dflash-append-optimizer` reads it.

    ```mlir
    module attributes {dflash.optimizer = #dflash.optimizer<
        lr = 6.0e-04 : f64, warmup_ratio = 4.0e-02 : f64,
        max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
        eps = 1.0e-08 : f64, weight_decay = 0.0 : f64>} {}
    ```
  }];
  let parameters = (ins "FloatAttr":$lr, "FloatAttr":$warmup_ratio,
                        "FloatAttr":$max_grad_norm, "FloatAttr":$beta1,
                        "FloatAttr":$beta2, "FloatAttr":$eps,
                        "FloatAttr":$weight_decay);
  let assemblyFormat = "`<` struct(params) `>`";
}

def DFlash_KernelAttr : AttrDef<DFlash_Dialect, "Kernel"> {
  let mnemonic = "kernel";
  let summary = "The kernel that runs an op, its constants and its scratch";
  let description = [{
    Attached to every kernel-level op under `dflash.kernel` by
    `dflash-select-kernels`: `name` is the entry point in kernels/ (or
    `cublaslt_gemm`), `constants` its template arguments in order (bools as
    0 and 1), `workspace` the bytes of scratch it needs while it runs and
    `tables` the bytes it keeps across steps (the optimizer's device
    tables). Both sizes come from kernels/Workspaces.h and
    kernels/AdamWTables.h, the headers the kernels use too;
    `dflash-plan-memory` gives each its arena slot. The emitter prints the
    call from this attribute and decides nothing.

    ```mlir
    %dx, %dw = dflash.rms_norm_grad %dy, %x, %w {eps = 1.0e-06 : f64,
        dflash.kernel = #dflash.kernel<name = "rms_norm_bwd_bf16",
                                       constants = [256],
                                       workspace = 405504, tables = 0>} : ...
    ```
  }];
  let parameters = (ins StringRefParameter<"the kernel's entry point">:$name,
                        "DenseI64ArrayAttr":$constants,
                        "int64_t":$workspace,
                        "int64_t":$tables);
  let assemblyFormat = "`<` struct(params) `>`";
}

def DFlash_YarnAttr : AttrDef<DFlash_Dialect, "Yarn"> {
  let mnemonic = "yarn";
  let summary = "YaRN's rope scaling of the drafter's RoPE";
  let description = [{
    On `dflash.rope`, `dflash.rope_grad`, `dflash.qk_norm_rope` and
    `dflash.qk_norm_rope_grad` under `yarn`, from the spec's
    [drafter.rope_scaling]: the frequencies and the factor on cos and sin of
    `dflash.yarn_rope` (whose attributes these are), so the rotation and its
    transpose use YaRN's.

    ```mlir
    %qr = dflash.rope %qn, %pos {theta = 1.0e+06 : f64,
        yarn = #dflash.yarn<factor = 4.0 : f64, beta_fast = 32.0 : f64,
                            beta_slow = 1.0 : f64,
                            original_max_positions = 32768,
                            truncate = true,
                            attention_factor = 1.1386294361119891 : f64>}
        : (tensor<4x8192x32x128xbf16>, tensor<4x8192xi32>)
        -> tensor<4x8192x32x128xbf16>
    ```
  }];
  let parameters = (ins "FloatAttr":$factor, "FloatAttr":$beta_fast,
                        "FloatAttr":$beta_slow,
                        "int64_t":$original_max_positions, "bool":$truncate,
                        "FloatAttr":$attention_factor);
  let assemblyFormat = "`<` struct(params) `>`";
}

#endif // DFLASH_ATTRS_TD
