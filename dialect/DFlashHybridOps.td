//===- DFlashHybridOps.td - Gated DeltaNet and gated attention -*- tablegen -*-===//
//
// The ops of a Qwen3.5 / Qwen3.6 / Qwen3-Next target beside the dense ones:
// the Gated DeltaNet layer's causal short convolution, its chunk-wise gated
// delta rule and its gated RMSNorm; the zero-centred RMSNorm of every other
// norm; the full-attention layers' partial rotary, the split of a tensor's
// last dimension (q_proj into query and output gate, the convolved q, k and
// v), and the sigmoid gate (also the shared expert's).
// Inference only: none is differentiable. Packed rows (docs/semantics.md
// section 9) restart the convolution and the recurrence at each conversation,
// by the rule causal_attention uses: token j is in token i's conversation iff
// `position_ids[b, i] - position_ids[b, j] == i - j`.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_HYBRID_OPS_TD
#define DFLASH_HYBRID_OPS_TD

def DFlash_CausalConvOp : DFlash_PureOp<"causal_conv"> {
  let summary = "Depthwise causal convolution over time, then SiLU";
  let description = [{
    `input` [B, S, C], `weight` [C, K]: in fp32,
    `y[b, t, c] = silu(sum_j weight[c, j] * input[b, t - (K - 1) + j, c])`
    over the `j` whose token is in token `t`'s conversation (earlier ones,
    and those before the row, count as zero).

    ```mlir
    %y = dflash.causal_conv %x, %w, %pos
        : (tensor<4x3072x10240xbf16>, tensor<10240x4xbf16>, tensor<4x3072xi32>)
        -> tensor<4x3072x10240xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       DFlash_IndexTensor:$position_ids);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $weight `,` $position_ids attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_GatedDeltaRuleOp : DFlash_PureOp<"gated_delta_rule"> {
  let summary = "The gated delta rule of a Gated DeltaNet layer";
  let description = [{
    `query`, `key` [B, S, Hk, dk], `value` [B, S, Hv, dv] with Hv a multiple
    of Hk (value head `h` reads key head `h / (Hv / Hk)`), `a`, `b`
    [B, S, Hv], `a_log`, `dt_bias` [Hv]. In fp32, per row and value head:
    q and k are L2-normalised (`x * rsqrt(sum x^2 + 1e-6)`) and q is scaled
    by `dk^-0.5`; `beta = sigmoid(b)`, `g = -exp(a_log) * softplus(a +
    dt_bias)`. The state `M` [dk, dv] is zero at each conversation's first
    token; at each token
    `M = exp(g) M`, `M += k (beta (v - M^T k))^T`, `result = M^T q`.
    A kernel computes it chunk-wise (the WY/UT form); the result is the
    same up to rounding.

    ```mlir
    %o = dflash.gated_delta_rule %q, %k, %v, %a, %b, %alog, %dt, %pos
        : (tensor<4x3072x16x128xbf16>, tensor<4x3072x16x128xbf16>,
           tensor<4x3072x48x128xbf16>, tensor<4x3072x48xbf16>,
           tensor<4x3072x48xbf16>, tensor<48xbf16>, tensor<48xbf16>,
           tensor<4x3072xi32>) -> tensor<4x3072x48x128xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$query, DFlash_FloatTensor:$key,
                       DFlash_FloatTensor:$value, DFlash_FloatTensor:$a,
                       DFlash_FloatTensor:$b, DFlash_FloatTensor:$a_log,
                       DFlash_FloatTensor:$dt_bias,
                       DFlash_IndexTensor:$position_ids);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$query `,` $key `,` $value `,` $a `,` $b `,` $a_log `,` $dt_bias `,` "
      "$position_ids attr-dict `:` functional-type(operands, results)";
}

def DFlash_GatedRmsNormOp : DFlash_PureOp<"gated_rms_norm"> {
  let summary = "RMS normalisation, then a SiLU gate";
  let description = [{
    Over the last dimension, in fp32:
    `x * rsqrt(mean(x^2) + eps) * weight * silu(gate)` (the weight as is,
    not zero-centred), the result cast to the input's element type.

    ```mlir
    %y = dflash.gated_rms_norm %o, %z, %w {eps = 1.0e-06 : f64}
        : (tensor<4x3072x48x128xbf16>, tensor<4x3072x48x128xbf16>,
           tensor<128xbf16>) -> tensor<4x3072x48x128xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$gate,
                       DFlash_FloatTensor:$weight, F64Attr:$eps);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $gate `,` $weight attr-dict `:` "
      "functional-type(operands, results)";
}

def DFlash_ZeroCentredRmsNormOp : DFlash_PureOp<"zero_centred_rms_norm"> {
  let summary = "RMS normalisation with a weight centred on zero";
  let description = [{
    In fp32: `x * rsqrt(mean(x^2) + eps) * (1 + weight)` over the last
    dimension, the result cast to the input's element type (the checkpoint
    stores each weight as its offset from 1).

    ```mlir
    %h = dflash.zero_centred_rms_norm %x, %w {eps = 1.0e-06 : f64}
        : (tensor<4x3072x5120xbf16>, tensor<5120xbf16>)
        -> tensor<4x3072x5120xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$weight,
                       F64Attr:$eps);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $weight attr-dict `:` functional-type(operands, results)";
}

def DFlash_PartialRopeOp : DFlash_PureOp<"partial_rope"> {
  let summary = "Rotary position embedding of the first dimensions of a head";
  let description = [{
    `rope` on the first `rotary_dim` dimensions of each head vector (its
    frequencies `theta^(-2i/rotary_dim)`, dimension `i` paired with
    `i + rotary_dim/2`); the others pass through.

    ```mlir
    %qr = dflash.partial_rope %q, %pos {theta = 1.0e+07 : f64, rotary_dim = 64 : i64}
        : (tensor<4x3072x24x256xbf16>, tensor<4x3072xi32>)
        -> tensor<4x3072x24x256xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input,
                       DFlash_IndexTensor:$positions, F64Attr:$theta,
                       I64Attr:$rotary_dim);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $positions attr-dict `:` functional-type(operands, results)";
}

def DFlash_SplitLastOp : DFlash_PureOp<"split_last"> {
  let summary = "Consecutive parts of the last dimension";
  let description = [{
    `input` [..., sum(sizes)] into one result per entry of `sizes`, result
    `r` holding the input's last-dimension entries from `sum(sizes[:r])` on
    (a DeltaNet layer's convolved q, k and v; a full-attention layer's
    q_proj reshaped to heads: each head's query, then its output gate).

    ```mlir
    %q, %gate = dflash.split_last %qg {sizes = array<i64: 256, 256>}
        : (tensor<4x3072x24x512xbf16>)
        -> (tensor<4x3072x24x256xbf16>, tensor<4x3072x24x256xbf16>)
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DenseI64ArrayAttr:$sizes);
  let results = (outs Variadic<DFlash_FloatTensor>:$parts);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def DFlash_SigmoidGateOp : DFlash_PureOp<"sigmoid_gate"> {
  let summary = "input * sigmoid(gate)";
  let description = [{
    Elementwise in fp32; `gate` has the input's shape, or its last dimension
    is 1 and it is broadcast along the input's (the shared expert's gate,
    one a token).

    ```mlir
    %y = dflash.sigmoid_gate %o, %g
        : (tensor<4x3072x6144xbf16>, tensor<4x3072x6144xbf16>)
        -> tensor<4x3072x6144xbf16>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input, DFlash_FloatTensor:$gate);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input `,` $gate attr-dict `:` functional-type(operands, results)";
}

#endif // DFLASH_HYBRID_OPS_TD
