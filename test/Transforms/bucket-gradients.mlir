// RUN: dflashc %specs/tiny.toml --emit=fused | dflash-opt --dflash-bucket-gradients="bucket-mib=1" | FileCheck %s
// RUN: dflash-opt %S/Inputs/mini-fused.mlir --dflash-bucket-gradients | FileCheck %s --check-prefix=ONE

// 1 MiB buckets of fp32: the tiny drafter's 1.3 M parameters need several,
// each right after its last gradient, filled in the order the backward pass
// finishes them (the final norm's gradient first); the optimizer reads them.
// CHECK-LABEL: func.func @step
// CHECK: %[[DN:[a-z_0-9]+]], %[[DNORM:[a-z_0-9]+]] = dflash.rms_norm_grad
// CHECK: %[[B0:.+]]:{{[0-9]+}} = dflash.gradient_bucket %[[DNORM]], {{.*}} -> (tensor<256xf32>,
// CHECK: dflash.gradient_bucket
// CHECK: dflash.adamw_multi {{.*}} grads(
// CHECK-SAME: %[[B0]]#0

// The default bucket (the spec's 64 MiB) holds all of them: one collective.
// ONE-COUNT-1: dflash.gradient_bucket
// ONE-NOT: dflash.gradient_bucket
