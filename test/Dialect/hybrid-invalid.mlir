// RUN: dflash-opt %s --split-input-file --verify-diagnostics
// The ops of a Qwen3.5/3.6/Next hybrid target: the Gated DeltaNet's conv,
// recurrence and gated norm, the zero-centred norm, partial rotary, the
// split of a last dimension and the sigmoid gate (docs/dialect.md).

func.func @conv_channels(%x: tensor<2x8x16xbf16>, %w: tensor<12x4xbf16>, %p: tensor<2x8xi32>) {
  // expected-error @+1 {{(C2) weight has 12 channels but input has 16}}
  %y = dflash.causal_conv %x, %w, %p : (tensor<2x8x16xbf16>, tensor<12x4xbf16>, tensor<2x8xi32>) -> tensor<2x8x16xbf16>
  return
}

// -----

func.func @conv_positions(%x: tensor<2x8x16xbf16>, %w: tensor<16x4xbf16>, %p: tensor<2x7xi32>) {
  // expected-error @+1 {{(C3) position_ids must have shape [2x8] but has [2x7]}}
  %y = dflash.causal_conv %x, %w, %p : (tensor<2x8x16xbf16>, tensor<16x4xbf16>, tensor<2x7xi32>) -> tensor<2x8x16xbf16>
  return
}

// -----

func.func @delta_heads(%q: tensor<2x8x2x16xbf16>, %v: tensor<2x8x3x16xbf16>, %ab: tensor<2x8x3xbf16>, %h: tensor<3xbf16>, %p: tensor<2x8xi32>) {
  // expected-error @+1 {{(C2) value has 3 heads, not a multiple of the query's 2}}
  %o = dflash.gated_delta_rule %q, %q, %v, %ab, %ab, %h, %h, %p : (tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x3x16xbf16>, tensor<2x8x3xbf16>, tensor<2x8x3xbf16>, tensor<3xbf16>, tensor<3xbf16>, tensor<2x8xi32>) -> tensor<2x8x3x16xbf16>
  return
}

// -----

func.func @delta_gates(%q: tensor<2x8x2x16xbf16>, %v: tensor<2x8x4x16xbf16>, %a: tensor<2x8x2xbf16>, %b: tensor<2x8x4xbf16>, %h: tensor<4xbf16>, %p: tensor<2x8xi32>) {
  // expected-error @+1 {{(C3) a must have shape [2x8x4] but has [2x8x2]}}
  %o = dflash.gated_delta_rule %q, %q, %v, %a, %b, %h, %h, %p : (tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x2xbf16>, tensor<2x8x4xbf16>, tensor<4xbf16>, tensor<4xbf16>, tensor<2x8xi32>) -> tensor<2x8x4x16xbf16>
  return
}

// -----

func.func @gated_norm_weight(%x: tensor<2x8x4x16xbf16>, %w: tensor<8xbf16>) {
  // expected-error @+1 {{(C2) weight must have shape [16] but has [8]}}
  %y = dflash.gated_rms_norm %x, %x, %w {eps = 1.0e-06 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<8xbf16>) -> tensor<2x8x4x16xbf16>
  return
}

// -----

func.func @centred_norm_eps(%x: tensor<2x8x16xbf16>, %w: tensor<16xbf16>) {
  // expected-error @+1 {{(C2) eps must be positive}}
  %y = dflash.zero_centred_rms_norm %x, %w {eps = 0.0 : f64} : (tensor<2x8x16xbf16>, tensor<16xbf16>) -> tensor<2x8x16xbf16>
  return
}

// -----

func.func @rope_dims(%x: tensor<2x8x4x64xbf16>, %p: tensor<2x8xi32>) {
  // expected-error @+1 {{(C2) rotary_dim is 15 but must be even and in [2, 64] (the head dimension)}}
  %y = dflash.partial_rope %x, %p {theta = 1.0e+07 : f64, rotary_dim = 15 : i64} : (tensor<2x8x4x64xbf16>, tensor<2x8xi32>) -> tensor<2x8x4x64xbf16>
  return
}

// -----

func.func @split_sum(%x: tensor<2x8x48xbf16>) {
  // expected-error @+1 {{(C2) sizes sum to 40 but the input's last dimension is 48}}
  %a, %b = dflash.split_last %x {sizes = array<i64: 16, 24>} : (tensor<2x8x48xbf16>) -> (tensor<2x8x16xbf16>, tensor<2x8x24xbf16>)
  return
}

// -----

func.func @split_count(%x: tensor<2x8x48xbf16>) {
  // expected-error @+1 {{(C1) has 2 results and 3 sizes}}
  %a, %b = dflash.split_last %x {sizes = array<i64: 16, 16, 16>} : (tensor<2x8x48xbf16>) -> (tensor<2x8x16xbf16>, tensor<2x8x16xbf16>)
  return
}

// -----

func.func @split_shape(%x: tensor<2x8x48xbf16>) {
  // expected-error @+1 {{(C3) each result must have shape [2x8x32] but has [2x8x16]}}
  %a, %b = dflash.split_last %x {sizes = array<i64: 16, 32>} : (tensor<2x8x48xbf16>) -> (tensor<2x8x16xbf16>, tensor<2x8x16xbf16>)
  return
}

// -----

func.func @gate_shape(%x: tensor<16x32xbf16>, %g: tensor<16x2xbf16>) {
  // expected-error @+1 {{(C2) gate is [16x2] but must be [16x32] or [16x1]}}
  %y = dflash.sigmoid_gate %x, %g : (tensor<16x32xbf16>, tensor<16x2xbf16>) -> tensor<16x32xbf16>
  return
}

// -----

// Well-formed: a DeltaNet layer's ops and the shared expert's broadcast gate.
func.func @valid(%x: tensor<2x8x64xbf16>, %w: tensor<64x4xbf16>, %p: tensor<2x8xi32>,
                 %ab: tensor<2x8x2xbf16>, %h: tensor<2xbf16>, %n: tensor<16xbf16>,
                 %t: tensor<16x32xbf16>, %g: tensor<16x1xbf16>) {
  %c = dflash.causal_conv %x, %w, %p : (tensor<2x8x64xbf16>, tensor<64x4xbf16>, tensor<2x8xi32>) -> tensor<2x8x64xbf16>
  %q, %k, %v = dflash.split_last %c {sizes = array<i64: 16, 16, 32>} : (tensor<2x8x64xbf16>) -> (tensor<2x8x16xbf16>, tensor<2x8x16xbf16>, tensor<2x8x32xbf16>)
  %q4 = dflash.reshape %q : (tensor<2x8x16xbf16>) -> tensor<2x8x1x16xbf16>
  %k4 = dflash.reshape %k : (tensor<2x8x16xbf16>) -> tensor<2x8x1x16xbf16>
  %v4 = dflash.reshape %v : (tensor<2x8x32xbf16>) -> tensor<2x8x2x16xbf16>
  %o = dflash.gated_delta_rule %q4, %k4, %v4, %ab, %ab, %h, %h, %p : (tensor<2x8x1x16xbf16>, tensor<2x8x1x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2xbf16>, tensor<2x8x2xbf16>, tensor<2xbf16>, tensor<2xbf16>, tensor<2x8xi32>) -> tensor<2x8x2x16xbf16>
  %y = dflash.gated_rms_norm %o, %v4, %n {eps = 1.0e-06 : f64} : (tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<16xbf16>) -> tensor<2x8x2x16xbf16>
  %s = dflash.sigmoid_gate %t, %g : (tensor<16x32xbf16>, tensor<16x1xbf16>) -> tensor<16x32xbf16>
  return
}
