//===- Summary.cpp - One-screen summary of a compiled spec ----------------===//

#include "compiler/Driver/Summary.h"

#include "compiler/Analysis/FlopCount.h"
#include "compiler/Analysis/MemoryPlan.h"
#include "kernels/AttentionLimits.h"
#include "schema/Parameters.h"
#include "llvm/Support/Format.h"

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

static std::string humanBytes(double v) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.1f ", v) << units[i];
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
  // whether their shape is on the fast (wgmma) path.
  auto kernelName = [](bool wgmma) { return wgmma ? "wgmma" : "mma.sync"; };
  int64_t D = s.headDim, BS = s.blockSize, NH = s.numHeads, NKV = s.numKvHeads;
  os << "  attention  forward "
     << kernelName(::dflash::kernels::wgmmaForwardSupports(D, BS, NH, NKV))
     << ", backward "
     << kernelName(::dflash::kernels::wgmmaBackwardSupports(D, BS, NH, NKV))
     << " (" << BS * (NH / NKV) << " query rows per block and kv head)\n";
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
