// RUN: dflash-opt %s --dflash-fuse-kernels --split-input-file | FileCheck %s
// RUN: dflashc %specs/tiny.toml --emit=train | dflash-opt --dflash-fuse-kernels | FileCheck %s --check-prefix=TINY

// A residual add feeding a norm becomes one kernel that writes both.
// CHECK-LABEL: func.func @residual
// CHECK: %[[SUM:[a-z_0-9]+]], %[[H:[a-z_0-9]+]] = dflash.residual_rms_norm %arg0, %arg1, %arg2 {eps = 9.9999999999999995E-7 : f64}
// CHECK-NOT: dflash.add
// CHECK-NOT: dflash.rms_norm
// CHECK: return %[[SUM]], %[[H]]
func.func @residual(%x: tensor<4x64xbf16>, %d: tensor<4x64xbf16>, %w: tensor<64xbf16>)
    -> (tensor<4x64xbf16>, tensor<4x64xbf16>) {
  %s = dflash.add %x, %d : (tensor<4x64xbf16>, tensor<4x64xbf16>) -> tensor<4x64xbf16>
  %h = dflash.rms_norm %s, %w {eps = 1.0e-6 : f64} : (tensor<4x64xbf16>, tensor<64xbf16>) -> tensor<4x64xbf16>
  return %s, %h : tensor<4x64xbf16>, tensor<4x64xbf16>
}

// -----

// Per-head norm then RoPE, and their gradients.
// CHECK-LABEL: func.func @qk
// CHECK: %[[Y:.+]] = dflash.qk_norm_rope %arg0, %arg1, %arg2 {eps = 9.9999999999999995E-7 : f64, theta = 1.000000e+04 : f64}
// CHECK: dflash.qk_norm_rope_grad %arg3, %arg0, %arg1, %arg2 {eps = 9.9999999999999995E-7 : f64, theta = 1.000000e+04 : f64}
// CHECK-NOT: dflash.rope
func.func @qk(%x: tensor<1x4x2x8xbf16>, %w: tensor<8xbf16>, %p: tensor<1x4xi32>, %dy: tensor<1x4x2x8xbf16>)
    -> (tensor<1x4x2x8xbf16>, tensor<1x4x2x8xbf16>, tensor<8xbf16>) {
  %n = dflash.rms_norm %x, %w {eps = 1.0e-6 : f64} : (tensor<1x4x2x8xbf16>, tensor<8xbf16>) -> tensor<1x4x2x8xbf16>
  %y = dflash.rope %n, %p {theta = 1.0e4 : f64} : (tensor<1x4x2x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x2x8xbf16>
  %g = dflash.rope_grad %dy, %p {theta = 1.0e4 : f64} : (tensor<1x4x2x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x2x8xbf16>
  %dx, %dw = dflash.rms_norm_grad %g, %x, %w {eps = 1.0e-6 : f64} : (tensor<1x4x2x8xbf16>, tensor<1x4x2x8xbf16>, tensor<8xbf16>) -> (tensor<1x4x2x8xbf16>, tensor<8xbf16>)
  return %y, %dx, %dw : tensor<1x4x2x8xbf16>, tensor<1x4x2x8xbf16>, tensor<8xbf16>
}

// -----

// Gradient sums become beta = 1 GEMMs into the running sum.
// CHECK-LABEL: func.func @accumulate
// CHECK: %[[G1:.+]] = dflash.linear_grad_weight %arg0, %arg1
// CHECK: dflash.accumulate_linear_grad %[[G1]], %arg2, %arg3 {weight_grad}
// CHECK-NOT: dflash.add
func.func @accumulate(%dy1: tensor<4x16xbf16>, %x1: tensor<4x8xbf16>, %dy2: tensor<6x16xbf16>, %x2: tensor<6x8xbf16>) -> tensor<16x8xbf16> {
  %g1 = dflash.linear_grad_weight %dy1, %x1 : (tensor<4x16xbf16>, tensor<4x8xbf16>) -> tensor<16x8xbf16>
  %g2 = dflash.linear_grad_weight %dy2, %x2 : (tensor<6x16xbf16>, tensor<6x8xbf16>) -> tensor<16x8xbf16>
  %s = dflash.add %g1, %g2 : (tensor<16x8xbf16>, tensor<16x8xbf16>) -> tensor<16x8xbf16>
  return %s : tensor<16x8xbf16>
}

// The whole tiny step: the seed is computed from the weights before the
// fused lm_head pass; nothing graph-level that has a kernel group is left.
// TINY-LABEL: func.func @step
// TINY: dflash.draft_embed
// TINY: %[[LABELS:[a-z_0-9]+]], %[[W:[a-z_0-9]+]] = dflash.draft_targets
// TINY-NEXT: %{{.+}}, %[[SEED:[a-z_0-9]+]] = dflash.loss_seed %[[W]]
// TINY-COUNT-2: dflash.qk_norm_rope
// TINY: dflash.residual_rms_norm
// TINY: dflash.lm_head_ce_fused {{.*}}, %[[LABELS]], %[[W]], %[[SEED]]
// TINY: dflash.rms_norm_grad_residual
// TINY: dflash.qk_norm_rope_grad
// TINY: dflash.accumulate_linear_grad
// TINY: dflash.adamw_multi params(
// TINY-NOT: dflash.lm_head_ce_grad
// TINY-NOT: dflash.global_norm
// TINY-NOT: dflash.adamw {{.*}}beta1
