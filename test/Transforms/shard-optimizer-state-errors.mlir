// RUN: dflashc %specs/tiny.toml --emit=fused | not dflash-opt --dflash-shard-optimizer-state="world-size=2" 2>&1 | FileCheck %s

// Shards are cut from the gradient buckets: without them there is nothing
// to cut.
// CHECK: error: 'dflash.adamw_multi' op gradient 0 is not in a dflash.gradient_bucket: run dflash-bucket-gradients before dflash-shard-optimizer-state
