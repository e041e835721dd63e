// RUN: dflash-opt %s --dflash-fuse-kernels=linear-swiglu=true --split-input-file | FileCheck %s
// RUN: dflash-opt %s --dflash-fuse-kernels --split-input-file | FileCheck %s --check-prefix=DEFAULT
// RUN: dflashc %specs/tiny.toml --emit=train | dflash-opt --dflash-fuse-kernels=linear-swiglu=true | FileCheck %s --check-prefix=DRAFTER

// dflash.linear_swiglu, asked for by the pass option or the module's
// dflash.fuse_target_mlp (spec [memory] fuse_target_mlp); off by default.
// DEFAULT-NOT: dflash.linear_swiglu
// The drafter's backward reads its gate and up products: never fused.
// DRAFTER-NOT: dflash.linear_swiglu

// The MLP's gate and up products that only SwiGLU reads (the target's
// forward) become one GEMM with SwiGLU in its epilogue; where the backward
// pass also reads them (the drafter), they stay two GEMMs and a SwiGLU.
// CHECK-LABEL: func.func @linear_swiglu
// CHECK: %[[A:[a-z_0-9]+]] = dflash.linear_swiglu %arg0, %arg1, %arg2 : (tensor<4x64xbf16>, tensor<96x64xbf16>, tensor<96x64xbf16>) -> tensor<4x96xbf16>
// CHECK-NOT: dflash.swiglu
// CHECK: return %[[A]]
func.func @linear_swiglu(%x: tensor<4x64xbf16>, %wg: tensor<96x64xbf16>, %wu: tensor<96x64xbf16>) -> tensor<4x96xbf16> {
  %g = dflash.linear %x, %wg : (tensor<4x64xbf16>, tensor<96x64xbf16>) -> tensor<4x96xbf16>
  %u = dflash.linear %x, %wu : (tensor<4x64xbf16>, tensor<96x64xbf16>) -> tensor<4x96xbf16>
  %a = dflash.swiglu %g, %u : (tensor<4x96xbf16>, tensor<4x96xbf16>) -> tensor<4x96xbf16>
  return %a : tensor<4x96xbf16>
}

// -----

// CHECK-LABEL: func.func @swiglu_products_read_again
// CHECK-COUNT-2: dflash.linear
// CHECK: dflash.swiglu
// CHECK-NOT: dflash.linear_swiglu
func.func @swiglu_products_read_again(%x: tensor<4x64xbf16>, %wg: tensor<96x64xbf16>, %wu: tensor<96x64xbf16>) -> (tensor<4x96xbf16>, tensor<4x96xbf16>) {
  %g = dflash.linear %x, %wg : (tensor<4x64xbf16>, tensor<96x64xbf16>) -> tensor<4x96xbf16>
  %u = dflash.linear %x, %wu : (tensor<4x64xbf16>, tensor<96x64xbf16>) -> tensor<4x96xbf16>
  %a = dflash.swiglu %g, %u : (tensor<4x96xbf16>, tensor<4x96xbf16>) -> tensor<4x96xbf16>
  return %a, %g : tensor<4x96xbf16>, tensor<4x96xbf16>
}

// -----

// A K that TMA cannot read in 16-byte rows (12 bf16) keeps cuBLASLt's GEMMs.
// CHECK-LABEL: func.func @swiglu_unsupported_depth
// CHECK-NOT: dflash.linear_swiglu
// CHECK: dflash.swiglu
func.func @swiglu_unsupported_depth(%x: tensor<4x12xbf16>, %wg: tensor<96x12xbf16>, %wu: tensor<96x12xbf16>) -> tensor<4x96xbf16> {
  %g = dflash.linear %x, %wg : (tensor<4x12xbf16>, tensor<96x12xbf16>) -> tensor<4x96xbf16>
  %u = dflash.linear %x, %wu : (tensor<4x12xbf16>, tensor<96x12xbf16>) -> tensor<4x96xbf16>
  %a = dflash.swiglu %g, %u : (tensor<4x96xbf16>, tensor<4x96xbf16>) -> tensor<4x96xbf16>
  return %a : tensor<4x96xbf16>
}

// -----

// The module attribute asks for it as the option does.
// CHECK-LABEL: func.func @by_attribute
// CHECK: dflash.linear_swiglu
// DEFAULT-LABEL: func.func @by_attribute
// DEFAULT: dflash.linear_swiglu
module attributes {dflash.fuse_target_mlp} {
func.func @by_attribute(%x: tensor<4x64xbf16>, %wg: tensor<96x64xbf16>, %wu: tensor<96x64xbf16>) -> tensor<4x96xbf16> {
  %g = dflash.linear %x, %wg : (tensor<4x64xbf16>, tensor<96x64xbf16>) -> tensor<4x96xbf16>
  %u = dflash.linear %x, %wu : (tensor<4x64xbf16>, tensor<96x64xbf16>) -> tensor<4x96xbf16>
  %a = dflash.swiglu %g, %u : (tensor<4x96xbf16>, tensor<4x96xbf16>) -> tensor<4x96xbf16>
  return %a : tensor<4x96xbf16>
}
}
