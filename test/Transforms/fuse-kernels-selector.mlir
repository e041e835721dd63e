// RUN: dflash-opt %s --dflash-fuse-kernels --split-input-file | FileCheck %s
// RUN: dflashc %specs/tiny-dflash2.toml --emit=train | dflash-opt --dflash-fuse-kernels | FileCheck %s --check-prefix=TRAIN
// RUN: dflashc %specs/tiny-dflash2.toml --emit=graph | dflash-opt --dflash-make-eval-program --dflash-fuse-kernels | FileCheck %s --check-prefix=EVAL

// A DFlash2 drafter's top-K of its unary logits (selector_candidates) reads
// what lm_head_ce reads: with the loss's transform (here none: multiplier 1,
// no softcap) its logits are the loss's, so the top-K is folded into the lm_head kernel
// (docs/kernels.md) and the second lm_head GEMM is gone. The fused op
// takes the place of the first of the two (here the selector's): the
// selector's readers come after it.
// CHECK-LABEL: func.func @shared
// CHECK: %[[LABELS:[a-z_0-9]+]], %[[W:[a-z_0-9]+]] = dflash.draft_targets
// CHECK-NEXT: %{{.+}}, %[[SEED:[a-z_0-9]+]] = dflash.loss_seed %[[W]]
// CHECK-NEXT: %[[LS:[a-z_0-9]+]], %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %[[DY:[a-z_0-9]+]], %[[TOP:[a-z_0-9]+]]:3 = dflash.lm_head_ce_fused %arg5, %arg6, %[[LABELS]], %[[W]], %[[SEED]] {top_k = 4 : i64} : {{.*}} -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x12xi8>, tensor<1x12x32xbf16>, tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>)
// CHECK-NEXT: %[[SUM:[a-z_0-9]+]] = dflash.add %[[TOP]]#0, %[[TOP]]#0
// CHECK-NOT: dflash.selector_candidates
// CHECK-NOT: dflash.lm_head_ce_grad
// CHECK: return %[[LS]], %[[DY]], %[[SUM]], %[[TOP]]#1, %[[TOP]]#2
func.func @shared(%ids: tensor<1x16xi32>, %mask: tensor<1x16xi8>, %anchors: tensor<1x3xi32>,
                  %keep: tensor<1x3xi8>, %positions: tensor<1x16xi32>, %y: tensor<1x12x32xbf16>,
                  %head: tensor<64x32xbf16>, %s: tensor<f32>)
    -> (tensor<f32>, tensor<1x12x32xbf16>, tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>) {
  %labels, %weights = dflash.draft_targets %ids, %mask, %anchors, %keep, %positions {block_size = 4 : i64, gamma = 0.0 : f64}
      : (tensor<1x16xi32>, tensor<1x16xi8>, tensor<1x3xi32>, tensor<1x3xi8>, tensor<1x16xi32>) -> (tensor<1x12xi32>, tensor<1x12xf32>)
  %v, %c, %lv = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<64x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>)
  %v2 = dflash.add %v, %v : (tensor<1x12x4xf32>, tensor<1x12x4xf32>) -> tensor<1x12x4xf32>
  %ls, %ws, %correct, %count, %hits = dflash.lm_head_ce %y, %head, %labels, %weights
      : (tensor<1x12x32xbf16>, tensor<64x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x12xi8>)
  %dy = dflash.lm_head_ce_grad %y, %head, %labels, %weights, %s
      : (tensor<1x12x32xbf16>, tensor<64x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>, tensor<f32>) -> tensor<1x12x32xbf16>
  return %ls, %dy, %v2, %c, %lv : tensor<f32>, tensor<1x12x32xbf16>, tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>
}

// -----

