// RUN: dflash-opt %S/Inputs/mini-graph.mlir --dflash-make-eval-program | FileCheck %s --check-prefix=MINI
// RUN: dflashc %specs/tiny.toml --emit=graph --program=eval | FileCheck %s
// RUN: dflashc %specs/tiny.toml --emit=planned --program=eval | FileCheck %s --check-prefix=PLANNED
// RUN: not dflash-opt %S/Inputs/mini-train.mlir --dflash-make-eval-program 2>&1 | FileCheck %s --check-prefix=TRAINED
// RUN: sed 's/^\[training.dflash2\]$/[training.dflash2]\nselector_denominator = "covered"/' %specs/tiny-dflash2.toml > %t-covered.toml
// RUN: dflashc %t-covered.toml --emit=graph --program=eval | FileCheck %s --check-prefix=COVERED

// The evaluation program is the forward graph under another name, its twelve
// sums all-reduced once at the end; nothing is differentiated or updated.
// After the sums come the hits and weights of every draft slot, this GPU's
// own (not all-reduced), for the serving walk on the host.
// CHECK-LABEL: func.func @eval(
// CHECK-SAME: {dflash.arg = #dflash.arg<parameter, "fc.weight">}
// CHECK-NOT: master
// CHECK-SAME: -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}
// CHECK-SAME: tensor<8xf32> {dflash.arg = #dflash.arg<metric, "position_counts">}
// CHECK-SAME: tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_counts">}, tensor<2x96xi8> {dflash.arg = #dflash.arg<metric, "draft_hits">}, tensor<2x96xf32> {dflash.arg = #dflash.arg<metric, "draft_weights">})
// CHECK-NOT: _grad
// CHECK: %[[LS:[a-z_0-9]+]], %[[WS:[a-z_0-9]+]], %[[C:[a-z_0-9]+]], %[[N:[a-z_0-9]+]], %[[HITS:[a-z_0-9]+]] = dflash.lm_head_ce
// CHECK-NEXT: %[[RUNS:[a-z_0-9]+]], %[[BLOCKS:[a-z_0-9]+]], %[[PH:[a-z_0-9]+]], %[[PC:[a-z_0-9]+]], %[[BR:[a-z_0-9]+]], %[[BB:[a-z_0-9]+]], %[[BH:[a-z_0-9]+]], %[[BC:[a-z_0-9]+]] = dflash.draft_acceptance %[[HITS]], %[[W:[a-z_0-9]+]],
// CHECK-NEXT: %[[R:.+]]:12 = dflash.all_reduce %[[LS]], %[[WS]], %[[C]], %[[N]], %[[RUNS]], %[[BLOCKS]], %[[PH]], %[[PC]], %[[BR]], %[[BB]], %[[BH]], %[[BC]]
// CHECK-NEXT: return %[[R]]#0, %[[R]]#1, %[[R]]#2, %[[R]]#3, %[[R]]#4, %[[R]]#5, %[[R]]#6, %[[R]]#7, %[[R]]#8, %[[R]]#9, %[[R]]#10, %[[R]]#11, %[[HITS]], %[[W]] :

// Lowered like a step, with an arena of its own: the lm_head runs the
// cross-entropy kernel without the dX GEMM, and nothing optimizes.
// PLANNED: module @tiny attributes {{{.*}}dflash.arena_bytes = {{[0-9]+}}
// PLANNED-LABEL: func.func @eval(
// PLANNED: dflash.lm_head_ce {{.*}}dflash.kernel = #dflash.kernel<name = "lm_head_cross_entropy_bf16"
// PLANNED-NOT: adamw
// PLANNED: dflash.all_reduce

// A module past the forward graph is refused.
// TRAINED: error: @step returns {{[0-9]+}} results but the forward graph returns the 12 forward sums: make the evaluation program from dflashc --emit=graph

// The same on the one-layer drafter of Inputs/mini.toml (blocks of 4).
// MINI-LABEL: func.func @eval(
// MINI-SAME: {dflash.arg = #dflash.arg<parameter, "fc.weight">}
// MINI-NOT: master
// MINI-SAME: -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}
// MINI-SAME: tensor<4xf32> {dflash.arg = #dflash.arg<metric, "position_counts">}
// MINI-SAME: tensor<1xf32> {dflash.arg = #dflash.arg<metric, "bucket_counts">}, tensor<{{[0-9]+x[0-9]+}}xi8> {dflash.arg = #dflash.arg<metric, "draft_hits">}, tensor<{{[0-9]+x[0-9]+}}xf32> {dflash.arg = #dflash.arg<metric, "draft_weights">})
// MINI-NOT: _grad
// MINI: %[[LS:[a-z_0-9]+]], %[[WS:[a-z_0-9]+]], %[[C:[a-z_0-9]+]], %[[N:[a-z_0-9]+]], %[[HITS:[a-z_0-9]+]] = dflash.lm_head_ce
// MINI-NEXT: %[[RUNS:[a-z_0-9]+]], %[[BLOCKS:[a-z_0-9]+]], %[[PH:[a-z_0-9]+]], %[[PC:[a-z_0-9]+]], %[[BR:[a-z_0-9]+]], %[[BB:[a-z_0-9]+]], %[[BH:[a-z_0-9]+]], %[[BC:[a-z_0-9]+]] = dflash.draft_acceptance %[[HITS]], %[[W:[a-z_0-9]+]],
// MINI-NEXT: %[[R:.+]]:12 = dflash.all_reduce %[[LS]], %[[WS]], %[[C]], %[[N]], %[[RUNS]], %[[BLOCKS]], %[[PH]], %[[PC]], %[[BR]], %[[BB]], %[[BH]], %[[BC]]
// MINI-NEXT: return %[[R]]#0, %[[R]]#1, %[[R]]#2, %[[R]]#3, %[[R]]#4, %[[R]]#5, %[[R]]#6, %[[R]]#7, %[[R]]#8, %[[R]]#9, %[[R]]#10, %[[R]]#11, %[[HITS]], %[[W]] :

// A DFlash2 drafter's loss sum is its selector objective of global sums
// (docs/semantics.md section 13): the all-reduce sums its operands and the
// objective runs after it. With "covered" it divides by sum(w * cov), a
// ratio that does not add up over batches: the evaluation reports the
// linear objective (no {covered}) and, last, the global unary sum and
// covered weight, from whose totals the runtime forms the objective.
// COVERED-LABEL: func.func @eval(
// COVERED-SAME: tensor<2x96xf32> {dflash.arg = #dflash.arg<metric, "draft_weights">}, tensor<f32> {dflash.arg = #dflash.arg<metric, "unary_sum">}, tensor<f32> {dflash.arg = #dflash.arg<metric, "covered_weight">})
// COVERED: %[[SEL:[a-z_0-9]+]], %[[COV:[a-z_0-9]+]], %{{[a-z_0-9]+}} = dflash.selector_loss
// COVERED-NOT: dflash.selector_objective
// COVERED: %[[R:.+]]:14 = dflash.all_reduce %{{[a-z_0-9]+}}, {{.*}}, %[[SEL]], %[[COV]] :
// COVERED-NEXT: %[[OBJ:[a-z_0-9]+]] = dflash.selector_objective %[[R]]#0, %[[R]]#12, %{{[a-z_0-9]+}}, %[[R]]#1, %[[R]]#13 :
// COVERED-NOT: dflash.selector_objective
// COVERED-NEXT: return %[[OBJ]], %[[R]]#1, %[[R]]#2, {{.*}}, %[[R]]#0, %[[R]]#13 :
