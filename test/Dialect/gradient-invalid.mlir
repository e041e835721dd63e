// RUN: dflash-opt %s --split-input-file --verify-diagnostics

func.func @lgi_rank(%dy: tensor<32xbf16>, %w: tensor<32x64xbf16>) {
  // expected-error @+1 {{(C1) grad must have rank 2 or more but has rank 1}}
  %dx = dflash.linear_grad_input %dy, %w : (tensor<32xbf16>, tensor<32x64xbf16>) -> tensor<64xbf16>
  return
}

// -----

func.func @lgi_dim(%dy: tensor<4x32xbf16>, %w: tensor<16x64xbf16>) {
  // expected-error @+1 {{(C2) grad's last dimension (32) must equal weight's output dimension (16)}}
  %dx = dflash.linear_grad_input %dy, %w : (tensor<4x32xbf16>, tensor<16x64xbf16>) -> tensor<4x64xbf16>
  return
}

// -----

func.func @lgi_result(%dy: tensor<4x32xbf16>, %w: tensor<32x64xbf16>) {
  // expected-error @+1 {{(C3) result must have shape [4x64] but has [4x32]}}
  %dx = dflash.linear_grad_input %dy, %w : (tensor<4x32xbf16>, tensor<32x64xbf16>) -> tensor<4x32xbf16>
  return
}

// -----

func.func @lgi_type(%dy: tensor<4x32xbf16>, %w: tensor<32x64xf32>) {
  // expected-error @+1 {{(C4) grad and weight must have the same element type}}
  %dx = dflash.linear_grad_input %dy, %w : (tensor<4x32xbf16>, tensor<32x64xf32>) -> tensor<4x64xbf16>
  return
}

// -----

func.func @lgw_rows(%dy: tensor<4x32xbf16>, %x: tensor<5x64xbf16>) {
  // expected-error @+1 {{(C1) grad [4x32] and input [5x64] must have rank 2 or more and the same leading dimensions}}
  %dw = dflash.linear_grad_weight %dy, %x : (tensor<4x32xbf16>, tensor<5x64xbf16>) -> tensor<32x64xbf16>
  return
}

// -----

func.func @lgw_result(%dy: tensor<4x32xbf16>, %x: tensor<4x64xbf16>) {
  // expected-error @+1 {{(C2) result must have shape [32x64] but has [64x32]}}
  %dw = dflash.linear_grad_weight %dy, %x : (tensor<4x32xbf16>, tensor<4x64xbf16>) -> tensor<64x32xbf16>
  return
}

// -----

func.func @lgw_type(%dy: tensor<4x32xbf16>, %x: tensor<4x64xf32>) {
  // expected-error @+1 {{(C3) grad and input must have the same element type}}
  %dw = dflash.linear_grad_weight %dy, %x : (tensor<4x32xbf16>, tensor<4x64xf32>) -> tensor<32x64xbf16>
  return
}

// -----

func.func @rng_eps(%dy: tensor<4x64xbf16>, %x: tensor<4x64xbf16>, %w: tensor<64xbf16>) {
  // expected-error @+1 {{(C1) eps is -1 but must be positive}}
  %dx, %dw = dflash.rms_norm_grad %dy, %x, %w {eps = -1.0 : f64} : (tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<64xbf16>) -> (tensor<4x64xbf16>, tensor<64xbf16>)
  return
}

// -----

func.func @rng_weight(%dy: tensor<4x64xbf16>, %x: tensor<4x64xbf16>, %w: tensor<32xbf16>) {
  // expected-error @+1 {{(C2) weight must have shape [64] but has [32]}}
  %dx, %dw = dflash.rms_norm_grad %dy, %x, %w {eps = 1.0e-6 : f64} : (tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<32xbf16>) -> (tensor<4x64xbf16>, tensor<32xbf16>)
  return
}

// -----

func.func @rng_results(%dy: tensor<4x64xbf16>, %x: tensor<4x64xbf16>, %w: tensor<64xbf16>) {
  // expected-error @+1 {{(C3) weight_grad ('tensor<64xf32>') and weight ('tensor<64xbf16>') must have the same type}}
  %dx, %dw = dflash.rms_norm_grad %dy, %x, %w {eps = 1.0e-6 : f64} : (tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<64xbf16>) -> (tensor<4x64xbf16>, tensor<64xf32>)
  return
}

// -----

