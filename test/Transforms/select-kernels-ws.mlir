// RUN: dflash-opt %s --dflash-select-kernels --dflash-print-kernels -o /dev/null 2>&1 | FileCheck %s

// The warp-specialised attention forward (kernels/AttentionLimits.h,
// warpSpecialisedForwardPays) on rows of 16384 tokens: picked for a full
// layer and a causal sliding layer of 8192 at the shape its GPU test passed
// (d 128, blocks of 16, 4 query heads per kv head); not for a window shorter
// than 8192 keys, DFlash2's bidirectional windows, or an untested shape
// (blocks of 8 with 8 query heads per kv head at d 128).
// CHECK: block_attention_fwd_ws_bf16[128, 16, 32, 8, 0, 0]
// CHECK-NEXT: block_attention_fwd_ws_bf16[128, 16, 32, 8, 8192, 1]
// CHECK-NEXT: block_attention_fwd_bf16[128, 16, 32, 8, 4096, 1]
// CHECK-NEXT: block_attention_fwd_bf16[128, 16, 32, 8, 8192, 0]
// CHECK-NEXT: block_attention_fwd_bf16[128, 8, 64, 8, 0, 0]
func.func @step(%q: tensor<1x16x32x128xbf16> {dflash.arg = #dflash.arg<input, "q">},
                %kc: tensor<1x16384x8x128xbf16> {dflash.arg = #dflash.arg<input, "kc">},
                %kd: tensor<1x16x8x128xbf16> {dflash.arg = #dflash.arg<input, "kd">},
                %q8: tensor<1x8x64x128xbf16> {dflash.arg = #dflash.arg<input, "q8">},
                %kd8: tensor<1x8x8x128xbf16> {dflash.arg = #dflash.arg<input, "kd8">},
                %a: tensor<1x1xi32> {dflash.arg = #dflash.arg<input, "anchors">},
                %keep: tensor<1x1xi8> {dflash.arg = #dflash.arg<input, "keep">},
                %pos: tensor<1x16384xi32> {dflash.arg = #dflash.arg<input, "position_ids">})
    -> (tensor<1x16x32x128xbf16> {dflash.arg = #dflash.arg<metric, "o1">},
        tensor<1x16x32x128xbf16> {dflash.arg = #dflash.arg<metric, "o2">},
        tensor<1x16x32x128xbf16> {dflash.arg = #dflash.arg<metric, "o3">},
        tensor<1x16x32x128xbf16> {dflash.arg = #dflash.arg<metric, "o4">},
        tensor<1x8x64x128xbf16> {dflash.arg = #dflash.arg<metric, "o5">}) {
  %o1, %l1 = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %keep, %pos {block_size = 16 : i64}
      : (tensor<1x16x32x128xbf16>, tensor<1x16384x8x128xbf16>, tensor<1x16384x8x128xbf16>,
         tensor<1x16x8x128xbf16>, tensor<1x16x8x128xbf16>, tensor<1x1xi32>, tensor<1x1xi8>, tensor<1x16384xi32>)
      -> (tensor<1x16x32x128xbf16>, tensor<1x16x32xf32>)
  %o2, %l2 = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %keep, %pos {block_size = 16 : i64, window = 8192 : i64, causal}
      : (tensor<1x16x32x128xbf16>, tensor<1x16384x8x128xbf16>, tensor<1x16384x8x128xbf16>,
         tensor<1x16x8x128xbf16>, tensor<1x16x8x128xbf16>, tensor<1x1xi32>, tensor<1x1xi8>, tensor<1x16384xi32>)
      -> (tensor<1x16x32x128xbf16>, tensor<1x16x32xf32>)
  %o3, %l3 = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %keep, %pos {block_size = 16 : i64, window = 4096 : i64, causal}
      : (tensor<1x16x32x128xbf16>, tensor<1x16384x8x128xbf16>, tensor<1x16384x8x128xbf16>,
         tensor<1x16x8x128xbf16>, tensor<1x16x8x128xbf16>, tensor<1x1xi32>, tensor<1x1xi8>, tensor<1x16384xi32>)
      -> (tensor<1x16x32x128xbf16>, tensor<1x16x32xf32>)
  %o4, %l4 = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %keep, %pos {block_size = 16 : i64, window = 8192 : i64}
      : (tensor<1x16x32x128xbf16>, tensor<1x16384x8x128xbf16>, tensor<1x16384x8x128xbf16>,
         tensor<1x16x8x128xbf16>, tensor<1x16x8x128xbf16>, tensor<1x1xi32>, tensor<1x1xi8>, tensor<1x16384xi32>)
      -> (tensor<1x16x32x128xbf16>, tensor<1x16x32xf32>)
  %o5, %l5 = dflash.block_attention %q8, %kc, %kc, %kd8, %kd8, %a, %keep, %pos {block_size = 8 : i64}
      : (tensor<1x8x64x128xbf16>, tensor<1x16384x8x128xbf16>, tensor<1x16384x8x128xbf16>,
         tensor<1x8x8x128xbf16>, tensor<1x8x8x128xbf16>, tensor<1x1xi32>, tensor<1x1xi8>, tensor<1x16384xi32>)
      -> (tensor<1x8x64x128xbf16>, tensor<1x8x64xf32>)
  return %o1, %o2, %o3, %o4, %o5 : tensor<1x16x32x128xbf16>, tensor<1x16x32x128xbf16>, tensor<1x16x32x128xbf16>, tensor<1x16x32x128xbf16>, tensor<1x8x64x128xbf16>
}
