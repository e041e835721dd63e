// RUN: dflash-opt %s --dflash-shard-optimizer-state="world-size=2" --split-input-file --verify-diagnostics
// RUN: dflashc %specs/tiny.toml --emit=fused | not dflash-opt --dflash-shard-optimizer-state="world-size=2" 2>&1 | FileCheck %s

// The whole tiny step, fused but not bucketed: shards are cut from the
// gradient buckets, so without them there is nothing to cut.
// CHECK: error: 'dflash.adamw_multi' op gradient 0 is not in a dflash.gradient_bucket: run dflash-bucket-gradients before dflash-shard-optimizer-state

// A step without the fused optimizer: nothing holds the state to shard.
// expected-error @+1 {{@step has 0 dflash.adamw_multi ops; sharding needs exactly one (run dflash-fuse-kernels first)}}
module {
  func.func @step(%g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">})
      -> (tensor<64xf32> {dflash.arg = #dflash.arg<metric, "g32">}) {
    %g32 = dflash.convert %g : (tensor<64xbf16>) -> tensor<64xf32>
    return %g32 : tensor<64xf32>
  }
}

// -----

// Two optimizers: the state of the step is sharded as one set of buckets.
// expected-error @+1 {{@step has 2 dflash.adamw_multi ops; sharding needs exactly one (run dflash-fuse-kernels first)}}
module {
  func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                  %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                  %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                  %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                  %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                  %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                  %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
      -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
    %g32 = dflash.gradient_bucket %g : (tensor<64xbf16>) -> tensor<64xf32>
    %a:4, %anorm, %alr = dflash.adamw_multi params(%w) masters(%master) moment1(%m1) moment2(%m2) grads(%g32) step(%step) total(%total) {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
    %b:4, %bnorm, %blr = dflash.adamw_multi params(%a#0) masters(%a#1) moment1(%a#2) moment2(%a#3) grads(%g32) step(%step) total(%total) {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
    return %b#0 : tensor<64xbf16>
  }
}

// -----

// A bf16 gradient read directly, not through a bucket (the hand-written
// form of the tiny step above).
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
  // expected-error @+1 {{'dflash.adamw_multi' op gradient 0 is not in a dflash.gradient_bucket: run dflash-bucket-gradients before dflash-shard-optimizer-state}}
  %new:4, %norm, %lr = dflash.adamw_multi params(%w) masters(%master) moment1(%m1) moment2(%m2) grads(%g) step(%step) total(%total) {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xbf16>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return %new#0 : tensor<64xbf16>
}

// -----

// A bucketed gradient that the step also returns: once sharded, only this
// GPU's part of the bucket holds the sum.
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
        tensor<64xf32> {dflash.arg = #dflash.arg<gradient, "w">}) {
  // expected-error @+1 {{'dflash.gradient_bucket' op result 0 must be read by the optimizer only, once}}
  %g32 = dflash.gradient_bucket %g : (tensor<64xbf16>) -> tensor<64xf32>
  %new:4, %norm, %lr = dflash.adamw_multi params(%w) masters(%master) moment1(%m1) moment2(%m2) grads(%g32) step(%step) total(%total) {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return %new#0, %g32 : tensor<64xbf16>, tensor<64xf32>
}

// -----

// A master computed in the step (widened from the parameter) rather than an
// argument: there is no per-tensor argument to replace by the shard.
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
  %master = dflash.convert %w : (tensor<64xbf16>) -> tensor<64xf32>
  %g32 = dflash.gradient_bucket %g : (tensor<64xbf16>) -> tensor<64xf32>
  // expected-error @+1 {{'dflash.adamw_multi' op expects each master and moment to be an argument of @step that only it reads}}
  %new:4, %norm, %lr = dflash.adamw_multi params(%w) masters(%master) moment1(%m1) moment2(%m2) grads(%g32) step(%step) total(%total) {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return %new#0 : tensor<64xbf16>
}

// -----

// A moment argument that another op reads too: once sharded, this GPU holds
// only its part of it.
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "moment1_norm">}) {
  %g32 = dflash.gradient_bucket %g : (tensor<64xbf16>) -> tensor<64xf32>
  %m1_norm = dflash.global_norm %m1 : (tensor<64xf32>) -> tensor<f32>
  // expected-error @+1 {{'dflash.adamw_multi' op expects each master and moment to be an argument of @step that only it reads}}
  %new:4, %norm, %lr = dflash.adamw_multi params(%w) masters(%master) moment1(%m1) moment2(%m2) grads(%g32) step(%step) total(%total) {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return %new#0, %m1_norm : tensor<64xbf16>, tensor<f32>
}

// -----

// Updated masters and moments that the step drops: the sharded state
// results would have no place among the results.
// expected-error @+1 {{@step returns none of the masters and moments that dflash.adamw_multi updates}}
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
  %g32 = dflash.gradient_bucket %g : (tensor<64xbf16>) -> tensor<64xf32>
  %new:4, %norm, %lr = dflash.adamw_multi params(%w) masters(%master) moment1(%m1) moment2(%m2) grads(%g32) step(%step) total(%total) {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return %new#0 : tensor<64xbf16>
}

// -----

// An updated master that an op other than the return reads: the sharded op
// has no whole master to give it.
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
        tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
        tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
        tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "master_norm">}) {
  %g32 = dflash.gradient_bucket %g : (tensor<64xbf16>) -> tensor<64xf32>
  // expected-error @+1 {{'dflash.adamw_multi' op has a master or moment result that an op other than func.return reads}}
  %new:4, %norm, %lr = dflash.adamw_multi params(%w) masters(%master) moment1(%m1) moment2(%m2) grads(%g32) step(%step) total(%total) {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  %master_norm = dflash.global_norm %new#1 : (tensor<64xf32>) -> tensor<f32>
  return %new#0, %new#1, %new#2, %new#3, %master_norm : tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>
}
