//===- Manifest.cpp - manifest.json of a generated trainer ----------------===//

#include "compiler/Target/Cuda/Manifest.h"

#include "compiler/Analysis/FlopCount.h"
#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/ModelConfigAttr.h"
#include "dialect/DFlashOps.h"
#include "kernels/Workspaces.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::dflash;
namespace json = llvm::json;

static const char *roleName(ArgRole role) {
  return stringifyArgRole(role).data();
}

static json::Array shapeOf(Type type) {
  json::Array a;
  for (int64_t d : cast<RankedTensorType>(type).getShape())
    a.push_back(d);
  return a;
}

namespace dflash {
std::string writeManifest(ModuleOp module, const ModelConfig &spec,
                          const StepSignature &sig) {
  func::FuncOp step = sig.func();
  json::Array buffers, parameters, kernels;
  int64_t argBytes = 0;
  for (unsigned i = 0; i < step.getNumArguments(); ++i) {
    ArgAttr info = sig.argInfo(i);
    Type t = step.getArgument(i).getType();
    int64_t bytes = tensorBytes(t);
    argBytes += bytes;
    buffers.push_back(json::Object{{"name", info.getName()},
                                   {"role", roleName(info.getRole())},
                                   {"shape", shapeOf(t)},
                                   {"bytes", bytes}});
    if (info.getRole() == ArgRole::Parameter)
      parameters.push_back(
          json::Object{{"name", info.getName()}, {"shape", shapeOf(t)}});
  }
  for (unsigned i = 0; i < step.getNumResults(); ++i)
    if (sig.resultInfo(i).getRole() == ArgRole::Metric)
      buffers.push_back(json::Object{{"name", sig.resultInfo(i).getName()},
                                     {"role", "metric"},
                                     {"shape", json::Array()},
                                     {"bytes", 4}});
  for (Operation &op : step.front().without_terminator()) {
    auto counted = dyn_cast<FlopCountOpInterface>(op);
    json::Object k{{"op", op.getName().getStringRef()},
                   {"flops", counted ? counted.getFlopCount() : 0}};
    if (mlir::dflash::KernelAttr kernel = kernelOf(&op))
      k["kernel"] = kernel.getName();
    if (auto name = dyn_cast<NameLoc>(op.getLoc()))
      k["at"] = name.getName().getValue();
    kernels.push_back(std::move(k));
  }
  FlopCount flops = FlopCount::of(step);
  auto arena = module->getAttrOfType<IntegerAttr>(kArenaBytesAttrName);
  int64_t arenaBytes = arena ? arena.getInt() : 0;
  const int64_t workspace = int64_t(kernels::kGemmWorkspaceBytes);
  json::Array windows;
  for (int64_t window : spec.layerWindows)
    windows.push_back(window);
  json::Object manifest{
      {"spec", specFileOf(module)},
      {"name", spec.name},
      {"shapes",
       json::Object{{"rows_per_gpu", spec.rowsPerGpu},
                    {"gradient_accumulation", spec.gradientAccumulation},
                    {"seq_len", spec.seqLen},
                    {"anchors_per_row", spec.anchorsPerRow},
                    {"block_size", spec.blockSize},
                    {"hidden_size", spec.hiddenSize},
                    {"num_layers", spec.numLayers},
                    {"layer_windows", std::move(windows)},
                    {"vocab_size", spec.vocabSize}}},
      {"flops_per_step",
       json::Object{{"forward", flops.total[FlopCount::Forward]},
                    {"backward", flops.total[FlopCount::Backward]},
                    {"optimizer", flops.total[FlopCount::Optimizer]},
                    {"total", flops.step()}}},
      {"memory",
       json::Object{{"arguments_bytes", argBytes},
                    {"arena_bytes", arenaBytes},
                    {"gemm_workspace_bytes", workspace},
                    {"total_bytes", argBytes + arenaBytes + workspace}}},
      {"buffers", std::move(buffers)},
      {"parameters", std::move(parameters)},
      {"kernels", std::move(kernels)}};
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("{0:2}", json::Value(std::move(manifest))) << "\n";
  return s;
}
} // namespace dflash
