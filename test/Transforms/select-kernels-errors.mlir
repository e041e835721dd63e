// RUN: dflash-opt %s --dflash-select-kernels --split-input-file --verify-diagnostics

// The RMSNorm kernels read rows as 16-byte vectors.
func.func @step(%x: tensor<4x100xbf16> {dflash.arg = #dflash.arg<input, "input_ids">},
                %w: tensor<100xbf16> {dflash.arg = #dflash.arg<parameter, "w">})
    -> (tensor<4x100xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{has no RMSNorm kernel for rows of 100: 'drafter.hidden_size' must be a multiple of 8}}
  %y = dflash.rms_norm %x, %w {eps = 1.0e-6 : f64} : (tensor<4x100xbf16>, tensor<100xbf16>) -> tensor<4x100xbf16>
  return %y : tensor<4x100xbf16>
}

// -----

// q/k norm + RoPE: 16 head dims per lane group.
func.func @step(%x: tensor<1x4x2x40xbf16> {dflash.arg = #dflash.arg<input, "input_ids">},
                %w: tensor<40xbf16> {dflash.arg = #dflash.arg<parameter, "w">},
                %p: tensor<1x4xi32> {dflash.arg = #dflash.arg<input, "anchors">})
    -> (tensor<1x4x2x40xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{has no q/k-norm + RoPE kernel for head dim 40: 'drafter.head_dim' must be a multiple of 16, at most 512}}
  %y = dflash.qk_norm_rope %x, %w, %p {eps = 1.0e-6 : f64, theta = 1.0e4 : f64} : (tensor<1x4x2x40xbf16>, tensor<40xbf16>, tensor<1x4xi32>) -> tensor<1x4x2x40xbf16>
  return %y : tensor<1x4x2x40xbf16>
}

// -----

// The attention kernels exist for head dims 64 and 128.
func.func @step(%q: tensor<2x12x4x16xbf16> {dflash.arg = #dflash.arg<input, "q">},
                %kc: tensor<2x32x2x16xbf16> {dflash.arg = #dflash.arg<input, "kc">},
                %kd: tensor<2x12x2x16xbf16> {dflash.arg = #dflash.arg<input, "kd">},
                %a: tensor<2x3xi32> {dflash.arg = #dflash.arg<input, "anchors">},
                %keep: tensor<2x3xi8> {dflash.arg = #dflash.arg<input, "keep">}, %pos: tensor<2x32xi32> {dflash.arg = #dflash.arg<input, "position_ids">})
    -> (tensor<2x12x4x16xbf16> {dflash.arg = #dflash.arg<metric, "o">}) {
  // expected-error @+1 {{has no attention kernel for head dim 16: 'drafter.head_dim' must be 64 or 128}}
  %o, %lse = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %keep, %pos {block_size = 4 : i64}
      : (tensor<2x12x4x16xbf16>, tensor<2x32x2x16xbf16>, tensor<2x32x2x16xbf16>,
         tensor<2x12x2x16xbf16>, tensor<2x12x2x16xbf16>, tensor<2x3xi32>, tensor<2x3xi8>, tensor<2x32xi32>)
      -> (tensor<2x12x4x16xbf16>, tensor<2x12x4xf32>)
  return %o : tensor<2x12x4x16xbf16>
}

// -----

// 12 x 8 / 1 = 96 query rows per block and kv head: neither at most 64 nor
// whole 64-row tiles.
func.func @step(%q: tensor<1x12x8x64xbf16> {dflash.arg = #dflash.arg<input, "q">},
                %kc: tensor<1x32x1x64xbf16> {dflash.arg = #dflash.arg<input, "kc">},
                %kd: tensor<1x12x1x64xbf16> {dflash.arg = #dflash.arg<input, "kd">},
                %a: tensor<1x1xi32> {dflash.arg = #dflash.arg<input, "anchors">},
                %keep: tensor<1x1xi8> {dflash.arg = #dflash.arg<input, "keep">}, %pos: tensor<1x32xi32> {dflash.arg = #dflash.arg<input, "position_ids">})
    -> (tensor<1x12x8x64xbf16> {dflash.arg = #dflash.arg<metric, "o">}) {
  // expected-error @+1 {{has no attention kernel for 96 query rows per block and kv head: 'drafter.block_size' x 'drafter.num_heads' / 'drafter.num_kv_heads' must be at most 64, or 128}}
  %o, %lse = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %keep, %pos {block_size = 12 : i64}
      : (tensor<1x12x8x64xbf16>, tensor<1x32x1x64xbf16>, tensor<1x32x1x64xbf16>,
         tensor<1x12x1x64xbf16>, tensor<1x12x1x64xbf16>, tensor<1x1xi32>, tensor<1x1xi8>, tensor<1x32xi32>)
      -> (tensor<1x12x8x64xbf16>, tensor<1x12x8xf32>)
  return %o : tensor<1x12x8x64xbf16>
}

// -----

// The draft-embedding gather reads rows as 16-byte vectors.
func.func @step(%t: tensor<64x100xbf16> {dflash.arg = #dflash.arg<frozen, "embed">},
                %ids: tensor<2x32xi32> {dflash.arg = #dflash.arg<input, "input_ids">},
                %a: tensor<2x3xi32> {dflash.arg = #dflash.arg<input, "anchors">},
                %keep: tensor<2x3xi8> {dflash.arg = #dflash.arg<input, "keep">})
    -> (tensor<2x12x100xbf16> {dflash.arg = #dflash.arg<metric, "x">}) {
  // expected-error @+1 {{has no draft-embedding kernel for rows of 100: 'drafter.hidden_size' must be a multiple of 8}}
  %x = dflash.draft_embed %t, %ids, %a, %keep {block_size = 4 : i64, mask_token_id = 63 : i64}
      : (tensor<64x100xbf16>, tensor<2x32xi32>, tensor<2x3xi32>, tensor<2x3xi8>) -> tensor<2x12x100xbf16>
  return %x : tensor<2x12x100xbf16>
}

// -----

// Blocks of 128 tokens: 128 rows per kv head would have a kernel, the block
// size has none.
func.func @step(%q: tensor<1x128x1x64xbf16> {dflash.arg = #dflash.arg<input, "q">},
                %kc: tensor<1x32x1x64xbf16> {dflash.arg = #dflash.arg<input, "kc">},
                %kd: tensor<1x128x1x64xbf16> {dflash.arg = #dflash.arg<input, "kd">},
                %a: tensor<1x1xi32> {dflash.arg = #dflash.arg<input, "anchors">},
                %keep: tensor<1x1xi8> {dflash.arg = #dflash.arg<input, "keep">}, %pos: tensor<1x32xi32> {dflash.arg = #dflash.arg<input, "position_ids">})
    -> (tensor<1x128x1x64xbf16> {dflash.arg = #dflash.arg<metric, "o">}) {
  // expected-error @+1 {{has no attention kernel for blocks of 128 tokens: 'drafter.block_size' must be at most 64}}
  %o, %lse = dflash.block_attention %q, %kc, %kc, %kd, %kd, %a, %keep, %pos {block_size = 128 : i64}
      : (tensor<1x128x1x64xbf16>, tensor<1x32x1x64xbf16>, tensor<1x32x1x64xbf16>,
         tensor<1x128x1x64xbf16>, tensor<1x128x1x64xbf16>, tensor<1x1xi32>, tensor<1x1xi8>, tensor<1x32xi32>)
      -> (tensor<1x128x1x64xbf16>, tensor<1x128x1xf32>)
  return %o : tensor<1x128x1x64xbf16>
}

// -----

// The SwiGLU GEMM reads weight rows with TMA (K a multiple of 8) and stores
// output pairs (F even).
func.func @step(%x: tensor<4x12xbf16> {dflash.arg = #dflash.arg<input, "input_ids">},
                %wg: tensor<96x12xbf16> {dflash.arg = #dflash.arg<frozen, "wg">},
                %wu: tensor<96x12xbf16> {dflash.arg = #dflash.arg<frozen, "wu">})
    -> (tensor<4x96xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{has no SwiGLU GEMM for weights 'tensor<96x12xbf16>': the target's 'intermediate_size' must be even and 'hidden_size' a multiple of 8, in bf16}}
  %y = dflash.linear_swiglu %x, %wg, %wu : (tensor<4x12xbf16>, tensor<96x12xbf16>, tensor<96x12xbf16>) -> tensor<4x96xbf16>
  return %y : tensor<4x96xbf16>
}

// -----

// The DFlash2 convolution's kernels (kernels/DFlash2Conv.cuh) refuse what
// they were not built for, each at its spec field: groups that are not a
// power of two of 16-byte vectors, rows not of whole vectors, more taps than
// kernels/GroupedConvLimits.h's, tensors not in bf16.
func.func @step(%x: tensor<1x8x48xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %d: tensor<1x8x8xbf16> {dflash.arg = #dflash.arg<parameter, "d">},
                %b: tensor<2x2x48xbf16> {dflash.arg = #dflash.arg<parameter, "base">})
    -> (tensor<1x8x48xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+2 {{'dflash.grouped_conv' op has no grouped-convolution kernel for groups of 24 channels: 'drafter.dflash2.conv_group_size' must be 8, 16, 32, 64, 128 or 256 (a thread's 8 channels, summed over a power of two of warp lanes)}}
  // expected-remark @+1 {{and 1 more 'dflash.grouped_conv' ops of these operand types, refused alike}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 24 : i64, half = 0 : i64}
      : (tensor<1x8x48xbf16>, tensor<1x8x8xbf16>, tensor<2x2x48xbf16>) -> tensor<1x8x48xbf16>
  %z = dflash.grouped_conv %y, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 24 : i64, half = 1 : i64}
      : (tensor<1x8x48xbf16>, tensor<1x8x8xbf16>, tensor<2x2x48xbf16>) -> tensor<1x8x48xbf16>
  return %z : tensor<1x8x48xbf16>
}

// -----

// The DFlash2 selector's kernels (kernels/DFlash2Selector.cuh) take bf16
// inputs and codebooks, a rank of at most 4096 and rows of a multiple of 8.
func.func @step(%v: tensor<1x8x4xf32> {dflash.arg = #dflash.arg<input, "v">},
                %c: tensor<1x8x4xi32> {dflash.arg = #dflash.arg<input, "c">},
                %lv: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "lv">},
                %y: tensor<1x8x32xf32> {dflash.arg = #dflash.arg<input, "y">},
                %wh: tensor<8x32xf32> {dflash.arg = #dflash.arg<parameter, "wh">},
                %p: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "p">},
                %l: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %wt: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "weights">},
                %pcb: tensor<64x8xf32> {dflash.arg = #dflash.arg<parameter, "pcb">},
                %scb: tensor<64x8xf32> {dflash.arg = #dflash.arg<parameter, "scb">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  // expected-error @+1 {{'dflash.selector_loss' op has a kernel for bf16 inputs, weights and codebooks only}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<1x8x4xf32>, tensor<1x8x4xi32>, tensor<1x8xf32>, tensor<1x8x32xf32>,
         tensor<8x32xf32>, tensor<1x8xi32>, tensor<1x8xi32>, tensor<1x8xf32>,
         tensor<64x8xf32>, tensor<64x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  return %loss : tensor<f32>
}

// -----

func.func @step(%g: tensor<1x8x36xbf16> {dflash.arg = #dflash.arg<input, "g">},
                %x: tensor<1x8x36xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %d: tensor<1x8x12xbf16> {dflash.arg = #dflash.arg<parameter, "d">},
                %b: tensor<2x36xbf16> {dflash.arg = #dflash.arg<parameter, "base">})
    -> (tensor<1x8x36xbf16> {dflash.arg = #dflash.arg<metric, "dx">}) {
  // expected-error @+1 {{'dflash.grouped_conv_grad' op has no grouped-convolution kernel for rows of 36: 'drafter.hidden_size' must be a multiple of 8}}
  %dx, %dd, %db = dflash.grouped_conv_grad %g, %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 12 : i64, half = 0 : i64}
      : (tensor<1x8x36xbf16>, tensor<1x8x36xbf16>, tensor<1x8x12xbf16>, tensor<2x36xbf16>)
      -> (tensor<1x8x36xbf16>, tensor<1x8x12xbf16>, tensor<2x36xbf16>)
  return %dx : tensor<1x8x36xbf16>
}

// -----

func.func @step(%x: tensor<1x8x32xbf16> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %d: tensor<1x8x20xbf16> {dflash.arg = #dflash.arg<parameter, "d">},
                %b: tensor<5x32xbf16> {dflash.arg = #dflash.arg<parameter, "base">})
    -> (tensor<1x8x32xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{'dflash.grouped_conv' op has no grouped-convolution kernel for 5 taps: 'drafter.dflash2.conv_kernel_size' must be 1 to 4}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 8 : i64, kernel_size = 5 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<1x8x32xbf16>, tensor<1x8x20xbf16>, tensor<5x32xbf16>) -> tensor<1x8x32xbf16>
  return %y : tensor<1x8x32xbf16>
}

// -----

func.func @step(%x: tensor<1x8x32xf32> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %d: tensor<1x8x8xf32> {dflash.arg = #dflash.arg<parameter, "d">},
                %b: tensor<2x32xf32> {dflash.arg = #dflash.arg<parameter, "base">})
    -> (tensor<1x8x32xf32> {dflash.arg = #dflash.arg<metric, "y">}) {
  // expected-error @+1 {{'dflash.grouped_conv' op has a grouped-convolution kernel for bf16 tensors only, not 'f32'}}
  %y = dflash.grouped_conv %x, %d, %b {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<1x8x32xf32>, tensor<1x8x8xf32>, tensor<2x32xf32>) -> tensor<1x8x32xf32>
  return %y : tensor<1x8x32xf32>
}

// -----

func.func @step(%v: tensor<1x8x4xf32> {dflash.arg = #dflash.arg<input, "v">},
                %c: tensor<1x8x4xi32> {dflash.arg = #dflash.arg<input, "c">},
                %lv: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "lv">},
                %y: tensor<1x8x32xbf16> {dflash.arg = #dflash.arg<input, "y">},
                %wh: tensor<4100x32xbf16> {dflash.arg = #dflash.arg<parameter, "wh">},
                %p: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "p">},
                %l: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %wt: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "weights">},
                %pcb: tensor<64x4100xbf16> {dflash.arg = #dflash.arg<parameter, "pcb">},
                %scb: tensor<64x4100xbf16> {dflash.arg = #dflash.arg<parameter, "scb">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  // expected-error @+1 {{'dflash.selector_loss' op has no selector kernel for rank 4100: 'drafter.dflash2.selector_rank' must be at most 4096}}
  %loss, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %p, %l, %wt, %pcb, %scb {gold = "topk"}
      : (tensor<1x8x4xf32>, tensor<1x8x4xi32>, tensor<1x8xf32>, tensor<1x8x32xbf16>,
         tensor<4100x32xbf16>, tensor<1x8xi32>, tensor<1x8xi32>, tensor<1x8xf32>,
         tensor<64x4100xbf16>, tensor<64x4100xbf16>)
      -> (tensor<f32>, tensor<f32>, tensor<1x8xi8>)
  return %loss : tensor<f32>
}

// -----

func.func @step(%y: tensor<1x8x36xbf16> {dflash.arg = #dflash.arg<input, "y">},
                %head: tensor<64x36xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %l: tensor<1x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %wt: tensor<1x8xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<1x8xf32> {dflash.arg = #dflash.arg<metric, "lv">}) {
  // expected-error @+1 {{'dflash.selector_candidates' op has no selector kernel for rows of 36: 'drafter.hidden_size' must be a multiple of 8}}
  %v, %c, %lv = dflash.selector_candidates %y, %head, %l, %wt
      {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64}
      : (tensor<1x8x36xbf16>, tensor<64x36xbf16>, tensor<1x8xi32>, tensor<1x8xf32>)
      -> (tensor<1x8x4xf32>, tensor<1x8x4xi32>, tensor<1x8xf32>)
  return %lv : tensor<1x8xf32>
}
