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

// -----

// selector_candidates: rows [2, 8], H 32, V 64, top 4.
func.func @sc_topk(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C1) top_k is 0 but must be at least 1}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 0 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x0xf32>, tensor<2x8x0xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_multiplier(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C1) multiplier is 0 but must be positive}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 0.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_softcap(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C1) softcap is -1 but must be 0 (none) or positive}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = -1.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_weight_rank(%y: tensor<2x8x32xbf16>, %w: tensor<64xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C2) weight must have rank 2 but has rank 1}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_input_rank(%y: tensor<32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C2) input must have rank 2 or more but has rank 1}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_hidden(%y: tensor<2x8x32xbf16>, %w: tensor<64x16xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C2) weight's hidden dimension (16) must equal the input's last dimension (32)}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x16xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_type(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xf32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C2) input and weight must have the same element type}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_vocab(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C3) top_k is 65 but must be at most the vocabulary (64)}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 65 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x65xf32>, tensor<2x8x65xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_labels(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x7xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C4) labels must have shape [2x8] but has [2x7]}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x7xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_weights(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x8xi32>, %wt: tensor<16xf32>) {
  // expected-error @+1 {{(C4) weights must have shape [2x8] but has [16]}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<16xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_values(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C5) values must have shape [2x8x4] but has [2x8x3]}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x3xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_candidates(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C5) candidates must have shape [2x8x4] but has [2x8]}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8xi32>, tensor<2x8xf32>)
  return
}

// -----

func.func @sc_label_values(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C5) label_values must have shape [2x8] but has [2x8x1]}}
  %v, %c, %lv = dflash.selector_candidates %y, %w, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8x1xf32>)
  return
}

// -----

// selector_candidates_grad: the forward's operands checked as the forward checks them.
func.func @scg_shared(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %c: tensor<2x8x65xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %dv: tensor<2x8x65xf32>, %dl: tensor<2x8xf32>) {
  // expected-error @+1 {{(C3) top_k is 65 but must be at most the vocabulary (64)}}
  %dy = dflash.selector_candidates_grad %y, %w, %c, %l, %wt values_grad %dv label_values_grad %dl {top_k = 65 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8x65xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<2x8x65xf32>, tensor<2x8xf32>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @scg_candidates(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %c: tensor<2x8x2xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %dv: tensor<2x8x4xf32>, %dl: tensor<2x8xf32>) {
  // expected-error @+1 {{(C5) candidates must have shape [2x8x4] but has [2x8x2]}}
  %dy = dflash.selector_candidates_grad %y, %w, %c, %l, %wt values_grad %dv label_values_grad %dl {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8x2xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<2x8x4xf32>, tensor<2x8xf32>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @scg_none(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %c: tensor<2x8x4xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>) {
  // expected-error @+1 {{(C5) needs values_grad, label_values_grad or both}}
  %dy = dflash.selector_candidates_grad %y, %w, %c, %l, %wt {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8x4xi32>, tensor<2x8xi32>, tensor<2x8xf32>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @scg_values_grad(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %c: tensor<2x8x4xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %dv: tensor<2x8x2xf32>, %dl: tensor<2x8xf32>) {
  // expected-error @+1 {{(C5) values_grad must have shape [2x8x4] but has [2x8x2]}}
  %dy = dflash.selector_candidates_grad %y, %w, %c, %l, %wt values_grad %dv label_values_grad %dl {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8x4xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<2x8x2xf32>, tensor<2x8xf32>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @scg_label_grad(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %c: tensor<2x8x4xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %dl: tensor<8xf32>) {
  // expected-error @+1 {{(C5) label_values_grad must have shape [2x8] but has [8]}}
  %dy = dflash.selector_candidates_grad %y, %w, %c, %l, %wt label_values_grad %dl {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8x4xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8x32xbf16>
  return
}

// -----

func.func @scg_result(%y: tensor<2x8x32xbf16>, %w: tensor<64x32xbf16>, %c: tensor<2x8x4xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %dv: tensor<2x8x4xf32>, %dl: tensor<2x8xf32>) {
  // expected-error @+1 {{(C6) result ('tensor<2x8x32xf32>') and input ('tensor<2x8x32xbf16>') must have the same type}}
  %dy = dflash.selector_candidates_grad %y, %w, %c, %l, %wt values_grad %dv label_values_grad %dl {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8x4xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<2x8x4xf32>, tensor<2x8xf32>) -> tensor<2x8x32xf32>
  return
}

// -----

// selector_loss: rows [2, 8], K 4, H 32, r 8, V 64.
func.func @sl_gold(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C1) gold is "best" but must be "topk" or "inject"}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "best"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_values_rank(%v: tensor<4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C2) values must have rank 2 or more but has rank 1}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_candidates(%v: tensor<2x8x4xf32>, %c: tensor<2x8x5xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C2) candidates must have shape [2x8x4] but has [2x8x5]}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x5xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_label_values(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x4xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C2) label_values must have shape [2x8] but has [2x4]}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x4xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_predecessors(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x9xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C2) predecessors must have shape [2x8] but has [2x9]}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x9xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_labels(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<16xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C2) labels must have shape [2x8] but has [16]}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<16xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_weights(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8x1xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C2) weights must have shape [2x8] but has [2x8x1]}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8x1xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_input_rank(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<16x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C3) input must have rank 3 but has rank 2}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<16x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_input(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x7x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C3) input must have shape [2x8x32] but has [2x7x32]}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x7x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_projection_rank(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C3) projection must have rank 2 but has rank 1}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_projection(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x16xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C3) projection must have shape [8x32] but has [8x16]}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x16xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_projection_type(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xf32>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C3) input and projection must have the same element type}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xf32>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_codebook_rank(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C4) predecessor_codebook must have rank 2 but has rank 1}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_codebook(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x4xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C4) predecessor_codebook must have shape [64x8] but has [64x4]}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x4xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_successor(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<32x8xbf16>) {
  // expected-error @+1 {{(C4) successor_codebook ('tensor<32x8xbf16>') and predecessor_codebook ('tensor<64x8xbf16>') must have the same type}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<32x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_codebook_type(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xf32>, %scb: tensor<64x8xf32>) {
  // expected-error @+1 {{(C4) predecessor_codebook and input must have the same element type}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xf32>, tensor<64x8xf32>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_vocab(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<3x8xbf16>, %scb: tensor<3x8xbf16>) {
  // expected-error @+1 {{(C4) 4 candidates per row but the codebooks hold a vocabulary of 3}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<3x8xbf16>, tensor<3x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return
}

