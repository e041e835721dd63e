// RUN: dflash-opt %s --dflash-generate-backward --split-input-file | FileCheck %s

// A value used twice gets the sum of both gradients; the input gradient of
// the data (target_hidden) is never built; the frozen lm_head gets none.

// CHECK-LABEL: func.func @step(
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<2x4x8xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">}
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<8x8xbf16> {dflash.arg = #dflash.arg<parameter, "w">}
// CHECK-SAME: %[[HEAD:[a-z0-9]+]]: tensor<16x8xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">}
// CHECK-SAME: %[[SEED:[a-z0-9]+]]: tensor<f32> {dflash.arg = #dflash.arg<input, "loss_sum_grad">}
// CHECK-SAME: -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}
// CHECK-SAME: tensor<8x8xbf16> {dflash.arg = #dflash.arg<gradient, "w">})
// CHECK: %[[H:.+]] = dflash.linear %[[X]], %[[W]]
// CHECK: %[[A:.+]] = dflash.add %[[H]], %[[H]]
// CHECK: %[[LS:[a-z_0-9]+]], {{.*}} = dflash.lm_head_ce %[[A]], %[[HEAD]]
// CHECK: %[[DA:.+]] = dflash.lm_head_ce_grad %[[A]], %[[HEAD]], %{{.*}}, %{{.*}}, %[[SEED]]
// CHECK: %[[DH:.+]] = dflash.add %[[DA]], %[[DA]]
// CHECK-NOT: dflash.linear_grad_input
// CHECK: %[[DW:.+]] = dflash.linear_grad_weight %[[DH]], %[[X]] : (tensor<2x4x8xbf16>, tensor<2x4x8xbf16>) -> tensor<8x8xbf16>
// CHECK: return %[[LS]], {{.*}}, %[[DW]] :
func.func @step(%x: tensor<2x4x8xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %w: tensor<8x8xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %head: tensor<16x8xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<2x4xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %weights: tensor<2x4xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "weight_sum">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "correct">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "count">}) {
  %h = dflash.linear %x, %w : (tensor<2x4x8xbf16>, tensor<8x8xbf16>) -> tensor<2x4x8xbf16>
  %a = dflash.add %h, %h : (tensor<2x4x8xbf16>, tensor<2x4x8xbf16>) -> tensor<2x4x8xbf16>
  %ls, %ws, %c, %n, %hits = dflash.lm_head_ce %a, %head, %labels, %weights
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>)
  return %ls, %ws, %c, %n : tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>
}

// -----

// Attention: the gradient takes the forward output and log-sum-exp, and
// returns the gradients of the query and of both key/value parts.

