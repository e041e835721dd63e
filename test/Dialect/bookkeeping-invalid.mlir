// RUN: dflash-opt %s --split-input-file --verify-diagnostics

func.func @draft_positions_block(%a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C1) block_size is 0 but must be at least 1}}
  %p = dflash.draft_positions %a, %pos {block_size = 0 : i64} : (tensor<2x3xi32>, tensor<2x32xi32>) -> tensor<2x0xi32>
  return
}

// -----

func.func @draft_positions_rank(%a: tensor<6xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C2) anchors must have rank 2 but has rank 1}}
  %p = dflash.draft_positions %a, %pos {block_size = 4 : i64} : (tensor<6xi32>, tensor<2x32xi32>) -> tensor<2x12xi32>
  return
}

// -----

func.func @draft_positions_rows(%a: tensor<2x3xi32>, %pos: tensor<3x32xi32>) {
  // expected-error @+1 {{(C3) position_ids must have shape [2x32] but has [3x32]}}
  %p = dflash.draft_positions %a, %pos {block_size = 4 : i64} : (tensor<2x3xi32>, tensor<3x32xi32>) -> tensor<2x12xi32>
  return
}

// -----

func.func @draft_positions_shape(%a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C4) result must have shape [2x12] but has [2x8]}}
  %p = dflash.draft_positions %a, %pos {block_size = 4 : i64} : (tensor<2x3xi32>, tensor<2x32xi32>) -> tensor<2x8xi32>
  return
}

// -----

func.func @draft_tokens_mask(%ids: tensor<2x32xi32>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>) {
  // expected-error @+1 {{(C1) mask_token_id is -1 but must be at least 0}}
  %t = dflash.draft_tokens %ids, %a, %k {block_size = 4 : i64, mask_token_id = -1 : i64}
      : (tensor<2x32xi32>, tensor<2x3xi32>, tensor<2x3xi8>) -> tensor<2x12xi32>
  return
}

// -----

func.func @draft_tokens_rank(%ids: tensor<64xi32>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>) {
  // expected-error @+1 {{(C2) input_ids must have rank 2 but has rank 1}}
  %t = dflash.draft_tokens %ids, %a, %k {block_size = 4 : i64, mask_token_id = 7 : i64}
      : (tensor<64xi32>, tensor<2x3xi32>, tensor<2x3xi8>) -> tensor<2x12xi32>
  return
}

// -----

func.func @draft_tokens_keep(%ids: tensor<2x32xi32>, %a: tensor<2x3xi32>, %k: tensor<2x4xi8>) {
  // expected-error @+1 {{(C3) keep must have shape [2x3] but has [2x4]}}
  %t = dflash.draft_tokens %ids, %a, %k {block_size = 4 : i64, mask_token_id = 7 : i64}
      : (tensor<2x32xi32>, tensor<2x3xi32>, tensor<2x4xi8>) -> tensor<2x12xi32>
  return
}

// -----

func.func @draft_tokens_result(%ids: tensor<2x32xi32>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>) {
  // expected-error @+1 {{(C4) result must have shape [2x12] but has [2x16]}}
  %t = dflash.draft_tokens %ids, %a, %k {block_size = 4 : i64, mask_token_id = 7 : i64}
      : (tensor<2x32xi32>, tensor<2x3xi32>, tensor<2x3xi8>) -> tensor<2x16xi32>
  return
}

// -----

func.func @draft_targets_gamma(%ids: tensor<2x32xi32>, %m: tensor<2x32xi8>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C1) gamma is -1 but must be zero or positive}}
  %l, %w = dflash.draft_targets %ids, %m, %a, %k, %pos {block_size = 4 : i64, gamma = -1.0 : f64}
      : (tensor<2x32xi32>, tensor<2x32xi8>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12xi32>, tensor<2x12xf32>)
  return
}

// -----

func.func @draft_targets_rank(%ids: tensor<2x32xi32>, %m: tensor<2x32xi8>, %a: tensor<6xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C2) anchors must have rank 2 but has rank 1}}
  %l, %w = dflash.draft_targets %ids, %m, %a, %k, %pos {block_size = 4 : i64, gamma = 7.0 : f64}
      : (tensor<2x32xi32>, tensor<2x32xi8>, tensor<6xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12xi32>, tensor<2x12xf32>)
  return
}

// -----

