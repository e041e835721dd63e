// RUN: dflash-opt %s --split-input-file --verify-diagnostics
// The mixture-of-experts ops of a Qwen3-MoE target: routing, grouping by
// expert, the grouped GEMM, the weighted sum back to the tokens.

func.func @route_top_k(%l: tensor<16x8xbf16>) {
  // expected-error @+1 {{(C2) top_k is 9 but must be in [1, 8] (the experts)}}
  %w, %e = dflash.moe_route %l {top_k = 9 : i64, scoring = "softmax_topk"} : (tensor<16x8xbf16>) -> (tensor<16x9xbf16>, tensor<16x9xi32>)
  return
}

// -----

func.func @route_scoring(%l: tensor<16x8xbf16>) {
  // expected-error @+1 {{(C3) scoring is 'sigmoid': 'softmax_topk' (softmax over every expert, then the top k) or 'topk_softmax'}}
  %w, %e = dflash.moe_route %l {top_k = 2 : i64, scoring = "sigmoid"} : (tensor<16x8xbf16>) -> (tensor<16x2xbf16>, tensor<16x2xi32>)
  return
}

// -----

func.func @route_results(%l: tensor<16x8xbf16>) {
  // expected-error @+1 {{(C4) experts must have shape [16x2] but has [16x3]}}
  %w, %e = dflash.moe_route %l {top_k = 2 : i64, scoring = "softmax_topk"} : (tensor<16x8xbf16>) -> (tensor<16x2xbf16>, tensor<16x3xi32>)
  return
}

// -----

func.func @permute_rows(%x: tensor<16x32xbf16>, %e: tensor<16x2xi32>) {
  // expected-error @+1 {{(C3) permuted must have shape [32x32] but has [16x32]}}
  %p, %o, %s = dflash.moe_permute %x, %e : (tensor<16x32xbf16>, tensor<16x2xi32>) -> (tensor<16x32xbf16>, tensor<9xi32>, tensor<32xi32>)
  return
}

// -----

func.func @permute_tokens(%x: tensor<16x32xbf16>, %e: tensor<8x2xi32>) {
  // expected-error @+1 {{(C2) experts has 8 rows but input has 16 tokens}}
  %p, %o, %s = dflash.moe_permute %x, %e : (tensor<16x32xbf16>, tensor<8x2xi32>) -> (tensor<32x32xbf16>, tensor<9xi32>, tensor<32xi32>)
  return
}

// -----

func.func @grouped_columns(%x: tensor<32x32xbf16>, %w: tensor<8x64x16xbf16>, %o: tensor<9xi32>) {
  // expected-error @+1 {{(C2) weight 'tensor<8x64x16xbf16>' must have the input's 32 columns}}
  %y = dflash.grouped_linear %x, %w, %o : (tensor<32x32xbf16>, tensor<8x64x16xbf16>, tensor<9xi32>) -> tensor<32x64xbf16>
  return
}

// -----

func.func @grouped_offsets(%x: tensor<32x32xbf16>, %w: tensor<8x64x32xbf16>, %o: tensor<8xi32>) {
  // expected-error @+1 {{(C3) offsets must have shape [9] but has [8]}}
  %y = dflash.grouped_linear %x, %w, %o : (tensor<32x32xbf16>, tensor<8x64x32xbf16>, tensor<8xi32>) -> tensor<32x64xbf16>
  return
}

// -----

func.func @unpermute_rows(%p: tensor<30x32xbf16>, %s: tensor<32xi32>, %w: tensor<16x2xbf16>) {
  // expected-error @+1 {{(C2) permuted has 30 rows but weights route 16 tokens to 2 experts (32 rows)}}
  %y = dflash.moe_unpermute %p, %s, %w : (tensor<30x32xbf16>, tensor<32xi32>, tensor<16x2xbf16>) -> tensor<16x32xbf16>
  return
}

// -----

func.func @unpermute_result(%p: tensor<32x32xbf16>, %s: tensor<32xi32>, %w: tensor<16x2xbf16>) {
  // expected-error @+1 {{(C3) result must have shape [16x32] but has [16x16]}}
  %y = dflash.moe_unpermute %p, %s, %w : (tensor<32x32xbf16>, tensor<32xi32>, tensor<16x2xbf16>) -> tensor<16x16xbf16>
  return
}

// -----

func.func @route_topk_normalize(%l: tensor<16x8xbf16>) {
  // expected-error @+1 {{(C3) normalize is only for 'softmax_topk'}}
  %w, %e = dflash.moe_route %l {top_k = 2 : i64, scoring = "topk_softmax", normalize} : (tensor<16x8xbf16>) -> (tensor<16x2xbf16>, tensor<16x2xi32>)
  return
}

// -----

func.func @expert_bias(%x: tensor<32x64xbf16>, %w: tensor<8x16x64xbf16>, %o: tensor<9xi32>, %b: tensor<8x64xbf16>) {
  // expected-error @+1 {{(C5) bias must have shape [8x16] but has [8x64]}}
  %y = dflash.grouped_linear %x, %w, %o bias %b : (tensor<32x64xbf16>, tensor<8x16x64xbf16>, tensor<9xi32>, tensor<8x64xbf16>) -> tensor<32x16xbf16>
  return
}

// -----

func.func @swiglu_half_clamp(%x: tensor<32x64xbf16>, %w: tensor<8x16x64xbf16>, %o: tensor<9xi32>) {
  // expected-error @+1 {{(C4) the clamped form needs both alpha and limit}}
  %y = dflash.grouped_linear_swiglu %x, %w, %w, %o {limit = 7.0 : f64} : (tensor<32x64xbf16>, tensor<8x16x64xbf16>, tensor<8x16x64xbf16>, tensor<9xi32>) -> tensor<32x16xbf16>
  return
}
