// RUN: dflash-opt %S/Inputs/mini-train.mlir --dflash-print-flops -o /dev/null | FileCheck %s
// RUN: dflashc %specs/qwen3-8b-b16.toml --emit=train | dflash-opt --dflash-print-flops -o /dev/null | FileCheck %s --check-prefix=QWEN
// RUN: dflash-opt %S/Inputs/dflash2-step.mlir --dflash-generate-backward --dflash-print-flops -o /dev/null | FileCheck %s --check-prefix=DFLASH2

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

// Inputs/dflash2-step.mlir (in any order). The
// convolutions: slot k of a block of 4 reads min(2, k + 1) taps, 7 a block;
// 2 blocks x 7 x 32 channels = 448 (slot, tap, channel) triples, 3 FLOPs
// each forward (base + delta, a multiply-add) and 6 backward, for each of
// the two convolutions. The selector over its 8 rows, V 16, H 32, top 4,
// rank 8: the logits' GEMM 2 x 8 x 16 x 32, the selector
// 8 x (2 x 8 x 32 + 8 + 2 x 4 x 8); backward the logits' 4 x 8 x (4 + 1)
// x 32 and the selector's 8 x (2 x 8 x 32 + 3 x 8 + 5 x 4 x 8).
// DFLASH2-DAG: flops forward dflash.grouped_conv 2688
// DFLASH2-DAG: flops forward dflash.selector_candidates 8192
// DFLASH2-DAG: flops forward dflash.selector_loss 4672
// DFLASH2-DAG: flops backward dflash.grouped_conv_grad 5376
// DFLASH2-DAG: flops backward dflash.selector_candidates_grad 5120
// DFLASH2-DAG: flops backward dflash.selector_loss_grad 5568
