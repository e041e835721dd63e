//===- TargetBench.h - KernelBench's sections of the online target -*- C++
//-*-===//
//
// Defined in TargetBench.cu, run by KernelBench's main.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_BENCH_KERNELS_TARGETBENCH_H
#define DFLASH_BENCH_KERNELS_TARGETBENCH_H

namespace dflash::bench {

/// "causal": the target's causal attention forward at the Qwen3-8B shape,
/// unpacked and packed.
void causalAttention();
/// "hybrid": Qwen3.6-27B's kernels: its gated attention's causal attention
/// (head dim 256) and the gated delta rule (both kernels), unpacked and
/// packed.
void hybridTarget();

} // namespace dflash::bench

#endif // DFLASH_BENCH_KERNELS_TARGETBENCH_H
