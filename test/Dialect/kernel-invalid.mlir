// RUN: dflash-opt %s --split-input-file --verify-diagnostics

// The fused kernel ops of dflash-fuse-kernels. One case per numbered
// constraint of docs/dialect.md.

func.func @linear_residual_result(%r: tensor<4x16xbf16>, %x: tensor<4x64xbf16>, %w: tensor<16x64xbf16>) {
  // expected-error @+1 {{(C1) result}}
  %y = dflash.linear_residual %r, %x, %w : (tensor<4x16xbf16>, tensor<4x64xbf16>, tensor<16x64xbf16>) -> tensor<4x16xf32>
  return
}

// -----

func.func @linear_residual_shapes(%r: tensor<4x16xbf16>, %x: tensor<4x64xbf16>, %w: tensor<16x32xbf16>) {
  // expected-error @+1 {{(C2) residual 'tensor<4x16xbf16>', input 'tensor<4x64xbf16>' and weight 'tensor<16x32xbf16>' do not form residual + input weight^T}}
  %y = dflash.linear_residual %r, %x, %w : (tensor<4x16xbf16>, tensor<4x64xbf16>, tensor<16x32xbf16>) -> tensor<4x16xbf16>
  return
}

// -----

func.func @linear_residual_rows(%r: tensor<5x16xbf16>, %x: tensor<4x64xbf16>, %w: tensor<16x64xbf16>) {
  // expected-error @+1 {{(C2) residual 'tensor<5x16xbf16>'}}
  %y = dflash.linear_residual %r, %x, %w : (tensor<5x16xbf16>, tensor<4x64xbf16>, tensor<16x64xbf16>) -> tensor<5x16xbf16>
  return
}

// -----

func.func @linear_residual_types(%r: tensor<4x16xf32>, %x: tensor<4x64xbf16>, %w: tensor<16x64xbf16>) {
  // expected-error @+1 {{(C3) input, weight and residual must have one element type}}
  %y = dflash.linear_residual %r, %x, %w : (tensor<4x16xf32>, tensor<4x64xbf16>, tensor<16x64xbf16>) -> tensor<4x16xf32>
  return
}

// -----

func.func @linear_swiglu_weights(%x: tensor<4x64xbf16>, %wg: tensor<96x64xbf16>, %wu: tensor<80x64xbf16>) {
  // expected-error @+1 {{(C1) gate weight 'tensor<96x64xbf16>' and up weight 'tensor<80x64xbf16>' must be one [F, K] shape}}
  %y = dflash.linear_swiglu %x, %wg, %wu : (tensor<4x64xbf16>, tensor<96x64xbf16>, tensor<80x64xbf16>) -> tensor<4x96xbf16>
  return
}

// -----

func.func @linear_swiglu_shapes(%x: tensor<4x32xbf16>, %wg: tensor<96x64xbf16>, %wu: tensor<96x64xbf16>) {
  // expected-error @+1 {{(C2) result 'tensor<4x96xbf16>', input 'tensor<4x32xbf16>' and weights 'tensor<96x64xbf16>' do not form swiglu(input weight^T)}}
  %y = dflash.linear_swiglu %x, %wg, %wu : (tensor<4x32xbf16>, tensor<96x64xbf16>, tensor<96x64xbf16>) -> tensor<4x96xbf16>
  return
}

// -----

func.func @linear_swiglu_types(%x: tensor<4x64xbf16>, %wg: tensor<96x64xbf16>, %wu: tensor<96x64xbf16>) {
  // expected-error @+1 {{(C3) input, weights and result must have one element type}}
  %y = dflash.linear_swiglu %x, %wg, %wu : (tensor<4x64xbf16>, tensor<96x64xbf16>, tensor<96x64xbf16>) -> tensor<4x96xf32>
  return
}

// -----

// lm_head_ce_fused with a folded top-K: three results with top_k, none
// without.
func.func @lm_head_ce_fused_top_k_results(%y: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %l: tensor<2x4xi32>, %wt: tensor<2x4xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{(C4) has 0 top_k_results but needs 3 with top_k, else none}}
  %a, %b, %c, %d, %hits, %dy = dflash.lm_head_ce_fused %y, %w, %l, %wt, %s {top_k = 2 : i64}
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>, tensor<f32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>, tensor<2x4x8xbf16>)
  return
}

