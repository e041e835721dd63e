//===- Passes.td - dflash compiler passes ------------------*- tablegen -*-===//

#ifndef DFLASH_TRANSFORMS_PASSES_TD
#define DFLASH_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def GenerateBackward : Pass<"dflash-generate-backward", "mlir::ModuleOp"> {
  let summary = "Reverse-mode autodiff of the step's forward graph";
  let description = [{
    Differentiates `@step`'s `loss_sum` result with respect to every
    `parameter` argument through the `DifferentiableOpInterface` of the ops
    on the path from a parameter to the loss (never the frozen embedding and
    lm_head, the data or the target features). The seed `d objective /
    d loss_sum` becomes a new argument `loss_sum_grad`; the gradients become
    new results, in parameter order. Gradients of a value used more than once
    are summed with `dflash.add`.

    Before:
    ```mlir
    func.func @step(%x: ... {dflash.arg = #dflash.arg<input, "target_hidden">},
                    %w: ... {dflash.arg = #dflash.arg<parameter, "fc.weight">}, ...)
        -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}, ...) {
      %h = dflash.linear %x, %w : ...
      ...
      %loss_sum, %wsum, %correct, %count = dflash.lm_head_ce %y, ...
      return %loss_sum, %wsum, %correct, %count : ...
    }
    ```
    After:
    ```mlir
    func.func @step(%x: ..., %w: ..., ...,
                    %seed: tensor<f32> {dflash.arg = #dflash.arg<input, "loss_sum_grad">})
        -> (..., tensor<256x512xbf16> {dflash.arg = #dflash.arg<gradient, "fc.weight">}) {
      ...forward...
      %dy = dflash.lm_head_ce_grad %y, %lm_head, %labels, %weights, %seed : ...
      ...
      %dw = dflash.linear_grad_weight %dh, %x : ...
      return %loss_sum, %wsum, %correct, %count, %dw : ...
    }
    ```
  }];
  let dependentDialects = ["::mlir::dflash::DFlashDialect"];
}

def MakeEvalProgram : Pass<"dflash-make-eval-program", "mlir::ModuleOp"> {
  let summary = "Forward graph to the evaluation program: its sums, summed "
                "over the GPUs";
  let description = [{
    Turns the forward graph `@step` into `@eval`, the program `train
    --eval-data` runs over held-out rows: the same forward, no backward and
    no update, and its results (the schema's `ForwardSum`: `loss_sum`,
    `weight_sum`, `correct`, `count`, `run_sum`, `kept_blocks`,
    `position_hits`, `position_counts` and the four `bucket_*` sums per
    anchor-position bucket) all-reduced over the GPUs, so that
    the runtime adds up global sums batch by batch and divides once at the
    end. After the sums it also returns, for each micro-batch, the hits and
    weights of every draft slot that its `dflash.draft_acceptance` reads
    (the schema's `DraftSlots`: `draft_hits` [B, N*bs] i8, `draft_weights`
    [B, N*bs] f32), this GPU's own: the runtime walks them on the host for
    the serving-order acceptance (docs/runtime.md, "Serving tau"). Being
    results, they live to the end of the program and are copied into
    buffers of their own, which the memory plan never reuses. The lowering
    then runs on `@eval` as on a step (`dflash-lower-eval-to-kernels`).

    After:
    ```mlir
    func.func @eval(...) -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}, ...,
        tensor<4x64xi8> {dflash.arg = #dflash.arg<metric, "draft_hits">},
        tensor<4x64xf32> {dflash.arg = #dflash.arg<metric, "draft_weights">}) {
      ...forward...
      %run_sum, %kept_blocks, %hits_k, %counts_k, %b_runs, %b_blocks,
          %b_hits, %b_counts = dflash.draft_acceptance %hits, %weights, ...
      %sums:12 = dflash.all_reduce %loss_sum, ..., %b_counts : ...
      return %sums#0, ..., %sums#11, %hits, %weights : ...
    }
    ```
  }];
  let dependentDialects = ["::mlir::dflash::DFlashDialect"];
}

