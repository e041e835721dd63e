// RUN: dflash-opt %s --dflash-append-optimizer --split-input-file --verify-diagnostics

// expected-error @+1 {{the module has no 'dflash.optimizer' attribute with the optimizer's hyperparameters}}
module {
  func.func @step() {
    return
  }
}

// -----

module attributes {dflash.optimizer = #dflash.optimizer<lr = 6.0e-04 : f64, warmup_ratio = 4.0e-02 : f64, max_grad_norm = 1.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64>} {
  // expected-error @+1 {{@step has no gradients: run dflash-generate-backward before dflash-append-optimizer}}
  func.func @step(%w: tensor<f32> {dflash.arg = #dflash.arg<parameter, "w">})
      -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
    return %w : tensor<f32>
  }
}
