// RUN: dflash-opt %s --split-input-file --verify-diagnostics

// The optimizer's kernel-level ops: gradient buckets and the sharded AdamW
// (ZeRO-1). One case per numbered constraint of docs/dialect.md.

func.func @bucket_count(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  // expected-error @+1 {{(C1) needs one result per gradient and at least one gradient, not 1 gradients and 2 results}}
  %g:2 = dflash.gradient_bucket %d : (tensor<64xbf16>) -> (tensor<64xf32>, tensor<64xf32>)
  return
}

// -----

func.func @bucket_shape(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  // expected-error @+1 {{(C2) result 'tensor<32xf32>' must have the shape of its gradient 'tensor<64xbf16>'}}
  %g = dflash.gradient_bucket %d : (tensor<64xbf16>) -> tensor<32xf32>
  return
}

// -----

func.func @bucket_half_sharded(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  // expected-error @+1 {{(C3) needs both world_size and shard_elements or neither}}
  %g = dflash.gradient_bucket %d {world_size = 2 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  return
}

// -----

func.func @bucket_zero_world(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  // expected-error @+1 {{(C3) world_size (0) and shard_elements (64) must be positive}}
  %g = dflash.gradient_bucket %d {world_size = 0 : i64, shard_elements = 64 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  return
}

// -----

func.func @bucket_shards_too_small(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  // expected-error @+1 {{(C4) 2 shards of 16 elements cannot hold its 64 gradient elements}}
  %g = dflash.gradient_bucket %d {world_size = 2 : i64, shard_elements = 16 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  return
}

// -----

func.func @sharded_valid(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  %g = dflash.gradient_bucket %d {world_size = 2 : i64, shard_elements = 64 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  %new:4, %norm, %lr = dflash.adamw_sharded params(%p) grads(%g) masters(%m) moment1(%m) moment2(%m) step(%s) total(%t) {world_size = 2 : i64, lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @sharded_groups(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  %g = dflash.gradient_bucket %d {world_size = 2 : i64, shard_elements = 64 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  // expected-error @+1 {{(C1) needs one grad per parameter (1) and one master, moment1 and moment2 per bucket (1)}}
  %new:3, %norm, %lr = dflash.adamw_sharded params(%p) grads(%g) masters(%m) moment1(%m) moment2() step(%s) total(%t) {world_size = 2 : i64, lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @sharded_results(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  %g = dflash.gradient_bucket %d {world_size = 2 : i64, shard_elements = 64 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  // expected-error @+1 {{(C2) has 3 state results; it needs 1 + 3 x 1}}
  %new:3, %norm, %lr = dflash.adamw_sharded params(%p) grads(%g) masters(%m) moment1(%m) moment2(%m) step(%s) total(%t) {world_size = 2 : i64, lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @sharded_param_shape(%d: tensor<64xbf16>, %q: tensor<32xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  %g = dflash.gradient_bucket %d {world_size = 2 : i64, shard_elements = 64 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  // expected-error @+1 {{(C3) the grad and new value of parameter 0 must have its shape}}
  %new:4, %norm, %lr = dflash.adamw_sharded params(%q) grads(%g) masters(%m) moment1(%m) moment2(%m) step(%s) total(%t) {world_size = 2 : i64, lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<32xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<32xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @sharded_world_zero(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  %g = dflash.gradient_bucket %d {world_size = 2 : i64, shard_elements = 64 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  // expected-error @+1 {{(C4) world_size must be positive, not 0}}
  %new:4, %norm, %lr = dflash.adamw_sharded params(%p) grads(%g) masters(%m) moment1(%m) moment2(%m) step(%s) total(%t) {world_size = 0 : i64, lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @sharded_world_differs(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  %g = dflash.gradient_bucket %d {world_size = 2 : i64, shard_elements = 64 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  // expected-error @+1 {{(C4) grad 0 must be a result of a gradient_bucket sharded over world_size 4}}
  %new:4, %norm, %lr = dflash.adamw_sharded params(%p) grads(%g) masters(%m) moment1(%m) moment2(%m) step(%s) total(%t) {world_size = 4 : i64, lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @sharded_grad_not_bucketed(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  // expected-error @+1 {{(C4) grad 0 must be a result of a gradient_bucket sharded over world_size 2}}
  %new:4, %norm, %lr = dflash.adamw_sharded params(%p) grads(%m) masters(%m) moment1(%m) moment2(%m) step(%s) total(%t) {world_size = 2 : i64, lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @sharded_bucket_half_read(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  %g:2 = dflash.gradient_bucket %d, %d {world_size = 2 : i64, shard_elements = 64 : i64} : (tensor<64xbf16>, tensor<64xbf16>) -> (tensor<64xf32>, tensor<64xf32>)
  // expected-error @+1 {{(C5) every result of a bucket must be exactly one grad; result 1 of a bucket is not}}
  %new:4, %norm, %lr = dflash.adamw_sharded params(%p) grads(%g#0) masters(%m) moment1(%m) moment2(%m) step(%s) total(%t) {world_size = 2 : i64, lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @sharded_state_shape(%d: tensor<64xbf16>, %p: tensor<64xbf16>, %m: tensor<64xf32>, %h: tensor<32xf32>, %s: tensor<i32>, %t: tensor<i32>) {
  %g = dflash.gradient_bucket %d {world_size = 2 : i64, shard_elements = 64 : i64} : (tensor<64xbf16>) -> tensor<64xf32>
  // expected-error @+1 {{(C6) the state of bucket 0 must be 'tensor<64xf32>', not 'tensor<32xf32>'}}
  %new:4, %norm, %lr = dflash.adamw_sharded params(%p) grads(%g) masters(%h) moment1(%m) moment2(%m) step(%s) total(%t) {world_size = 2 : i64, lr = 1.0e-3 : f64, warmup_ratio = 0.0 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (tensor<64xbf16>, tensor<64xf32>, tensor<32xf32>, tensor<64xf32>, tensor<64xf32>, tensor<i32>, tensor<i32>) -> (tensor<64xbf16>, tensor<32xf32>, tensor<64xf32>, tensor<64xf32>, tensor<f32>, tensor<f32>)
  return
}
