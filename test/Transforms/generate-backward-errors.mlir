// RUN: dflash-opt %s --dflash-generate-backward --split-input-file --verify-diagnostics

// expected-error @+1 {{the module has no func.func @step (or @eval, or @target) with a body}}
module {
  func.func @not_step() {
    return
  }
}

// -----

// expected-error @+1 {{@step has no result #dflash.arg<metric, "loss_sum"> to differentiate}}
func.func @step(%w: tensor<8xbf16> {dflash.arg = #dflash.arg<parameter, "w">})
    -> (tensor<8xbf16> {dflash.arg = #dflash.arg<metric, "other">}) {
  return %w : tensor<8xbf16>
}

// -----

// expected-error @+1 {{argument 0 of @step has no 'dflash.arg' attribute}}
func.func @step(%w: tensor<8xbf16>) {
  return
}

// -----

// Gradients never flow into an embedding table: a trainable table is an error.
func.func @step(%table: tensor<16x8xbf16> {dflash.arg = #dflash.arg<parameter, "embed">},
                %ids: tensor<1x4xi32> {dflash.arg = #dflash.arg<input, "ids">},
                %head: tensor<16x8xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<1x4xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %weights: tensor<1x4xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  // expected-error @+1 {{'dflash.embed' op lies on the path from a parameter to the loss but has no gradient rule (DifferentiableOpInterface)}}
  %x = dflash.embed %table, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %ls, %ws, %c, %n, %hits = dflash.lm_head_ce %x, %head, %labels, %weights
      : (tensor<1x4x8xbf16>, tensor<16x8xbf16>, tensor<1x4xi32>, tensor<1x4xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x4xi8>)
  return %ls : tensor<f32>
}

// -----

// expected-error @+1 {{parameter 'unused' does not reach the loss}}
func.func @step(%unused: tensor<8xbf16> {dflash.arg = #dflash.arg<parameter, "unused">},
                %y: tensor<1x4x8xbf16> {dflash.arg = #dflash.arg<input, "y">},
                %head: tensor<16x8xbf16> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<1x4xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %weights: tensor<1x4xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  %ls, %ws, %c, %n, %hits = dflash.lm_head_ce %y, %head, %labels, %weights
      : (tensor<1x4x8xbf16>, tensor<16x8xbf16>, tensor<1x4xi32>, tensor<1x4xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<1x4xi8>)
  return %ls : tensor<f32>
}

// -----

// expected-error @+1 {{@step already has gradient results: dflash-generate-backward runs once}}
func.func @step(%w: tensor<8xbf16> {dflash.arg = #dflash.arg<parameter, "w">})
    -> (tensor<8xbf16> {dflash.arg = #dflash.arg<gradient, "w">}) {
  return %w : tensor<8xbf16>
}
