// RUN: dflash-opt %s --dflash-verify-lowering --split-input-file --verify-diagnostics

func.func @step(%x: tensor<1x4x2x8xbf16> {dflash.arg = #dflash.arg<input, "x">},
                %p: tensor<1x4xi32> {dflash.arg = #dflash.arg<input, "p">})
    -> (tensor<1x4x2x8xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{'dflash.rope' op has no kernel: it must be grouped by dflash-fuse-kernels before translation to CUDA}}
  %y = dflash.rope %x, %p {theta = 1.0e4 : f64, dflash.offsets = array<i64: 0>} : (tensor<1x4x2x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x2x8xbf16>
  return %y : tensor<1x4x2x8xbf16>
}

// -----

func.func @step(%x: tensor<4x8xbf16> {dflash.arg = #dflash.arg<input, "x">})
    -> (tensor<4x8xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{'dflash.add' op has no memory plan: run dflash-plan-memory before translation to CUDA}}
  %y = dflash.add %x, %x : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<4x8xbf16>
  return %y : tensor<4x8xbf16>
}
