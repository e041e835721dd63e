// RUN: dflash-opt %s --split-input-file --verify-diagnostics

func.func @block_size(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xbf16>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C1) block_size is 0 but must be at least 1}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 0 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return
}

// -----

func.func @window(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xbf16>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C2) window is 0 but must be positive}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 4 : i64, window = 0 : i64, causal}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return
}

// -----

func.func @query_rank(%q: tensor<2x12x64xbf16>, %kc: tensor<2x32x2x16xbf16>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C3) query must have rank 4 but has rank 3}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 4 : i64}
      : (tensor<2x12x64xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12x64xbf16>, tensor<2x12x4xf32>)
  return
}

// -----

func.func @context_head_dim(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x8xbf16>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C4) context_keys must have shape [2x32x2x16] but has [2x32x2x8]}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x8xbf16>, tensor<2x32x2x8xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return
}

// -----

func.func @gqa(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x3x16xbf16>, %kd: tensor<2x12x3x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C5) num_heads (4) must be a multiple of num_kv_heads (3)}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x3x16xbf16>, tensor<2x32x3x16xbf16>, tensor<2x12x3x16xbf16>, tensor<2x12x3x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return
}

// -----

func.func @draft_keys(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xbf16>, %kd: tensor<2x8x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C6) draft_keys must have shape [2x12x2x16] but has [2x8x2x16]}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return
}

// -----

func.func @blocks(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xbf16>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C7) query length (12) must equal anchors per row (3) times block_size (5)}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 5 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return
}

// -----

func.func @element_types(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xf32>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C8) query and context_keys must have the same element type}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xf32>, tensor<2x32x2x16xf32>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return
}

// -----

func.func @lse(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xbf16>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x32xi32>) {
  // expected-error @+1 {{(C9) lse must have shape [2x12x4] but has [2x4x12]}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x4x12xf32>)
  return
}

// -----

func.func @positions(%q: tensor<2x12x4x16xbf16>, %kc: tensor<2x32x2x16xbf16>, %kd: tensor<2x12x2x16xbf16>, %a: tensor<2x3xi32>, %k: tensor<2x3xi8>, %pos: tensor<2x12xi32>) {
  // expected-error @+1 {{(C7) position_ids must have shape [2x32] but has [2x12]}}
  %o, %l = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %k, %pos {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x12xi32>) -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return
}
