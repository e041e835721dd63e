// RUN: dflash-opt %s --split-input-file --verify-diagnostics

func.func @all_reduce_types(%x: tensor<4xf32>) {
  // expected-error @+1 {{(C1) result type 'tensor<4xbf16>' must equal its operand's type 'tensor<4xf32>'}}
  %y = dflash.all_reduce %x : (tensor<4xf32>) -> tensor<4xbf16>
  return
}

// -----

func.func @all_reduce_count(%x: tensor<4xf32>) {
  // expected-error @+1 {{(C1) has 1 operands but 2 results}}
  %y:2 = dflash.all_reduce %x : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  return
}

// -----

func.func @convert_shape(%x: tensor<4xbf16>) {
  // expected-error @+1 {{(C1) input [4] and result [8] must have the same shape}}
  %y = dflash.convert %x : (tensor<4xbf16>) -> tensor<8xf32>
  return
}

// -----

func.func @global_norm_empty() {
  // expected-error @+1 {{(C1) needs at least one operand}}
  %n = dflash.global_norm : () -> tensor<f32>
  return
}

// -----

func.func @clip(%n: tensor<f32>) {
  // expected-error @+1 {{(C1) max_norm is 0 but must be positive}}
  %c = dflash.clip_coefficient %n {max_norm = 0.0 : f64} : (tensor<f32>) -> tensor<f32>
  return
}

// -----

func.func @lr(%s: tensor<i32>, %t: tensor<i32>) {
  // expected-error @+1 {{(C1) lr is 0 but must be positive}}
  %lr = dflash.lr_schedule %s, %t {lr = 0.0 : f64, warmup_ratio = 0.04 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
  return
}

// -----

func.func @warmup(%s: tensor<i32>, %t: tensor<i32>) {
  // expected-error @+1 {{(C2) warmup_ratio is 1 but must be in [0, 1)}}
  %lr = dflash.lr_schedule %s, %t {lr = 6.0e-4 : f64, warmup_ratio = 1.0 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
  return
}

// -----

func.func @adamw_types(%p: tensor<4xf32>, %g: tensor<8xf32>, %s: tensor<i32>, %lr: tensor<f32>) {
  // expected-error @+1 {{(C1) grad ('tensor<8xf32>') and master ('tensor<4xf32>') must have the same type}}
  %a, %b, %c, %d = dflash.adamw %p, %g, %p, %p, %s, %lr, %lr {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64}
      : (tensor<4xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xbf16>)
  return
}

// -----

func.func @adamw_param(%p: tensor<4xf32>, %s: tensor<i32>, %lr: tensor<f32>) {
  // expected-error @+1 {{(C2) new_parameter must have shape [4] but has [2]}}
  %a, %b, %c, %d = dflash.adamw %p, %p, %p, %p, %s, %lr, %lr {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64}
      : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<2xbf16>)
  return
}

// -----

func.func @adamw_betas(%p: tensor<4xf32>, %s: tensor<i32>, %lr: tensor<f32>) {
  // expected-error @+1 {{(C3) beta1 (1) and beta2 (0.999) must be in [0, 1)}}
  %a, %b, %c, %d = dflash.adamw %p, %p, %p, %p, %s, %lr, %lr {beta1 = 1.0 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64}
      : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<i32>, tensor<f32>, tensor<f32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xbf16>)
  return
}
