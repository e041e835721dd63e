//===- DFlashKernelOps.td - dflash fused kernel ops --------*- tablegen -*-===//
//
// Ops that `dflash-fuse-kernels` forms from groups of graph ops. Each one is
// exactly one kernel template of kernels/ (or one cuBLASLt call), so the
// emitter translates it 1:1. Graph ops that already are one kernel (linear,
// block_attention, swiglu, ...) stay as they are.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNEL_OPS_TD
#define DFLASH_KERNEL_OPS_TD

def DFlash_DraftEmbedOp : DFlash_PureOp<"draft_embed"> {
  let summary = "draft_tokens + embed in one gather";
  let description = [{
    The embedding of the noised draft blocks, without materialising their
    token ids: `embed(table, draft_tokens(input_ids, anchors, keep))`, with
    the embed's `scale` when it has one (a DFlash2 drafter's
    `input_embedding_scale`): the rows times `scale` in fp32, rounded once.

    ```mlir
    %x = dflash.draft_embed %embed, %ids, %anchors, %keep
        {block_size = 16 : i64, mask_token_id = 151669 : i64}
        : (tensor<151936x4096xbf16>, tensor<4x3072xi32>, tensor<4x512xi32>,
           tensor<4x512xi8>) -> tensor<4x8192x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$table, DFlash_IndexTensor:$input_ids,
                       DFlash_IndexTensor:$anchors, DFlash_FlagTensor:$keep,
                       I64Attr:$block_size, I64Attr:$mask_token_id,
                       OptionalAttr<F64Attr>:$scale);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$table `,` $input_ids `,` $anchors `,` $keep attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_LinearResidualOp : DFlash_PureOp<"linear_residual"> {
  let summary = "A linear layer's output added to the residual stream";
  let description = [{
    `result = residual + linear(input, weight)`: one GEMM whose epilogue adds
    the residual (cuBLASLt's C operand, beta = 1) and rounds once, so the
    linear's own output is never stored. The result reuses the residual's
    buffer when nothing else reads the residual.

    ```mlir
    %h1 = dflash.linear_residual %h, %attn, %wo
        : (tensor<4x8192x4096xbf16>, tensor<4x8192x4096xbf16>,
           tensor<4096x4096xbf16>) -> tensor<4x8192x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$residual,
                       DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$residual `,` $input `,` $weight attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_LinearSwigluOp : DFlash_PureOp<"linear_swiglu"> {
  let summary = "The MLP's gate and up projections with SwiGLU applied";
  let description = [{
    `result = swiglu(linear(input, gate_weight), linear(input, up_weight))`:
    one GEMM (kernels/SwiGluGemm.cuh) whose epilogue applies SwiGLU to the
    fp32 products and rounds once, so neither projection is stored. Only
    where nothing else reads them: the target's forward, never a layer the
    backward pass differentiates.

    ```mlir
    %a = dflash.linear_swiglu %h, %wg, %wu
        : (tensor<4x3072x4096xbf16>, tensor<12288x4096xbf16>,
           tensor<12288x4096xbf16>) -> tensor<4x3072x12288xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input,
                       DFlash_FloatTensor:$gate_weight,
                       DFlash_FloatTensor:$up_weight);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $gate_weight `,` $up_weight attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_ResidualRmsNormOp : DFlash_PureOp<"residual_rms_norm"> {
  let summary = "Residual add and RMS normalisation in one pass";
  let description = [{
    `sum = input + delta` (rounded to the storage type) and
    `result = rms_norm(sum, weight)`, reading and writing each row once.

    ```mlir
    %sum, %h = dflash.residual_rms_norm %x, %o, %w {eps = 1.0e-06 : f64}
        : (tensor<4x8192x4096xbf16>, tensor<4x8192x4096xbf16>,
           tensor<4096xbf16>)
        -> (tensor<4x8192x4096xbf16>, tensor<4x8192x4096xbf16>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$delta,
                       DFlash_FloatTensor:$weight, F64Attr:$eps);
  let results = (outs DFlash_FloatTensor:$sum, DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $delta `,` $weight attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_QkNormRopeOp : DFlash_PureOp<"qk_norm_rope"> {
  let summary = "Per-head RMS normalisation then rotary embedding";
  let description = [{
    `rope(rms_norm(input, weight), positions)` over `[B, T, heads, d]`, with
    YaRN's frequencies where `yarn` is given.

    ```mlir
    %q = dflash.qk_norm_rope %x, %w, %pos {eps = 1.0e-06 : f64,
        theta = 1.0e+06 : f64}
        : (tensor<4x8192x32x128xbf16>, tensor<128xbf16>, tensor<4x8192xi32>)
        -> tensor<4x8192x32x128xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$positions, F64Attr:$eps,
                       F64Attr:$theta, OptionalAttr<DFlash_YarnAttr>:$yarn);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $weight `,` $positions attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_QkNormRopeGradOp : DFlash_PureOp<"qk_norm_rope_grad"> {
  let summary = "Gradients of qk_norm_rope";
  let description = [{
    `rope_grad` then `rms_norm_grad` in one kernel: the input gradient and
    the norm weight's gradient (summed over rows and heads).

    ```mlir
    %dx, %dw = dflash.qk_norm_rope_grad %dy, %x, %w, %pos {...}
        : (...) -> (tensor<4x8192x32x128xbf16>, tensor<128xbf16>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$grad, DFlash_FloatTensor:$input,
                       DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$positions, F64Attr:$eps,
                       F64Attr:$theta, OptionalAttr<DFlash_YarnAttr>:$yarn);
  let results = (outs DFlash_FloatTensor:$input_grad,
                      DFlash_FloatTensor:$weight_grad);
  let assemblyFormat =
      "$grad `,` $input `,` $weight `,` $positions attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_RmsNormGradResidualOp : DFlash_PureOp<"rms_norm_grad_residual"> {
  let summary = "RMS-norm gradient added to the residual stream's gradient";
  let description = [{
    `input_grad = residual_grad + d rms_norm / d input` and the weight's
    gradient, in one pass: the backward of a pre-norm residual block.

    ```mlir
    %dx, %dw = dflash.rms_norm_grad_residual %dy, %x, %w, %dres
        {eps = 1.0e-06 : f64} : (...) -> (...)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$grad, DFlash_FloatTensor:$input,
                       DFlash_FloatTensor:$weight,
                       DFlash_FloatTensor:$residual_grad, F64Attr:$eps);
  let results = (outs DFlash_FloatTensor:$input_grad,
                      DFlash_FloatTensor:$weight_grad);
  let assemblyFormat =
      "$grad `,` $input `,` $weight `,` $residual_grad attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_AccumulateLinearGradOp : DFlash_PureOp<"accumulate_linear_grad"> {
  let summary = "A linear layer's gradient added to a running sum";
  let description = [{
    `result = accumulator + g` where `g` is `linear_grad_input(grad, operand)`
    (`weight_grad` unset) or `linear_grad_weight(grad, operand)`
    (`weight_grad` set): one GEMM with beta = 1 into the accumulator's
    buffer, which the result reuses.

    ```mlir
    %dw2 = dflash.accumulate_linear_grad %dw1, %dy, %x {weight_grad}
        : (tensor<1024x4096xbf16>, tensor<4x8192x1024xbf16>,
           tensor<4x8192x4096xbf16>) -> tensor<1024x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$accumulator,
                       DFlash_FloatTensor:$grad, DFlash_FloatTensor:$operand,
                       UnitAttr:$weight_grad);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$accumulator `,` $grad `,` $operand attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_LossSeedOp : DFlash_PureOp<"loss_seed"> {
  let summary = "1 / sum(w) over the step: the seed of the backward pass";
  let description = [{
    Sums the loss weights of this GPU; with `all_ranks` the sum is over every
    GPU (the runtime's all-reduce). Known before the loss itself, so the
    fused lm_head kernel can write the input gradient in the same pass.

    ```mlir
    %wsum, %seed = dflash.loss_seed %weights
        : (tensor<4x8192xf32>) -> (tensor<f32>, tensor<f32>)
    ```
  }];
  let arguments = (ins DFlash_F32Tensor:$weights);
  let results = (outs DFlash_F32Scalar:$weight_sum,
                      DFlash_F32Scalar:$loss_sum_grad);
  let assemblyFormat =
      "$weights attr-dict `:` functional-type(operands, results)";
}

def DFlash_LmHeadCeFusedOp : DFlash_PureOp<"lm_head_ce_fused"> {
  let summary = "lm_head, weighted cross-entropy and its input gradient";
  let description = [{
    `lm_head_ce` and `lm_head_ce_grad` in one chunked pass: each chunk of
    rows computes its logits once (never the whole batch), adds to the sums
    and writes its rows of the input gradient, scaled by `loss_sum_grad`.
    `multiplier` and `softcap` are the two ops' unary transform (identity by
    default).

    With `top_k`, also a `dflash.selector_candidates` of the same operands
    and the same transform: the three `top_k_results` are its `values`,
    `candidates` and `label_values`, taken from the same transformed logits
    before they become their gradient (a DFlash2 drafter's unary logits are
    `CE_u`'s; docs/semantics.md section 13).

    ```mlir
    %loss, %wsum, %correct, %count, %hits, %dy = dflash.lm_head_ce_fused %y,
        %w, %labels, %weights, %seed : (...) -> (...)
    %loss, %wsum, %correct, %count, %hits, %dy, %values, %candidates,
        %label_values = dflash.lm_head_ce_fused %y, %w, %labels, %weights,
        %seed {top_k = 16 : i64} : (...) -> (...)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$labels,
                       DFlash_F32Tensor:$weights,
                       DFlash_F32Scalar:$loss_sum_grad,
                       OptionalAttr<I64Attr>:$top_k,
                       DefaultValuedAttr<F64Attr, "1.0">:$multiplier,
                       DefaultValuedAttr<F64Attr, "0.0">:$softcap);
  // top_k_results: none, or values [rows, K] f32, candidates [rows, K] i32
  // and label_values [rows] f32 (C4, C5).
  let results = (outs DFlash_F32Scalar:$loss_sum, DFlash_F32Scalar:$weight_sum,
                      DFlash_F32Scalar:$correct, DFlash_F32Scalar:$count,
                      DFlash_FlagTensor:$hits,
                      DFlash_FloatTensor:$input_grad,
                      Variadic<AnyRankedTensor>:$top_k_results);
  let assemblyFormat =
      "$input `,` $weight `,` $labels `,` $weights `,` $loss_sum_grad "
      "attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = [{
    /// The folded selector_candidates' results, or null without top_k.
    ::mlir::Value getValues() { return topKResult(0); }
    ::mlir::Value getCandidates() { return topKResult(1); }
    ::mlir::Value getLabelValues() { return topKResult(2); }
    ::mlir::Value topKResult(unsigned i) {
      return getTopKResults().size() == 3 ? getTopKResults()[i]
                                          : ::mlir::Value();
    }
  }];
}

def DFlash_LmHeadCeTopKOp : DFlash_PureOp<"lm_head_ce_top_k"> {
  let summary = "lm_head_ce and the selector's top-K of the same logits";
  let description = [{
    `lm_head_ce` (the forward alone: an evaluation program's) and a
    `dflash.selector_candidates` of the same operands and the same unary
    transform (`multiplier`, `softcap`; identity by default), in one chunked
    pass: each chunk's logits are made once, for the sums and for each row's
    top `top_k` (docs/semantics.md section 13).

    ```mlir
    %loss, %wsum, %correct, %count, %hits, %values, %candidates,
        %label_values = dflash.lm_head_ce_top_k %y, %lm_head, %labels,
        %weights {top_k = 16 : i64} : (...) -> (...)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$labels,
                       DFlash_F32Tensor:$weights, I64Attr:$top_k,
                       DefaultValuedAttr<F64Attr, "1.0">:$multiplier,
                       DefaultValuedAttr<F64Attr, "0.0">:$softcap);
  let results = (outs DFlash_F32Scalar:$loss_sum, DFlash_F32Scalar:$weight_sum,
                      DFlash_F32Scalar:$correct, DFlash_F32Scalar:$count,
                      DFlash_FlagTensor:$hits, DFlash_F32Tensor:$values,
                      DFlash_IndexTensor:$candidates,
                      DFlash_F32Tensor:$label_values);
  let assemblyFormat =
      "$input `,` $weight `,` $labels `,` $weights attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_AdamWMultiOp : DFlash_PureOp<"adamw_multi", [AttrSizedOperandSegments]> {
  let summary = "Global-norm clip and AdamW over every parameter at once";
  let description = [{
    The optimizer of docs/semantics.md section 5 in a few launches: the global
    L2 norm of every (all-reduced) gradient, the clip coefficient, the
    learning rate of `step` and one AdamW update of each parameter's fp32
    master and moments, with the bf16 parameter written back. Operands come
    in groups of equal length, one entry per parameter.

    ```mlir
    %state:8, %norm, %lr = dflash.adamw_multi
        params(%a, %b) masters(%a32, %b32) moment1(%ma, %mb) moment2(%va, %vb)
        grads(%ga, %gb) step(%step) total(%total) {...} : ...
    ```
  }];
  let arguments = (ins Variadic<DFlash_FloatTensor>:$params,
                       Variadic<DFlash_F32Tensor>:$masters,
                       Variadic<DFlash_F32Tensor>:$moment1,
                       Variadic<DFlash_F32Tensor>:$moment2,
                       Variadic<DFlash_FloatTensor>:$grads,
                       0DTensorOf<[I32]>:$step, 0DTensorOf<[I32]>:$total,
                       F64Attr:$lr, F64Attr:$warmup_ratio,
                       F64Attr:$max_grad_norm, F64Attr:$beta1,
                       F64Attr:$beta2, F64Attr:$eps, F64Attr:$weight_decay);
  // new_state: the updated parameters, masters, first and second moments,
  // n of each in parameter order.
  let results = (outs Variadic<DFlash_FloatTensor>:$new_state,
                      DFlash_F32Scalar:$grad_norm, DFlash_F32Scalar:$lr_value);
  let assemblyFormat =
      "`params` `(` $params `)` `masters` `(` $masters `)` "
      "`moment1` `(` $moment1 `)` `moment2` `(` $moment2 `)` "
      "`grads` `(` $grads `)` `step` `(` $step `)` `total` `(` $total `)` "
      "attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = [{
    unsigned getNumParams() { return getParams().size(); }
    ::mlir::Value getNewParam(unsigned i) { return getNewState()[i]; }
    ::mlir::Value getNewMaster(unsigned i) {
      return getNewState()[getNumParams() + i];
    }
    ::mlir::Value getNewMoment1(unsigned i) {
      return getNewState()[2 * getNumParams() + i];
    }
    ::mlir::Value getNewMoment2(unsigned i) {
      return getNewState()[3 * getNumParams() + i];
    }
  }];
}

def DFlash_GradientBucketOp : DFlash_PureOp<"gradient_bucket"> {
  let summary = "fp32 gradients of a group of parameters, summed over GPUs";
  let description = [{
    Converts each gradient to fp32 and sums it over every GPU of the
    data-parallel group (docs/semantics.md section 5: gradients to fp32, then
    all-reduce). `dflash-bucket-gradients` groups the gradients into buckets
    of a fixed size in the order the backward pass finishes them and places
    each bucket right after its last gradient, so that its all-reduce runs
    on a second stream while the backward pass goes on. The results of one
    bucket are contiguous in memory: one collective per bucket.

    With `world_size` and `shard_elements` S (set by
    `dflash-shard-optimizer-state`, for `dflash.adamw_sharded`), the flat
    fp32 range is padded to `world_size` x S elements and reduce-scattered
    instead: on rank r only the elements [r S, (r + 1) S) hold the sum over
    the GPUs; the others are unspecified.

    ```mlir
    %g32:2 = dflash.gradient_bucket %dw_down, %dw_up
        : (tensor<4096x12288xbf16>, tensor<12288x4096xbf16>)
        -> (tensor<4096x12288xf32>, tensor<12288x4096xf32>)
    ```
  }];
  let arguments = (ins Variadic<DFlash_FloatTensor>:$grads,
                       OptionalAttr<I64Attr>:$world_size,
                       OptionalAttr<I64Attr>:$shard_elements);
  let results = (outs Variadic<DFlash_F32Tensor>:$results);
  let assemblyFormat =
      "$grads attr-dict `:` functional-type(operands, results)";
}

def DFlash_AdamWShardedOp : DFlash_PureOp<"adamw_sharded",
                                          [AttrSizedOperandSegments]> {
  let summary = "AdamW on this GPU's shard of every gradient bucket (ZeRO-1)";
  let description = [{
    The optimizer of docs/semantics.md section 5 with its fp32 state split over
    the `world_size` GPUs of the data-parallel group. Every gradient is a
    result of a sharded `dflash.gradient_bucket` (`world_size`,
    `shard_elements` S): the bucket's flat fp32 range of `world_size` x S
    elements is reduce-scattered, so that rank r holds the sum of the
    elements [r S, (r + 1) S). State group k (`masters`, `moment1`,
    `moment2`, each `tensor<S x f32>`) is rank r's shard of the k-th bucket,
    in the order the `grads` first name the buckets. The op sums the squares
    of its shards' gradients over every GPU for the global norm and clip,
    updates its shards as `dflash.adamw_multi` updates whole tensors, and
    all-gathers the bf16 parameters: every GPU ends with all of them.

    ```mlir
    %g:2 = dflash.gradient_bucket %da, %db {shard_elements = 2048 : i64,
        world_size = 4 : i64} : ... -> (tensor<64x64xf32>, tensor<64x64xf32>)
    %state:5, %norm, %lr = dflash.adamw_sharded params(%a, %b)
        grads(%g#0, %g#1) masters(%m) moment1(%m1) moment2(%m2)
        step(%step) total(%total) {world_size = 4 : i64, ...} : ...
    ```
  }];
  let arguments = (ins Variadic<DFlash_FloatTensor>:$params,
                       Variadic<DFlash_F32Tensor>:$grads,
                       Variadic<DFlash_F32Tensor>:$masters,
                       Variadic<DFlash_F32Tensor>:$moment1,
                       Variadic<DFlash_F32Tensor>:$moment2,
                       0DTensorOf<[I32]>:$step, 0DTensorOf<[I32]>:$total,
                       I64Attr:$world_size,
                       F64Attr:$lr, F64Attr:$warmup_ratio,
                       F64Attr:$max_grad_norm, F64Attr:$beta1,
                       F64Attr:$beta2, F64Attr:$eps, F64Attr:$weight_decay);
  // new_state: the updated parameters (one per parameter), then the updated
  // masters, first and second moments (one per bucket each).
  let results = (outs Variadic<DFlash_FloatTensor>:$new_state,
                      DFlash_F32Scalar:$grad_norm, DFlash_F32Scalar:$lr_value);
  let assemblyFormat =
      "`params` `(` $params `)` `grads` `(` $grads `)` "
      "`masters` `(` $masters `)` `moment1` `(` $moment1 `)` "
      "`moment2` `(` $moment2 `)` `step` `(` $step `)` `total` `(` $total `)` "
      "attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = [{
    unsigned getNumParams() { return getParams().size(); }
    unsigned getNumBuckets() { return getMasters().size(); }
    ::mlir::Value getNewParam(unsigned i) { return getNewState()[i]; }
    ::mlir::Value getNewMaster(unsigned k) {
      return getNewState()[getNumParams() + k];
    }
    ::mlir::Value getNewMoment1(unsigned k) {
      return getNewState()[getNumParams() + getNumBuckets() + k];
    }
    ::mlir::Value getNewMoment2(unsigned k) {
      return getNewState()[getNumParams() + 2 * getNumBuckets() + k];
    }
  }];
}

#endif // DFLASH_KERNEL_OPS_TD
