//===- Summary.cpp - One-screen summary of a compiled spec ----------------===//

#include "compiler/Driver/Summary.h"

#include "compiler/Analysis/FlopCount.h"
#include "llvm/Support/Format.h"

using namespace dflash;

static std::string humanCount(double v, const char *unit) {
  const char *prefixes[] = {"", " K", " M", " G", " T", " P"};
  int i = 0;
  while (v >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.2f", v) << prefixes[i] << (i ? "" : " ") << unit;
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

void dflash::printStepSummary(llvm::raw_ostream &os, const DrafterSpec &s,
                              mlir::ModuleOp module) {
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
     << " draft slots/row, gamma " << s.gamma << "\n";
  os << "  layers     ";
  for (int64_t i = 0; i < s.numLayers; ++i) {
    const LayerSpec &l = s.layers[i];
    os << (i ? ", " : "") << i << ":"
       << (l.kind == AttentionKind::Sliding
               ? "sliding(" + std::to_string(l.window) + ")"
               : std::string("full"));
  }
  os << "\n";
  int64_t params = s.numParameters();
  os << "  parameters " << humanCount(double(params), "") << "("
     << humanBytes(2.0 * params) << " bf16; "
     << humanBytes(double(params) * (2 + 2 + 4 + 4 + 4))
     << " with grads, fp32 masters and Adam moments)\n";
  FlopCount flops = FlopCount::of(module);
  os << "  FLOPs/step " << humanCount(double(flops.total), "FLOP")
     << " per GPU in this graph:";
  for (auto &[name, n] : flops.byOp)
    if (n)
      os << " " << name.drop_front(7) << " "
         << llvm::format("%.1f%%", 100.0 * double(n) / double(flops.total));
  os << "\n";
}
