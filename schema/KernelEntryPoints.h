//===- KernelEntryPoints.h - The kernels generated code calls ---*- C++ -*-===//
//
// One schema for the kernel entry points, read by dflash-select-kernels
// (which names each fused group's kernel) and by the CUDA printer (which
// calls it): the kernel names as constants, and for each kernel template
// that kernels.cu instantiates, how its wrapper is named and what it takes.
// Plain C++: no MLIR, no CUDA.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_SCHEMA_KERNELENTRYPOINTS_H
#define DFLASH_SCHEMA_KERNELENTRYPOINTS_H

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace dflash::kernel_names {
inline constexpr std::string_view kCublasLtGemm = "cublaslt_gemm";
inline constexpr std::string_view kRmsNormFwd = "rms_norm_fwd_bf16";
inline constexpr std::string_view kRmsNormBwd = "rms_norm_bwd_bf16";
inline constexpr std::string_view kQkNormRopeFwd = "qk_norm_rope_fwd_bf16";
inline constexpr std::string_view kQkNormRopeBwd = "qk_norm_rope_bwd_bf16";
inline constexpr std::string_view kRopeFwd = "rope_fwd_bf16";
inline constexpr std::string_view kCausalAttentionFwd =
    "causal_attention_fwd_bf16";
inline constexpr std::string_view kBlockAttentionFwd =
    "block_attention_fwd_bf16";
// The warp-specialised forward for long contexts (kernels/AttentionLimits.h,
// warpSpecialisedForwardPays): the same arguments as kBlockAttentionFwd.
inline constexpr std::string_view kBlockAttentionFwdWs =
    "block_attention_fwd_ws_bf16";
// The same with its two consumer warpgroups issuing their products in turns,
// on the same layers once it may run (kUnvalidatedKernels): the same
// arguments.
inline constexpr std::string_view kBlockAttentionFwdWsPingpong =
    "block_attention_fwd_ws_pingpong_bf16";
inline constexpr std::string_view kBlockAttentionBwd =
    "block_attention_bwd_bf16";
// The backward with its context kernel in clusters of two key tiles, for
// short rows several to a GPU (kernels/AttentionLimits.h,
// clusterBackwardPays): the same arguments as kBlockAttentionBwd.
inline constexpr std::string_view kBlockAttentionBwdCluster =
    "block_attention_bwd_cluster_bf16";
// The backward launching the key tiles of one (row, kv head) pair at a time,
// for the longest rows (kernels/AttentionLimits.h, pairByPairBackwardPays):
// the same arguments.
inline constexpr std::string_view kBlockAttentionBwdPairByPair =
    "block_attention_bwd_pair_by_pair_bf16";
inline constexpr std::string_view kEmbedRows = "embed_rows_bf16";
inline constexpr std::string_view kCopyColumns = "copy_columns";
inline constexpr std::string_view kSwigluFwd = "swiglu_fwd_bf16";
inline constexpr std::string_view kSwigluGemm = "swiglu_gemm_bf16";
inline constexpr std::string_view kSwigluBwd = "swiglu_bwd_bf16";
inline constexpr std::string_view kMoeRoute = "moe_route_bf16";
inline constexpr std::string_view kMoePermute = "moe_permute_bf16";
inline constexpr std::string_view kGroupedLinear = "grouped_linear_bf16";
inline constexpr std::string_view kGroupedLinearSwiglu =
    "grouped_linear_swiglu_bf16";
inline constexpr std::string_view kMoeUnpermute = "moe_unpermute_bf16";
inline constexpr std::string_view kCausalConv = "causal_conv_bf16";
inline constexpr std::string_view kGroupedConv = "grouped_conv_bf16";
inline constexpr std::string_view kGroupedConvGrad = "grouped_conv_grad_bf16";
inline constexpr std::string_view kGatedDeltaRule = "gated_delta_rule_bf16";
inline constexpr std::string_view kGatedRmsNorm = "gated_rms_norm_bf16";
inline constexpr std::string_view kZeroCentredRmsNorm =
    "zero_centred_rms_norm_bf16";
inline constexpr std::string_view kPartialRope = "partial_rope_bf16";
inline constexpr std::string_view kSigmoidGate = "sigmoid_gate_bf16";
inline constexpr std::string_view kAdd = "add_bf16";
inline constexpr std::string_view kAddF32 = "add_f32";
inline constexpr std::string_view kDraftEmbed = "draft_embed_bf16";
inline constexpr std::string_view kDraftPositions = "draft_positions";
inline constexpr std::string_view kDraftTargets = "draft_targets";
inline constexpr std::string_view kDraftAcceptance = "draft_acceptance_f32";
inline constexpr std::string_view kLossSeed = "loss_seed_f32";
inline constexpr std::string_view kLossStats = "loss_stats_f32";
inline constexpr std::string_view kLmHeadCrossEntropy =
    "lm_head_cross_entropy_bf16";
inline constexpr std::string_view kConvertBf16F32 = "convert_bf16_f32";
inline constexpr std::string_view kAdamWMultiTensor = "adamw_multi_tensor_step";
inline constexpr std::string_view kAdamWSharded = "adamw_sharded";
// DFlash2 selector (kernels/DFlash2Selector.cuh).
inline constexpr std::string_view kSelectorCandidates =
    "selector_candidates_bf16";
inline constexpr std::string_view kSelectorCandidatesGrad =
    "selector_candidates_grad_bf16";
inline constexpr std::string_view kSelectorLoss = "selector_loss_bf16";
inline constexpr std::string_view kSelectorLossGrad = "selector_loss_grad_bf16";
inline constexpr std::string_view kDraftPredecessors = "draft_predecessors";
inline constexpr std::string_view kSelectorAlpha = "selector_alpha_f32";
inline constexpr std::string_view kSelectorObjective = "selector_objective_f32";
inline constexpr std::string_view kSelectorObjectiveGrad =
    "selector_objective_grad_f32";
} // namespace dflash::kernel_names