// CHECK-LABEL: func.func @step(
// CHECK: %[[O:[a-z_0-9]+]], %[[LSE:[a-z_0-9]+]] = dflash.block_attention %[[Q:[a-z_0-9]+]], %[[KC:[a-z_0-9]+]], %[[VC:[a-z_0-9]+]], %[[KD:[a-z_0-9]+]], %[[VD:[a-z_0-9]+]], %{{.*}} {block_size = 4 : i64, causal, window = 8 : i64}
// CHECK: dflash.block_attention_grad %{{.*}}, %[[Q]], %[[KC]], %[[VC]], %[[KD]], %[[VD]], %{{.*}}, %{{.*}}, %[[O]], %[[LSE]] {block_size = 4 : i64, causal, window = 8 : i64}
func.func @step(%q: tensor<1x8x2x4xbf16> {dflash.arg = #dflash.arg<parameter, "q">},
                %kc: tensor<1x16x1x4xbf16> {dflash.arg = #dflash.arg<parameter, "kc">},
                %vc: tensor<1x16x1x4xbf16> {dflash.arg = #dflash.arg<parameter, "vc">},
                %kd: tensor<1x8x1x4xbf16> {dflash.arg = #dflash.arg<parameter, "kd">},
                %vd: tensor<1x8x1x4xbf16> {dflash.arg = #dflash.arg<parameter, "vd">},
                %anchors: tensor<1x2xi32> {dflash.arg = #dflash.arg<input, "anchors">},
                %keep: tensor<1x2xi8> {dflash.arg = #dflash.arg<input, "keep">}, %pos: tensor<1x16xi32> {dflash.arg = #dflash.arg<input, "position_ids">},
                %head: tensor<16x8xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %weights: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  %o, %lse = dflash.block_attention %q, %kc, %vc, %kd, %vd, %anchors, %keep, %pos
      {block_size = 4 : i64, window = 8 : i64, causal}
      : (tensor<1x8x2x4xbf16>, tensor<1x16x1x4xbf16>, tensor<1x16x1x4xbf16>,
         tensor<1x8x1x4xbf16>, tensor<1x8x1x4xbf16>, tensor<1x2xi32>, tensor<1x2xi8>, tensor<1x16xi32>)
      -> (tensor<1x8x2x4xbf16>, tensor<1x8x2xf32>)
  %y = dflash.reshape %o : (tensor<1x8x2x4xbf16>) -> tensor<1x8x8xbf16>
  %ls, %ws, %c, %n, %hits = dflash.lm_head_ce %y, %head, %labels, %weights
      : (tensor<1x8x8xbf16>, tensor<16x8xbf16>, tensor<1x8xi32>, tensor<1x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  return %ls : tensor<f32>
}

// -----

// DFlash2: the two convolutions of a sublayer read one D and one base, each
// its half; their gradients (the other half 0) are added.
// CHECK-LABEL: func.func @step(
// CHECK: %[[D:.+]] = dflash.linear
// CHECK: %[[H:.+]] = dflash.grouped_conv %{{.*}}, %[[D]], %[[BASE:[a-z0-9]+]] {{.*}}half = 0
// CHECK: %[[O:.+]] = dflash.grouped_conv %[[H]], %[[D]], %[[BASE]] {{.*}}half = 1
// CHECK: %[[DO:.+]] = dflash.lm_head_ce_grad %[[O]]
// CHECK: %[[DH:.+]], %[[DD1:.+]], %[[DB1:.+]] = dflash.grouped_conv_grad %[[DO]], %[[H]], %[[D]], %[[BASE]] {{.*}}half = 1
// CHECK: %{{.+}}, %[[DD0:.+]], %[[DB0:.+]] = dflash.grouped_conv_grad %[[DH]], %{{.*}}, %[[D]], %[[BASE]] {{.*}}half = 0
// CHECK-DAG: %[[DD:.+]] = dflash.add %[[DD1]], %[[DD0]] : (tensor<1x8x8xbf16>
// CHECK-DAG: %[[DB:.+]] = dflash.add %[[DB1]], %[[DB0]] : (tensor<2x2x32xbf16>
// CHECK: dflash.linear_grad_weight %[[DD]]
func.func @step(%x: tensor<1x8x32xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %wc: tensor<8x32xbf16> {dflash.arg = #dflash.arg<parameter, "layers.0.attention_conv.kernel_projection.weight">},
                %base: tensor<2x2x32xbf16> {dflash.arg = #dflash.arg<parameter, "layers.0.attention_conv.base_kernel">},
                %head: tensor<16x32xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %weights: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  %d = dflash.linear %x, %wc : (tensor<1x8x32xbf16>, tensor<8x32xbf16>) -> tensor<1x8x8xbf16>
  %h = dflash.grouped_conv %x, %d, %base
      {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<1x8x32xbf16>, tensor<1x8x8xbf16>, tensor<2x2x32xbf16>) -> tensor<1x8x32xbf16>
  %o = dflash.grouped_conv %h, %d, %base
      {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 1 : i64}
      : (tensor<1x8x32xbf16>, tensor<1x8x8xbf16>, tensor<2x2x32xbf16>) -> tensor<1x8x32xbf16>
  %ls, %ws, %c, %n, %hits = dflash.lm_head_ce %o, %head, %labels, %weights
      : (tensor<1x8x32xbf16>, tensor<16x32xbf16>, tensor<1x8xi32>, tensor<1x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  return %ls : tensor<f32>
}

// -----

// The DFlash2 selector with stop_gradient: Wh and the codebooks learn, and
// nothing of the selector reaches y (neither through t nor through the
// unary logits): y's gradient is CE_u's alone.
// CHECK-LABEL: func.func @step(
// CHECK: %[[Y:.+]] = dflash.linear
// CHECK: dflash.selector_loss_grad {{.*}} {gold = "topk", stop_gradient}
// CHECK-NEXT: %[[DWH:.+]] = dflash.linear_grad_weight %projected_grad, %[[Y]]
// CHECK-NOT: dflash.linear_grad_input
// CHECK-NOT: dflash.selector_candidates_grad
// CHECK: %[[DY:.+]] = dflash.lm_head_ce_grad
// CHECK-NOT: dflash.add
// CHECK: %[[DWY:.+]] = dflash.linear_grad_weight %[[DY]]
// CHECK: return %{{.*}}, %[[DWY]], %[[DWH]], %predecessor_codebook_grad, %successor_codebook_grad :
func.func @step(%x: tensor<1x8x32xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %wy: tensor<32x32xbf16> {dflash.arg = #dflash.arg<parameter, "wy">},
                %wh: tensor<8x32xbf16> {dflash.arg = #dflash.arg<parameter, "wh">},
                %pcb: tensor<16x8xbf16> {dflash.arg = #dflash.arg<parameter, "pcb">},
                %scb: tensor<16x8xbf16> {dflash.arg = #dflash.arg<parameter, "scb">},
                %head: tensor<16x32xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %preds: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "predecessors">},
                %weights: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  %y = dflash.linear %x, %wy : (tensor<1x8x32xbf16>, tensor<32x32xbf16>) -> tensor<1x8x32xbf16>
  %v, %c, %lv = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<1x8x32xbf16>, tensor<16x32xbf16>, tensor<1x8xi32>, tensor<1x8xf32>)
      -> (tensor<1x8x4xf32>, tensor<1x8x4xi32>, tensor<1x8xf32>)
  %ls, %ws, %cr, %n, %ce_hits = dflash.lm_head_ce %y, %head, %labels, %weights
      : (tensor<1x8x32xbf16>, tensor<16x32xbf16>, tensor<1x8xi32>, tensor<1x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  %sel, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %preds, %labels, %weights, %pcb, %scb
      {gold = "topk", stop_gradient}
      : (tensor<1x8x4xf32>, tensor<1x8x4xi32>, tensor<1x8xf32>, tensor<1x8x32xbf16>,
         tensor<8x32xbf16>, tensor<1x8xi32>, tensor<1x8xi32>, tensor<1x8xf32>,
         tensor<16x8xbf16>, tensor<16x8xbf16>)
      -> (tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  %loss = dflash.add %ls, %sel : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// The DFlash2 selector without it, injecting: y gets the gradient through t
// and through the values and the injected labels' values.
// CHECK-LABEL: func.func @step(
// CHECK: %[[Y:.+]] = dflash.linear
// CHECK: dflash.selector_loss {{.*}}, %[[Y]], %[[WH:[a-z0-9]+]],
// CHECK: dflash.selector_loss_grad {{.*}} {gold = "inject"}
// CHECK-NEXT: %[[DWH:.+]] = dflash.linear_grad_weight %projected_grad, %[[Y]]
// CHECK-NEXT: dflash.linear_grad_input %projected_grad, %[[WH]]
// CHECK: dflash.selector_candidates_grad %[[Y]], {{.*}} values_grad %values_grad label_values_grad %label_values_grad
// CHECK: return %{{.*}}, %{{.*}}, %[[DWH]], %predecessor_codebook_grad, %successor_codebook_grad :
func.func @step(%x: tensor<1x8x32xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %wy: tensor<32x32xbf16> {dflash.arg = #dflash.arg<parameter, "wy">},
                %wh: tensor<8x32xbf16> {dflash.arg = #dflash.arg<parameter, "wh">},
                %pcb: tensor<16x8xbf16> {dflash.arg = #dflash.arg<parameter, "pcb">},
                %scb: tensor<16x8xbf16> {dflash.arg = #dflash.arg<parameter, "scb">},
                %head: tensor<16x32xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %preds: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "predecessors">},
                %weights: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  %y = dflash.linear %x, %wy : (tensor<1x8x32xbf16>, tensor<32x32xbf16>) -> tensor<1x8x32xbf16>
  %v, %c, %lv = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<1x8x32xbf16>, tensor<16x32xbf16>, tensor<1x8xi32>, tensor<1x8xf32>)
      -> (tensor<1x8x4xf32>, tensor<1x8x4xi32>, tensor<1x8xf32>)
  %ls, %ws, %cr, %n, %ce_hits = dflash.lm_head_ce %y, %head, %labels, %weights
      : (tensor<1x8x32xbf16>, tensor<16x32xbf16>, tensor<1x8xi32>, tensor<1x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  %sel, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %preds, %labels, %weights, %pcb, %scb
      {gold = "inject"}
      : (tensor<1x8x4xf32>, tensor<1x8x4xi32>, tensor<1x8xf32>, tensor<1x8x32xbf16>,
         tensor<8x32xbf16>, tensor<1x8xi32>, tensor<1x8xi32>, tensor<1x8xf32>,
         tensor<16x8xbf16>, tensor<16x8xbf16>)
      -> (tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  %loss = dflash.add %ls, %sel : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %loss : tensor<f32>
}