def AppendOptimizer : Pass<"dflash-append-optimizer", "mlir::ModuleOp"> {
  let summary = "Global loss normalisation, gradient all-reduce, clip, AdamW";
  let description = [{
    Closes the step of docs/semantics.md sections 4 and 5 after
    `dflash-generate-backward`: the four forward sums are all-reduced once
    and `dflash.loss_stats` gives the global loss, accuracy and the backward
    seed `1 / sum(w)`, which replaces the `loss_sum_grad` argument. The bf16
    gradients are converted to fp32 and all-reduced, their global norm gives
    the clip coefficient, `dflash.lr_schedule` the learning rate at the
    `step` argument, and one `dflash.adamw` per parameter updates its fp32
    master and Adam moments (new arguments) and writes back the bf16
    parameter. Hyperparameters come from the module's `dflash.optimizer`.

    After (one parameter shown):
    ```mlir
    func.func @step(..., %p: tensor<256xbf16> {dflash.arg = #dflash.arg<parameter, "norm.weight">},
                    %p32: tensor<256xf32> {dflash.arg = #dflash.arg<master, "norm.weight">},
                    %m: tensor<256xf32> {dflash.arg = #dflash.arg<moment1, "norm.weight">},
                    %v: tensor<256xf32> {dflash.arg = #dflash.arg<moment2, "norm.weight">},
                    %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                    %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total_steps">}) -> (...) {
      %ls, %ws, %c, %n = dflash.lm_head_ce ...
      %gls, %gws, %gc, %gn = dflash.all_reduce %ls, %ws, %c, %n : ...
      %loss, %acc, %seed = dflash.loss_stats %gls, %gws, %gc, %gn : ...
      ...backward seeded by %seed...
      %g32 = dflash.convert %g : (tensor<256xbf16>) -> tensor<256xf32>
      %gsum = dflash.all_reduce %g32 : ...
      %norm = dflash.global_norm %gsum : (tensor<256xf32>) -> tensor<f32>
      %clip = dflash.clip_coefficient %norm {max_norm = 1.0 : f64} : ...
      %lr = dflash.lr_schedule %step, %total {lr = 6.0e-04 : f64, warmup_ratio = 4.0e-02 : f64} : ...
      %p32n, %mn, %vn, %pn = dflash.adamw %p32, %gsum, %m, %v, %step, %lr, %clip {...} : ...
      return %pn, %p32n, %mn, %vn, %loss, %acc, %norm, %lr : ...
    }
    ```
  }];
  let dependentDialects = ["::mlir::dflash::DFlashDialect"];
}

def PrintFlops : Pass<"dflash-print-flops", "mlir::ModuleOp"> {
  let summary = "Print the FLOPs of the step by phase and op kind";
  let description = [{
    Prints, for `@step`, the FLOPs of every op kind in each phase: forward,
    backward (ops that depend on the loss gradient) and optimizer, then the
    totals. The benchmarks divide by these numbers.

    ```
    flops forward dflash.linear 1234567
    flops backward dflash.linear_grad_input 1234567
    flops total forward=... backward=... optimizer=... step=...
    ```
  }];
}