// A transform of the unary logits other than the loss's (a softcap, a
// multiplier other than 1, where the loss has none), other operands than
// the loss's, or more candidates than the kernel keeps (64): the selector
// keeps its own op, and the loss fuses as without it.
// CHECK-LABEL: func.func @not_folded
// CHECK: dflash.lm_head_ce_fused
// CHECK-NOT: top_k = 4
// CHECK-SAME: -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x12xi8>, tensor<1x12x32xbf16>)
// CHECK: dflash.selector_candidates %arg5, %arg6, %labels, %weights {multiplier = 1.000000e+00 : f64, softcap = 3.000000e+01 : f64, top_k = 4 : i64}
// CHECK: dflash.selector_candidates %arg5, %arg6, %labels, %weights {multiplier = 2.000000e+00 : f64, softcap = 0.000000e+00 : f64, top_k = 4 : i64}
// CHECK: dflash.selector_candidates %arg7, %arg6, %labels, %weights {multiplier = 1.000000e+00 : f64, softcap = 0.000000e+00 : f64, top_k = 4 : i64}
// CHECK: dflash.selector_candidates %arg5, %arg6, %labels, %arg8 {multiplier = 1.000000e+00 : f64, softcap = 0.000000e+00 : f64, top_k = 4 : i64}
// CHECK: dflash.selector_candidates %arg5, %arg6, %labels, %weights {multiplier = 1.000000e+00 : f64, softcap = 0.000000e+00 : f64, top_k = 65 : i64}
func.func @not_folded(%ids: tensor<1x16xi32>, %mask: tensor<1x16xi8>, %anchors: tensor<1x3xi32>,
                      %keep: tensor<1x3xi8>, %positions: tensor<1x16xi32>, %y: tensor<1x12x32xbf16>,
                      %head: tensor<80x32xbf16>, %y2: tensor<1x12x32xbf16>, %w2: tensor<1x12xf32>, %s: tensor<f32>)
    -> (tensor<f32>, tensor<1x12x32xbf16>, tensor<1x12x4xi32>, tensor<1x12x4xi32>, tensor<1x12x4xi32>,
        tensor<1x12x4xi32>, tensor<1x12x65xi32>) {
  %labels, %weights = dflash.draft_targets %ids, %mask, %anchors, %keep, %positions {block_size = 4 : i64, gamma = 0.0 : f64}
      : (tensor<1x16xi32>, tensor<1x16xi8>, tensor<1x3xi32>, tensor<1x3xi8>, tensor<1x16xi32>) -> (tensor<1x12xi32>, tensor<1x12xf32>)
  %ls, %ws, %correct, %count, %hits = dflash.lm_head_ce %y, %head, %labels, %weights
      : (tensor<1x12x32xbf16>, tensor<80x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x12xi8>)
  %dy = dflash.lm_head_ce_grad %y, %head, %labels, %weights, %s
      : (tensor<1x12x32xbf16>, tensor<80x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>, tensor<f32>) -> tensor<1x12x32xbf16>
  %v1, %c1, %lv1 = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 30.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<80x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>)
  %v2, %c2, %lv2 = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 2.0 : f64, softcap = 0.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<80x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>)
  %v3, %c3, %lv3 = dflash.selector_candidates %y2, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<80x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>)
  %v4, %c4, %lv4 = dflash.selector_candidates %y, %head, %labels, %w2
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<80x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>)
  %v5, %c5, %lv5 = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 65 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<80x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<1x12x65xf32>, tensor<1x12x65xi32>, tensor<1x12xf32>)
  return %ls, %dy, %c1, %c2, %c3, %c4, %c5 : tensor<f32>, tensor<1x12x32xbf16>, tensor<1x12x4xi32>, tensor<1x12x4xi32>,
      tensor<1x12x4xi32>, tensor<1x12x4xi32>, tensor<1x12x65xi32>
}

// -----

// The loss's transform (CE_u of a DFlash2 drafter with output_multiplier
// and final_logit_softcapping): the fused op carries it, and a top-K of the
// same transform folds into it; one of another transform does not. The
// gradient fuses only with its loss's transform.
// CHECK-LABEL: func.func @same_transform
// CHECK: %[[LS:[a-z_0-9]+]], %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %[[DY:[a-z_0-9]+]], %[[TOP:[a-z_0-9]+]]:3 = dflash.lm_head_ce_fused %arg5, %arg6, %labels, %weights, %{{.+}} {multiplier = 1.500000e+00 : f64, softcap = 3.000000e+01 : f64, top_k = 4 : i64}
// CHECK-NOT: dflash.lm_head_ce_grad
// CHECK: dflash.selector_candidates %arg5, %arg6, %labels, %weights {multiplier = 1.000000e+00 : f64, softcap = 3.000000e+01 : f64, top_k = 4 : i64}
// CHECK-NOT: dflash.selector_candidates
// CHECK: return %[[LS]], %[[DY]], %[[TOP]]#1, %{{.+}}
func.func @same_transform(%ids: tensor<1x16xi32>, %mask: tensor<1x16xi8>, %anchors: tensor<1x3xi32>,
                          %keep: tensor<1x3xi8>, %positions: tensor<1x16xi32>, %y: tensor<1x12x32xbf16>,
                          %head: tensor<64x32xbf16>, %s: tensor<f32>)
    -> (tensor<f32>, tensor<1x12x32xbf16>, tensor<1x12x4xi32>, tensor<1x12x4xi32>) {
  %labels, %weights = dflash.draft_targets %ids, %mask, %anchors, %keep, %positions {block_size = 4 : i64, gamma = 0.0 : f64}
      : (tensor<1x16xi32>, tensor<1x16xi8>, tensor<1x3xi32>, tensor<1x3xi8>, tensor<1x16xi32>) -> (tensor<1x12xi32>, tensor<1x12xf32>)
  %ls, %ws, %correct, %count, %hits = dflash.lm_head_ce %y, %head, %labels, %weights
      {multiplier = 1.5 : f64, softcap = 30.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<64x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x12xi8>)
  %dy = dflash.lm_head_ce_grad %y, %head, %labels, %weights, %s {multiplier = 1.5 : f64, softcap = 30.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<64x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>, tensor<f32>) -> tensor<1x12x32xbf16>
  %v1, %c1, %lv1 = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 1.5 : f64, softcap = 30.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<64x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>)
  %v2, %c2, %lv2 = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 30.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<64x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>)
  return %ls, %dy, %c1, %c2 : tensor<f32>, tensor<1x12x32xbf16>, tensor<1x12x4xi32>, tensor<1x12x4xi32>
}

