//===- DFlashOps.td - dflash graph-level ops ---------------*- tablegen -*-===//
//
// Forward ops of the DFlash training step. Every op is pure, statically
// shaped, and verified against the numbered constraints of docs/dialect.md.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_OPS_TD
#define DFLASH_OPS_TD

include "dialect/DFlashDialect.td"
include "dialect/DFlashAttrs.td"
include "dialect/DFlashInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def DFlash_FloatTensor : RankedTensorOf<[BF16, F32]>;
def DFlash_IndexTensor : RankedTensorOf<[I32]>;
def DFlash_FlagTensor : RankedTensorOf<[I8]>;
def DFlash_F32Tensor : RankedTensorOf<[F32]>;
def DFlash_F32Scalar : 0DTensorOf<[F32]>;

class DFlash_PureOp<string mnemonic, list<Trait> traits = []>
    : DFlash_Op<mnemonic, !listconcat(traits, [Pure,
        DeclareOpInterfaceMethods<DFlash_FlopCountOpInterface>])> {
  let hasVerifier = 1;
}

// A forward op with a vector-Jacobian product (dialect/DFlashVJP.cpp).
def DFlash_Differentiable
    : DeclareOpInterfaceMethods<DFlash_DifferentiableOpInterface>;

//===----------------------------------------------------------------------===//
// Draft-block bookkeeping
//===----------------------------------------------------------------------===//

def DFlash_DraftPositionsOp : DFlash_PureOp<"draft_positions"> {
  let summary = "Rotary positions of the draft slots";
  let description = [{
    Draft slot `(n, k)` of a row sits `k` positions after its anchor, in the
    anchor's conversation (docs/semantics.md sections 3 and 9):
    `result[b, n * block_size + k] = position_ids[b, anchors[b, n]] + k`. The
    context keys sit at `position_ids` itself (`arange(S)` in an unpacked
    row).

    ```mlir
    %pos = dflash.draft_positions %anchors, %position_ids {block_size = 16 : i64}
        : (tensor<4x512xi32>, tensor<4x3072xi32>) -> tensor<4x8192xi32>
    ```
  }];
  let arguments = (ins DFlash_IndexTensor:$anchors,
                       DFlash_IndexTensor:$position_ids, I64Attr:$block_size);
  let results = (outs DFlash_IndexTensor:$result);
  let assemblyFormat =
      "$anchors `,` $position_ids attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_DraftTokensOp : DFlash_PureOp<"draft_tokens"> {
  let summary = "Token ids of the noised draft blocks";
  let description = [{
    The first slot of each kept block holds the anchor's token, every other
    slot the mask token (docs/semantics.md section 3, item 2):
    `result[b, n*bs] = keep[b,n] ? input_ids[b, anchors[b,n]] : mask_token_id`
    and `result[b, n*bs + k] = mask_token_id` for `k > 0`.

    ```mlir
    %ids = dflash.draft_tokens %input_ids, %anchors, %keep
        {block_size = 16 : i64, mask_token_id = 151669 : i64}
        : (tensor<4x3072xi32>, tensor<4x512xi32>, tensor<4x512xi8>)
        -> tensor<4x8192xi32>
    ```
  }];
  let arguments = (ins DFlash_IndexTensor:$input_ids,
                       DFlash_IndexTensor:$anchors, DFlash_FlagTensor:$keep,
                       I64Attr:$block_size, I64Attr:$mask_token_id);
  let results = (outs DFlash_IndexTensor:$result);
  let assemblyFormat =
      "$input_ids `,` $anchors `,` $keep attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_DraftTargetsOp : DFlash_PureOp<"draft_targets"> {
  let summary = "Labels and loss weights of the draft slots";
  let description = [{
    Draft slot `(n, k)` predicts the token at its own position (no shift):
    `labels[b, n*bs + k] = input_ids[b, anchors[b,n] + k]` (0 where that is
    past the row). Its loss weight is
    `keep[b,n] * [a+k < S] * [k > 0] * loss_mask[b, a+k] * same(a, a+k) *
    decay(k)` with `a = anchors[b,n]`, `same(a, a+k) = [position_ids[b, a+k]
    == position_ids[b, a] + k]` (the slot lies in the anchor's conversation,
    docs/semantics.md section 9) and `decay(k) = exp(-(k-1)/gamma)` when
    `gamma > 0`, else 1 (docs/semantics.md section 4).

    ```mlir
    %labels, %weights = dflash.draft_targets %input_ids, %loss_mask,
        %anchors, %keep, %position_ids {block_size = 16 : i64, gamma = 7.0 : f64}
        : (tensor<4x3072xi32>, tensor<4x3072xi8>, tensor<4x512xi32>,
           tensor<4x512xi8>, tensor<4x3072xi32>)
        -> (tensor<4x8192xi32>, tensor<4x8192xf32>)
    ```
  }];
  let arguments = (ins DFlash_IndexTensor:$input_ids,
                       DFlash_FlagTensor:$loss_mask,
                       DFlash_IndexTensor:$anchors, DFlash_FlagTensor:$keep,
                       DFlash_IndexTensor:$position_ids,
                       I64Attr:$block_size, F64Attr:$gamma);
  let results = (outs DFlash_IndexTensor:$labels, DFlash_F32Tensor:$weights);
  let assemblyFormat =
      "$input_ids `,` $loss_mask `,` $anchors `,` $keep `,` $position_ids "
      "attr-dict `:` functional-type(operands, results)";
}

