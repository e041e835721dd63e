// RUN: dflash-opt %s --split-input-file --verify-diagnostics

func.func @heads(%q: tensor<2x8x6x16xbf16>, %k: tensor<2x8x4x16xbf16>, %pos: tensor<2x8xi32>) {
  // expected-error @+1 {{(C3) query heads (6) must be a multiple of key/value heads (4)}}
  %o = dflash.causal_attention %q, %k, %k, %pos
      : (tensor<2x8x6x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x6x16xbf16>
  return
}

// -----

func.func @key_length(%q: tensor<2x8x4x16xbf16>, %k: tensor<2x6x2x16xbf16>, %pos: tensor<2x8xi32>) {
  // expected-error @+1 {{(C2) keys [2x6x2x16] must have the rows, positions and head dimension of query [2x8x4x16]}}
  %o = dflash.causal_attention %q, %k, %k, %pos
      : (tensor<2x8x4x16xbf16>, tensor<2x6x2x16xbf16>, tensor<2x6x2x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x4x16xbf16>
  return
}

// -----

func.func @positions(%q: tensor<2x8x4x16xbf16>, %k: tensor<2x8x2x16xbf16>, %pos: tensor<2x6xi32>) {
  // expected-error @+1 {{(C4) position_ids must have shape [2x8] but has [2x6]}}
  %o = dflash.causal_attention %q, %k, %k, %pos
      : (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x6xi32>) -> tensor<2x8x4x16xbf16>
  return
}

// -----

func.func @concat_width(%a: tensor<2x8x16xbf16>, %b: tensor<2x8x16xbf16>) {
  // expected-error @+1 {{(C3) result must have shape [2x8x32] but has [2x8x48]}}
  %f = dflash.concat_last %a, %b : (tensor<2x8x16xbf16>, tensor<2x8x16xbf16>) -> tensor<2x8x48xbf16>
  return
}

// -----

func.func @concat_rows(%a: tensor<2x8x16xbf16>, %b: tensor<2x4x16xbf16>) {
  // expected-error @+1 {{(C2) every input must have the element type and leading dimensions of the first, [2x8x16]}}
  %f = dflash.concat_last %a, %b : (tensor<2x8x16xbf16>, tensor<2x4x16xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @scaling_bands(%x: tensor<2x8x4x16xbf16>, %pos: tensor<2x8xi32>) {
  // expected-error @+1 {{(C2) high_freq_factor must be at least low_freq_factor}}
  %y = dflash.scaled_rope %x, %pos {theta = 5.0e+05 : f64, factor = 8.0 : f64, low_freq_factor = 4.0 : f64, high_freq_factor = 1.0 : f64, original_max_positions = 8192 : i64}
      : (tensor<2x8x4x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x4x16xbf16>
  return
}

// -----

func.func @scaling_factor(%x: tensor<2x8x4x16xbf16>, %pos: tensor<2x8xi32>) {
  // expected-error @+1 {{(C1) factor is 0 but must be positive}}
  %y = dflash.scaled_rope %x, %pos {theta = 5.0e+05 : f64, factor = 0.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_positions = 8192 : i64}
      : (tensor<2x8x4x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x4x16xbf16>
  return
}

// -----

func.func @sinks_per_head(%q: tensor<2x8x4x16xbf16>, %k: tensor<2x8x2x16xbf16>, %pos: tensor<2x8xi32>, %s: tensor<2xbf16>) {
  // expected-error @+1 {{(C7) sinks must have shape [4] but has [2]}}
  %o = dflash.causal_attention %q, %k, %k, %pos sinks %s {window = 4 : i64}
      : (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8xi32>, tensor<2xbf16>) -> tensor<2x8x4x16xbf16>
  return
}

// -----

func.func @window_sign(%q: tensor<2x8x4x16xbf16>, %k: tensor<2x8x2x16xbf16>, %pos: tensor<2x8xi32>) {
  // expected-error @+1 {{(C6) window is -3 but must be 0 (none) or positive}}
  %o = dflash.causal_attention %q, %k, %k, %pos {window = -3 : i64}
      : (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x4x16xbf16>
  return
}

// -----

func.func @bias_width(%x: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %b: tensor<32xbf16>) {
  // expected-error @+1 {{(C6) bias must have shape [64] but has [32]}}
  %y = dflash.biased_linear %x, %w, %b : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<32xbf16>) -> tensor<2x8x64xbf16>
  return
}

// -----

func.func @yarn_betas(%x: tensor<2x8x4x16xbf16>, %pos: tensor<2x8xi32>) {
  // expected-error @+1 {{(C2) beta_fast must be at least beta_slow}}
  %y = dflash.yarn_rope %x, %pos {theta = 1.5e+05 : f64, factor = 32.0 : f64,
      beta_fast = 1.0 : f64, beta_slow = 32.0 : f64, original_max_positions = 4096 : i64,
      truncate = false, attention_factor = 1.3 : f64}
      : (tensor<2x8x4x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x4x16xbf16>
  return
}

// -----

func.func @clamp_limit(%g: tensor<8x16xbf16>) {
  // expected-error @+1 {{(C2) alpha and limit must be positive}}
  %y = dflash.clamped_swiglu %g, %g {alpha = 1.702 : f64, limit = 0.0 : f64} : (tensor<8x16xbf16>, tensor<8x16xbf16>) -> tensor<8x16xbf16>
  return
}
