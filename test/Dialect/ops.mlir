// RUN: dflash-opt %s | FileCheck %s
// RUN: dflash-opt %s --verify-roundtrip | FileCheck %s
// RUN: dflash-opt %s --mlir-print-op-generic | dflash-opt | FileCheck %s

// CHECK-LABEL: func.func @bookkeeping
func.func @bookkeeping(%ids: tensor<2x32xi32>, %mask: tensor<2x32xi8>,
                       %anchors: tensor<2x3xi32>, %keep: tensor<2x3xi8>,
                       %pos: tensor<2x32xi32>, %hits: tensor<2x12xi8>)
    -> (tensor<2x12xi32>, tensor<2x12xi32>, tensor<2x12xi32>, tensor<2x12xf32>) {
  // CHECK: dflash.draft_positions %{{.*}}, %{{.*}} {block_size = 4 : i64}
  %dp = dflash.draft_positions %anchors, %pos {block_size = 4 : i64}
      : (tensor<2x3xi32>, tensor<2x32xi32>) -> tensor<2x12xi32>
  // CHECK: dflash.draft_tokens {{.*}} {block_size = 4 : i64, mask_token_id = 7 : i64}
  %t = dflash.draft_tokens %ids, %anchors, %keep
      {block_size = 4 : i64, mask_token_id = 7 : i64}
      : (tensor<2x32xi32>, tensor<2x3xi32>, tensor<2x3xi8>) -> tensor<2x12xi32>
  // CHECK: %[[L:.+]], %[[W:.+]] = dflash.draft_targets {{.*}} {block_size = 4 : i64, gamma = 7.000000e+00 : f64}
  %l, %w = dflash.draft_targets %ids, %mask, %anchors, %keep, %pos
      {block_size = 4 : i64, gamma = 7.0 : f64}
      : (tensor<2x32xi32>, tensor<2x32xi8>, tensor<2x3xi32>, tensor<2x3xi8>,
         tensor<2x32xi32>) -> (tensor<2x12xi32>, tensor<2x12xf32>)
  // CHECK: dflash.draft_acceptance {{.*}} {block_size = 4 : i64, bucket_edges = array<i64: 8, 16>} : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
  %runs, %blocks, %hits_k, %counts_k, %b_runs, %b_blocks, %b_hits, %b_counts = dflash.draft_acceptance %hits, %w, %keep, %anchors, %pos {block_size = 4 : i64, bucket_edges = array<i64: 8, 16>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
  // CHECK: dflash.draft_acceptance {{.*}} {block_size = 4 : i64, bucket_edges = array<i64>} : {{.*}} -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
  %runs1, %blocks1, %hits_k1, %counts_k1, %b_runs1, %b_blocks1, %b_hits1, %b_counts1 = dflash.draft_acceptance %hits, %w, %keep, %anchors, %pos {block_size = 4 : i64, bucket_edges = array<i64>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
  return %dp, %t, %l, %w : tensor<2x12xi32>, tensor<2x12xi32>, tensor<2x12xi32>, tensor<2x12xf32>
}

// CHECK-LABEL: func.func @layer
func.func @layer(%table: tensor<100x64xbf16>, %ids: tensor<2x12xi32>,
                 %wq: tensor<64x64xbf16>, %nw: tensor<64xbf16>,
                 %hn: tensor<16xbf16>, %pos: tensor<2x12xi32>)
    -> tensor<2x12x64xbf16> {
  // CHECK: %[[X:.+]] = dflash.embed
  %x = dflash.embed %table, %ids
      : (tensor<100x64xbf16>, tensor<2x12xi32>) -> tensor<2x12x64xbf16>
  // CHECK: %[[H:.+]] = dflash.rms_norm %[[X]], %{{.*}} {eps = 9.9999999999999995E-7 : f64}
  %h = dflash.rms_norm %x, %nw {eps = 1.0e-6 : f64}
      : (tensor<2x12x64xbf16>, tensor<64xbf16>) -> tensor<2x12x64xbf16>
  // CHECK: %[[Q:.+]] = dflash.linear %[[H]]
  %q = dflash.linear %h, %wq
      : (tensor<2x12x64xbf16>, tensor<64x64xbf16>) -> tensor<2x12x64xbf16>
  // CHECK: dflash.reshape %[[Q]] : (tensor<2x12x64xbf16>) -> tensor<2x12x4x16xbf16>
  %qh = dflash.reshape %q : (tensor<2x12x64xbf16>) -> tensor<2x12x4x16xbf16>
  %qn = dflash.rms_norm %qh, %hn {eps = 1.0e-6 : f64}
      : (tensor<2x12x4x16xbf16>, tensor<16xbf16>) -> tensor<2x12x4x16xbf16>
  // CHECK: dflash.rope {{.*}} {theta = 1.000000e+06 : f64}
  %qr = dflash.rope %qn, %pos {theta = 1.0e6 : f64}
      : (tensor<2x12x4x16xbf16>, tensor<2x12xi32>) -> tensor<2x12x4x16xbf16>
  %back = dflash.reshape %qr : (tensor<2x12x4x16xbf16>) -> tensor<2x12x64xbf16>
  // CHECK: dflash.swiglu
  %s = dflash.swiglu %back, %x
      : (tensor<2x12x64xbf16>, tensor<2x12x64xbf16>) -> tensor<2x12x64xbf16>
  // CHECK: dflash.add
  %r = dflash.add %x, %s
      : (tensor<2x12x64xbf16>, tensor<2x12x64xbf16>) -> tensor<2x12x64xbf16>
  return %r : tensor<2x12x64xbf16>
}

// CHECK-LABEL: func.func @attention
func.func @attention(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xbf16>,
                     %vc: tensor<2x32x2x16xbf16>, %kd: tensor<2x12x2x16xbf16>,
                     %vd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>,
                     %keep: tensor<2x3xi8>, %pos: tensor<2x32xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x12x4x16xbf16>) {
  // CHECK: dflash.block_attention {{.*}} {block_size = 4 : i64}
  %o, %lse = dflash.block_attention %q, %kc, %vc, %kd, %vd, %a, %keep, %pos
      {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>,
         tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>)
      -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  // CHECK: dflash.block_attention {{.*}} {block_size = 4 : i64, causal, window = 8 : i64}
  %o2, %lse2 = dflash.block_attention %q, %kc, %vc, %kd, %vd, %a, %keep, %pos
      {block_size = 4 : i64, window = 8 : i64, causal}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>,
         tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>)
      -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return %o, %o2 : tensor<2x12x4x16xbf16>, tensor<2x12x4x16xbf16>
}

// CHECK-LABEL: func.func @loss
func.func @loss(%y: tensor<2x12x64xbf16>, %w: tensor<100x64xbf16>,
                %l: tensor<2x12xi32>, %wt: tensor<2x12xf32>) -> tensor<f32> {
  // CHECK: dflash.lm_head_ce {{.*}} -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x12xi8>)
  %a, %b, %c, %d, %hits = dflash.lm_head_ce %y, %w, %l, %wt
      : (tensor<2x12x64xbf16>, tensor<100x64xbf16>, tensor<2x12xi32>, tensor<2x12xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x12xi8>)
  return %a : tensor<f32>
}

// A DFlash2 unary transform: the defaults are elided, the rest printed.
// CHECK-LABEL: func.func @unary_loss
func.func @unary_loss(%y: tensor<2x12x64xbf16>, %w: tensor<100x64xbf16>,
                      %l: tensor<2x12xi32>, %wt: tensor<2x12xf32>, %s: tensor<f32>)
    -> (tensor<f32>, tensor<2x12x64xbf16>) {
  // CHECK: dflash.lm_head_ce %{{.*}} {softcap = 3.000000e+01 : f64} :
  %a, %b, %c, %d, %hits = dflash.lm_head_ce %y, %w, %l, %wt
      {multiplier = 1.0 : f64, softcap = 30.0 : f64}
      : (tensor<2x12x64xbf16>, tensor<100x64xbf16>, tensor<2x12xi32>, tensor<2x12xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x12xi8>)
  // CHECK: dflash.lm_head_ce_grad %{{.*}} {multiplier = 1.500000e+00 : f64} :
  %dy = dflash.lm_head_ce_grad %y, %w, %l, %wt, %s {multiplier = 1.5 : f64}
      : (tensor<2x12x64xbf16>, tensor<100x64xbf16>, tensor<2x12xi32>, tensor<2x12xf32>, tensor<f32>)
      -> tensor<2x12x64xbf16>
  return %a, %dy : tensor<f32>, tensor<2x12x64xbf16>
}

// CHECK-LABEL: func.func @arg_attr
// CHECK-SAME: {dflash.arg = #dflash.arg<parameter, "fc.weight">}
func.func @arg_attr(%w: tensor<4x8xbf16> {dflash.arg = #dflash.arg<parameter, "fc.weight">}) {
  return
}

// CHECK-LABEL: func.func @linear_residual
func.func @linear_residual(%r: tensor<2x12x16xbf16>, %x: tensor<2x12x64xbf16>,
                           %w: tensor<16x64xbf16>) -> tensor<2x12x16xbf16> {
  // CHECK: dflash.linear_residual %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x12x16xbf16>, tensor<2x12x64xbf16>, tensor<16x64xbf16>) -> tensor<2x12x16xbf16>
  %y = dflash.linear_residual %r, %x, %w
      : (tensor<2x12x16xbf16>, tensor<2x12x64xbf16>, tensor<16x64xbf16>)
      -> tensor<2x12x16xbf16>
  return %y : tensor<2x12x16xbf16>
}

// DFlash2 (docs/semantics.md section 13): one layer's D [2, 8, 2*2*2] feeds
// both convolutions; base [kc, H] or the whole [2, kc, H].
// CHECK-LABEL: func.func @dflash2_conv
func.func @dflash2_conv(%x: tensor<2x8x32xbf16>, %d: tensor<2x8x8xbf16>,
                        %b: tensor<2x2x32xbf16>, %b1: tensor<2x32xbf16>)
    -> (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>) {
  // CHECK: dflash.grouped_conv %{{.*}}, %{{.*}}, %{{.*}} {block_size = 4 : i64, group_size = 16 : i64, half = 0 : i64, kernel_size = 2 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>) -> tensor<2x8x32xbf16>
  %y = dflash.grouped_conv %x, %d, %b
      {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>) -> tensor<2x8x32xbf16>
  // CHECK: dflash.grouped_conv {{.*}} half = 1 : i64{{.*}} : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  %z = dflash.grouped_conv %y, %d, %b1
      {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 1 : i64}
      : (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x32xbf16>) -> tensor<2x8x32xbf16>
  // CHECK: dflash.grouped_conv_grad {{.*}} -> (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>)
  %dx, %dd, %db = dflash.grouped_conv_grad %z, %x, %d, %b
      {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<2x8x32xbf16>, tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>)
      -> (tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>)
  return %dx, %dd, %db : tensor<2x8x32xbf16>, tensor<2x8x8xbf16>, tensor<2x2x32xbf16>
}

// The selector: rows [2, 8], H 32, V 64, top 4, rank 8.
// CHECK-LABEL: func.func @dflash2_selector
func.func @dflash2_selector(%y: tensor<2x8x32xbf16>, %head: tensor<64x32xbf16>,
                            %l: tensor<2x8xi32>, %wt: tensor<2x8xf32>,
                            %wh: tensor<8x32xbf16>, %p: tensor<2x8xi32>,
                            %pcb: tensor<64x8xbf16>, %scb: tensor<64x8xbf16>,
                            %seed: tensor<f32>) -> tensor<2x8x32xbf16> {
  // CHECK: dflash.selector_candidates {{.*}} {multiplier = 1.500000e+00 : f64, softcap = 3.000000e+01 : f64, top_k = 4 : i64} : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  %v, %c, %lv = dflash.selector_candidates %y, %head, %l, %wt
      {top_k = 4 : i64, multiplier = 1.5 : f64, softcap = 30.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8xi32>, tensor<2x8xf32>)
      -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  // CHECK: dflash.selector_loss {{.*}} {gold = "inject", stop_gradient} : {{.*}} -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb
      {gold = "inject", stop_gradient}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>,
         tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>,
         tensor<64x8xbf16>, tensor<64x8xbf16>)
      -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  // CHECK: dflash.selector_loss_grad {{.*}} {gold = "topk"} : {{.*}} -> (tensor<2x8x4xf32>, tensor<2x8xf32>, tensor<2x8x8xbf16>, tensor<64x8xbf16>, tensor<64x8xbf16>)
  %dv, %dl, %dt, %dp, %ds = dflash.selector_loss_grad %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb, %seed
      {gold = "topk"}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xbf16>,
         tensor<8x32xbf16>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>,
         tensor<64x8xbf16>, tensor<64x8xbf16>, tensor<f32>)
      -> (tensor<2x8x4xf32>, tensor<2x8xf32>, tensor<2x8x8xbf16>, tensor<64x8xbf16>, tensor<64x8xbf16>)
  // CHECK: dflash.selector_candidates_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} values_grad %{{.*}} label_values_grad %{{.*}} {multiplier = 1.500000e+00 : f64, softcap = 3.000000e+01 : f64, top_k = 4 : i64}
  %dy = dflash.selector_candidates_grad %y, %head, %c, %l, %wt values_grad %dv label_values_grad %dl
      {top_k = 4 : i64, multiplier = 1.5 : f64, softcap = 30.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8x4xi32>, tensor<2x8xi32>,
         tensor<2x8xf32>, tensor<2x8x4xf32>, tensor<2x8xf32>) -> tensor<2x8x32xbf16>
  // CHECK: dflash.selector_candidates_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} values_grad %{{.*}} {
  %dy2 = dflash.selector_candidates_grad %y, %head, %c, %l, %wt values_grad %dv
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x8x32xbf16>, tensor<64x32xbf16>, tensor<2x8x4xi32>, tensor<2x8xi32>,
         tensor<2x8xf32>, tensor<2x8x4xf32>) -> tensor<2x8x32xbf16>
  return %dy : tensor<2x8x32xbf16>
}
