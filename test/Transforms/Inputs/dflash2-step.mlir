// A DFlash2 sublayer's two convolutions and the selector (docs/semantics.md
// section 13): B 1, Q 8 (two blocks of 4), H 32, kernel_size 2, group_size
// 16 (G 2); one projection D [1, 8, 2*2*2] and one base [2, 2, 32] feed both
// halves; V 16, top 4, rank 8; the loss is CE_u plus the selector's sum.
func.func @step(%x: tensor<1x8x32xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %wc: tensor<8x32xbf16> {dflash.arg = #dflash.arg<parameter, "layers.0.attention_conv.kernel_projection.weight">},
                %base: tensor<2x2x32xbf16> {dflash.arg = #dflash.arg<parameter, "layers.0.attention_conv.base_kernel">},
                %wh: tensor<8x32xbf16> {dflash.arg = #dflash.arg<parameter, "candidate_selector.hidden_projection.weight">},
                %pcb: tensor<16x8xbf16> {dflash.arg = #dflash.arg<parameter, "candidate_selector.predecessor_codebook">},
                %scb: tensor<16x8xbf16> {dflash.arg = #dflash.arg<parameter, "candidate_selector.successor_codebook">},
                %head: tensor<16x32xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %preds: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "predecessors">},
                %weights: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  %d = dflash.linear %x, %wc : (tensor<1x8x32xbf16>, tensor<8x32xbf16>) -> tensor<1x8x8xbf16>
  %h = dflash.grouped_conv %x, %d, %base
      {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<1x8x32xbf16>, tensor<1x8x8xbf16>, tensor<2x2x32xbf16>) -> tensor<1x8x32xbf16>
  %o = dflash.grouped_conv %h, %d, %base
      {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 1 : i64}
      : (tensor<1x8x32xbf16>, tensor<1x8x8xbf16>, tensor<2x2x32xbf16>) -> tensor<1x8x32xbf16>
  %ls, %ws, %c, %n, %hits = dflash.lm_head_ce %o, %head, %labels, %weights
      : (tensor<1x8x32xbf16>, tensor<16x32xbf16>, tensor<1x8xi32>, tensor<1x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  %v, %cand, %lv = dflash.selector_candidates %o, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<1x8x32xbf16>, tensor<16x32xbf16>, tensor<1x8xi32>, tensor<1x8xf32>)
      -> (tensor<1x8x4xf32>, tensor<1x8x4xi32>, tensor<1x8xf32>)
  %sel, %covered, %sel_hits = dflash.selector_loss %v, %cand, %lv, %o, %wh, %preds, %labels, %weights, %pcb, %scb
      {gold = "topk"}
      : (tensor<1x8x4xf32>, tensor<1x8x4xi32>, tensor<1x8xf32>, tensor<1x8x32xbf16>,
         tensor<8x32xbf16>, tensor<1x8xi32>, tensor<1x8xi32>, tensor<1x8xf32>,
         tensor<16x8xbf16>, tensor<16x8xbf16>)
      -> (tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  %loss = dflash.add %ls, %sel : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %loss : tensor<f32>
}
