// The DFlash2 selector's ops (docs/semantics.md section 13) in a small
// forward graph on mini's shapes (test/Transforms/Inputs/mini.toml: B 1, S 16,
// 3 blocks of 4, H 32, V 64) with a selector of rank 8 and top 4, written by
// hand: no spec compiles to CUDA while the convolutions have no kernel. y is
// a trained linear of the draft embedding, so that the backward reaches
// selector_candidates_grad. dflash-train-step and dflash-lower-to-kernels
// make it a whole step. The objective reads a loss_seed's weight sum (the
// spec's step reads lm_head_ce's, which the step's all_reduce overwrites in
// place before selector_objective_grad reads it).
module @mini attributes {dflash.bucket_mib = 64 : i64, dflash.model_config = {adam_eps = 1.000000e-08 : f64, anchors_per_row = 3 : i64, beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, block_size = 4 : i64, conv_group_size = 16 : i64, conv_kernel_size = 2 : i64, dflash2 = true, final_logit_softcapping = 0.000000e+00 : f64, gamma = 0.000000e+00 : f64, gradient_accumulation = 1 : i64, head_dim = 16 : i64, hidden_size = 32 : i64, init_std = 2.000000e-02 : f64, input_embedding_scale = 1.000000e+00 : f64, intermediate_size = 64 : i64, layer_windows = array<i64: 0>, lr = 6.000000e-04 : f64, mask_token_id = 63 : i64, max_grad_norm = 1.000000e+00 : f64, max_position_embeddings = 40960 : i64, name = "mini", num_heads = 2 : i64, num_kv_heads = 1 : i64, num_layers = 1 : i64, output_multiplier = 1.000000e+00 : f64, position_buckets = array<i64>, rms_norm_eps = 9.9999999999999995E-7 : f64, rope_scaling_attention_factor = 1.000000e+00 : f64, rope_scaling_beta_fast = 3.200000e+01 : f64, rope_scaling_beta_slow = 1.000000e+00 : f64, rope_scaling_factor = 0.000000e+00 : f64, rope_scaling_original_max_position_embeddings = 0 : i64, rope_scaling_truncate = true, rope_theta = 1.000000e+06 : f64, rows_per_gpu = 1 : i64, seed = 0 : i64, selector_alpha = 1.000000e+00 : f64, selector_denominator_covered = false, selector_gold_inject = false, selector_ramp_ratio = 0.000000e+00 : f64, selector_rank = 8 : i64, selector_stop_gradient = false, selector_top_k = 4 : i64, selector_warmup_ratio = 0.000000e+00 : f64, seq_len = 16 : i64, target_hidden_size = 32 : i64, target_layer_ids = array<i64: 1>, target_model = "test/mini-target", target_num_layers = 4 : i64, tie_word_embeddings = false, total_steps = 10000 : i64, vocab_size = 64 : i64, warmup_ratio = 4.000000e-02 : f64, weight_decay = 0.000000e+00 : f64}, dflash.optimizer = #dflash.optimizer<lr = 6.000000e-04 : f64, warmup_ratio = 4.000000e-02 : f64, max_grad_norm = 1.000000e+00 : f64, beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, eps = 1.000000e-08 : f64, weight_decay = 0.000000e+00 : f64>} {
func.func @step(%ids: tensor<1x16xi32> {dflash.arg = #dflash.arg<input, "input_ids">},
                %mask: tensor<1x16xi8> {dflash.arg = #dflash.arg<input, "loss_mask">},
                %anchors: tensor<1x3xi32> {dflash.arg = #dflash.arg<input, "anchors">},
                %keep: tensor<1x3xi8> {dflash.arg = #dflash.arg<input, "keep">},
                %positions: tensor<1x16xi32> {dflash.arg = #dflash.arg<input, "position_ids">},
                %embed: tensor<64x32xbf16> {dflash.arg = #dflash.arg<frozen, "embed">},
                %head: tensor<64x32xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %fc: tensor<32x32xbf16> {dflash.arg = #dflash.arg<parameter, "fc.weight">},
                %wh: tensor<8x32xbf16> {dflash.arg = #dflash.arg<parameter, "candidate_selector.hidden_projection.weight">},
                %pcb: tensor<64x8xbf16> {dflash.arg = #dflash.arg<parameter, "candidate_selector.predecessor_codebook">},
                %scb: tensor<64x8xbf16> {dflash.arg = #dflash.arg<parameter, "candidate_selector.successor_codebook">},
                %step: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">},
                %total: tensor<i32> {dflash.arg = #dflash.arg<counter, "total_steps">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "weight_sum">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "correct">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "count">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "run_sum">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "kept_blocks">},
        tensor<4xf32> {dflash.arg = #dflash.arg<metric, "position_hits">},
        tensor<4xf32> {dflash.arg = #dflash.arg<metric, "position_counts">},
        tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_runs">},
        tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_blocks">},
        tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_hits">},
        tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_counts">}) {
  %labels, %weights = dflash.draft_targets %ids, %mask, %anchors, %keep, %positions {block_size = 4 : i64, gamma = 0.000000e+00 : f64}
      : (tensor<1x16xi32>, tensor<1x16xi8>, tensor<1x3xi32>, tensor<1x3xi8>, tensor<1x16xi32>) -> (tensor<1x12xi32>, tensor<1x12xf32>)
  %tokens = dflash.draft_tokens %ids, %anchors, %keep {block_size = 4 : i64, mask_token_id = 63 : i64}
      : (tensor<1x16xi32>, tensor<1x3xi32>, tensor<1x3xi8>) -> tensor<1x12xi32>
  %e = dflash.embed %embed, %tokens : (tensor<64x32xbf16>, tensor<1x12xi32>) -> tensor<1x12x32xbf16>
  %x = dflash.linear %e, %fc : (tensor<1x12x32xbf16>, tensor<32x32xbf16>) -> tensor<1x12x32xbf16>

  %alpha = dflash.selector_alpha %step, %total {alpha = 0.5 : f64, warmup_ratio = 0.25 : f64, ramp_ratio = 0.5 : f64}
      : (tensor<i32>, tensor<i32>) -> tensor<f32>
  %preds = dflash.draft_predecessors %ids, %anchors, %keep {block_size = 4 : i64}
      : (tensor<1x16xi32>, tensor<1x3xi32>, tensor<1x3xi8>) -> tensor<1x12xi32>
  %ls, %ws, %c, %n, %ce_hits = dflash.lm_head_ce %x, %head, %labels, %weights
      : (tensor<1x12x32xbf16>, tensor<64x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x12xi8>)
  %v, %cand, %lv = dflash.selector_candidates %x, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = 1.5 : f64, softcap = 30.0 : f64}
      : (tensor<1x12x32xbf16>, tensor<64x32xbf16>, tensor<1x12xi32>, tensor<1x12xf32>)
      -> (tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>)
  %sel, %covered, %hits = dflash.selector_loss %v, %cand, %lv, %x, %wh, %preds, %labels, %weights, %pcb, %scb
      {gold = "inject"}
      : (tensor<1x12x4xf32>, tensor<1x12x4xi32>, tensor<1x12xf32>, tensor<1x12x32xbf16>,
         tensor<8x32xbf16>, tensor<1x12xi32>, tensor<1x12xi32>, tensor<1x12xf32>,
         tensor<64x8xbf16>, tensor<64x8xbf16>)
      -> (tensor<f32>, tensor<f32>, tensor<1x12xi8>)
  %run_sum, %kept_blocks, %position_hits, %position_counts, %bucket_runs, %bucket_blocks, %bucket_hits, %bucket_counts = dflash.draft_acceptance %hits, %weights, %keep, %anchors, %positions {block_size = 4 : i64, bucket_edges = array<i64>} : (tensor<1x12xi8>, tensor<1x12xf32>, tensor<1x3xi8>, tensor<1x3xi32>, tensor<1x16xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
  %wsum, %unused = dflash.loss_seed %weights : (tensor<1x12xf32>) -> (tensor<f32>, tensor<f32>)
  %loss = dflash.selector_objective %ls, %sel, %alpha, %wsum, %covered {covered}
      : (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>) -> tensor<f32>
  return %loss, %ws, %c, %n, %run_sum, %kept_blocks, %position_hits, %position_counts, %bucket_runs, %bucket_blocks, %bucket_hits, %bucket_counts : tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>
}
}