// -----

func.func @sl_hits(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>) {
  // expected-error @+1 {{(C5) hits must have shape [2x8] but has [2x7]}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>) -> (tensor<f32>, tensor<f32>, tensor<2x7xi8>)
  return
}

// -----

// selector_loss_grad: the forward's operands checked as the forward checks them.
func.func @slg_shared(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>, %seed: tensor<f32>) {
  // expected-error @+1 {{(C1) gold is "skip" but must be "topk" or "inject"}}
  %dv, %dl, %dt, %dp, %ds = dflash.selector_loss_grad %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb, %seed {gold = "skip", stop_gradient}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>, tensor<f32>)
      -> (tensor<2x8x4xf32>, tensor<2x8xf32>, tensor<2x8x8xbf16>, tensor<64x8xbf16>, tensor<64x8xbf16>)
  return
}

// -----

func.func @slg_values_grad(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>, %seed: tensor<f32>) {
  // expected-error @+1 {{(C5) values_grad ('tensor<2x8x3xf32>') and values ('tensor<2x8x4xf32>') must have the same type}}
  %dv, %dl, %dt, %dp, %ds = dflash.selector_loss_grad %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb, %seed {gold = "topk", stop_gradient}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>, tensor<f32>)
      -> (tensor<2x8x3xf32>, tensor<2x8xf32>, tensor<2x8x8xbf16>, tensor<64x8xbf16>, tensor<64x8xbf16>)
  return
}

// -----

func.func @slg_label_grad(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>, %seed: tensor<f32>) {
  // expected-error @+1 {{(C5) label_values_grad ('tensor<2x4xf32>') and label_values ('tensor<2x8xf32>') must have the same type}}
  %dv, %dl, %dt, %dp, %ds = dflash.selector_loss_grad %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb, %seed {gold = "topk", stop_gradient}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>, tensor<f32>)
      -> (tensor<2x8x4xf32>, tensor<2x4xf32>, tensor<2x8x8xbf16>, tensor<64x8xbf16>, tensor<64x8xbf16>)
  return
}

// -----

// projected_grad is t's gradient, t = input @ projection^T [2, 8, 8].
func.func @slg_projected(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>, %seed: tensor<f32>) {
  // expected-error @+1 {{(C6) projected_grad must have shape [2x8x8] but has [2x8x32]}}
  %dv, %dl, %dt, %dp, %ds = dflash.selector_loss_grad %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb, %seed {gold = "topk", stop_gradient}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>, tensor<f32>)
      -> (tensor<2x8x4xf32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<64x8xbf16>, tensor<64x8xbf16>)
  return
}

// -----

func.func @slg_projected_type(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>, %seed: tensor<f32>) {
  // expected-error @+1 {{(C6) projected_grad and input must have the same element type}}
  %dv, %dl, %dt, %dp, %ds = dflash.selector_loss_grad %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb, %seed {gold = "topk", stop_gradient}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>, tensor<f32>)
      -> (tensor<2x8x4xf32>, tensor<2x8xf32>, tensor<2x8x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>)
  return
}

// -----

func.func @slg_pcb(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>, %seed: tensor<f32>) {
  // expected-error @+1 {{(C6) predecessor_codebook_grad ('tensor<64x8xf32>') and predecessor_codebook ('tensor<64x8xbf16>') must have the same type}}
  %dv, %dl, %dt, %dp, %ds = dflash.selector_loss_grad %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb, %seed {gold = "topk", stop_gradient}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>, tensor<f32>)
      -> (tensor<2x8x4xf32>, tensor<2x8xf32>, tensor<2x8x8xbf16>, tensor<64x8xf32>, tensor<64x8xbf16>)
  return
}

// -----

func.func @slg_scb(%v: tensor<2x8x4xf32>, %c: tensor<2x8x4xi32>, %lv: tensor<2x8xf32>, %y: tensor<2x8x32xbf16>, %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>, %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>, %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>, %seed: tensor<f32>) {
  // expected-error @+1 {{(C6) successor_codebook_grad ('tensor<8x64xbf16>') and successor_codebook ('tensor<64x8xbf16>') must have the same type}}
  %dv, %dl, %dt, %dp, %ds = dflash.selector_loss_grad %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb, %seed {gold = "topk", stop_gradient}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>, tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<64x8xbf16>, tensor<64x8xbf16>, tensor<f32>)
      -> (tensor<2x8x4xf32>, tensor<2x8xf32>, tensor<2x8x8xbf16>, tensor<64x8xbf16>, tensor<8x64xbf16>)
  return
}
