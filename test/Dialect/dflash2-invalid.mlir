// RUN: dflash-opt %s --split-input-file --verify-diagnostics

// The DFlash2 ops (docs/semantics.md section 13), one case per verifier
// error (docs/dialect.md numbers them). Valid shapes: B 2, Q 8 (two blocks
// of 4), H 32, kernel_size 2, group_size 16 (G 2), D [2, 8, 2*2*2].

func.func @gc_block(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C1) block_size is 0 but must be at least 1}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 0 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_taps(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C1) kernel_size is 0 but must be at least 1}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 0 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_group(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C1) group_size is 0 but must be at least 1}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 0 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_half(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C1) half is 2 but must be 0 (before the sublayer) or 1 (after it)}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 2 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_rank(%x: tensor<16x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C2) input must have rank 3 but has rank 2}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<16x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<16x32xbf16>
  return
}

// -----

func.func @gc_blocks(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C2) input's 8 slots must be a multiple of block_size (3)}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 3 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_groups(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C3) hidden size 32 must be a multiple of group_size (12)}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 12 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

// D holds both halves: 2 * kernel_size * (32 / 16) = 8 per slot.
func.func @gc_delta(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x4xbf16>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C4) delta must have shape [2x8x8] but has [2x8x4]}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x4xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_base(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<3x32xbf16>) {
  // expected-error @+1 {{(C5) base must have shape [2x32] or [2x2x32] but has [3x32]}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<3x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_base3(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<1x2x32xbf16>) {
  // expected-error @+1 {{(C5) base must have shape [2x32] or [2x2x32] but has [1x2x32]}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<1x2x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_delta_type(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xf32>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C6) input and delta must have the same element type}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xf32>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_base_type(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x2x32xf32>) {
  // expected-error @+1 {{(C6) input and base must have the same element type}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xf32>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @gc_result(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x32xbf16>) {
  // expected-error @+1 {{(C6) result ('tensor<2x8x32xf32>') and input ('tensor<2x8x32xbf16>') must have the same type}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xf32>
  return
}

// -----

// The forward operands are checked as grouped_conv checks them.
func.func @gcg_shared(%g: tensor<2x8x32xbf16>, %x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<4x32xbf16>) {
  // expected-error @+1 {{(C4) delta must have shape [2x8x16] but has [2x8x8]}}
  %dx, %dd, %db = dflash.grouped_conv_grad %g, %x, %d, %b {block_size = 4 : i64, kernel_size = 4 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<2x8x32xbf16>, tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<4x32xbf16>) -> (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<4x32xbf16>)
  return
}

// -----

func.func @gcg_grad(%g: tensor<2x8x16xbf16>, %x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x2x32xbf16>) {
  // expected-error @+1 {{(C6) grad ('tensor<2x8x16xbf16>') and input ('tensor<2x8x32xbf16>') must have the same type}}
  %dx, %dd, %db = dflash.grouped_conv_grad %g, %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<2x8x16xbf16>, tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>) -> (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>)
  return
}

// -----

func.func @gcg_dx(%g: tensor<2x8x32xbf16>, %x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x2x32xbf16>) {
  // expected-error @+1 {{(C7) input_grad ('tensor<2x8x32xf32>') and input ('tensor<2x8x32xbf16>') must have the same type}}
  %dx, %dd, %db = dflash.grouped_conv_grad %g, %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<2x8x32xbf16>, tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>) -> (tensor<2x8x32xf32>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>)
  return
}

// -----

// delta_grad is the whole D's gradient, the other half 0.
func.func @gcg_dd(%g: tensor<2x8x32xbf16>, %x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x2x32xbf16>) {
  // expected-error @+1 {{(C7) delta_grad ('tensor<2x8x4xbf16>') and delta ('tensor<2x8x8xbf16>') must have the same type}}
  %dx, %dd, %db = dflash.grouped_conv_grad %g, %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<2x8x32xbf16>, tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>) -> (tensor<2x8x32xbf16>, tensor<2x8x4xbf16>, tensor<2x2x32xbf16>)
  return
}

// -----

func.func @gcg_db(%g: tensor<2x8x32xbf16>, %x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>, %b: tensor<2x2x32xbf16>) {
  // expected-error @+1 {{(C7) base_grad ('tensor<2x32xbf16>') and base ('tensor<2x2x32xbf16>') must have the same type}}
  %dx, %dd, %db = dflash.grouped_conv_grad %g, %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<2x8x32xbf16>, tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>) -> (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>)
  return
}
