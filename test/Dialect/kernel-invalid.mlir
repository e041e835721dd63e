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