func.func @rope_grad_positions(%dy: tensor<2x12x4x16xbf16>, %p: tensor<2x11xi32>) {
  // expected-error @+1 {{(C4) positions must have shape [2x12] but has [2x11]}}
  %dx = dflash.rope_grad %dy, %p {theta = 1.0e6 : f64} : (tensor<2x12x4x16xbf16>, tensor<2x11xi32>) -> tensor<2x12x4x16xbf16>
  return
}

// -----

func.func @attn_grad_lse(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xbf16>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>, %lse: tensor<2x12xf32>) {
  // expected-error @+1 {{(C9) lse must have shape [2x12x4] but has [2x12]}}
  %dq, %dkc, %dvc, %dkd, %dvd = dflash.block_attention_grad %q, %q, %kc, %kc, %kd, %kd, %a, %k, %pos, %q, %lse {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>, tensor<2x12x4x16xbf16>, tensor<2x12xf32>)
      -> (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>)
  return
}

// -----

func.func @attn_grad_results(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xbf16>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>, %lse: tensor<2x12x4xf32>) {
  // expected-error @+1 {{(C10) context_keys_grad ('tensor<2x12x2x16xbf16>') and context_keys ('tensor<2x32x2x16xbf16>') must have the same type}}
  %dq, %dkc, %dvc, %dkd, %dvd = dflash.block_attention_grad %q, %q, %kc, %kc, %kd, %kd, %a, %k, %pos, %q, %lse {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>, tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
      -> (tensor<2x12x4x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>)
  return
}

// -----

func.func @attn_grad_gqa(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x3x16xbf16>, %kd: tensor<2x12x3x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>, %lse: tensor<2x12x4xf32>) {
  // expected-error @+1 {{(C5) num_heads (4) must be a multiple of num_kv_heads (3)}}
  %dq, %dkc, %dvc, %dkd, %dvd = dflash.block_attention_grad %q, %q, %kc, %kc, %kd, %kd, %a, %k, %pos, %q, %lse {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x12x4x16xbf16>, tensor<2x32x3x16xbf16>, tensor<2x32x3x16xbf16>, tensor<2x12x3x16xbf16>, tensor<2x12x3x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>, tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
      -> (tensor<2x12x4x16xbf16>, tensor<2x32x3x16xbf16>, tensor<2x32x3x16xbf16>, tensor<2x12x3x16xbf16>, tensor<2x12x3x16xbf16>)
  return
}

// -----

func.func @swiglu_grad_types(%dy: tensor<4x64xbf16>, %g: tensor<4x64xbf16>, %u: tensor<4x32xbf16>) {
  // expected-error @+1 {{(C1) up ('tensor<4x32xbf16>') and grad ('tensor<4x64xbf16>') must have the same type}}
  %dg, %du = dflash.swiglu_grad %dy, %g, %u : (tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<4x32xbf16>) -> (tensor<4x64xbf16>, tensor<4x32xbf16>)
  return
}

// -----

func.func @ce_grad_result(%y: tensor<2x12x64xbf16>, %w: tensor<100x64xbf16>, %l: tensor<2x12xi32>, %wt: tensor<2x12xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{(C4) result ('tensor<2x12x64xf32>') and input ('tensor<2x12x64xbf16>') must have the same type}}
  %dy = dflash.lm_head_ce_grad %y, %w, %l, %wt, %s : (tensor<2x12x64xbf16>, tensor<100x64xbf16>, tensor<2x12xi32>, tensor<2x12xf32>, tensor<f32>) -> tensor<2x12x64xf32>
  return
}

// -----

func.func @ce_grad_hidden(%y: tensor<2x12x64xbf16>, %w: tensor<100x32xbf16>, %l: tensor<2x12xi32>, %wt: tensor<2x12xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{(C2) weight's hidden dimension (32) must equal the input's last dimension (64)}}
  %dy = dflash.lm_head_ce_grad %y, %w, %l, %wt, %s : (tensor<2x12x64xbf16>, tensor<100x32xbf16>, tensor<2x12xi32>, tensor<2x12xf32>, tensor<f32>) -> tensor<2x12x64xbf16>
  return
}

// -----

func.func @ce_grad_multiplier(%y: tensor<2x12x64xbf16>, %w: tensor<100x64xbf16>, %l: tensor<2x12xi32>, %wt: tensor<2x12xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{(C5) multiplier is -1.5 but must be positive}}
  %dy = dflash.lm_head_ce_grad %y, %w, %l, %wt, %s {multiplier = -1.5 : f64} : (tensor<2x12x64xbf16>, tensor<100x64xbf16>, tensor<2x12xi32>, tensor<2x12xf32>, tensor<f32>) -> tensor<2x12x64xbf16>
  return
}
