// RUN: dflash-opt %s --split-input-file --verify-diagnostics

func.func @embed_rank(%t: tensor<100xbf16>, %ids: tensor<2x12xi32>) {
  // expected-error @+1 {{(C1) table must have rank 2 but has rank 1}}
  %x = dflash.embed %t, %ids : (tensor<100xbf16>, tensor<2x12xi32>) -> tensor<2x12x64xbf16>
  return
}

// -----

func.func @embed_shape(%t: tensor<100x64xbf16>, %ids: tensor<2x12xi32>) {
  // expected-error @+1 {{(C2) result must have shape [2x12x64] but has [2x12x32]}}
  %x = dflash.embed %t, %ids : (tensor<100x64xbf16>, tensor<2x12xi32>) -> tensor<2x12x32xbf16>
  return
}

// -----

func.func @embed_type(%t: tensor<100x64xbf16>, %ids: tensor<2x12xi32>) {
  // expected-error @+1 {{(C3) result and table must have the same element type}}
  %x = dflash.embed %t, %ids : (tensor<100x64xbf16>, tensor<2x12xi32>) -> tensor<2x12x64xf32>
  return
}

// -----

func.func @linear_rank(%x: tensor<64xbf16>, %w: tensor<32x64xbf16>) {
  // expected-error @+1 {{(C1) input must have rank 2 or more but has rank 1}}
  %y = dflash.linear %x, %w : (tensor<64xbf16>, tensor<32x64xbf16>) -> tensor<32xbf16>
  return
}

// -----

func.func @linear_weight_rank(%x: tensor<4x64xbf16>, %w: tensor<2x32x64xbf16>) {
  // expected-error @+1 {{(C2) weight must have rank 2 but has rank 3}}
  %y = dflash.linear %x, %w : (tensor<4x64xbf16>, tensor<2x32x64xbf16>) -> tensor<4x32xbf16>
  return
}

// -----

func.func @linear_contraction(%x: tensor<4x64xbf16>, %w: tensor<32x48xbf16>) {
  // expected-error @+1 {{(C3) input's last dimension (64) must equal weight's input dimension (48)}}
  %y = dflash.linear %x, %w : (tensor<4x64xbf16>, tensor<32x48xbf16>) -> tensor<4x32xbf16>
  return
}

// -----

func.func @linear_result(%x: tensor<4x64xbf16>, %w: tensor<32x64xbf16>) {
  // expected-error @+1 {{(C4) result must have shape [4x32] but has [4x64]}}
  %y = dflash.linear %x, %w : (tensor<4x64xbf16>, tensor<32x64xbf16>) -> tensor<4x64xbf16>
  return
}

// -----

func.func @linear_types(%x: tensor<4x64xbf16>, %w: tensor<32x64xf32>) {
  // expected-error @+1 {{(C5) input and weight must have the same element type}}
  %y = dflash.linear %x, %w : (tensor<4x64xbf16>, tensor<32x64xf32>) -> tensor<4x32xbf16>
  return
}

// -----

func.func @rms_norm_eps(%x: tensor<4x64xbf16>, %w: tensor<64xbf16>) {
  // expected-error @+1 {{(C1) eps is 0 but must be positive}}
  %y = dflash.rms_norm %x, %w {eps = 0.0 : f64} : (tensor<4x64xbf16>, tensor<64xbf16>) -> tensor<4x64xbf16>
  return
}

// -----

func.func @rms_norm_weight(%x: tensor<4x64xbf16>, %w: tensor<32xbf16>) {
  // expected-error @+1 {{(C2) weight must have shape [64] but has [32]}}
  %y = dflash.rms_norm %x, %w {eps = 1.0e-6 : f64} : (tensor<4x64xbf16>, tensor<32xbf16>) -> tensor<4x64xbf16>
  return
}

// -----

func.func @rms_norm_result(%x: tensor<4x64xbf16>, %w: tensor<64xbf16>) {
  // expected-error @+1 {{(C3) result ('tensor<4x64xf32>') and input ('tensor<4x64xbf16>') must have the same type}}
  %y = dflash.rms_norm %x, %w {eps = 1.0e-6 : f64} : (tensor<4x64xbf16>, tensor<64xbf16>) -> tensor<4x64xf32>
  return
}

// -----

func.func @reshape_count(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{(C1) input has 256 elements but the result has 128}}
  %y = dflash.reshape %x : (tensor<4x64xbf16>) -> tensor<4x2x16xbf16>
  return
}

// -----

func.func @reshape_type(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{(C2) input and result must have the same element type}}
  %y = dflash.reshape %x : (tensor<4x64xbf16>) -> tensor<4x4x16xf32>
  return
}

// -----

func.func @rope_theta(%x: tensor<2x12x4x16xbf16>, %p: tensor<2x12xi32>) {
  // expected-error @+1 {{(C1) theta is -1 but must be positive}}
  %y = dflash.rope %x, %p {theta = -1.0 : f64} : (tensor<2x12x4x16xbf16>, tensor<2x12xi32>) -> tensor<2x12x4x16xbf16>
  return
}

// -----

