// RUN: dflash-opt %S/Inputs/mini-graph.mlir --dflash-generate-backward --dflash-append-optimizer | FileCheck %s --check-prefix=MINI
// RUN: dflashc %specs/tiny.toml --emit=train | FileCheck %s
// RUN: dflash-opt %S/Inputs/mini-graph.mlir --dflash-train-step | FileCheck %s --check-prefix=MINI
// RUN: sed 's/^\[training.dflash2\]$/[training.dflash2]\nselector_denominator = "covered"/' %specs/tiny-dflash2.toml > %t-covered.toml
// RUN: dflashc %t-covered.toml --emit=train | FileCheck %s --check-prefix=COVERED

// The forward sums (the loss's and the acceptance's) are all-reduced once,
// right after them; their statistics seed the backward pass (no
// loss_sum_grad argument remains) and give tau.
// CHECK-LABEL: func.func @step(
// CHECK-NOT: loss_sum_grad
// CHECK-SAME: {dflash.arg = #dflash.arg<master, "fc.weight">}
// CHECK-SAME: {dflash.arg = #dflash.arg<moment1, "fc.weight">}
// CHECK-SAME: {dflash.arg = #dflash.arg<moment2, "fc.weight">}
// CHECK-SAME: %[[STEP:[a-z0-9]+]]: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">}
// CHECK-SAME: %[[TOTAL:[a-z0-9]+]]: tensor<i32> {dflash.arg = #dflash.arg<counter, "total_steps">}
// CHECK-SAME: -> (tensor<256x512xbf16> {dflash.arg = #dflash.arg<parameter, "fc.weight">}
// CHECK-SAME: tensor<256x512xf32> {dflash.arg = #dflash.arg<master, "fc.weight">}
// CHECK-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "loss">}
// CHECK-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "acc">}
// CHECK-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "grad_norm">}
// CHECK-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "lr">}
// CHECK-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "tau">}
// CHECK-SAME: tensor<8xf32> {dflash.arg = #dflash.arg<metric, "position_hits">}
// CHECK-SAME: tensor<8xf32> {dflash.arg = #dflash.arg<metric, "position_counts">}
// CHECK-SAME: tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_runs">}
// CHECK-SAME: tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_counts">})
// CHECK: %[[LS:[a-z_0-9]+]], %[[WS:[a-z_0-9]+]], %[[C:[a-z_0-9]+]], %[[N:[a-z_0-9]+]], %[[HITS:[a-z_0-9]+]] = dflash.lm_head_ce
// CHECK-NEXT: %[[RUNS:[a-z_0-9]+]], %[[BLOCKS:[a-z_0-9]+]], %[[PH:[a-z_0-9]+]], %[[PC:[a-z_0-9]+]], %[[BR:[a-z_0-9]+]], %[[BB:[a-z_0-9]+]], %[[BH:[a-z_0-9]+]], %[[BC:[a-z_0-9]+]] = dflash.draft_acceptance %[[HITS]]
// CHECK-NEXT: %[[R:.+]]:12 = dflash.all_reduce %[[LS]], %[[WS]], %[[C]], %[[N]], %[[RUNS]], %[[BLOCKS]], %[[PH]], %[[PC]], %[[BR]], %[[BB]], %[[BH]], %[[BC]]
// CHECK-NEXT: %[[LOSS:[a-z_0-9]+]], %[[ACC:[a-z_0-9]+]], %[[TAU:[a-z_0-9]+]], %[[SEED:[a-z_0-9]+]] = dflash.loss_stats %[[R]]#0, %[[R]]#1, %[[R]]#2, %[[R]]#3, %[[R]]#4, %[[R]]#5
// CHECK: dflash.lm_head_ce_grad {{.*}}, %[[SEED]]
// CHECK: dflash.convert {{.*}} : (tensor<256x512xbf16>) -> tensor<256x512xf32>
// CHECK: %[[G:.+]]:25 = dflash.all_reduce
// CHECK: %[[NORM:.+]] = dflash.global_norm %[[G]]#0,
// CHECK: %[[CLIP:.+]] = dflash.clip_coefficient %[[NORM]] {max_norm = 1.000000e+00 : f64}
// CHECK: %[[LR:.+]] = dflash.lr_schedule %[[STEP]], %[[TOTAL]] {lr = 3.000000e-03 : f64, warmup_ratio = 4.000000e-02 : f64}
// CHECK-COUNT-25: dflash.adamw {{.*}}, %[[STEP]], %[[LR]], %[[CLIP]] {beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, eps = 1.000000e-08 : f64, weight_decay = 0.000000e+00 : f64}
// CHECK: return {{.*}}, %[[LOSS]], %[[ACC]], %[[NORM]], %[[LR]], %[[TAU]], %[[R]]#6, %[[R]]#7, %[[R]]#8, %[[R]]#9, %[[R]]#10, %[[R]]#11 :

