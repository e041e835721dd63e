// RUN: dflash-opt %s --dflash-fuse-kernels --split-input-file --verify-diagnostics

// Loss weights that are an argument: the fused loss seed is placed after the
// op that computes them, and there is none.
func.func @step(%y: tensor<2x4x8xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %w: tensor<16x8xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %l: tensor<2x4xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %wt: tensor<2x4xf32> {dflash.arg = #dflash.arg<input, "weights">},
                %s: tensor<f32> {dflash.arg = #dflash.arg<input, "loss_sum_grad">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">},
        tensor<2x4x8xbf16> {dflash.arg = #dflash.arg<metric, "input_grad">}) {
  // expected-error @+1 {{'dflash.lm_head_ce' op needs its loss weights computed by an op, not passed as an argument: the loss seed is placed right after them}}
  %a, %b, %c, %d, %hits = dflash.lm_head_ce %y, %w, %l, %wt : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>) -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x4xi8>)
  %dy = dflash.lm_head_ce_grad %y, %w, %l, %wt, %s : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>, tensor<2x4xf32>, tensor<f32>) -> tensor<2x4x8xbf16>
  return %a, %dy : tensor<f32>, tensor<2x4x8xbf16>
}

// -----

// A learning rate passed in as an argument instead of dflash.lr_schedule.
// expected-error @+1 {{the first dflash.adamw's learning rate and clip must come from dflash.lr_schedule and from dflash.clip_coefficient of a dflash.global_norm}}
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %lr: tensor<f32> {dflash.arg = #dflash.arg<input, "lr">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
  %g32 = dflash.convert %g : (tensor<64xbf16>) -> tensor<64xf32>
  %r = dflash.all_reduce %g32 : (tensor<64xf32>) -> tensor<64xf32>
  %norm = dflash.global_norm %r : (tensor<64xf32>) -> tensor<f32>
  %clip = dflash.clip_coefficient %norm {max_norm = 1.0 : f64} : (tensor<f32>) -> tensor<f32>
  %nm, %n1, %n2, %np = dflash.adamw %master, %r, %m1, %m2, %step, %lr, %clip {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xbf16>)
  return %np : tensor<64xbf16>
}

// -----

