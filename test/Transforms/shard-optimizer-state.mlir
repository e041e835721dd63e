// RUN: dflashc %specs/tiny.toml --emit=fused | dflash-opt --dflash-bucket-gradients="bucket-mib=1" --dflash-shard-optimizer-state="world-size=4" | FileCheck %s
// RUN: dflash-opt %S/Inputs/mini-fused.mlir --dflash-bucket-gradients --dflash-shard-optimizer-state | FileCheck %s --check-prefix=OFF

// Over 4 GPUs, each bucket's flat fp32 range is cut into 4 shards of 64-
// element multiples. The bucket that the optimizer names first (the final
// norm, fc and its norm: 64 + 256x256 + 256 + 256 + 256x512 gradients, each
// 256-byte aligned) spans 197184 elements: shards of ceil(197184 / 4) =
// 49296, rounded up to 49344. Its state is bucket.0; the per-tensor masters
// and moments are gone from the signature.
// CHECK-LABEL: func.func @step
// CHECK-SAME: tensor<49344xf32> {dflash.arg = #dflash.arg<master, "bucket.0">}
// CHECK-SAME: {dflash.arg = #dflash.arg<moment1, "bucket.0">}
// CHECK-SAME: {dflash.arg = #dflash.arg<moment2, "bucket.4">}
// CHECK-SAME: -> (
// CHECK-SAME: tensor<49344xf32> {dflash.arg = #dflash.arg<master, "bucket.0">}
// CHECK-NOT: #dflash.arg<master, "fc.weight">
// CHECK: dflash.gradient_bucket
// CHECK-SAME: {shard_elements = {{[0-9]+}} : i64, world_size = 4 : i64}
// CHECK: %[[LAST:.+]]:5 = dflash.gradient_bucket %weight_grad_{{[0-9]+}}, {{.*}} {shard_elements = 49344
// CHECK-SAME: : i64, world_size = 4 : i64}
// CHECK: dflash.adamw_sharded params({{.*}}) grads(%[[LAST]]#4,
// CHECK-SAME: world_size = 4 : i64
// CHECK-NOT: dflash.adamw_multi

// Without a world size (option or module attribute) nothing changes.
// OFF: dflash.adamw_multi
// OFF-NOT: shard_elements
