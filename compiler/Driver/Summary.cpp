//===- Summary.cpp - One-screen summary of a compiled spec ----------------===//

#include "compiler/Driver/Summary.h"
#include "compiler/Support/HumanUnits.h"

#include "compiler/Analysis/FlopCount.h"
#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Analysis/StepTime.h"
#include "dialect/DFlashOps.h"
#include "kernels/AttentionLimits.h"
#include "schema/KernelEntryPoints.h"
#include "schema/Parameters.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace ::dflash;

static std::string humanCount(double v, const char *unit) {
  const char *prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (v >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.2f", v) << " " << prefixes[i] << unit;
  return s;
}

/// The memory lines: the step's, and the online target's beside it.
static void printMemory(llvm::raw_ostream &os, mlir::ModuleOp module,
                        mlir::ModuleOp target, bool targetGiven) {
  std::optional<ProgramMemory> step = ProgramMemory::of(module);
  if (!step) {
    os << "  memory     unknown: the step does not lower to kernels "
          "(dflashc --emit=planned says why)\n";
    return;
  }
  os << "  memory     step " << humanBytes(double(step->total()))
     << " per GPU (weights and optimizer state "
     << humanBytes(double(step->fixed())) << ", inputs "
     << humanBytes(double(step->inputs)) << ", activations "
     << humanBytes(double(step->arena)) << ", GEMM workspace "
     << humanBytes(double(step->workspace)) << ")\n";
  std::optional<ProgramMemory> online =
      target ? ProgramMemory::of(target) : std::nullopt;
  if (!online) {
    if (targetGiven)
      os << "             online target unknown: it does not lower to "
            "kernels (dflashc --emit=planned says why)\n";
    return;
  }
  os << "             online target " << humanBytes(double(online->total()))
     << " (frozen weights " << humanBytes(double(online->fixed()))
     << ", inputs " << humanBytes(double(online->inputs)) << ", features "
     << humanBytes(double(online->features));
  if (online->outputs)
    os << ", other results " << humanBytes(double(online->outputs));
  // The features are the step's target_hidden input, counted there too.
  os << ", activations " << humanBytes(double(online->arena)) << "): "
     << humanBytes(double(step->total() + online->total() - online->features))
     << " on a GPU that holds both (train --target-gpus gives the target "
        "GPUs of its own)\n";
}

/// The FLOPs line: the step's, by phase, with each phase's largest op kinds.
static void printFlops(llvm::raw_ostream &os, const FlopCount &flops) {
  os << "  FLOPs/step " << humanCount(double(flops.step()), "FLOP")
     << " per GPU";
  for (int p = 0; p < 3; ++p) {
    if (!flops.total[p])
      continue;
    os << (p ? ", " : ": ") << FlopCount::phaseNames[p] << " "
       << humanCount(double(flops.total[p]), "");
    // The three largest op kinds of the phase.
    llvm::SmallVector<std::pair<int64_t, llvm::StringRef>> kinds;
    for (auto &[name, n] : flops.byOp[p])
      kinds.push_back({n, name});
    llvm::sort(kinds, [](auto &a, auto &b) { return a.first > b.first; });
    os << " (";
    for (size_t k = 0; k < kinds.size() && k < 3 && kinds[k].first; ++k)
      os << (k ? " " : "") << kinds[k].second.drop_front(7) << " "
         << llvm::format("%.0f%%", 100.0 * double(kinds[k].first) /
                                       double(flops.total[p]));
    os << ")";
  }
  os << "\n";
}

/// An online target's expert GEMMs, each at its depth's rate, and the bytes
/// its routed rows' copies move (compiler/Analysis/StepTime.h).
static void addExpertWork(mlir::func::FuncOp target, TargetWork &work) {
  auto bytes = [](mlir::Value v) { return double(tensorBytes(v.getType())); };
  auto depthOf = [](mlir::Value weight) {
    return mlir::cast<mlir::RankedTensorType>(weight.getType()).getDimSize(2);
  };
  target.walk([&](mlir::Operation *op) {
    int64_t flops = 0, depth = 0;
    if (auto g = mlir::dyn_cast<mlir::dflash::GroupedLinearOp>(op)) {
      flops = g.getFlopCount();
      depth = depthOf(g.getWeight());
    } else if (auto g =
                   mlir::dyn_cast<mlir::dflash::GroupedLinearSwigluOp>(op)) {
      flops = g.getFlopCount();
      depth = depthOf(g.getGateWeight());
    } else if (auto p = mlir::dyn_cast<mlir::dflash::MoePermuteOp>(op)) {
      work.routedBytes += bytes(p.getInput()) + bytes(p.getPermuted());
    } else if (auto u = mlir::dyn_cast<mlir::dflash::MoeUnpermuteOp>(op)) {
      work.routedBytes += bytes(u.getPermuted()) + bytes(u.getResult());
    }
    if (flops == 0)
      return;
    work.expertFlops += flops;
    work.expertH200Seconds +=
        double(flops) / (expertGemmH200Tflops(double(depth)) * 1e12);
  });
}

/// The time lines: a step's time on an H100 and an H200 from its FLOPs at the
/// rates bench/RESULTS.md measured (compiler/Analysis/StepTime.h), and the
/// context tokens a GPU trains on an hour; with the online target on the
/// same GPU (`target`, its forward; null without one), its forward's time
/// added.
static void printTime(llvm::raw_ostream &os, const DrafterSpec &s,
                      const FlopCount &flops, mlir::func::FuncOp target) {
  const int64_t stepFlops = flops.step();
  // The target's forward: its causal attention, Gated DeltaNet and expert
  // GEMMs apart from the rest, each at its own rate.
  TargetWork work;
  if (target) {
    const FlopCount counts = FlopCount::of(target);
    work.flops = counts.step();
    work.attentionFlops = counts.byOp[FlopCount::Forward].lookup(
        mlir::dflash::CausalAttentionOp::getOperationName());
    work.deltaRuleFlops = counts.byOp[FlopCount::Forward].lookup(
        mlir::dflash::GatedDeltaRuleOp::getOperationName());
    addExpertWork(target, work);
  }
  const int64_t attentionFlops =
      flops.byOp[0].lookup(mlir::dflash::BlockAttentionOp::getOperationName()) +
      flops.byOp[1].lookup(
          mlir::dflash::BlockAttentionGradOp::getOperationName());
  // Below about 10 ms of tensor-core work a step is bound by its launches
  // and its memory traffic, not its FLOPs (tiny's 2 GFLOP step takes 0.67
  // ms on the H200, bench/RESULTS.md): no rate tells its time.
  if (estimatedStepSeconds(stepFlops, attentionFlops, kH200) <
      kSmallestEstimatedStepSeconds) {
    os << "  time/step  too little work for its FLOPs to tell (under "
       << llvm::formatv("{0:F0}", kSmallestEstimatedStepSeconds * 1e3)
       << " ms at the H200's rate: launches and memory latency dominate)\n";
    return;
  }
  auto ms = [](double seconds) {
    return llvm::formatv("{0:F0} ms", seconds * 1e3).str();
  };
  const double tokens = double(s.rowsPerStep() * s.seqLen);
  auto perHour = [&](double seconds) {
    return humanCount(tokens * 3600 / seconds, "");
  };
  std::string times, rates, online, onlineRates;
  for (const GpuEstimate &gpu : kEstimatedGpus) {
    double t = estimatedStepSeconds(stepFlops, attentionFlops, gpu);
    const char *sep = times.empty() ? "" : ", ";
    times += sep + ms(t) + " on an " + gpu.name;
    rates += sep + perHour(t) + " on an " + gpu.name;
    if (target) {
      t += estimatedTargetSeconds(work, gpu);
      online += sep + ms(t) + " on an " + gpu.name;
      onlineRates += sep + perHour(t) + " on an " + gpu.name;
    }
  }
  os << "  time/step  about " << times << " (block attention at the "
     << llvm::formatv("{0:F0}", kH200AttentionTflops)
     << " TFLOP/s its kernels reach in a long step, the rest at the "
     << llvm::formatv("{0:F0}", kH200StepRestTflops)
     << " TFLOP/s that make the qwen3-8b-b16 step's time, on an H200; "
        "scaled by each GPU's GEMM ceiling)\n";
  if (target) {
    os << "             with the online target on the same GPU about " << online
       << " (its projections and the rest at "
       << llvm::formatv("{0:F0}", kH200TargetRestTflops) << " TFLOP/s";
    if (work.attentionFlops)
      os << ", its causal attention at "
         << llvm::formatv("{0:F0}", kH200TargetAttentionTflops);
    if (work.deltaRuleFlops)
      os << ", its Gated DeltaNet at "
         << llvm::formatv("{0:F0}", kH200TargetDeltaRuleTflops);
    if (work.expertFlops)
      os << ", its expert GEMMs at "
         << llvm::formatv("{0:F0}",
                          work.expertFlops / (work.expertH200Seconds * 1e12))
         << " by their depth, its routed rows' copies at "
         << llvm::formatv("{0:F1}", kH200RoutedBytesPerSecond / 1e12)
         << " TB/s";
    os << ", on an H200)\n";
  }
  os << "  tokens/h   about " << rates << " per GPU (" << s.rowsPerStep()
     << " rows x " << s.seqLen << " context tokens a step)";
  if (target)
    os << "; with the online target on the same GPU " << onlineRates;
  os << "\n";
}

void dflash::printStepSummary(llvm::raw_ostream &os, const DrafterSpec &s,
                              mlir::ModuleOp module, mlir::ModuleOp target,
                              bool targetGiven) {
  os << "dflashc: " << s.name << " (" << s.file << ")\n";
  os << "  target     " << (s.targetModel.empty() ? "(unnamed)" : s.targetModel)
     << ": " << s.targetNumLayers << " layers, hidden " << s.targetHiddenSize
     << ", vocab " << s.vocabSize << ", taps [";
  for (size_t i = 0; i < s.targetLayerIds.size(); ++i)
    os << (i ? ", " : "") << s.targetLayerIds[i];
  os << "]" << (s.targetLayerIdsDefaulted ? " (spread rule)" : "")
     << (s.tieWordEmbeddings ? ", tied embeddings" : "") << "\n";
  os << "  drafter    " << s.numLayers << " layers, hidden " << s.hiddenSize
     << ", mlp " << s.intermediateSize << ", heads " << s.numHeads << "/"
     << s.numKvHeads << " x " << s.headDim << ", block " << s.blockSize
     << ", mask token " << s.maskTokenId << "\n";
  os << "  step       " << s.rowsPerGpu << " rows/GPU x " << s.seqLen
     << " context, " << s.anchorsPerRow << " anchors -> " << s.draftLength()
     << " draft slots/row, gamma " << llvm::format("%g", s.gamma) << "\n";
  if (s.gradientAccumulation > 1)
    os << "  accumulate " << s.gradientAccumulation << " micro-batches of "
       << s.rowsPerGpu << " rows per optimizer step (" << s.rowsPerStep()
       << " rows/GPU)\n";
  os << "  layers     ";
  for (int64_t i = 0; i < s.numLayers; ++i) {
    const int64_t window = s.layerWindows[size_t(i)];
    os << (i ? ", " : "") << i << ":"
       << (window > 0 ? "sliding(" + std::to_string(window) + ")"
                      : std::string("full"));
  }
  os << "\n";
  // The attention kernels the generated step's dispatchers pick: users see
  // whether their shape is on the fast (wgmma) path, and which layers the
  // warp-specialised forward runs (and whether its consumers take turns) and
  // whether the backward's key tiles run in clusters or one pair at a time
  // (dflash-select-kernels' choices, in the planned step).
  auto kernelName = [](bool wgmma) { return wgmma ? "wgmma" : "mma.sync"; };
  int64_t D = s.headDim, BS = s.blockSize, NH = s.numHeads, NKV = s.numKvHeads;
  bool wsSelected = false, pingpongSelected = false, clusterSelected = false,
       pairByPairSelected = false;
  module.walk([&](mlir::Operation *op) {
    auto kernel = op->getAttrOfType<mlir::dflash::KernelAttr>(kKernelAttrName);
    if (!kernel)
      return;
    const std::string name = kernel.getName().str();
    wsSelected |= name == kernel_names::kBlockAttentionFwdWs;
    pingpongSelected |= name == kernel_names::kBlockAttentionFwdWsPingpong;
    clusterSelected |= name == kernel_names::kBlockAttentionBwdCluster;
    pairByPairSelected |= name == kernel_names::kBlockAttentionBwdPairByPair;
  });
  int64_t longLayers = 0;
  for (int64_t i = 0; i < s.numLayers; ++i)
    longLayers += ::dflash::kernels::warpSpecialisedForwardPays(
        D, BS, NH, NKV, s.layerWindows[size_t(i)], s.blockCausal(i), s.seqLen);
  auto layers = [](int64_t n) {
    return std::to_string(n) +
           (n == 1 ? " long-context layer" : " long-context layers");
  };
  os << "  attention  forward "
     << kernelName(::dflash::kernels::wgmmaForwardSupports(D, BS, NH, NKV));
  if (pingpongSelected)
    os << " (warp-specialised, consumers in turns, on its "
       << layers(longLayers) << ")";
  else if (wsSelected)
    os << " (warp-specialised on its " << layers(longLayers) << ")";
  os << ", backward "
     << kernelName(::dflash::kernels::wgmmaBackwardSupports(D, BS, NH, NKV))
     << " (" << BS * (NH / NKV) << " query rows per block and kv head";
  if (clusterSelected)
    os << "; key tiles in clusters of two";
  if (pairByPairSelected)
    os << "; key tiles one (row, kv head) pair at a time";
  os << ")\n";
  int64_t params = numParameters(s);
  os << "  parameters " << humanCount(double(params), "") << " ("
     << humanBytes(2.0 * params) << " bf16; "
     << humanBytes(double(params) * (2 + 2 + 4 + 4 + 4))
     << " with grads, fp32 masters and Adam moments";
  // ZeRO-1: each rank keeps 1/N of the 12 bytes of fp32 state.
  if (s.shardOptimizerState) {
    int64_t ranks = s.gpusPerNode * s.nodes;
    os << "; " << humanBytes(double(params) * (2 + 2 + 12.0 / double(ranks)))
       << " per GPU with the state sharded over " << ranks << " GPUs";
  }
  os << ")\n";
  printMemory(os, module, target, targetGiven);
  auto step = module.lookupSymbol<mlir::func::FuncOp>("step");
  if (!step)
    return;
  FlopCount flops = FlopCount::of(step);
  printFlops(os, flops);
  mlir::func::FuncOp targetForward;
  if (target)
    if (mlir::FailureOr<StepSignature> sig = StepSignature::get(target);
        succeeded(sig))
      targetForward = sig->func();
  printTime(os, s, flops, targetForward);
}
