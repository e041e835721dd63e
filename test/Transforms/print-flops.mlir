// RUN: dflash-opt %S/Inputs/mini-train.mlir --dflash-print-flops -o /dev/null | FileCheck %s
// RUN: dflashc %specs/qwen3-8b-b16.toml --emit=train | dflash-opt --dflash-print-flops -o /dev/null | FileCheck %s --check-prefix=QWEN

// Inputs/mini.toml: 1 row x 12 draft slots (3 blocks of 4); lm_head 64 x 32:
// forward lm_head_ce = 2 * 12 * 64 * 32, its gradient twice that.
// CHECK: flops forward dflash.linear
// CHECK: flops forward dflash.lm_head_ce 49152
// CHECK: flops backward dflash.lm_head_ce_grad 98304
// CHECK: flops optimizer dflash.adamw
// CHECK: flops total forward={{[0-9]+}} backward={{[0-9]+}} optimizer={{[0-9]+}} step={{[0-9]+}}

// qwen3-8b: lm_head 32768 rows x 151936 x 4096 = 40.78 TFLOP forward.
// QWEN: flops forward dflash.lm_head_ce 40785009442816
// QWEN: flops backward dflash.lm_head_ce_grad 81570018885632