def FuseKernels : Pass<"dflash-fuse-kernels", "mlir::ModuleOp"> {
  let summary = "Group graph ops into kernels and pick each kernel's template";
  let description = [{
    Rewrites the training step (after `dflash-append-optimizer`) so that
    each op is one kernel of kernels/ or one cuBLASLt call: a linear layer's
    output added to the residual stream in the GEMM's epilogue, residual add
    and RMS norm, per-head norm and RoPE (and their gradients), the residual
    stream's gradient, gradient accumulation into GEMMs (beta = 1), the
    draft embedding gather, lm_head with the cross-entropy and its gradient
    (chunked; logits never materialised for the whole batch; a DFlash2
    drafter's `selector_candidates` of the same operands and the same unary
    transform folded in, its top-K kept from the same logits) and the whole
    optimizer. See docs/dialect.md for the fused ops.

    Before:
    ```mlir
    %o = dflash.linear %a, %wo : ...
    %x1 = dflash.add %x, %o : ...
    %h = dflash.rms_norm %x1, %w {eps = 1.0e-06 : f64} : ...
    %x2 = dflash.add %x1, %e : ...
    %h2 = dflash.rms_norm %x2, %w2 {eps = 1.0e-06 : f64} : ...
    ```
    After (`%e` is not a linear layer's output):
    ```mlir
    %x1 = dflash.linear_residual %x, %a, %wo : ...
    %h = dflash.rms_norm %x1, %w {eps = 1.0e-06 : f64} : ...
    %x2, %h2 = dflash.residual_rms_norm %x1, %e, %w2 {eps = 1.0e-06 : f64} : ...
    ```
    With the module's `dflash.fuse_target_mlp` (spec `[memory]
    fuse_target_mlp`, the online target's program) or `linear-swiglu=true`,
    `swiglu(linear(x, Wg), linear(x, Wu))` whose products nothing else reads
    becomes one `dflash.linear_swiglu`. Off by default: on the H200 that GEMM
    ran 1-2% slower in the target's forward than cuBLASLt's two GEMMs and the
    SwiGLU pass (bench/RESULTS.md).
  }];
  let options = [
    Option<"linearSwiglu", "linear-swiglu", "bool", "false",
           "Form dflash.linear_swiglu even without the module attribute">
  ];
  let dependentDialects = ["::mlir::dflash::DFlashDialect"];
}

def InterleaveMicroBatches
    : Pass<"dflash-interleave-micro-batches", "mlir::ModuleOp"> {
  let summary = "Run each micro-batch's forward and backward before the "
                "next (gradient accumulation)";
  let description = [{
    After `dflash-fuse-kernels`, for a step of K > 1 micro-batches (spec
    `[training] gradient_accumulation`; the importer cuts the inputs with
    `dflash.row_slice`): reorders the step so that micro-batch K-1 runs its
    forward and backward pass first, then K-2, down to 0, each one's
    activations dead before the next starts. What reads no micro-batch (the
    step's labels and weights, the loss seed over all of them) comes first;
    every other op goes with the latest micro-batch it reads, so the adds
    of the gradients and of the forward sums, and the optimizer, go with
    micro-batch 0. A stable sort: within a micro-batch the order is the one
    the ops had. A step without row slices is left as it is.

    ```mlir
    %w = ... draft_targets (all rows)
    %f0 = ... forward of rows 0-1      %seed = dflash.loss_seed %w
    %f1 = ... forward of rows 2-3      %f1 = ... forward of rows 2-3
    %s = dflash.add %s0, %s1           %g1 = ... backward of rows 2-3
    %g1 = ... backward of rows 2-3     %f0 = ... forward of rows 0-1
    %g0 = ... backward of rows 0-1     %s = dflash.add %s0, %s1
    %g = accumulate %g1 ...            %g0 = ... backward, into %g1
    ```
  }];
  let dependentDialects = ["::mlir::dflash::DFlashDialect"];
}

def RecomputeActivations
    : Pass<"dflash-recompute-activations", "mlir::ModuleOp"> {
  let summary = "Recompute cheap activations in the backward pass instead "
                "of keeping them";
  let description = [{
    After `dflash-fuse-kernels`, with the module's
    `dflash.recompute_activations` (spec `[memory] recompute_activations`)
    or `--dflash-recompute-activations=enabled=true`: every `rms_norm`,
    `qk_norm_rope` and `swiglu` of the forward pass (before
    `lm_head_ce_fused`) whose result the backward pass reads is computed
    again right before its first backward reader, which reads the copy. The
    forward result then dies after its last forward reader. Their inputs
    stay live anyway (their own gradients read them), so each recomputation
    costs one memory-bound pass and frees a stored tensor: for qwen3-8b-b16
    about 1.6 GB a layer. A step without lm_head_ce_fused (the evaluation,
    the online target) has no backward pass and is left as it is.

    With `dflash.recompute_mlp_products` (spec `[memory]
    recompute_mlp_products`) or `mlp-products=true`, the `linear`s whose
    result a forward `swiglu` reads (the gate and up projections) are
    computed again too: two GEMMs a layer instead of two stored [T, I]
    tensors (about 1.6 GB a layer of qwen3-8b-b16 at 4 rows). A copy that
    reads another op's copy is moved, with what it reads, before it.

    ```mlir
    %a = dflash.swiglu %g, %u : ...
    %y = dflash.linear %a, %w : ...
    ...
    %loss ... = dflash.lm_head_ce_fused ...
    ...
    %dw = dflash.linear_grad_weight %dy, %a : ...
    ```
    becomes
    ```mlir
    %a = dflash.swiglu %g, %u : ...
    %y = dflash.linear %a, %w : ...
    ...
    %a2 = dflash.swiglu %g, %u : ...
    %dw = dflash.linear_grad_weight %dy, %a2 : ...
    ```
  }];
  let options = [
    Option<"enabled", "enabled", "bool", "false",
           "Recompute the cheap activations even without the module "
           "attribute">,
    Option<"mlpProducts", "mlp-products", "bool", "false",
           "Recompute the gate and up products even without the module "
           "attribute">
  ];
  let dependentDialects = ["::mlir::dflash::DFlashDialect"];
}

def BucketGradients : Pass<"dflash-bucket-gradients", "mlir::ModuleOp"> {
  let summary = "Group the gradients into fp32 all-reduce buckets";
  let description = [{
    After `dflash-fuse-kernels`: the bf16 gradients that `dflash.adamw_multi`
    reads become the results of `dflash.gradient_bucket` ops (fp32, summed
    over every GPU), each bucket of about `bucket-mib` MiB (default: the
    module's `dflash.bucket_mib` from the spec's [parallel] bucket_mib),
    filled in the order the backward pass finishes the gradients and placed
    right after its last one, so that its all-reduce overlaps the rest of
    the backward pass.

    ```mlir
    %dw = dflash.linear_grad_weight %dy, %x : ...
    %g32:2 = dflash.gradient_bucket %dw, %dw2 : ... -> (tensor<..xf32>, ...)
    ...
    dflash.adamw_multi ... grads(%g32#0, %g32#1) ...
    ```
  }];
  let options = [
    Option<"bucketMiB", "bucket-mib", "int64_t", "0",
           "Bucket size in MiB of fp32 (0: the module's, else 64)">
  ];
  let dependentDialects = ["::mlir::dflash::DFlashDialect"];
}

def ShardOptimizerState
    : Pass<"dflash-shard-optimizer-state", "mlir::ModuleOp"> {
  let summary = "ZeRO-1: each GPU keeps and updates one shard of the "
                "optimizer state";
  let description = [{
    After `dflash-bucket-gradients`, when the optimizer state is to be
    sharded over `world-size` GPUs (default: the module's
    `dflash.shard_optimizer_state`, from the spec's [parallel]
    shard_optimizer_state and its GPU count; without either the pass does
    nothing). Each gradient bucket gets `world_size` and `shard_elements`
    S (its flat fp32 range over the GPUs, rounded up to 64 elements) and
    becomes a reduce-scatter; the per-tensor `master`, `moment1` and
    `moment2` arguments and results of @step are replaced by one of each per
    bucket (`#dflash.arg<master, "bucket.K">`, `tensor<S x f32>`), and
    `dflash.adamw_multi` by `dflash.adamw_sharded`, which updates this GPU's
    shards and all-gathers the parameters.

    ```mlir
    %g:2 = dflash.gradient_bucket %da, %db
        {shard_elements = 2048 : i64, world_size = 4 : i64} : ...
    %s:5, %norm, %lr = dflash.adamw_sharded params(%a, %b) grads(%g#0, %g#1)
        masters(%m) moment1(%m1) moment2(%m2) step(%t) total(%n) ...
    ```
  }];
  let options = [
    Option<"worldSize", "world-size", "int64_t", "0",
           "GPUs to shard over (0: the module's dflash.shard_optimizer_state)">
  ];
  let dependentDialects = ["::mlir::dflash::DFlashDialect"];
}

def SelectKernels : Pass<"dflash-select-kernels", "mlir::ModuleOp"> {
  let summary = "Pick each kernel op's kernel, constants and scratch sizes";
  let description = [{
    Runs after the kernel grouping passes (fuse-kernels, bucket-gradients,
    shard-optimizer-state) and before dflash-plan-memory. Every kernel op
    gets `dflash.kernel = #dflash.kernel<...>`: the entry point of kernels/
    that runs it, its template constants, the scratch bytes it needs while
    it runs (`workspace`) and the bytes it keeps across steps (`tables`),
    all from the plain headers the kernels use (kernels/AttentionLimits.h,
    kernels/Workspaces.h, kernels/AdamWTables.h). Where two kernels compute
    the same op, the shape decides (the warp-specialised attention forward
    for long contexts); a kernel that has not passed its GPU test
    (schema/KernelEntryPoints.h, kUnvalidatedKernels) is picked only with
    `allow-unvalidated-kernels`. A shape no kernel supports
    is an error that names the spec field: a head dim the attention kernels
    lack, too many query rows per block, an attention backward whose shared
    memory exceeds a CTA's for the anchors per row, a hidden size or head
    dim the vector loads cannot split.

    Before:
    ```mlir
    %dx, %dw = dflash.rms_norm_grad %dy, %x, %w {eps = 1.0e-06 : f64} : ...
    ```
    After:
    ```mlir
    %dx, %dw = dflash.rms_norm_grad %dy, %x, %w {eps = 1.0e-06 : f64,
        dflash.kernel = #dflash.kernel<name = "rms_norm_bwd_bf16",
            constants = [256], workspace = 405504, tables = 0>} : ...
    ```
  }];
  let options = [
    Option<"allowUnvalidatedKernels", "allow-unvalidated-kernels", "bool",
           "false",
           "Also pick kernels that have not passed their GPU tests yet (for "
           "trainers built to run those tests)">,
    ListOption<"allowUnvalidatedKernelNames", "allow-unvalidated-kernel",
               "std::string",
               "Also pick these kernels before their GPU tests have passed "
               "(for a trainer that times one against the step it would "
               "replace)">
  ];
}

def PrintKernels : Pass<"dflash-print-kernels", "mlir::ModuleOp"> {
  let summary = "Print each op's kernel, constants and scratch";
  let description = [{
    One line per kernel op, in program order:
    `kernel <op> <name>[<constants>] workspace=<bytes> tables=<bytes>`
    followed by ` at <spec location name>` when the op has one; for review
    as a lit diff.
  }];
}

def PlanMemory : Pass<"dflash-plan-memory", "mlir::ModuleOp"> {
  let summary = "Static arena offsets from liveness; checks the memory budget";
  let description = [{
    Gives every tensor the step computes a static offset in one per-GPU
    arena: values whose lifetimes do not overlap share bytes (greedy,
    largest first, 256-byte aligned). Views and in-place updates share their
    source's bytes: a reshape, an accumulated gradient whose accumulator dies
    there, and the optimizer's new state, written over its argument. Each op
    gets `dflash.offsets` (one per result: the arena offset, or -(i+1) when
    the result is written into argument i); the module gets
    `dflash.arena_bytes`. After dflash-select-kernels, an op's `workspace`
    is a slot live during that op only (`dflash.workspace_offset`) and its
    `tables` a slot live through the whole step (`dflash.tables_offset`):
    every byte the step uses is in the plan, with its exact size.

    With a budget (`budget-gib`, or the module's `dflash.memory_budget_gib`
    from the spec), the arguments, the arena and the kernels' workspaces
    must fit, or the pass fails with the sizes and the rows per GPU that
    would fit.

    ```mlir
    %0 = dflash.linear %a, %w {dflash.offsets = array<i64: 0>} : ...
    module attributes {dflash.arena_bytes = 1048576 : i64} ...
    ```
  }];
  let options = [
    Option<"budgetGiB", "budget-gib", "double", "0",
           "GPU memory budget in GiB (0: the module's, else none)">
  ];
}

def PrintMemoryPlan : Pass<"dflash-print-memory-plan", "mlir::ModuleOp"> {
  let summary = "Print the arena plan: slot, offset, size, live range";
  let description = [{
    One line per planned value, in program order:
    `slot <op>#<result> offset=<bytes> size=<bytes> live=[<def>, <last use>]`,
    then `arena <bytes>` and the peak; for review as a lit diff.
  }];
}

def VerifyLowering : Pass<"dflash-verify-lowering", "mlir::ModuleOp"> {
  let summary = "Check that only ops the CUDA emitter translates remain";
  let description = [{
    Fails on any op of @step that is not one kernel (a graph op that
    dflash-fuse-kernels should have grouped, such as dflash.lm_head_ce,
    dflash.adamw or dflash.global_norm), and on any result without a memory
    plan. Runs right before translation.
  }];
}

#endif // DFLASH_TRANSFORMS_PASSES_TD
