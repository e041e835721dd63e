//===- DFlashOptimizerOps.td - dflash optimizer ops --------*- tablegen -*-===//
//
// The ops that `dflash-append-optimizer` adds after the backward pass:
// collectives, loss normalisation, global clipping, the learning-rate
// schedule and AdamW with fp32 masters (docs/semantics.md sections 4 and 5).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_OPTIMIZER_OPS_TD
#define DFLASH_OPTIMIZER_OPS_TD

def DFlash_AllReduceOp : DFlash_PureOp<"all_reduce"> {
  let summary = "Sum over every GPU of the step";
  let description = [{
    Each result is the elementwise sum of its operand over all ranks of the
    data-parallel group. On one GPU it is the identity; lowering places it
    in buckets and overlaps it with the backward pass.

    ```mlir
    %a, %b = dflash.all_reduce %x, %y
        : (tensor<f32>, tensor<4096x4096xf32>) -> (tensor<f32>, tensor<4096x4096xf32>)
    ```
  }];
  let arguments = (ins Variadic<DFlash_FloatTensor>:$inputs);
  let results = (outs Variadic<DFlash_FloatTensor>:$results);
  let assemblyFormat =
      "$inputs attr-dict `:` functional-type(operands, results)";
}

def DFlash_LossStatsOp : DFlash_PureOp<"loss_stats"> {
  let summary = "Global loss, accuracy and backward seed from the summed sums";
  let description = [{
    From the all-reduced forward sums: `loss = loss_sum / weight_sum`,
    `acc = correct / count` (0 when count is 0), `tau = run_sum /
    kept_blocks` (0 when no block is kept; docs/semantics.md section 10) and
    `loss_sum_grad = 1 / weight_sum`, the seed that makes the gradients those
    of the exact global weighted mean (docs/semantics.md section 4).

    ```mlir
    %loss, %acc, %tau, %seed = dflash.loss_stats %ls, %ws, %c, %n, %runs,
        %blocks : (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>,
                   tensor<f32>, tensor<f32>)
        -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>)
    ```
  }];
  let arguments = (ins DFlash_F32Scalar:$loss_sum, DFlash_F32Scalar:$weight_sum,
                       DFlash_F32Scalar:$correct, DFlash_F32Scalar:$count,
                       DFlash_F32Scalar:$run_sum,
                       DFlash_F32Scalar:$kept_blocks);
  let results = (outs DFlash_F32Scalar:$loss, DFlash_F32Scalar:$acc,
                      DFlash_F32Scalar:$tau, DFlash_F32Scalar:$loss_sum_grad);
  let assemblyFormat =
      "$loss_sum `,` $weight_sum `,` $correct `,` $count `,` $run_sum `,` "
      "$kept_blocks attr-dict `:` functional-type(operands, results)";
}

def DFlash_ConvertOp : DFlash_PureOp<"convert"> {
  let summary = "Element type conversion (bf16 gradients to fp32)";
  let description = [{
    ```mlir
    %g32 = dflash.convert %g : (tensor<4096xbf16>) -> tensor<4096xf32>
    ```
  }];
  let arguments = (ins DFlash_FloatTensor:$input);
  let results = (outs DFlash_FloatTensor:$result);
  let assemblyFormat =
      "$input attr-dict `:` functional-type(operands, results)";
}

def DFlash_GlobalNormOp : DFlash_PureOp<"global_norm"> {
  let summary = "L2 norm over every element of every operand";
  let description = [{
    `sqrt(sum over operands of sum(x^2))`, accumulated in fp32 or wider.

    ```mlir
    %norm = dflash.global_norm %g0, %g1
        : (tensor<4096x4096xf32>, tensor<4096xf32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Variadic<DFlash_F32Tensor>:$inputs);
  let results = (outs DFlash_F32Scalar:$result);
  let assemblyFormat =
      "$inputs attr-dict `:` functional-type(operands, results)";
}

def DFlash_ClipCoefficientOp : DFlash_PureOp<"clip_coefficient"> {
  let summary = "Global gradient clipping factor";
  let description = [{
    `min(1, max_norm / (norm + 1e-6))`.

    ```mlir
    %c = dflash.clip_coefficient %norm {max_norm = 1.0 : f64}
        : (tensor<f32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins DFlash_F32Scalar:$norm, F64Attr:$max_norm);
  let results = (outs DFlash_F32Scalar:$result);
  let assemblyFormat =
      "$norm attr-dict `:` functional-type(operands, results)";
}

def DFlash_LrScheduleOp : DFlash_PureOp<"lr_schedule"> {
  let summary = "Linear warmup then cosine decay to zero";
  let description = [{
    With `warm = int(warmup_ratio * total)`, step `t < warm` (0-based) gives
    `lr * (t+1) / warm`; later steps
    `lr * 0.5 * (1 + cos(pi * (t - warm) / (total - warm)))`.

    ```mlir
    %lr = dflash.lr_schedule %step, %total {lr = 6.0e-04 : f64,
        warmup_ratio = 4.0e-02 : f64} : (tensor<i32>, tensor<i32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[I32]>:$step, 0DTensorOf<[I32]>:$total,
                       F64Attr:$lr, F64Attr:$warmup_ratio);
  let results = (outs DFlash_F32Scalar:$result);
  let assemblyFormat =
      "$step `,` $total attr-dict `:` functional-type(operands, results)";
}

def DFlash_AdamWOp : DFlash_PureOp<"adamw"> {
  let summary = "One AdamW step on an fp32 master and its bf16 copy";
  let description = [{
    torch.optim.AdamW on the fp32 master with gradient `grad * clip`, at the
    1-based step `step + 1` for bias correction and learning rate `lr`:
    `p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`. Also returns the
    updated parameter rounded to its storage type.

    ```mlir
    %p32, %m1, %v1, %p = dflash.adamw %master, %g, %m, %v, %step, %lr, %clip
        {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-08 : f64,
         weight_decay = 0.0 : f64}
        : (tensor<4096xf32>, tensor<4096xf32>, tensor<4096xf32>,
           tensor<4096xf32>, tensor<i32>, tensor<f32>, tensor<f32>)
        -> (tensor<4096xf32>, tensor<4096xf32>, tensor<4096xf32>,
            tensor<4096xbf16>)
    ```
  }];
  let arguments = (ins DFlash_F32Tensor:$master, DFlash_F32Tensor:$grad,
                       DFlash_F32Tensor:$moment1, DFlash_F32Tensor:$moment2,
                       0DTensorOf<[I32]>:$step, DFlash_F32Scalar:$lr,
                       DFlash_F32Scalar:$clip, F64Attr:$beta1, F64Attr:$beta2,
                       F64Attr:$eps, F64Attr:$weight_decay);
  let results = (outs DFlash_F32Tensor:$new_master,
                      DFlash_F32Tensor:$new_moment1,
                      DFlash_F32Tensor:$new_moment2,
                      DFlash_FloatTensor:$new_parameter);
  let assemblyFormat =
      "$master `,` $grad `,` $moment1 `,` $moment2 `,` $step `,` $lr `,` "
      "$clip attr-dict `:` functional-type(operands, results)";
}

#endif // DFLASH_OPTIMIZER_OPS_TD