// -----

func.func @lm_head_ce_fused_top_k_range(%y: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %l: tensor<2x4xi32>, %wt: tensor<2x4xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{(C5) top_k is 17 but must lie in 1..16 (the vocabulary)}}
  %a, %b, %c, %d, %hits, %dy, %v, %cand, %lv = dflash.lm_head_ce_fused %y, %w, %l, %wt, %s {top_k = 17 : i64}
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>, tensor<f32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>, tensor<2x4x8xbf16>,
          tensor<2x4x17xf32>, tensor<2x4x17xi32>, tensor<2x4xf32>)
  return
}

// -----

func.func @lm_head_ce_fused_top_k_shapes(%y: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %l: tensor<2x4xi32>, %wt: tensor<2x4xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{(C5) candidates is 'tensor<2x4x3xi32>' but must be 'tensor<2x4x2xi32>'}}
  %a, %b, %c, %d, %hits, %dy, %v, %cand, %lv = dflash.lm_head_ce_fused %y, %w, %l, %wt, %s {top_k = 2 : i64}
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>, tensor<f32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>, tensor<2x4x8xbf16>,
          tensor<2x4x2xf32>, tensor<2x4x3xi32>, tensor<2x4xf32>)
  return
}

// -----

func.func @lm_head_ce_top_k_rows(%y: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %l: tensor<2x5xi32>, %wt: tensor<2x4xf32>) {
  // expected-error @+1 {{(C2) labels, weights and hits must have one entry per row}}
  %a, %b, %c, %d, %hits, %v, %cand, %lv = dflash.lm_head_ce_top_k %y, %w, %l, %wt {top_k = 2 : i64}
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x5xi32>, tensor<2x4xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>,
          tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2x4xf32>)
  return
}

// -----

func.func @lm_head_ce_top_k_range(%y: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %l: tensor<2x4xi32>, %wt: tensor<2x4xf32>) {
  // expected-error @+1 {{(C3) top_k is 0 but must lie in 1..16 (the vocabulary)}}
  %a, %b, %c, %d, %hits, %v, %cand, %lv = dflash.lm_head_ce_top_k %y, %w, %l, %wt {top_k = 0 : i64}
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>,
          tensor<2x4x0xf32>, tensor<2x4x0xi32>, tensor<2x4xf32>)
  return
}

// -----

func.func @lm_head_ce_top_k_label_values(%y: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %l: tensor<2x4xi32>, %wt: tensor<2x4xf32>) {
  // expected-error @+1 {{(C4) label_values is 'tensor<2x5xf32>' but must be 'tensor<2x4xf32>'}}
  %a, %b, %c, %d, %hits, %v, %cand, %lv = dflash.lm_head_ce_top_k %y, %w, %l, %wt {top_k = 2 : i64}
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>,
          tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2x5xf32>)
  return
}

// -----

func.func @lm_head_ce_fused_softcap(%y: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %l: tensor<2x4xi32>, %wt: tensor<2x4xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{(C6) softcap is -4 but must be 0 (none) or positive}}
  %a, %b, %c, %d, %hits, %dy = dflash.lm_head_ce_fused %y, %w, %l, %wt, %s {softcap = -4.0 : f64}
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>, tensor<f32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>, tensor<2x4x8xbf16>)
  return
}

// -----

func.func @lm_head_ce_top_k_multiplier(%y: tensor<2x4x8xbf16>, %w: tensor<16x8xbf16>, %l: tensor<2x4xi32>, %wt: tensor<2x4xf32>) {
  // expected-error @+1 {{(C5) multiplier is 0 but must be positive}}
  %a, %b, %c, %d, %hits, %v, %cand, %lv = dflash.lm_head_ce_top_k %y, %w, %l, %wt {top_k = 2 : i64, multiplier = 0.0 : f64}
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>,
          tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2x4xf32>)
  return
}