namespace dflash {

/// A kernel (or a shape of one) built but not yet passed its GPU test on the
/// GPU machine: dflashc writes no trainer that runs it unless told to build
/// one for that test (--allow-unvalidated-kernels). An entry leaves this
/// table when its test has passed there (docs/kernels.md, "Validation").
struct UnvalidatedKernel {
  std::string_view name;
  std::string_view gpuTest; ///< the test binary (and filter) that validates it
};
// DFlash2ConvGpuTest, DFlash2SelectorGpuTest and AttentionGpuTest's
// bidirectional windows passed on an H100 on 2026-12-06, and LmHeadGpuTest's
// folded top-K and unary transform the same evening (bench/RESULTS.md,
// "DFlash2 on the GPU" and "DFlash2 validated, evaluation, long context on
// the GPU"); AttentionGpuTest's BlockAttentionWgmmaWs cases (the
// warp-specialised forward) on an H100 on 2026-12-07 ("The warp-specialised
// attention forward on the GPU"): their kernels and shapes left this table.
// AttentionGpuTest's BlockAttentionBwdWgmma cases in clusters of two key
// tiles (block_attention_bwd_cluster_bf16) passed on an H100 on 2026-12-07
// ("The attention backward in clusters of two key tiles, measured").
// The pingpong forward awaits the same BlockAttentionWgmmaWs cases, which
// run it in every case, and the pair-by-pair backward its own entry point's
// cases (docs/kernels.md, "Waiting now").
inline constexpr std::array<UnvalidatedKernel, 2> kUnvalidatedKernels = {{
    {kernel_names::kBlockAttentionFwdWsPingpong,
     "AttentionGpuTest --gtest_filter=BlockAttentionWgmmaWs.*"},
    {kernel_names::kBlockAttentionBwdPairByPair,
     "AttentionGpuTest --gtest_filter=BlockAttentionBwdWgmma.PairByPair"},
}};

/// The GPU test that has yet to pass for kernel `name` ("" when none).
constexpr std::string_view pendingGpuTest(std::string_view name) {
  for (const UnvalidatedKernel &k : kUnvalidatedKernels)
    if (k.name == name)
      return k.gpuTest;
  return {};
}

/// Which kernels awaiting their GPU test a compile may pick anyway: every one
/// (dflashc --allow-unvalidated-kernels: the trainers that run those tests),
/// or those named (--allow-unvalidated-kernel=NAME: a trainer that times one
/// of them against the step it would replace while others still wait).
struct UnvalidatedKernelAllowance {
  bool all = false;
  std::vector<std::string> names;

  bool allows(std::string_view name) const {
    return all || std::find(names.begin(), names.end(), name) != names.end();
  }
};

/// Whether `name` may run in a trainer dflashc writes: it has passed its GPU
/// test, or the trainer is built to run it before (`allowance`).
inline bool kernelSelectable(std::string_view name,
                             const UnvalidatedKernelAllowance &allowance) {
  return pendingGpuTest(name).empty() || allowance.allows(name);
}

} // namespace dflash

