// RUN: dflash-opt %S/Inputs/mini-fused.mlir --dflash-recompute-activations=enabled=true | FileCheck %s
// RUN: dflash-opt %S/Inputs/mini-fused.mlir --dflash-recompute-activations | FileCheck %s --check-prefix=OFF-MINI
// RUN: dflashc %specs/tiny.toml --emit=fused | dflash-opt --dflash-recompute-activations | FileCheck %s --check-prefix=OFF
// RUN: dflashc %specs/tiny.toml --emit=fused | dflash-opt --dflash-recompute-activations=enabled=true --dflash-select-kernels --dflash-plan-memory --dflash-print-memory-plan -o /dev/null 2>&1 | FileCheck %s --check-prefix=PLAN-ON
// RUN: dflashc %specs/tiny.toml --emit=fused | dflash-opt --dflash-select-kernels --dflash-plan-memory --dflash-print-memory-plan -o /dev/null 2>&1 | FileCheck %s --check-prefix=PLAN-OFF
// RUN: dflash-opt %S/Inputs/mini-fused.mlir '--dflash-recompute-activations=enabled=true mlp-products=true' | FileCheck %s --check-prefix=MLP
// RUN: dflashc %specs/tiny.toml --emit=fused | dflash-opt '--dflash-recompute-activations=enabled=true mlp-products=true' --dflash-select-kernels --dflash-plan-memory --dflash-print-memory-plan -o /dev/null 2>&1 | FileCheck %s --check-prefix=PLAN-MLP

// The last layer (of Inputs/mini.toml's one): its SwiGLU is computed again after the fused lm_head,
// right before the down projection's weight gradient reads it; its
// post-attention norm before the gate/up weight gradients; its q/k norm +
// RoPE before the attention's backward.
// CHECK-LABEL: func.func @step
// CHECK: %[[ACT:[0-9]+]] = dflash.swiglu %[[G:[0-9]+]], %[[U:[0-9]+]] :
// CHECK: dflash.linear_residual %{{.*}}, %[[ACT]],
// CHECK: dflash.lm_head_ce_fused
// CHECK: %[[AGAIN:[0-9]+]] = dflash.swiglu %[[G]], %[[U]] :
// CHECK-NEXT: dflash.linear_grad_weight %{{.*}}, %[[AGAIN]] :
// CHECK: dflash.qk_norm_rope
// CHECK: dflash.block_attention_grad
// CHECK: dflash.adamw_multi

// Without the module attribute (spec [memory] recompute_activations) or the
// option, nothing is recomputed: one swiglu a layer.
// OFF-COUNT-2: dflash.swiglu %
// OFF-NOT: dflash.swiglu %
// OFF-MINI-COUNT-1: dflash.swiglu %
// OFF-MINI-NOT: dflash.swiglu %

// The arena shrinks by 16% (qwen3-8b-b16's by 33%: 24.69 -> 16.45 GB; with
// the MLP products by 55%, to 11.06 GB).
// PLAN-ON: arena 3892992 bytes
// PLAN-OFF: arena 4612352 bytes

// With the MLP products too: the last layer's post-attention norm, gate and
// up products and SwiGLU are computed again, in that order (each copy reads
// the copies before it), and the SwiGLU gradient reads the copied products.
// MLP-LABEL: func.func @step
// MLP: dflash.lm_head_ce_fused
// MLP: %[[N:[0-9]+]] = dflash.rms_norm %{{[0-9]+}}, %[[NW:arg[0-9]+]]
// MLP-NEXT: %[[G:[0-9]+]] = dflash.linear %[[N]], %[[GW:arg[0-9]+]]
// MLP-NEXT: %[[U:[0-9]+]] = dflash.linear %[[N]], %[[UW:arg[0-9]+]]
// MLP-NEXT: %[[A:[0-9]+]] = dflash.swiglu %[[G]], %[[U]]
// MLP-NEXT: dflash.linear_grad_weight %{{[a-z_0-9]+}}, %[[A]]
// MLP: dflash.swiglu_grad %{{[a-z_0-9]+}}, %[[G]], %[[U]]
// MLP: dflash.adamw_multi
// PLAN-MLP: arena 3876608 bytes