// The same on the one-layer drafter of Inputs/mini.toml (14 trainable
// tensors, blocks of 4).
// MINI-LABEL: func.func @step(
// MINI-NOT: loss_sum_grad
// MINI-SAME: {dflash.arg = #dflash.arg<master, "fc.weight">}
// MINI-SAME: {dflash.arg = #dflash.arg<moment1, "fc.weight">}
// MINI-SAME: {dflash.arg = #dflash.arg<moment2, "fc.weight">}
// MINI-SAME: %[[STEP:[a-z0-9]+]]: tensor<i32> {dflash.arg = #dflash.arg<counter, "step">}
// MINI-SAME: %[[TOTAL:[a-z0-9]+]]: tensor<i32> {dflash.arg = #dflash.arg<counter, "total_steps">}
// MINI-SAME: -> (tensor<32x32xbf16> {dflash.arg = #dflash.arg<parameter, "fc.weight">}
// MINI-SAME: tensor<32x32xf32> {dflash.arg = #dflash.arg<master, "fc.weight">}
// MINI-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "loss">}
// MINI-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "acc">}
// MINI-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "grad_norm">}
// MINI-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "lr">}
// MINI-SAME: tensor<f32> {dflash.arg = #dflash.arg<metric, "tau">}
// MINI-SAME: tensor<4xf32> {dflash.arg = #dflash.arg<metric, "position_hits">}
// MINI-SAME: tensor<4xf32> {dflash.arg = #dflash.arg<metric, "position_counts">}
// MINI-SAME: tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_runs">}
// MINI-SAME: tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_counts">})
// MINI: %[[LS:[a-z_0-9]+]], %[[WS:[a-z_0-9]+]], %[[C:[a-z_0-9]+]], %[[N:[a-z_0-9]+]], %[[HITS:[a-z_0-9]+]] = dflash.lm_head_ce
// MINI-NEXT: %[[RUNS:[a-z_0-9]+]], %[[BLOCKS:[a-z_0-9]+]], %[[PH:[a-z_0-9]+]], %[[PC:[a-z_0-9]+]], %[[BR:[a-z_0-9]+]], %[[BB:[a-z_0-9]+]], %[[BH:[a-z_0-9]+]], %[[BC:[a-z_0-9]+]] = dflash.draft_acceptance %[[HITS]]
// MINI-NEXT: %[[R:.+]]:12 = dflash.all_reduce %[[LS]], %[[WS]], %[[C]], %[[N]], %[[RUNS]], %[[BLOCKS]], %[[PH]], %[[PC]], %[[BR]], %[[BB]], %[[BH]], %[[BC]]
// MINI-NEXT: %[[LOSS:[a-z_0-9]+]], %[[ACC:[a-z_0-9]+]], %[[TAU:[a-z_0-9]+]], %[[SEED:[a-z_0-9]+]] = dflash.loss_stats %[[R]]#0, %[[R]]#1, %[[R]]#2, %[[R]]#3, %[[R]]#4, %[[R]]#5
// MINI: dflash.lm_head_ce_grad {{.*}}, %[[SEED]]
// MINI: dflash.convert {{.*}} : (tensor<32x32xbf16>) -> tensor<32x32xf32>
// MINI: %[[G:.+]]:14 = dflash.all_reduce
// MINI: %[[NORM:.+]] = dflash.global_norm %[[G]]#0,
// MINI: %[[CLIP:.+]] = dflash.clip_coefficient %[[NORM]] {max_norm = 1.000000e+00 : f64}
// MINI: %[[LR:.+]] = dflash.lr_schedule %[[STEP]], %[[TOTAL]] {lr = 6.000000e-04 : f64, warmup_ratio = 4.000000e-02 : f64}
// MINI-COUNT-14: dflash.adamw {{.*}}, %[[STEP]], %[[LR]], %[[CLIP]] {beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, eps = 1.000000e-08 : f64, weight_decay = 0.000000e+00 : f64}
// MINI: return {{.*}}, %[[LOSS]], %[[ACC]], %[[NORM]], %[[LR]], %[[TAU]], %[[R]]#6, %[[R]]#7, %[[R]]#8, %[[R]]#9, %[[R]]#10, %[[R]]#11 :

// A DFlash2 step's loss sum is its selector objective, whose "covered"
// denominator sum(w cov) is global (docs/semantics.md section 13): the
// all-reduce sums the objective's operands (CE_u's sum, the selector's sum,
// sum(w), sum(w cov)) and the objective is computed after it from the global
// sums, not per GPU and then added up.
// COVERED: %[[SEL:[a-z_0-9]+]], %[[COV:[a-z_0-9]+]], %{{[a-z_0-9]+}} = dflash.selector_loss
// COVERED-NOT: dflash.selector_objective
// COVERED: %[[R:.+]]:14 = dflash.all_reduce %{{[a-z_0-9]+}}, {{.*}}, %[[SEL]], %[[COV]] :
// COVERED-NEXT: %[[OBJ:[a-z_0-9]+]] = dflash.selector_objective %[[R]]#0, %[[R]]#12, %{{[a-z_0-9]+}}, %[[R]]#1, %[[R]]#13 {covered}
// COVERED-NEXT: dflash.loss_stats %[[OBJ]], %[[R]]#1, %[[R]]#2, %[[R]]#3, %[[R]]#4, %[[R]]#5
// COVERED-NEXT: dflash.selector_objective_grad %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}}, %[[R]]#1, %[[R]]#13 {covered}
