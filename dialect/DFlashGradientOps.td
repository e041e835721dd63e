//===- DFlashGradientOps.td - dflash gradient ops ----------*- tablegen -*-===//
//
// The ops that `dflash-generate-backward` builds from the VJP rules of the
// forward ops. Each computes exactly the gradient of its forward op; the CPU
// reference (kernels/reference) and the CUDA kernels implement them.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_GRADIENT_OPS_TD
#define DFLASH_GRADIENT_OPS_TD

def DFlash_LinearGradInputOp : DFlash_PureOp<"linear_grad_input"> {
  let summary = "Input gradient of a linear layer, dx = dy W";
  let description = [{
    `result[..., k] = sum_n grad[..., n] * weight[n, k]`.

    ```mlir
    %dx = dflash.linear_grad_input %dy, %w
        : (tensor<4x8192x4096xbf16>, tensor<1024x4096xbf16>)
        -> tensor<4x8192x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$grad, DFlash_FloatTensor:$weight);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$grad `,` $weight attr-dict `:` functional-type(operands, results)";
}

def DFlash_LinearGradWeightOp : DFlash_PureOp<"linear_grad_weight"> {
  let summary = "Weight gradient of a linear layer, dW = dy^T x";
  let description = [{
    `result[n, k] = sum over every leading index r of grad[r, n] * input[r, k]`.

    ```mlir
    %dw = dflash.linear_grad_weight %dy, %x
        : (tensor<4x8192x1024xbf16>, tensor<4x8192x4096xbf16>)
        -> tensor<1024x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$grad, DFlash_FloatTensor:$input);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$grad `,` $input attr-dict `:` functional-type(operands, results)";
}

def DFlash_RmsNormGradOp : DFlash_PureOp<"rms_norm_grad"> {
  let summary = "Gradients of RMS normalisation";
  let description = [{
    Input and weight gradients of `dflash.rms_norm`; the weight gradient is
    summed over every row.

    ```mlir
    %dx, %dw = dflash.rms_norm_grad %dy, %x, %w {eps = 1.0e-06 : f64}
        : (tensor<4x8192x4096xbf16>, tensor<4x8192x4096xbf16>,
           tensor<4096xbf16>) -> (tensor<4x8192x4096xbf16>, tensor<4096xbf16>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$grad, DFlash_FloatTensor:$input,
                       DFlash_FloatTensor:$weight, F64Attr:$eps);
  let results = (outs DFlash_FloatTensor:$input_grad,
                      DFlash_FloatTensor:$weight_grad);
  let assemblyFormat =
      "$grad `,` $input `,` $weight attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_RopeGradOp : DFlash_PureOp<"rope_grad"> {
  let summary = "Input gradient of rotary embedding";
  let description = [{
    The rotation of `dflash.rope` by the opposite angle (its transpose),
    scaled by YaRN's attention factor where `yarn` is given.

    ```mlir
    %dx = dflash.rope_grad %dy, %pos {theta = 1.0e+06 : f64}
        : (tensor<4x8192x32x128xbf16>, tensor<4x8192xi32>)
        -> tensor<4x8192x32x128xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$grad,
                       DFlash_IndexTensor:$positions, F64Attr:$theta,
                       OptionalAttr<DFlash_YarnAttr>:$yarn);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$grad `,` $positions attr-dict `:` functional-type(operands, results)";
}

def DFlash_BlockAttentionGradOp : DFlash_PureOp<"block_attention_grad"> {
  let summary = "Gradients of block-prefix attention";
  let description = [{
    Gradients of `dflash.block_attention` with respect to the query and the
    context and draft keys and values, given the output gradient and the
    forward's output and log-sum-exp. The context key/value gradients sum the
    contributions of every block that sees them; a query that sees nothing
    contributes nothing.

    ```mlir
    %dq, %dkc, %dvc, %dkd, %dvd = dflash.block_attention_grad %do, %q, %kc,
        %vc, %kd, %vd, %anchors, %keep, %position_ids, %o, %lse
        {block_size = 16 : i64}
        : (...) -> (...)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$grad, DFlash_FloatTensor:$query,
                       DFlash_FloatTensor:$context_keys,
                       DFlash_FloatTensor:$context_values,
                       DFlash_FloatTensor:$draft_keys,
                       DFlash_FloatTensor:$draft_values,
                       DFlash_IndexTensor:$anchors, DFlash_FlagTensor:$keep,
                       DFlash_IndexTensor:$position_ids,
                       DFlash_FloatTensor:$output, DFlash_F32Tensor:$lse,
                       I64Attr:$block_size, OptionalAttr<I64Attr>:$window,
                       UnitAttr:$causal);
  let results = (outs DFlash_FloatTensor:$query_grad,
                      DFlash_FloatTensor:$context_keys_grad,
                      DFlash_FloatTensor:$context_values_grad,
                      DFlash_FloatTensor:$draft_keys_grad,
                      DFlash_FloatTensor:$draft_values_grad);
  let assemblyFormat =
      "$grad `,` $query `,` $context_keys `,` $context_values `,` "
      "$draft_keys `,` $draft_values `,` $anchors `,` $keep `,` $position_ids "
      "`,` $output `,` $lse attr-dict `:` functional-type(operands, results)";
}

def DFlash_SwigluGradOp : DFlash_PureOp<"swiglu_grad"> {
  let summary = "Gradients of silu(gate) * up";
  let description = [{
    ```mlir
    %dg, %du = dflash.swiglu_grad %dy, %g, %u
        : (tensor<4x8192x12288xbf16>, tensor<4x8192x12288xbf16>,
           tensor<4x8192x12288xbf16>)
        -> (tensor<4x8192x12288xbf16>, tensor<4x8192x12288xbf16>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$grad, DFlash_FloatTensor:$gate,
                       DFlash_FloatTensor:$up);
  let results = (outs DFlash_FloatTensor:$gate_grad,
                      DFlash_FloatTensor:$up_grad);
  let assemblyFormat =
      "$grad `,` $gate `,` $up attr-dict `:` functional-type(operands, results)";
}

def DFlash_LmHeadCeGradOp : DFlash_PureOp<"lm_head_ce_grad"> {
  let summary = "Input gradient of the fused lm_head cross-entropy";
  let description = [{
    `d(loss_sum_grad * loss_sum) / d input` of `dflash.lm_head_ce` (same
    `multiplier` and `softcap`): with `z = input @ weight^T` and
    `u = T(z)`, `result = loss_sum_grad * sum over rows of T'(z) * w *
    (softmax(u) - onehot) @ weight`, the logits recomputed one chunk of rows
    at a time (`T'` = 1 for the identity).

    ```mlir
    %dy = dflash.lm_head_ce_grad %y, %lm_head, %labels, %weights, %seed
        : (tensor<4x8192x4096xbf16>, tensor<151936x4096xbf16>,
           tensor<4x8192xi32>, tensor<4x8192xf32>, tensor<f32>)
        -> tensor<4x8192x4096xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$labels,
                       DFlash_F32Tensor:$weights,
                       DFlash_F32Scalar:$loss_sum_grad,
                       DefaultValuedAttr<F64Attr, "1.0">:$multiplier,
                       DefaultValuedAttr<F64Attr, "0.0">:$softcap);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $weight `,` $labels `,` $weights `,` $loss_sum_grad "
      "attr-dict `:` functional-type(operands, results)";
}

def DFlash_GroupedConvGradOp : DFlash_PureOp<"grouped_conv_grad"> {
  let summary = "Gradients of the DFlash2 grouped convolution";
  let description = [{
    Given the output gradient `grad` of `dflash.grouped_conv` (same
    attributes and forward operands), with `q = n * block_size + k`:
    - `input_grad[b, q, c] = sum over o with k + o < block_size of
      (base[o, c] + D[b, q + o, half, o, c / gs]) * grad[b, q + o, c]`;
    - `delta_grad[b, q, half, o, g] = sum over c in group g of
      grad[b, q, c] * input[b, q - o, c]` (0 where `k < o`); the other half
      of `delta_grad` is 0;
    - `base_grad[o, c] = sum over b, q with k >= o of grad[b, q, c] *
      input[b, q - o, c]`, at `base`'s row `half` when `base` is
      `[2, kc, H]`, the other row 0.
    The zeros make `delta_grad` (and a whole `base_grad`) accumulate
    exactly: the `dflash.add` that `dflash-generate-backward` puts between
    the two convolutions sharing one `D` adds each entry to a 0, so a
    kernel may as well write its half into a buffer that holds the other
    half's.

    ```mlir
    %dh, %dd, %dbase = dflash.grouped_conv_grad %dy, %h, %d, %base
        {block_size = 8 : i64, kernel_size = 2 : i64, group_size = 16 : i64,
         half = 0 : i64}
        : (tensor<4x4096x5120xbf16>, tensor<4x4096x5120xbf16>,
           tensor<4x4096x1280xbf16>, tensor<2x2x5120xbf16>)
        -> (tensor<4x4096x5120xbf16>, tensor<4x4096x1280xbf16>,
            tensor<2x2x5120xbf16>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$grad, DFlash_FloatTensor:$input,
                       DFlash_FloatTensor:$delta, DFlash_FloatTensor:$base,
                       I64Attr:$block_size, I64Attr:$kernel_size,
                       I64Attr:$group_size, I64Attr:$half);
  let results = (outs DFlash_FloatTensor:$input_grad,
                      DFlash_FloatTensor:$delta_grad,
                      DFlash_FloatTensor:$base_grad);
  let assemblyFormat =
      "$grad `,` $input `,` $delta `,` $base attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_SelectorCandidatesGradOp
    : DFlash_PureOp<"selector_candidates_grad", [AttrSizedOperandSegments]> {
  let summary = "Input gradient of the DFlash2 selector's unary top-K";
  let description = [{
    The gradient that `values` and `label_values` of
    `dflash.selector_candidates` pass back to its input: per row with a
    nonzero weight, `input_grad = sum_j values_grad_j * T'(z_cj) *
    weight[c_j] + label_values_grad * T'(z_label) * weight[label]`, with
    `z = input @ weight^T` and `T'(z) = multiplier * (1 - tanh^2(multiplier
    * z / softcap))` (`multiplier` without a cap). Sparse: K + 1 rows of
    the lm_head per row, never a [rows, V] product. Either gradient may be
    absent (zero): `label_values_grad` is, unless the selector injects.

    ```mlir
    %dy = dflash.selector_candidates_grad %y, %lm_head, %candidates, %labels,
        %weights values_grad %dv label_values_grad %dl
        {top_k = 16 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
        : (...) -> tensor<4x4096x5120xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$candidates,
                       DFlash_IndexTensor:$labels, DFlash_F32Tensor:$weights,
                       Optional<DFlash_F32Tensor>:$values_grad,
                       Optional<DFlash_F32Tensor>:$label_values_grad,
                       I64Attr:$top_k, F64Attr:$multiplier, F64Attr:$softcap);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $weight `,` $candidates `,` $labels `,` $weights "
      "(`values_grad` $values_grad^)? "
      "(`label_values_grad` $label_values_grad^)? attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_SelectorLossGradOp : DFlash_PureOp<"selector_loss_grad"> {
  let summary = "Gradients of the DFlash2 selector's loss sum";
  let description = [{
    `d(loss_sum_grad * loss_sum) / d operand` of `dflash.selector_loss`
    (same operands and attributes), `kernels/reference/DFlash2.h`'s
    `selectorBackward`. At a covered row of weight `w`, with
    `e_j = loss_sum_grad * w * (softmax(s)_j - [j == j*])`, `z = P[p] * t`
    and `dz = sum_j e_j S[c_j]`:
    - `values_grad` [rows, K] = `e_j` at candidate j, and
      `label_values_grad` [rows] = `e_K` where the label was injected, 0
      elsewhere; both 0 with `stop_gradient`;
    - `projected_grad` [rows, r] = `dz * P[p]`, the gradient of `t`, given
      with `stop_gradient` too: `Wh` learns from it (the VJP turns it into
      `linear_grad_weight`, and into `linear_grad_input` unless
      `stop_gradient`);
    - `predecessor_codebook_grad` and `successor_codebook_grad` [V, r] are
      row scatter-adds into zeros: row `p` gets `dz * t` once per covered
      row, row `c_j` gets `e_j z` for each of its K candidates. A kernel
      zeroes them and adds 1 + K rows per covered row (atomically: rows
      repeat); nothing is a dense [V, r] product.
    Uncovered and zero-weight rows contribute nothing.

    ```mlir
    %dv, %dl, %dt, %dpcb, %dscb = dflash.selector_loss_grad %values,
        %candidates, %label_values, %y, %wh, %predecessors, %labels,
        %weights, %pcb, %scb, %seed {gold = "topk"} : (...) -> (...)
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
                       DFlash_F32Scalar:$loss_sum_grad,
                       StrAttr:$gold, UnitAttr:$stop_gradient);
  let results = (outs DFlash_F32Tensor:$values_grad,
                      DFlash_F32Tensor:$label_values_grad,
                      DFlash_FloatTensor:$projected_grad,
                      DFlash_FloatTensor:$predecessor_codebook_grad,
                      DFlash_FloatTensor:$successor_codebook_grad);
  let assemblyFormat =
      "$values `,` $candidates `,` $label_values `,` $input `,` $projection "
      "`,` $predecessors `,` $labels `,` $weights `,` $predecessor_codebook "
      "`,` $successor_codebook `,` $loss_sum_grad attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_SelectorObjectiveGradOp : DFlash_PureOp<"selector_objective_grad"> {
  let summary = "The selector sum's gradient in selector_objective";
  let description = [{
    `result = grad * alpha`, or with `covered` `grad * alpha * weight_sum /
    covered_weight` (0 when `covered_weight` is 0): the derivative of
    `dflash.selector_objective` by its `selector_sum`.

    ```mlir
    %g = dflash.selector_objective_grad %grad, %alpha, %wsum, %covered
        : (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins DFlash_F32Scalar:$grad, DFlash_F32Scalar:$alpha,
                       DFlash_F32Scalar:$weight_sum,
                       DFlash_F32Scalar:$covered_weight, UnitAttr:$covered);
  let results = (outs DFlash_F32Scalar:$result);
  let assemblyFormat =
      "$grad `,` $alpha `,` $weight_sum `,` $covered_weight attr-dict `:` "
      "functional-type(operands, results)";
}

#endif // DFLASH_GRADIENT_OPS_TD