def DFlash_DraftAcceptanceOp : DFlash_PureOp<"draft_acceptance"> {
  let summary = "What greedy verification accepts of the draft blocks";
  let description = [{
    docs/semantics.md section 10. For a kept block `n`, `run_n` is the largest
    `r` such that every `1 <= k <= r` has `weights[b, n*bs + k] > 0` and
    `hits[b, n*bs + k]` (the prediction is the label); `run_sum = sum over
    kept blocks of (1 + run_n)` and `kept_blocks` their count, so that
    `tau = run_sum / kept_blocks` once both are summed over the GPUs.
    Per block position `k`, `position_counts[k]` counts the kept slots with
    `weights > 0` and `position_hits[k]` those of them with a hit: the
    accuracy at `k` is their ratio (`k = 0`, the given anchor token, is 0).

    The same sums per bucket of anchor position (section 14): a kept block
    falls in bucket `j` = the number of `bucket_edges` at or below
    `position_ids[b, anchors[b, n]]`, its anchor's position in its
    conversation. `bucket_runs[j]` and `bucket_blocks[j]` are `run_sum` and
    `kept_blocks` over bucket `j`'s blocks, `bucket_hits[j]` and
    `bucket_counts[j]` the position sums over every `k` of them; each adds
    up over the buckets to its total.

    ```mlir
    %runs, %blocks, %hits_k, %counts_k, %b_runs, %b_blocks, %b_hits,
        %b_counts = dflash.draft_acceptance %hits, %weights, %keep, %anchors,
        %position_ids {block_size = 16 : i64,
                       bucket_edges = array<i64: 4096, 16384, 65536>}
        : (tensor<4x8192xi8>, tensor<4x8192xf32>, tensor<4x512xi8>,
           tensor<4x512xi32>, tensor<4x131072xi32>)
        -> (tensor<f32>, tensor<f32>, tensor<16xf32>, tensor<16xf32>,
            tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>)
    ```
  }];
  let arguments = (ins DFlash_FlagTensor:$hits, DFlash_F32Tensor:$weights,
                       DFlash_FlagTensor:$keep, DFlash_IndexTensor:$anchors,
                       DFlash_IndexTensor:$position_ids, I64Attr:$block_size,
                       DenseI64ArrayAttr:$bucket_edges);
  let results = (outs DFlash_F32Scalar:$run_sum, DFlash_F32Scalar:$kept_blocks,
                      DFlash_F32Tensor:$position_hits,
                      DFlash_F32Tensor:$position_counts,
                      DFlash_F32Tensor:$bucket_runs,
                      DFlash_F32Tensor:$bucket_blocks,
                      DFlash_F32Tensor:$bucket_hits,
                      DFlash_F32Tensor:$bucket_counts);
  let assemblyFormat =
      "$hits `,` $weights `,` $keep `,` $anchors `,` $position_ids attr-dict "
      "`:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Dense layers
//===----------------------------------------------------------------------===//

def DFlash_EmbedOp : DFlash_PureOp<"embed"> {
  let summary = "Row gather from a frozen embedding table";
  let description = [{
    `result[b, t, :] = table[ids[b, t], :]`, unscaled; with `scale` (a
    DFlash2 drafter's `input_embedding_scale`, docs/semantics.md section
    13) times `scale` in fp32, rounded once.

    ```mlir
    %x = dflash.embed %embed, %ids
        : (tensor<151936x4096xbf16>, tensor<4x8192xi32>)
        -> tensor<4x8192x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$table, DFlash_IndexTensor:$ids,
                       OptionalAttr<F64Attr>:$scale);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$table `,` $ids attr-dict `:` functional-type(operands, results)";
}

def DFlash_LinearOp : DFlash_PureOp<"linear", [DFlash_Differentiable]> {
  let summary = "Bias-free linear layer, y = x W^T";
  let description = [{
    `result[..., n] = sum_k input[..., k] * weight[n, k]`, with the weight in
    torch Linear layout `[out, in]`. Leading dimensions of the input are
    batch dimensions. bf16 operands accumulate in fp32.

    ```mlir
    %q = dflash.linear %h, %wq
        : (tensor<4x8192x4096xbf16>, tensor<4096x4096xbf16>)
        -> tensor<4x8192x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $weight attr-dict `:` functional-type(operands, results)";
}

def DFlash_RmsNormOp : DFlash_PureOp<"rms_norm", [DFlash_Differentiable]> {
  let summary = "RMS normalisation over the last dimension";
  let description = [{
    In fp32: `x * rsqrt(mean(x^2) + eps) * weight` over the last dimension,
    the result cast to the input's element type. Used for the layer norms
    (last dimension = hidden) and, after a reshape to heads, for the per-head
    q/k norms (last dimension = head_dim).

    ```mlir
    %h = dflash.rms_norm %x, %w {eps = 1.0e-06 : f64}
        : (tensor<4x8192x4096xbf16>, tensor<4096xbf16>)
        -> tensor<4x8192x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       F64Attr:$eps);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $weight attr-dict `:` functional-type(operands, results)";
}

def DFlash_ReshapeOp : DFlash_PureOp<"reshape", [DFlash_Differentiable]> {
  let summary = "Reinterpret a row-major tensor with another static shape";
  let description = [{
    Changes the shape, never the data or its row-major order; used to split
    the hidden dimension into heads.

    ```mlir
    %qh = dflash.reshape %q
        : (tensor<4x8192x4096xbf16>) -> tensor<4x8192x32x128xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input attr-dict `:` functional-type(operands, results)";
}

def DFlash_RowSliceOp : DFlash_PureOp<"row_slice"> {
  let summary = "Rows [offset, offset + n) of a tensor, as a view";
  let description = [{
    The micro-batch `offset / n` of a step's rows (gradient accumulation,
    `[training] gradient_accumulation`): the result is the `n` rows of its
    leading dimension starting at `offset`, the other dimensions whole.
    Row-major, so the rows are contiguous: the lowering reads them in
    place, and nothing runs.

    ```mlir
    %ids1 = dflash.row_slice %ids {offset = 2 : i64}
        : (tensor<8x3072xi32>) -> tensor<2x3072xi32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, I64Attr:$offset);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat =
      "$input attr-dict `:` functional-type(operands, results)";
}

def DFlash_RopeOp : DFlash_PureOp<"rope", [DFlash_Differentiable]> {
  let summary = "Rotary position embedding, rotate-half form";
  let description = [{
    For each head vector `x` of dimension `d` at position `p`, with
    `f_i = theta^(-2i/d)` and the angle `p * f_i` in fp32, `i < d/2`:
    `y[i] = x[i] cos - x[i + d/2] sin`, `y[i + d/2] = x[i + d/2] cos + x[i] sin`.
    With `yarn` (the drafter's [drafter.rope_scaling]), `f_i`, cos and sin
    are `dflash.yarn_rope`'s.

    ```mlir
    %qr = dflash.rope %qn, %pos {theta = 1.0e+06 : f64}
        : (tensor<4x8192x32x128xbf16>, tensor<4x8192xi32>)
        -> tensor<4x8192x32x128xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input,
                       DFlash_IndexTensor:$positions, F64Attr:$theta,
                       OptionalAttr<DFlash_YarnAttr>:$yarn);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $positions attr-dict `:` functional-type(operands, results)";
}

def DFlash_ScaledRopeOp : DFlash_PureOp<"scaled_rope"> {
  let summary = "Rotary position embedding with Llama-3 frequency scaling";
  let description = [{
    `dflash.rope` with each `f_i` first rescaled as Llama-3 does: with the
    wavelength `l = 2 pi / f_i`, `lo = original / low_freq_factor` and
    `hi = original / high_freq_factor`, `f_i / factor` where `l > lo`, `f_i`
    where `l < hi`, and between them `(1 - s) f_i / factor + s f_i` with
    `s = (original / l - low_freq_factor) / (high_freq_factor -
    low_freq_factor)`. A target decoder's (inference only).

    ```mlir
    %qr = dflash.scaled_rope %q, %pos {theta = 5.0e+05 : f64, factor = 8.0 : f64,
        low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64,
        original_max_positions = 8192 : i64}
        : (tensor<2x3072x32x128xbf16>, tensor<2x3072xi32>)
        -> tensor<2x3072x32x128xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input,
                       DFlash_IndexTensor:$positions, F64Attr:$theta,
                       F64Attr:$factor, F64Attr:$low_freq_factor,
                       F64Attr:$high_freq_factor, I64Attr:$original_max_positions);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $positions attr-dict `:` functional-type(operands, results)";
}

def DFlash_BlockAttentionOp : DFlash_PureOp<"block_attention", [DFlash_Differentiable]> {
  let summary = "Block-prefix attention of draft blocks over the context";
  let description = [{
    Grouped-query attention with scale `d^-0.5` (query head `i` reads key/value
    head `i / (nh/nkv)`) of the draft queries over the keys
    `[context (S rows) | draft (Q rows)]` (docs/semantics.md section 3). Query
    `(n, k)` of a kept block sees
    - context key `j` iff `anchor_n - position_ids[anchor_n] <= j < anchor_n`
      (the anchor's conversation, docs/semantics.md section 9: all of the row
      before the anchor when `position_ids` is `arange(S)`) and, when
      `window` is present, `j >= anchor_n + k - (window - 1)`;
    - draft key `(n, k')` of its own block for every `k'`, or only `k' <= k`
      when `causal` is set.
    A query of a `keep = 0` block sees nothing and outputs 0. The second
    result is the log-sum-exp of each query row's scores (natural log, -inf
    where nothing is seen), kept for the backward pass.

    A full layer has no `window` and no `causal`; a sliding layer has both.

    ```mlir
    %o, %lse = dflash.block_attention %q, %kc, %vc, %kd, %vd, %anchors, %keep,
        %position_ids {block_size = 16 : i64, window = 2048 : i64, causal}
        : (tensor<4x8192x32x128xbf16>, tensor<4x3072x8x128xbf16>,
           tensor<4x3072x8x128xbf16>, tensor<4x8192x8x128xbf16>,
           tensor<4x8192x8x128xbf16>, tensor<4x512xi32>, tensor<4x512xi8>,
           tensor<4x3072xi32>)
        -> (tensor<4x8192x32x128xbf16>, tensor<4x8192x32xf32>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$query,
                       DFlash_FloatTensor:$context_keys,
                       DFlash_FloatTensor:$context_values,
                       DFlash_FloatTensor:$draft_keys,
                       DFlash_FloatTensor:$draft_values,
                       DFlash_IndexTensor:$anchors, DFlash_FlagTensor:$keep,
                       DFlash_IndexTensor:$position_ids,
                       I64Attr:$block_size, OptionalAttr<I64Attr>:$window,
                       UnitAttr:$causal);
  let results = (outs DFlash_FloatTensor:$result, DFlash_F32Tensor:$lse);
  let assemblyFormat =
      "$query `,` $context_keys `,` $context_values `,` $draft_keys `,` "
      "$draft_values `,` $anchors `,` $keep `,` $position_ids attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_SwigluOp : DFlash_PureOp<"swiglu", [DFlash_Differentiable]> {
  let summary = "silu(gate) * up";
  let description = [{
    Elementwise `gate * sigmoid(gate) * up`, computed in fp32.

    ```mlir
    %a = dflash.swiglu %g, %u
        : (tensor<4x8192x12288xbf16>, tensor<4x8192x12288xbf16>)
        -> tensor<4x8192x12288xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$gate, DFlash_FloatTensor:$up);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$gate `,` $up attr-dict `:` functional-type(operands, results)";
}

def DFlash_AddOp : DFlash_PureOp<"add", [DFlash_Differentiable]> {
  let summary = "Elementwise sum (the residual connection)";
  let description = [{
    ```mlir
    %x1 = dflash.add %x, %o
        : (tensor<4x8192x4096xbf16>, tensor<4x8192x4096xbf16>)
        -> tensor<4x8192x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$lhs, DFlash_FloatTensor:$rhs);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// The online target's forward (inference only)
//===----------------------------------------------------------------------===//

def DFlash_CausalAttentionOp : DFlash_PureOp<"causal_attention"> {
  let summary = "Causal grouped attention of a target decoder over packed rows";
  let description = [{
    Query `i` of row `b` sees key `j` iff `j <= i` and
    `position_ids[b, i] - position_ids[b, j] == i - j`: earlier tokens of its
    own conversation when a row packs several (docs/semantics.md section 9),
    plain causal attention otherwise. With `window` > 0 (a sliding layer)
    also `i - j < window`. Scale `d^-0.5`; query head `h` reads key/value
    head `h / (nh / nkv)`; softmax in fp32. With `sinks` [nh] (gpt-oss),
    head `h`'s softmax denominator also holds `exp(sinks[h])`, a logit with
    no value.

    ```mlir
    %o = dflash.causal_attention %q, %k, %v, %pos sinks %s {window = 128 : i64}
        : (tensor<2x3072x64x64xbf16>, tensor<2x3072x8x64xbf16>,
           tensor<2x3072x8x64xbf16>, tensor<2x3072xi32>, tensor<64xbf16>)
        -> tensor<2x3072x64x64xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$query, DFlash_FloatTensor:$keys,
                       DFlash_FloatTensor:$values,
                       DFlash_IndexTensor:$position_ids,
                       Optional<DFlash_FloatTensor>:$sinks,
                       DefaultValuedAttr<I64Attr, "0">:$window);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$query `,` $keys `,` $values `,` $position_ids (`sinks` $sinks^)? "
      "attr-dict `:` functional-type(operands, results)";
}

def DFlash_BiasedLinearOp : DFlash_PureOp<"biased_linear"> {
  let summary = "Linear layer with a bias, y = x W^T + b";
  let description = [{
    `dflash.linear` plus `bias[n]` on every row, added to the fp32 product
    before it is rounded: a target decoder's projections with biases
    (gpt-oss's q/k/v/o and router; inference only).

    ```mlir
    %q = dflash.biased_linear %h, %wq, %bq
        : (tensor<2x3072x2880xbf16>, tensor<4096x2880xbf16>, tensor<4096xbf16>)
        -> tensor<2x3072x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_FloatTensor:$bias);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $weight `,` $bias attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_YarnRopeOp : DFlash_PureOp<"yarn_rope"> {
  let summary = "Rotary position embedding with YaRN frequency scaling";
  let description = [{
    `dflash.rope` with YaRN's frequencies (gpt-oss), as transformers'
    `_compute_yarn_parameters` makes them: `f_i = theta^(-2i/d)` blended with
    `f_i / factor` by a linear ramp over `i` between the correction
    dimensions of `beta_fast` and `beta_slow` rotations at
    `original_max_positions` (floored and ceiled with `truncate`), the
    extrapolated `f_i` below the ramp, the interpolated above; cos and sin
    are multiplied by `attention_factor`. A target decoder's (inference
    only).

    ```mlir
    %qr = dflash.yarn_rope %q, %pos {theta = 1.5e+05 : f64, factor = 32.0 : f64,
        beta_fast = 32.0 : f64, beta_slow = 1.0 : f64,
        original_max_positions = 4096 : i64, truncate = false,
        attention_factor = 1.3465735902799727 : f64}
        : (tensor<2x3072x64x64xbf16>, tensor<2x3072xi32>)
        -> tensor<2x3072x64x64xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input,
                       DFlash_IndexTensor:$positions, F64Attr:$theta,
                       F64Attr:$factor, F64Attr:$beta_fast, F64Attr:$beta_slow,
                       I64Attr:$original_max_positions, BoolAttr:$truncate,
                       F64Attr:$attention_factor);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $positions attr-dict `:` functional-type(operands, results)";
}

def DFlash_ClampedSwigluOp : DFlash_PureOp<"clamped_swiglu"> {
  let summary = "gpt-oss's clamped gated activation";
  let description = [{
    Elementwise, in fp32: with `g = min(gate, limit)` and
    `u = clamp(up, -limit, limit)`, `(u + 1) * g * sigmoid(alpha * g)`. A
    target decoder's (inference only).

    ```mlir
    %a = dflash.clamped_swiglu %g, %u {alpha = 1.702 : f64, limit = 7.0 : f64}
        : (tensor<24576x2880xbf16>, tensor<24576x2880xbf16>)
        -> tensor<24576x2880xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$gate, DFlash_FloatTensor:$up,
                       F64Attr:$alpha, F64Attr:$limit);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$gate `,` $up attr-dict `:` functional-type(operands, results)";
}

def DFlash_ConcatLastOp : DFlash_PureOp<"concat_last"> {
  let summary = "Concatenation along the last dimension";
  let description = [{
    The target's tapped hidden states side by side, in operand order: the
    drafter's `target_hidden` `[B, S, L*H]`.

    ```mlir
    %features = dflash.concat_last %t1, %t5
        : (tensor<2x128x256xbf16>, tensor<2x128x256xbf16>)
        -> tensor<2x128x512xbf16>
    ```
  }];
  let arguments = (ins Variadic<DFlash_FloatTensor>:$inputs);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$inputs attr-dict `:` functional-type(operands, results)";
}

def DFlash_LmHeadCeOp : DFlash_PureOp<"lm_head_ce", [DFlash_Differentiable]> {
  let summary = "Fused lm_head, weighted cross-entropy and accuracy";
  let description = [{
    With `logits = T(input @ weight^T)` (never materialised whole) and
    `w = weights`, returns four fp32 scalars summed over every row:
    `loss_sum = sum(w * CE(logits, labels))` (CE in fp32 from bf16 logits),
    `weight_sum = sum(w)`, `correct = sum([argmax == label] * [w > 0])` and
    `count = sum([w > 0])` (docs/semantics.md section 4), and per row
    `hits = [argmax == label] * [w > 0]` (what `draft_acceptance` counts).
    The weight is frozen. `T` is a DFlash2 drafter's unary transform
    (docs/semantics.md section 13, "Unary logits"; `CE_u`), applied in fp32
    to each bf16 logit: `T(z) = softcap * tanh(multiplier * z / softcap)`,
    or `multiplier * z` when `softcap` is 0; the defaults (multiplier 1,
    softcap 0, elided) make it the identity. `T` is monotonic, so the
    argmax is the raw logits'.

    ```mlir
    %loss, %wsum, %correct, %count, %hits = dflash.lm_head_ce %y, %lm_head,
        %labels, %weights : (tensor<4x8192x4096xbf16>, tensor<151936x4096xbf16>,
                             tensor<4x8192xi32>, tensor<4x8192xf32>)
        -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<4x8192xi8>)
    %loss, %wsum, %correct, %count, %hits = dflash.lm_head_ce %y, %lm_head,
        %labels, %weights {softcap = 3.000000e+01 : f64} : (...) -> (...)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$labels,
                       DFlash_F32Tensor:$weights,
                       DefaultValuedAttr<F64Attr, "1.0">:$multiplier,
                       DefaultValuedAttr<F64Attr, "0.0">:$softcap);
  let results = (outs DFlash_F32Scalar:$loss_sum, DFlash_F32Scalar:$weight_sum,
                      DFlash_F32Scalar:$correct, DFlash_F32Scalar:$count,
                      DFlash_FlagTensor:$hits);
  let assemblyFormat =
      "$input `,` $weight `,` $labels `,` $weights attr-dict `:` "
      "functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// DFlash2 drafters (docs/semantics.md section 13)
//===----------------------------------------------------------------------===//

def DFlash_GroupedConvOp
    : DFlash_PureOp<"grouped_conv", [DFlash_Differentiable]> {
  let summary = "Block-local grouped dynamic convolution of a DFlash2 layer";
  let description = [{
    docs/semantics.md section 13, "Convolution": with `kc = kernel_size`,
    `gs = group_size`, `G = H / gs` and slot `q = n * block_size + k`,
    `result[b, q, c] = sum over o in [0, kc) with k - o >= 0 of
    (base[o, c] + D[b, q, half, o, c / gs]) * input[b, q - o, c]`: causal
    inside each block, never reaching the previous block, the per-token
    delta taken at the output slot. `D` is a layer's whole projection
    `h @ Wc^T` `[B, Q, 2*kc*G]`, read as `[2, kc, G]` per slot; `half` (0
    before the sublayer, 1 after it) picks the half this convolution reads,
    so both convolutions of a sublayer share one `D`. `base` is that
    convolution's `[kc, H]`, or the checkpoint's whole `base_kernel`
    `[2, kc, H]`, of which `half` picks the row. `base + delta` in fp32,
    the result rounded once.

    ```mlir
    %hc = dflash.grouped_conv %h, %d, %base
        {block_size = 8 : i64, kernel_size = 2 : i64, group_size = 16 : i64,
         half = 0 : i64}
        : (tensor<4x4096x5120xbf16>, tensor<4x4096x1280xbf16>,
           tensor<2x2x5120xbf16>) -> tensor<4x4096x5120xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$delta,
                       DFlash_FloatTensor:$base, I64Attr:$block_size,
                       I64Attr:$kernel_size, I64Attr:$group_size,
                       I64Attr:$half);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $delta `,` $base attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_SelectorCandidatesOp
    : DFlash_PureOp<"selector_candidates", [DFlash_Differentiable]> {
  let summary = "Top-K of a DFlash2 drafter's unary logits, never materialised";
  let description = [{
    docs/semantics.md section 13, "Unary logits" and "Selector": with
    `u = T(input @ weight^T)` in fp32 (`weight` the frozen lm_head [V, H],
    `T(z) = softcap * tanh(multiplier * z / softcap)`, or `multiplier * z`
    when `softcap` is 0), per row with a nonzero weight:
    `candidates` = the `top_k` tokens of largest `u` in descending order
    (ties: the lower token first), `values` their `u`, and `label_values` =
    `u[labels]` (the logit an injected label is scored with). A row whose
    weight is 0 (every slot `k = 0`) is skipped: candidates -1, values and
    label value 0.

    Like `dflash.lm_head_ce`, it takes the `(input, lm_head)` pair and not
    the logits: its kernel streams the logits chunk by chunk and keeps each
    row's running top-K, so that a later pass can fold it into the lm_head
    cross-entropy kernel, which computes the same logits (with this
    transform) for `CE_u`. Only `[rows, K]` leaves it.

    ```mlir
    %values, %candidates, %label_values = dflash.selector_candidates %y,
        %lm_head, %labels, %weights
        {top_k = 16 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
        : (tensor<4x4096x5120xbf16>, tensor<248320x5120xbf16>,
           tensor<4x4096xi32>, tensor<4x4096xf32>)
        -> (tensor<4x4096x16xf32>, tensor<4x4096x16xi32>, tensor<4x4096xf32>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$labels, DFlash_F32Tensor:$weights,
                       I64Attr:$top_k, F64Attr:$multiplier, F64Attr:$softcap);
  let results = (outs DFlash_F32Tensor:$values,
                      DFlash_IndexTensor:$candidates,
                      DFlash_F32Tensor:$label_values);
  let assemblyFormat =
      "$input `,` $weight `,` $labels `,` $weights attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_SelectorLossOp
    : DFlash_PureOp<"selector_loss", [DFlash_Differentiable]> {
  let summary = "The DFlash2 selector's weighted cross-entropy sums and hits";
  let description = [{
    docs/semantics.md section 13, "Selector" and "Loss", over
    `selector_candidates`' results. Per row with a nonzero weight `w`, with
    predecessor token `p`, `t = input @ projection^T` ([r], `projection`
    being `Wh` [r, H]) and `z = predecessor_codebook[p] * t`
    (elementwise): the scores are `s_j = values_j +
    z . successor_codebook[candidates_j]`; `cov = [label among the
    candidates]` and `CE_s = -log softmax(s)[j*]` at the label's index
    `j*`. With `gold = "inject"` a label outside the top-K takes the place
    of candidate K, scored with `label_values` (so `cov = 1`); with
    `gold = "topk"` such a row has no term.
    - `loss_sum = sum(w * cov * CE_s)`, `covered_weight = sum(w * cov)`:
      the selector term's numerator and NeMo's "covered" denominator. The
      loss is assembled elsewhere: `alpha_t * loss_sum / sum(w)` (or
      `/ covered_weight`), so its gradient reaches this op as
      `loss_sum_grad`.
    - `hits = [argmax_j s_j == label] * [w > 0]`, over the true top-K
      (never an injected label): the token greedy serving picks, what
      `dflash.draft_acceptance` counts.
    `t` is a GEMM of this op (as the logits are `lm_head_ce`'s): its
    gradient goes to `projection` always, and to `input` unless
    `stop_gradient` is set, which also stops the gradient at `values`
    (docs/semantics.md: "it stops at u and y").

    ```mlir
    %loss, %covered, %hits = dflash.selector_loss %values, %candidates,
        %label_values, %y, %wh, %predecessors, %labels, %weights, %pcb, %scb
        {gold = "topk"}
        : (tensor<4x4096x16xf32>, tensor<4x4096x16xi32>, tensor<4x4096xf32>,
           tensor<4x4096x5120xbf16>, tensor<256x5120xbf16>, tensor<4x4096xi32>,
           tensor<4x4096xi32>, tensor<4x4096xf32>, tensor<248320x256xbf16>,
           tensor<248320x256xbf16>)
        -> (tensor<f32>, tensor<f32>, tensor<4x4096xi8>)
    ```
  }];
  let arguments = (ins DFlash_F32Tensor:$values,
                       DFlash_IndexTensor:$candidates,
                       DFlash_F32Tensor:$label_values,
                       DFlash_FloatTensor:$input,
                       DFlash_FloatTensor:$projection,
                       DFlash_IndexTensor:$predecessors,
                       DFlash_IndexTensor:$labels, DFlash_F32Tensor:$weights,
                       DFlash_FloatTensor:$predecessor_codebook,
                       DFlash_FloatTensor:$successor_codebook,
                       StrAttr:$gold, UnitAttr:$stop_gradient);
  let results = (outs DFlash_F32Scalar:$loss_sum,
                      DFlash_F32Scalar:$covered_weight,
                      DFlash_FlagTensor:$hits);
  let assemblyFormat =
      "$values `,` $candidates `,` $label_values `,` $input `,` $projection "
      "`,` $predecessors `,` $labels `,` $weights `,` $predecessor_codebook "
      "`,` $successor_codebook attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_DraftPredecessorsOp : DFlash_PureOp<"draft_predecessors"> {
  let summary = "The DFlash2 selector's predecessor tokens (teacher forcing)";
  let description = [{
    docs/semantics.md section 13, "Selector": slot `(n, k)` with `k >= 1`
    gets `input_ids[b, anchors[b,n] + k - 1]`, the token before its label;
    slot 0, a slot of a block with `keep = 0` and one whose position lies
    past the row get 0 (their loss weight is 0).

    ```mlir
    %p = dflash.draft_predecessors %input_ids, %anchors, %keep
        {block_size = 8 : i64}
        : (tensor<4x8192xi32>, tensor<4x512xi32>, tensor<4x512xi8>)
        -> tensor<4x4096xi32>
    ```
  }];
  let arguments = (ins DFlash_IndexTensor:$input_ids,
                       DFlash_IndexTensor:$anchors, DFlash_FlagTensor:$keep,
                       I64Attr:$block_size);
  let results = (outs DFlash_IndexTensor:$result);
  let assemblyFormat =
      "$input_ids `,` $anchors `,` $keep attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_SelectorAlphaOp : DFlash_PureOp<"selector_alpha"> {
  let summary = "The selector term's weight alpha_t at an optimizer step";
  let description = [{
    docs/semantics.md section 13, "Loss": with `warm = int(warmup_ratio *
    total)` and `ramp = int(ramp_ratio * total)`, step `t < warm` (0-based)
    gives 0, `warm <= t < warm + ramp` gives `alpha * (t - warm + 1) /
    ramp`, later steps `alpha` (`kernels/reference/DFlash2.h`,
    `selectorAlphaAt`).

    ```mlir
    %alpha = dflash.selector_alpha %step, %total {alpha = 1.0 : f64,
        warmup_ratio = 0.1 : f64, ramp_ratio = 0.2 : f64}
        : (tensor<i32>, tensor<i32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[I32]>:$step, 0DTensorOf<[I32]>:$total,
                       F64Attr:$alpha, F64Attr:$warmup_ratio,
                       F64Attr:$ramp_ratio);
  let results = (outs DFlash_F32Scalar:$result);
  let assemblyFormat =
      "$step `,` $total attr-dict `:` functional-type(operands, results)";
}

def DFlash_SelectorObjectiveOp
    : DFlash_PureOp<"selector_objective", [DFlash_Differentiable]> {
  let summary = "A DFlash2 step's loss numerator over sum(w)";
  let description = [{
    docs/semantics.md section 13, "Loss", written as the numerator that the
    step divides by `sum(w)` (`dflash.loss_stats`, whose seed `1 / sum(w)`
    starts the backward pass): `result = unary_sum + alpha * selector_sum`,
    or with `covered` `unary_sum + alpha * selector_sum * weight_sum /
    covered_weight` (0 when `covered_weight` is 0), so that the selector
    term is divided by `sum(w * cov)`. The sums are the step's (every
    micro-batch's); `alpha`, `weight_sum` and `covered_weight` get no
    gradient (the last is piecewise constant).

    ```mlir
    %loss = dflash.selector_objective %ce, %sel, %alpha, %wsum, %covered
        : (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>)
        -> tensor<f32>
    ```
  }];
  let arguments = (ins DFlash_F32Scalar:$unary_sum,
                       DFlash_F32Scalar:$selector_sum,
                       DFlash_F32Scalar:$alpha, DFlash_F32Scalar:$weight_sum,
                       DFlash_F32Scalar:$covered_weight, UnitAttr:$covered);
  let results = (outs DFlash_F32Scalar:$result);
  let assemblyFormat =
      "$unary_sum `,` $selector_sum `,` $alpha `,` $weight_sum `,` "
      "$covered_weight attr-dict `:` functional-type(operands, results)";
}

include "dialect/DFlashGradientOps.td"
include "dialect/DFlashOptimizerOps.td"
include "dialect/DFlashKernelOps.td"
include "dialect/DFlashMoeOps.td"
include "dialect/DFlashHybridOps.td"

#endif // DFLASH_OPS_TD
