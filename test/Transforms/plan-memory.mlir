// RUN: dflash-opt %s --dflash-plan-memory --split-input-file | FileCheck %s
// RUN: dflash-opt %s --dflash-plan-memory --dflash-print-memory-plan --split-input-file -o /dev/null | FileCheck %s --check-prefix=PRINT
// RUN: dflash-opt %s --dflash-plan-memory --dflash-verify-lowering --split-input-file -o /dev/null

// Three 512-byte values: the third reuses the first's bytes, which are dead
// by then; the second cannot.
// CHECK-LABEL: module attributes {dflash.arena_bytes = 1024 : i64}
// CHECK: dflash.linear %arg0, %arg1 {dflash.offsets = array<i64: 0>}
// CHECK: dflash.linear {{.*}} {dflash.offsets = array<i64: 512>}
// CHECK: dflash.linear {{.*}} {dflash.offsets = array<i64: 0>}
// PRINT: slot dflash.linear#0 offset=0 size=512 live=[0, 1]
// PRINT: slot dflash.linear#0 offset=512 size=512 live=[1, 2]
// PRINT: slot dflash.linear#0 offset=0 size=512 live=[2, 3]
// PRINT: arena 1024 bytes, peak live 1024 bytes
func.func @step(%x: tensor<4x64xbf16> {dflash.arg = #dflash.arg<input, "x">},
                %w: tensor<64x64xbf16> {dflash.arg = #dflash.arg<parameter, "w">})
    -> (tensor<4x64xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  %a = dflash.linear %x, %w : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  %b = dflash.linear %a, %w : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  %c = dflash.linear %b, %w : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  return %c : tensor<4x64xbf16>
}

// -----

// A reshape is a view, and an accumulated gradient is written over its dead
// accumulator: both share the source's offset.
// CHECK-LABEL: module attributes {dflash.arena_bytes = 512 : i64}
// CHECK: dflash.linear_grad_weight %arg0, %arg1 {dflash.offsets = array<i64: 0>}
// CHECK: dflash.accumulate_linear_grad {{.*}} {dflash.offsets = array<i64: 0>, weight_grad}
// CHECK: dflash.reshape {{.*}} {dflash.offsets = array<i64: 0>}
func.func @step(%dy: tensor<4x16xbf16> {dflash.arg = #dflash.arg<input, "dy">},
                %x: tensor<4x8xbf16> {dflash.arg = #dflash.arg<input, "x">})
    -> (tensor<128xbf16> {dflash.arg = #dflash.arg<metric, "g">}) {
  %g1 = dflash.linear_grad_weight %dy, %x : (tensor<4x16xbf16>, tensor<4x8xbf16>) -> tensor<16x8xbf16>
  %g2 = dflash.accumulate_linear_grad %g1, %dy, %x {weight_grad} : (tensor<16x8xbf16>, tensor<4x16xbf16>, tensor<4x8xbf16>) -> tensor<16x8xbf16>
  %r = dflash.reshape %g2 : (tensor<16x8xbf16>) -> tensor<128xbf16>
  %unused = dflash.linear %x, %x : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<4x4xbf16>
  return %r : tensor<128xbf16>
}

// -----

// swiglu_grad writes the gate's gradient over the gate, which it reads last;
// the up is read again after it, so the up's gradient takes bytes of its own.
// CHECK-LABEL: module attributes
// CHECK: dflash.linear %arg0, %arg1 {dflash.offsets = array<i64: [[G:[0-9]+]]>}
// CHECK: dflash.swiglu_grad {{.*}} {dflash.offsets = array<i64: [[G]], {{[0-9]+}}>}
// PRINT-NOT: swiglu_grad#0
// PRINT: slot dflash.swiglu_grad#1
// PRINT-NOT: swiglu_grad#0
// PRINT: arena
func.func @step(%x: tensor<4x64xbf16> {dflash.arg = #dflash.arg<input, "x">},
                %w: tensor<64x64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %dy: tensor<4x64xbf16> {dflash.arg = #dflash.arg<input, "dy">})
    -> (tensor<4x64xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  %g = dflash.linear %x, %w : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  %u = dflash.linear %x, %w : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  %dg, %du = dflash.swiglu_grad %dy, %g, %u : (tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<4x64xbf16>) -> (tensor<4x64xbf16>, tensor<4x64xbf16>)
  %s = dflash.add %u, %du : (tensor<4x64xbf16>, tensor<4x64xbf16>) -> tensor<4x64xbf16>
  %t = dflash.add %dg, %s : (tensor<4x64xbf16>, tensor<4x64xbf16>) -> tensor<4x64xbf16>
  return %t : tensor<4x64xbf16>
}