func.func @rope_rank(%x: tensor<2x12x64xbf16>, %p: tensor<2x12xi32>) {
  // expected-error @+1 {{(C2) input must have rank 4 but has rank 3}}
  %y = dflash.rope %x, %p {theta = 1.0e6 : f64} : (tensor<2x12x64xbf16>, tensor<2x12xi32>) -> tensor<2x12x64xbf16>
  return
}

// -----

func.func @rope_odd(%x: tensor<2x12x4x15xbf16>, %p: tensor<2x12xi32>) {
  // expected-error @+1 {{(C3) head dimension (15) must be even}}
  %y = dflash.rope %x, %p {theta = 1.0e6 : f64} : (tensor<2x12x4x15xbf16>, tensor<2x12xi32>) -> tensor<2x12x4x15xbf16>
  return
}

// -----

func.func @rope_positions(%x: tensor<2x12x4x16xbf16>, %p: tensor<2x11xi32>) {
  // expected-error @+1 {{(C4) positions must have shape [2x12] but has [2x11]}}
  %y = dflash.rope %x, %p {theta = 1.0e6 : f64} : (tensor<2x12x4x16xbf16>, tensor<2x11xi32>) -> tensor<2x12x4x16xbf16>
  return
}

// -----

func.func @rope_result(%x: tensor<2x12x4x16xbf16>, %p: tensor<2x12xi32>) {
  // expected-error @+1 {{(C5) result}}
  %y = dflash.rope %x, %p {theta = 1.0e6 : f64} : (tensor<2x12x4x16xbf16>, tensor<2x12xi32>) -> tensor<2x12x4x16xf32>
  return
}

// -----

func.func @swiglu_types(%g: tensor<4x64xbf16>, %u: tensor<4x32xbf16>) {
  // expected-error @+1 {{(C1) gate ('tensor<4x64xbf16>') and up ('tensor<4x32xbf16>') must have the same type}}
  %y = dflash.swiglu %g, %u : (tensor<4x64xbf16>, tensor<4x32xbf16>) -> tensor<4x64xbf16>
  return
}

// -----

func.func @add_types(%a: tensor<4x64xbf16>, %b: tensor<4x64xbf16>) {
  // expected-error @+1 {{(C1) result ('tensor<4x64xf32>') and lhs ('tensor<4x64xbf16>') must have the same type}}
  %y = dflash.add %a, %b : (tensor<4x64xbf16>, tensor<4x64xbf16>) -> tensor<4x64xf32>
  return
}

// -----

func.func @ce_weight_rank(%y: tensor<2x12x64xbf16>, %w: tensor<100xbf16>, %l: tensor<2x12xi32>, %wt: tensor<2x12xf32>) {
  // expected-error @+1 {{(C1) weight must have rank 2 but has rank 1}}
  %a, %b, %c, %d, %hits = dflash.lm_head_ce %y, %w, %l, %wt
      : (tensor<2x12x64xbf16>, tensor<100xbf16>, tensor<2x12xi32>, tensor<2x12xf32>) -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x12xi8>)
  return
}

// -----

func.func @ce_hidden(%y: tensor<2x12x64xbf16>, %w: tensor<100x32xbf16>, %l: tensor<2x12xi32>, %wt: tensor<2x12xf32>) {
  // expected-error @+1 {{(C2) weight's hidden dimension (32) must equal the input's last dimension (64)}}
  %a, %b, %c, %d, %hits = dflash.lm_head_ce %y, %w, %l, %wt
      : (tensor<2x12x64xbf16>, tensor<100x32xbf16>, tensor<2x12xi32>, tensor<2x12xf32>) -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x12xi8>)
  return
}

// -----

func.func @ce_labels(%y: tensor<2x12x64xbf16>, %w: tensor<100x64xbf16>, %l: tensor<2x11xi32>, %wt: tensor<2x12xf32>) {
  // expected-error @+1 {{(C3) labels must have shape [2x12] but has [2x11]}}
  %a, %b, %c, %d, %hits = dflash.lm_head_ce %y, %w, %l, %wt
      : (tensor<2x12x64xbf16>, tensor<100x64xbf16>, tensor<2x11xi32>, tensor<2x12xf32>) -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x11xi8>)
  return
}

// -----

func.func @ce_multiplier(%y: tensor<2x12x64xbf16>, %w: tensor<100x64xbf16>, %l: tensor<2x12xi32>, %wt: tensor<2x12xf32>) {
  // expected-error @+1 {{(C4) multiplier is 0 but must be positive}}
  %a, %b, %c, %d, %hits = dflash.lm_head_ce %y, %w, %l, %wt {multiplier = 0.0 : f64}
      : (tensor<2x12x64xbf16>, tensor<100x64xbf16>, tensor<2x12xi32>, tensor<2x12xf32>) -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x12xi8>)
  return
}

// -----

func.func @ce_softcap(%y: tensor<2x12x64xbf16>, %w: tensor<100x64xbf16>, %l: tensor<2x12xi32>, %wt: tensor<2x12xf32>) {
  // expected-error @+1 {{(C4) softcap is -30 but must be 0 (none) or positive}}
  %a, %b, %c, %d, %hits = dflash.lm_head_ce %y, %w, %l, %wt {softcap = -30.0 : f64}
      : (tensor<2x12x64xbf16>, tensor<100x64xbf16>, tensor<2x12xi32>, tensor<2x12xf32>) -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x12xi8>)
  return
}
