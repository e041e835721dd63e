//===- DFlashMoeOps.td - Mixture-of-experts ops ------------*- tablegen -*-===//
//
// The sparse MLP of a mixture-of-experts target (Qwen3-MoE): routing, the
// token rows grouped by expert, the expert GEMMs over those groups, and the
// weighted sum back to the tokens. Shapes are static although the number of
// rows each expert gets changes every batch: T tokens routed to k experts
// each are always T*k rows in all, and where each expert's group starts is
// a tensor (`offsets`), read by the grouped GEMM at run time.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_MOE_OPS_TD
#define DFLASH_MOE_OPS_TD

def DFlash_MoeRouteOp : DFlash_PureOp<"moe_route"> {
  let summary = "Top-k experts of each token and their weights";
  let description = [{
    `logits` [T, E] are the router's scores. With `scoring = "softmax_topk"`
    (Qwen3-MoE): p = softmax(logits) over the E experts in fp32, the k
    largest p (ties: the lower expert index first), divided by their sum when
    `normalize` is set. With `scoring = "topk_softmax"` (gpt-oss): the k
    largest logits (same ties), then softmax over those k in fp32.
    Results: `weights` [T, k] (rounded to their element type) and `experts`
    [T, k], expert indices by descending weight.

    ```mlir
    %w, %e = dflash.moe_route %logits {top_k = 8 : i64,
        scoring = "softmax_topk", normalize}
        : (tensor<12288x128xbf16>) -> (tensor<12288x8xbf16>, tensor<12288x8xi32>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$logits, I64Attr:$top_k,
                       StrAttr:$scoring, UnitAttr:$normalize);
  let results = (outs DFlash_FloatTensor:$weights,
                      DFlash_IndexTensor:$experts);
  let assemblyFormat =
      "$logits attr-dict `:` functional-type(operands, results)";
}

def DFlash_MoePermuteOp : DFlash_PureOp<"moe_permute"> {
  let summary = "Token rows grouped by expert";
  let description = [{
    Row `t * k + j` of the routed copies (token `t`, its `j`-th expert
    `experts[t, j]`) goes to `permuted`, grouped by expert in ascending
    order and, within an expert, in ascending `t * k + j`. `offsets` [E + 1]:
    expert `e`'s rows are `[offsets[e], offsets[e + 1])`. `source` [T * k]:
    the `t * k + j` each permuted row came from.

    ```mlir
    %xs, %offsets, %source = dflash.moe_permute %x, %e
        : (tensor<12288x2048xbf16>, tensor<12288x8xi32>)
        -> (tensor<98304x2048xbf16>, tensor<129xi32>, tensor<98304xi32>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_IndexTensor:$experts);
  let results = (outs DFlash_FloatTensor:$permuted,
                      DFlash_IndexTensor:$offsets,
                      DFlash_IndexTensor:$source);
  let assemblyFormat =
      "$input `,` $experts attr-dict `:` functional-type(operands, results)";
}

def DFlash_GroupedLinearOp : DFlash_PureOp<"grouped_linear"> {
  let summary = "Each expert's rows times that expert's weight";
  let description = [{
    `y[r] = x[r] @ weight[e]^T (+ bias[e])` for the rows `r` in
    `[offsets[e], offsets[e + 1])`, fp32 accumulation; `weight` [E, N, K]
    stacks the experts' [N, K] weights, `bias` [E, N] (gpt-oss) their
    biases. One grouped GEMM whose problem sizes live in device memory.

    ```mlir
    %g = dflash.grouped_linear %xs, %w_gate, %offsets
        : (tensor<98304x2048xbf16>, tensor<128x768x2048xbf16>, tensor<129xi32>)
        -> tensor<98304x768xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$offsets,
                       Optional<DFlash_FloatTensor>:$bias);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $weight `,` $offsets (`bias` $bias^)? attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_GroupedLinearSwigluOp
    : DFlash_PureOp<"grouped_linear_swiglu", [AttrSizedOperandSegments]> {
  let summary = "The experts' gate and up projections with SwiGLU applied";
  let description = [{
    `swiglu(grouped_linear(x, gate_weight, offsets), grouped_linear(x,
    up_weight, offsets))` as one grouped GEMM whose epilogue applies SwiGLU
    to the fp32 products and rounds once (kernels/Moe.cuh): neither
    product is stored. With `gate_bias` and `up_bias` [E, N] the products
    have the experts' biases; with `alpha` and `limit` the activation is
    `dflash.clamped_swiglu`'s (gpt-oss). dflash-fuse-kernels forms it where
    nothing else reads the two products (a target's sparse MLP, inference
    only).

    ```mlir
    %a = dflash.grouped_linear_swiglu %xs, %w_gate, %w_up, %offsets
        : (tensor<98304x2048xbf16>, tensor<128x768x2048xbf16>,
           tensor<128x768x2048xbf16>, tensor<129xi32>)
        -> tensor<98304x768xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input,
                       DFlash_FloatTensor:$gate_weight,
                       DFlash_FloatTensor:$up_weight,
                       DFlash_IndexTensor:$offsets,
                       Optional<DFlash_FloatTensor>:$gate_bias,
                       Optional<DFlash_FloatTensor>:$up_bias,
                       OptionalAttr<F64Attr>:$alpha,
                       OptionalAttr<F64Attr>:$limit);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $gate_weight `,` $up_weight `,` $offsets "
      "(`biases` $gate_bias^ `,` $up_bias)? attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_MoeUnpermuteOp : DFlash_PureOp<"moe_unpermute"> {
  let summary = "The experts' rows back to their tokens, weighted and summed";
  let description = [{
    `y[t] = sum_j weights[t, j] * permuted[p]` where `source[p] = t * k + j`,
    in fp32, rounded once.

    ```mlir
    %y = dflash.moe_unpermute %ys, %source, %w
        : (tensor<98304x2048xbf16>, tensor<98304xi32>, tensor<12288x8xbf16>)
        -> tensor<12288x2048xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$permuted,
                       DFlash_IndexTensor:$source,
                       DFlash_FloatTensor:$weights);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$permuted `,` $source `,` $weights attr-dict `:` "
      "functional-type(operands, results)";
}

#endif // DFLASH_MOE_OPS_TD
