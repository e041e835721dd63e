// RUN: dflashc %specs/tiny.toml --emit=train | dflash-opt --dflash-print-flops -o /dev/null | FileCheck %s
// RUN: dflashc %specs/qwen3-8b-b16.toml --emit=train | dflash-opt --dflash-print-flops -o /dev/null | FileCheck %s --check-prefix=QWEN

// tiny: 2 rows x 96 draft slots; lm_head 1024 x 256:
// forward lm_head_ce = 2 * 192 * 1024 * 256, its gradient twice that.
// CHECK: flops forward dflash.linear
// CHECK: flops forward dflash.lm_head_ce 100663296
// CHECK: flops backward dflash.lm_head_ce_grad 201326592
// CHECK: flops optimizer dflash.adamw
// CHECK: flops total forward={{[0-9]+}} backward={{[0-9]+}} optimizer={{[0-9]+}} step={{[0-9]+}}

// qwen3-8b: lm_head 32768 rows x 151936 x 4096 = 40.78 TFLOP forward.
// QWEN: flops forward dflash.lm_head_ce 40785009442816
// QWEN: flops backward dflash.lm_head_ce_grad 81570018885632