// A clip coefficient of a norm passed in as an argument, not of
// dflash.global_norm (which adamw_multi computes itself).
// expected-error @+1 {{the first dflash.adamw's learning rate and clip must come from dflash.lr_schedule and from dflash.clip_coefficient of a dflash.global_norm}}
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">},
                %norm: tensor<f32> {dflash.arg = #dflash.arg<input, "norm">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
  %g32 = dflash.convert %g : (tensor<64xbf16>) -> tensor<64xf32>
  %r = dflash.all_reduce %g32 : (tensor<64xf32>) -> tensor<64xf32>
  %clip = dflash.clip_coefficient %norm {max_norm = 1.0 : f64} : (tensor<f32>) -> tensor<f32>
  %lr = dflash.lr_schedule %step, %total {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
  %nm, %n1, %n2, %np = dflash.adamw %master, %r, %m1, %m2, %step, %lr, %clip {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xbf16>)
  return %np : tensor<64xbf16>
}

// -----

// Two updates with a learning rate each: adamw_multi has one schedule.
func.func @step(%a: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "a">},
                %b: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "b">},
                %ga: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "ga">},
                %gb: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "gb">},
                %master_a: tensor<64xf32> {dflash.arg = #dflash.arg<master, "a">},
                %m1_a: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "a">},
                %m2_a: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "a">},
                %master_b: tensor<64xf32> {dflash.arg = #dflash.arg<master, "b">},
                %m1_b: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "b">},
                %m2_b: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "b">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "a">},
        tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "b">}) {
  %ga32 = dflash.convert %ga : (tensor<64xbf16>) -> tensor<64xf32>
  %gb32 = dflash.convert %gb : (tensor<64xbf16>) -> tensor<64xf32>
  %r:2 = dflash.all_reduce %ga32, %gb32 : (tensor<64xf32>, tensor<64xf32>) -> (tensor<64xf32>, tensor<64xf32>)
  %norm = dflash.global_norm %r#0, %r#1 : (tensor<64xf32>, tensor<64xf32>) -> tensor<f32>
  %clip = dflash.clip_coefficient %norm {max_norm = 1.0 : f64} : (tensor<f32>) -> tensor<f32>
  %lr = dflash.lr_schedule %step, %total {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
  %lr_b = dflash.lr_schedule %step, %total {lr = 2.0e-3 : f64, warmup_ratio = 0.0 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
  %na, %na1, %na2, %pa = dflash.adamw %master_a, %r#0, %m1_a, %m2_a, %step, %lr, %clip {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xbf16>)
  // expected-error @+1 {{'dflash.adamw' op must use the learning rate and clip of the first dflash.adamw}}
  %nb, %nb1, %nb2, %pb = dflash.adamw %master_b, %r#1, %m1_b, %m2_b, %step, %lr_b, %clip {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xbf16>)
  return %pa, %pb : tensor<64xbf16>, tensor<64xbf16>
}

// -----

// An fp32 gradient all-reduced without the dflash.convert from bf16 that
// adamw_multi performs.
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g32: tensor<64xf32> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
  %r = dflash.all_reduce %g32 : (tensor<64xf32>) -> tensor<64xf32>
  %norm = dflash.global_norm %r : (tensor<64xf32>) -> tensor<f32>
  %clip = dflash.clip_coefficient %norm {max_norm = 1.0 : f64} : (tensor<f32>) -> tensor<f32>
  %lr = dflash.lr_schedule %step, %total {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
  // expected-error @+1 {{'dflash.adamw' op expects its gradient from dflash.convert through dflash.all_reduce}}
  %nm, %n1, %n2, %np = dflash.adamw %master, %r, %m1, %m2, %step, %lr, %clip {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xbf16>)
  return %np : tensor<64xbf16>
}

// -----

// A converted gradient that is not all-reduced over the GPUs.
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
  %g32 = dflash.convert %g : (tensor<64xbf16>) -> tensor<64xf32>
  %norm = dflash.global_norm %g32 : (tensor<64xf32>) -> tensor<f32>
  %clip = dflash.clip_coefficient %norm {max_norm = 1.0 : f64} : (tensor<f32>) -> tensor<f32>
  %lr = dflash.lr_schedule %step, %total {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
  // expected-error @+1 {{'dflash.adamw' op expects its gradient from dflash.convert through dflash.all_reduce}}
  %nm, %n1, %n2, %np = dflash.adamw %master, %g32, %m1, %m2, %step, %lr, %clip {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xbf16>)
  return %np : tensor<64xbf16>
}

// -----

// A master computed in the step (widened from the bf16 parameter) instead of
// the fp32 argument that adamw_multi updates in place.
func.func @step(%w: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "w">}) {
  %master = dflash.convert %w : (tensor<64xbf16>) -> tensor<64xf32>
  %g32 = dflash.convert %g : (tensor<64xbf16>) -> tensor<64xf32>
  %r = dflash.all_reduce %g32 : (tensor<64xf32>) -> tensor<64xf32>
  %norm = dflash.global_norm %r : (tensor<64xf32>) -> tensor<f32>
  %clip = dflash.clip_coefficient %norm {max_norm = 1.0 : f64} : (tensor<f32>) -> tensor<f32>
  %lr = dflash.lr_schedule %step, %total {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
  // expected-error @+1 {{'dflash.adamw' op expects its master to be an argument of @step}}
  %nm, %n1, %n2, %np = dflash.adamw %master, %r, %m1, %m2, %step, %lr, %clip {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xbf16>)
  return %np : tensor<64xbf16>
}

// -----

// A master named "w" but the parameter "v": adamw_multi pairs them by name.
func.func @step(%v: tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "v">},
                %g: tensor<64xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %master: tensor<64xf32> {dflash.arg = #dflash.arg<master, "w">},
                %m1: tensor<64xf32> {dflash.arg = #dflash.arg<moment1, "w">},
                %m2: tensor<64xf32> {dflash.arg = #dflash.arg<moment2, "w">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total">})
    -> (tensor<64xbf16> {dflash.arg = #dflash.arg<parameter, "v">}) {
  %g32 = dflash.convert %g : (tensor<64xbf16>) -> tensor<64xf32>
  %r = dflash.all_reduce %g32 : (tensor<64xf32>) -> tensor<64xf32>
  %norm = dflash.global_norm %r : (tensor<64xf32>) -> tensor<f32>
  %clip = dflash.clip_coefficient %norm {max_norm = 1.0 : f64} : (tensor<f32>) -> tensor<f32>
  %lr = dflash.lr_schedule %step, %total {lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
  // expected-error @+1 {{'dflash.adamw' op has no parameter argument named 'w' like its master}}
  %nm, %n1, %n2, %np = dflash.adamw %master, %r, %m1, %m2, %step, %lr, %clip {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xbf16>)
  return %np : tensor<64xbf16>
}
