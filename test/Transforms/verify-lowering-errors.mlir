// RUN: dflash-opt %s --dflash-verify-lowering --split-input-file --verify-diagnostics

// A graph-level op that dflash-fuse-kernels groups into a kernel (rope_grad
// left over, as if the pass had not run), even with a memory plan.
func.func @step(%x: tensor<1x4x2x8xbf16> {dflash.arg = #dflash.arg<input, "x">},
                %p: tensor<1x4xi32> {dflash.arg = #dflash.arg<input, "p">})
    -> (tensor<1x4x2x8xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{'dflash.rope_grad' op has no kernel: it must be grouped by dflash-fuse-kernels before translation to CUDA}}
  %y = dflash.rope_grad %x, %p {theta = 1.0e4 : f64, dflash.offsets = array<i64: 0>} : (tensor<1x4x2x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x2x8xbf16>
  return %y : tensor<1x4x2x8xbf16>
}

// -----

// A kernel op without dflash.offsets (dflash-plan-memory has not run).
func.func @step(%x: tensor<4x8xbf16> {dflash.arg = #dflash.arg<input, "x">})
    -> (tensor<4x8xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{'dflash.add' op has no memory plan: run dflash-plan-memory before translation to CUDA}}
  %y = dflash.add %x, %x : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<4x8xbf16>
  return %y : tensor<4x8xbf16>
}

// -----

// An op of another dialect (here a call): only dflash ops have a kernel.
func.func private @helper(tensor<4x8xbf16>) -> tensor<4x8xbf16>

func.func @step(%x: tensor<4x8xbf16> {dflash.arg = #dflash.arg<input, "x">})
    -> (tensor<4x8xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{'func.call' op has no kernel: only dflash ops translate to CUDA}}
  %y = func.call @helper(%x) : (tensor<4x8xbf16>) -> tensor<4x8xbf16>
  return %y : tensor<4x8xbf16>
}

// -----

// A memory plan of two offsets for an op with one result.
func.func @step(%x: tensor<4x8xbf16> {dflash.arg = #dflash.arg<input, "x">})
    -> (tensor<4x8xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{'dflash.add' op has a memory plan of 2 offsets, not one per result (1)}}
  %y = dflash.add %x, %x {dflash.offsets = array<i64: 0, 64>} : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<4x8xbf16>
  return %y : tensor<4x8xbf16>
}

// -----

// A plan that puts %b over %a while the add still reads %a.
func.func @step(%x: tensor<4x64xbf16> {dflash.arg = #dflash.arg<input, "x">},
                %w: tensor<64x64xbf16> {dflash.arg = #dflash.arg<parameter, "w">})
    -> (tensor<4x64xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  %a = dflash.linear %x, %w {dflash.offsets = array<i64: 0>} : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  %b = dflash.linear %x, %w {dflash.offsets = array<i64: 256>} : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  // expected-error @+1 {{'dflash.add' op reads a value whose arena byte 256 another value was planned over before this read (dflash-plan-memory)}}
  %c = dflash.add %a, %b {dflash.offsets = array<i64: 1024>} : (tensor<4x64xbf16>, tensor<4x64xbf16>) -> tensor<4x64xbf16>
  return %c : tensor<4x64xbf16>
}

// -----

// A GEMM planned over its own input, which it is not written in place of.
func.func @step(%x: tensor<4x64xbf16> {dflash.arg = #dflash.arg<input, "x">},
                %w: tensor<64x64xbf16> {dflash.arg = #dflash.arg<parameter, "w">})
    -> (tensor<4x64xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  %a = dflash.linear %x, %w {dflash.offsets = array<i64: 0>} : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  // expected-error @+1 {{'dflash.linear' op result 0 is planned over an operand it is not written in place of (dflash-plan-memory)}}
  %b = dflash.linear %a, %w {dflash.offsets = array<i64: 0>} : (tensor<4x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64xbf16>
  return %b : tensor<4x64xbf16>
}