func.func @draft_targets_mask(%ids: tensor<2x32xi32>, %m: tensor<2x31xi8>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C3) loss_mask must have shape [2x32] but has [2x31]}}
  %l, %w = dflash.draft_targets %ids, %m, %a, %k, %pos {block_size = 4 : i64, gamma = 7.0 : f64}
      : (tensor<2x32xi32>, tensor<2x31xi8>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12xi32>, tensor<2x12xf32>)
  return
}

// -----

func.func @draft_targets_result(%ids: tensor<2x32xi32>, %m: tensor<2x32xi8>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C4) weights must have shape [2x12] but has [2x11]}}
  %l, %w = dflash.draft_targets %ids, %m, %a, %k, %pos {block_size = 4 : i64, gamma = 7.0 : f64}
      : (tensor<2x32xi32>, tensor<2x32xi8>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12xi32>, tensor<2x11xf32>)
  return
}

// -----

func.func @draft_targets_positions(%ids: tensor<2x32xi32>, %m: tensor<2x32xi8>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x31xi32>) {
  // expected-error @+1 {{(C3) position_ids must have shape [2x32] but has [2x31]}}
  %l, %w = dflash.draft_targets %ids, %m, %a, %k, %pos {block_size = 4 : i64, gamma = 7.0 : f64}
      : (tensor<2x32xi32>, tensor<2x32xi8>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x31xi32>) -> (tensor<2x12xi32>, tensor<2x12xf32>)
  return
}

// -----

func.func @draft_acceptance_block(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C1) block_size is 0 but must be at least 1}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 0 : i64, bucket_edges = array<i64>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<0xf32>, tensor<0xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
  return
}

// -----

func.func @draft_acceptance_big(%h: tensor<1x65xi8>, %w: tensor<1x65xf32>, %k: tensor<1x1xi8>, %a: tensor<1x1xi32>, %pos: tensor<1x70xi32>) {
  // expected-error @+1 {{(C1) block_size is 65 but must be at most 64}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 65 : i64, bucket_edges = array<i64>}
      : (tensor<1x65xi8>, tensor<1x65xf32>, tensor<1x1xi8>, tensor<1x1xi32>, tensor<1x70xi32>) -> (tensor<f32>, tensor<f32>, tensor<65xf32>, tensor<65xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
  return
}

// -----

func.func @draft_acceptance_hits(%h: tensor<2x11xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C2) hits must have shape [2x12] but has [2x11]}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64>}
      : (tensor<2x11xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
  return
}

// -----

func.func @draft_acceptance_positions(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C3) position_counts must have shape [4] but has [3]}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<3xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
  return
}

// -----

func.func @draft_acceptance_anchors(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x4xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C4) anchors must have shape [2x3] but has [2x4]}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x4xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
  return
}

// -----

func.func @draft_acceptance_position_rows(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<3x32xi32>) {
  // expected-error @+1 {{(C4) position_ids has 3 rows but keep has 2}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<3x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
  return
}

// -----

func.func @draft_acceptance_too_many_buckets(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C5) bucket_edges has 8 edges but at most 7 are supported}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64: 1, 2, 3, 4, 5, 6, 7, 8>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<9xf32>, tensor<9xf32>, tensor<9xf32>, tensor<9xf32>)
  return
}

// -----

func.func @draft_acceptance_edges_order(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C5) bucket_edges must be strictly increasing in [1, 32) but entry 1 is 8}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64: 8, 8>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
  return
}

// -----

func.func @draft_acceptance_edge_past_row(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C5) bucket_edges must be strictly increasing in [1, 32) but entry 1 is 32}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64: 8, 32>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
  return
}

// -----

func.func @draft_acceptance_edge_zero(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C5) bucket_edges must be strictly increasing in [1, 32) but entry 0 is 0}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64: 0>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>)
  return
}

// -----

func.func @draft_acceptance_bucket_sums(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C6) bucket_counts must have shape [3] but has [2]}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64: 8, 16>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<2xf32>)
  return
}

// -----

func.func @draft_acceptance_one_bucket(%h: tensor<2x12xi8>, %w: tensor<2x12xf32>, %k: tensor<2x3xi8>, %a: tensor<2x3xi32>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C6) bucket_runs must have shape [1] but has [3]}}
  %r, %n, %p, %c, %br, %bn, %bh, %bc = dflash.draft_acceptance %h, %w, %k, %a, %pos {block_size = 4 : i64, bucket_edges = array<i64>}
      : (tensor<2x12xi8>, tensor<2x12xf32>, tensor<2x3xi8>, tensor<2x3xi32>, tensor<2x32xi32>) -> (tensor<f32>, tensor<f32>, tensor<4xf32>, tensor<4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
  return
}
