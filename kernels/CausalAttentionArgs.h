//===- CausalAttentionArgs.h - Causal attention operands --------*- C++ -*-===//
//
// What causal_attention_fwd_bf16 (kernels/CausalAttention.cuh) takes, as
// plain C++: generated host code fills and passes it on without CUDA
// headers. The target model's forward (inference only) over packed rows,
// ref::causalAttention: query i of row b, head h reads kv head h / (nh /
// nkv) and sees key j iff j <= i and pos[b, i] - pos[b, j] == i - j (each
// conversation of a packed row has position_ids 0, 1, 2, ...; attention is
// block-diagonal causal), and with window > 0 (a sliding layer of
// gpt-oss) also i - j < window. Scale d^-0.5. With sinks (gpt-oss), head
// h's softmax denominator also holds exp(sinks[h]), an unscaled logit no
// value goes with. Layouts:
//   q, out [B, S, nh, d]; k, v [B, S, nkv, d] (bf16); positionIds int32
//   [B, S], non-negative (arange in an unpacked row); sinks bf16 [nh].
// Every pointer but sinks 16-byte aligned.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_CAUSALATTENTIONARGS_H
#define DFLASH_KERNELS_CAUSALATTENTIONARGS_H

#include <cstdint>

// <cuda_bf16.h>'s element type; only pointers to it are needed here.
struct __nv_bfloat16;

namespace dflash::kernels {

/// Forward operands; B and S are the runtime batch dimensions.
struct CausalAttentionFwdArgs {
  const __nv_bfloat16 *q, *k, *v;
  const int32_t *positionIds;
  __nv_bfloat16 *out;
  int B, S;
  const __nv_bfloat16 *sinks = nullptr; ///< [nh], or none
  int window = 0;                       ///< keys i - j < window only; 0: all
};

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_CAUSALATTENTIONARGS_H
