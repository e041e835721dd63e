// RUN: dflash-opt %s --dflash-bucket-gradients --split-input-file --verify-diagnostics

// A step without the fused optimizer (here: before dflash-fuse-kernels, with
// nothing to update): the buckets are the gradients that adamw_multi reads.
// expected-error @+1 {{@step has no dflash.adamw_multi: run dflash-fuse-kernels before dflash-bucket-gradients}}
module {
  func.func @step(%g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">})
      -> (tensor<64xf32> {dflash.arg = #dflash.arg<metric, "g32">}) {
    %g32 = dflash.convert %g : (tensor<64xbf16>) -> tensor<64xf32>
    return %g32 : tensor<64xf32>
  }
}

// -----

// Gradients that are already fp32 buckets (the pass run twice).
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
  %g32 = dflash.gradient_bucket %g : (tensor<64xbf16>) -> tensor<64xf32>
  // expected-error @+1 {{'dflash.adamw_multi' op expects bf16 gradients, but gradient 0 is 'tensor<64xf32>': each gradient is bucketed once}}
  %new:4, %norm, %lr = dflash.adamw_multi params(%w) masters(%master) moment1(%m1) moment2(%m2) grads(%g32) step(%step) total(%total) {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return %new#0 : tensor<64xbf16>
}
