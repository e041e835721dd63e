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

// A linear layer's output added to the residual stream becomes one GEMM
// with the add in its epilogue, so the norm after it reads one tensor; an
// add whose other side is no linear (or a linear read twice) stays an add
// for residual_rms_norm.
// CHECK-LABEL: func.func @linear_residual
// CHECK: %[[X1:[a-z_0-9]+]] = dflash.linear_residual %arg0, %arg1, %arg2 :
// CHECK: %[[H1:[a-z_0-9]+]] = dflash.rms_norm %[[X1]], %arg3
// CHECK: %[[O2:[a-z_0-9]+]] = dflash.linear %[[H1]], %arg2
// CHECK: %[[X2:[a-z_0-9]+]], %[[H2:[a-z_0-9]+]] = dflash.residual_rms_norm %[[X1]], %[[O2]], %arg3
// CHECK-NOT: dflash.add
// CHECK: return %[[X2]], %[[H2]], %[[O2]]
func.func @linear_residual(%x: tensor<4x64xbf16>, %a: tensor<4x64xbf16>, %wo: tensor<64x64xbf16>, %w: tensor<64xbf16>)
    -> (tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<4x64xbf16>) {
  %o = dflash.linear %a, %wo : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  %x1 = dflash.add %x, %o : (tensor<4x64xbf16>, tensor<4x64xbf16>) -> tensor<4x64xbf16>
  %h1 = dflash.rms_norm %x1, %w {eps = 1.0e-6 : f64} : (tensor<4x64xbf16>, tensor<64xbf16>) -> tensor<4x64xbf16>
  %o2 = dflash.linear %h1, %wo : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  %x2 = dflash.add %x1, %o2 : (tensor<4x64xbf16>, tensor<4x64xbf16>) -> tensor<4x64xbf16>
  %h2 = dflash.rms_norm %x2, %w {eps = 1.0e-6 : f64} : (tensor<4x64xbf16>, tensor<64xbf16>) -> tensor<4x64xbf16>
  return %x2, %h2, %o2 : tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<4x64xbf16>
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
// TINY: dflash.linear_residual
// TINY: dflash.rms_norm
// TINY: dflash.linear_residual
// TINY: dflash.lm_head_ce_fused {{.*}}, %[[LABELS]], %[[W]], %[[SEED]]
// TINY: dflash.rms_norm_grad_residual
// TINY: dflash.qk_norm_rope_grad
// TINY: dflash.accumulate_linear_grad
// TINY: dflash.adamw_multi params(
// TINY-NOT: dflash.linear_swiglu
// TINY-NOT: dflash.lm_head_ce_grad
// TINY-NOT: dflash.global_norm
// TINY-NOT: dflash.adamw {{.*}}beta1