// -----

// Without the gradient (an evaluation program's forward): lm_head_ce and
// the top-K become lm_head_ce_top_k, the same kernel without the dX GEMM;
// a loss without a foldable selector stays lm_head_ce.
// CHECK-LABEL: func.func @forward
// CHECK: %[[LS:[a-z_0-9]+]], %{{.+}}, %{{.+}}, %{{.+}}, %[[HITS:[a-z_0-9]+]], %[[V:[a-z_0-9]+]], %[[C:[a-z_0-9]+]], %[[LV:[a-z_0-9]+]] = dflash.lm_head_ce_top_k %arg0, %arg1, %arg2, %arg3 {top_k = 2 : i64} : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>) -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2x4xf32>)
// CHECK-NEXT: %[[LS2:[a-z_0-9]+]], {{.*}} = dflash.lm_head_ce %arg4, %arg1, %arg2, %arg3
// CHECK-NOT: dflash.selector_candidates
// CHECK: return %[[LS]], %[[HITS]], %[[V]], %[[C]], %[[LV]], %[[LS2]]
func.func @forward(%y: tensor<2x4x8xbf16>, %head: tensor<16x8xbf16>, %labels: tensor<2x4xi32>,
                   %weights: tensor<2x4xf32>, %y2: tensor<2x4x8xbf16>)
    -> (tensor<f32>, tensor<2x4xi8>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2x4xf32>, tensor<f32>) {
  %ls, %ws, %correct, %count, %hits = dflash.lm_head_ce %y, %head, %labels, %weights
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>)
  %ls2, %ws2, %correct2, %count2, %hits2 = dflash.lm_head_ce %y2, %head, %labels, %weights
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>)
  %v, %c, %lv = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 2 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>)
      -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2x4xf32>)
  return %ls, %hits, %v, %c, %lv, %ls2 : tensor<f32>, tensor<2x4xi8>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2x4xf32>, tensor<f32>
}

// The tiny DFlash2 drafter's step: the selector's top-K comes out of the
// fused lm_head op, which its gradient and the selector's loss read.
// TRAIN-LABEL: func.func @step
// TRAIN: %{{.+}}, %[[TOP:[a-z_0-9]+]]:3 = dflash.lm_head_ce_fused {{.*}} {top_k = 4 : i64}
// TRAIN: dflash.selector_loss %[[TOP]]#0, %[[TOP]]#1, %[[TOP]]#2,
// TRAIN: dflash.selector_candidates_grad {{.*}}, %[[TOP]]#1,
// TRAIN-NOT: dflash.selector_candidates %

// Its evaluation program the same, without the gradient.
// EVAL-LABEL: func.func @eval
// EVAL: %[[V:[a-z_0-9]+]], %[[C:[a-z_0-9]+]], %[[LV:[a-z_0-9]+]] = dflash.lm_head_ce_top_k {{.*}} {top_k = 4 : i64}
// EVAL: dflash.selector_loss %[[V]], %[[C]], %[[LV]],
// EVAL-NOT: dflash.selector_candidates
// EVAL-NOT: dflash.lm_head_ce %