namespace dflash {

/// A kernel template of dflash::kernels that kernels.cu instantiates once per
/// set of constants, behind a plain function (its wrapper): named
/// `<name>_<label><constant>...`, with `parameters` as its parameter list,
/// forwarding `arguments` to `name<constants..., trailing>`.
struct KernelTemplate {
  std::string_view name;
  /// The labels of its constants in the wrapper's name, in order ("" past
  /// the last).
  std::array<std::string_view, 6> labels;
  /// The constant that is a bool (named by its label alone when true), or -1.
  int boolAt = -1;
  /// Template arguments after the constants.
  std::string_view trailing;
  std::string_view parameters;
  std::string_view arguments;
};

inline constexpr KernelTemplate kKernelTemplates[] = {
    {kernel_names::kRmsNormFwd,
     {"h"},
     -1,
     "",
     "const __nv_bfloat16 *x, const __nv_bfloat16 *delta, const "
     "__nv_bfloat16 *w, __nv_bfloat16 *xSum, __nv_bfloat16 *y, int64_t rows, "
     "float eps, cudaStream_t stream",
     "x, delta, w, xSum, y, rows, eps, stream"},
    {kernel_names::kRmsNormBwd,
     {"h"},
     -1,
     ", __nv_bfloat16",
     "const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const __nv_bfloat16 "
     "*w, const __nv_bfloat16 *dResidual, __nv_bfloat16 *dx, __nv_bfloat16 "
     "*dw, int64_t rows, float eps, float *workspace, cudaStream_t stream",
     "dy, x, w, dResidual, dx, dw, rows, eps, workspace, stream"},
    {kernel_names::kQkNormRopeFwd,
     {"d", "h"},
     -1,
     "",
     "const __nv_bfloat16 *x, const __nv_bfloat16 *w, const int32_t *pos, "
     "__nv_bfloat16 *y, int64_t rows, float eps, "
     "dflash::kernels::RopeFrequencies freq, cudaStream_t stream",
     "x, w, pos, y, rows, eps, freq, stream"},
    {kernel_names::kQkNormRopeBwd,
     {"d", "h"},
     -1,
     ", __nv_bfloat16",
     "const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const __nv_bfloat16 "
     "*w, const int32_t *pos, __nv_bfloat16 *dx, __nv_bfloat16 *dw, int64_t "
     "rows, float eps, dflash::kernels::RopeFrequencies freq, float "
     "*workspace, cudaStream_t stream",
     "dy, x, w, pos, dx, dw, rows, eps, freq, workspace, stream"},
    {kernel_names::kBlockAttentionFwd,
     {"d", "bs", "nh", "nkv", "w", "causal"},
     5,
     "",
     "const dflash::kernels::BlockAttentionFwdArgs &args, cudaStream_t stream",
     "args, stream"},
    {kernel_names::kBlockAttentionFwdWs,
     {"d", "bs", "nh", "nkv", "w", "causal"},
     5,
     "",
     "const dflash::kernels::BlockAttentionFwdArgs &args, cudaStream_t stream",
     "args, stream"},
    {kernel_names::kBlockAttentionFwdWsPingpong,
     {"d", "bs", "nh", "nkv", "w", "causal"},
     5,
     "",
     "const dflash::kernels::BlockAttentionFwdArgs &args, cudaStream_t stream",
     "args, stream"},
    {kernel_names::kBlockAttentionBwd,
     {"d", "bs", "nh", "nkv", "w", "causal"},
     5,
     "",
     "const dflash::kernels::BlockAttentionBwdArgs &args, cudaStream_t stream",
     "args, stream"},
    {kernel_names::kBlockAttentionBwdCluster,
     {"d", "bs", "nh", "nkv", "w", "causal"},
     5,
     "",
     "const dflash::kernels::BlockAttentionBwdArgs &args, cudaStream_t stream",
     "args, stream"},
    {kernel_names::kBlockAttentionBwdPairByPair,
     {"d", "bs", "nh", "nkv", "w", "causal"},
     5,
     "",
     "const dflash::kernels::BlockAttentionBwdArgs &args, cudaStream_t stream",
     "args, stream"},
    {kernel_names::kDraftEmbed,
     {"h"},
     -1,
     "",
     "const __nv_bfloat16 *embed, const int32_t *ids, const int32_t *anchors, "
     "const uint8_t *keep, __nv_bfloat16 *out, "
     "dflash::kernels::DraftBlocksShape shape, int mask, float scale, "
     "cudaStream_t stream",
     "embed, ids, anchors, keep, out, nullptr, shape, mask, scale, stream"},
    {kernel_names::kRopeFwd,
     {"d", "h"},
     -1,
     "",
     "const __nv_bfloat16 *x, const int32_t *pos, __nv_bfloat16 *y, int64_t "
     "rows, dflash::kernels::RopeFrequencies freq, cudaStream_t stream",
     "x, pos, y, rows, freq, stream"},
    {kernel_names::kCausalAttentionFwd,
     {"d", "nh", "nkv"},
     -1,
     "",
     "const dflash::kernels::CausalAttentionFwdArgs &args, cudaStream_t "
     "stream",
     "args, stream"},
};

/// The template entry of `name`, or nullptr for a kernel called directly.
constexpr const KernelTemplate *kernelTemplate(std::string_view name) {
  for (const KernelTemplate &t : kKernelTemplates)
    if (t.name == name)
      return &t;
  return nullptr;
}

} // namespace dflash

#endif // DFLASH_SCHEMA_KERNELENTRYPOINTS_H
