//===- ProgramTables.cpp - A program's buffers, slots and tables ----------===//

#include "compiler/Target/Cuda/StepEmitter.h"

#include "compiler/Analysis/FlopCount.h"
#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/ModelConfigAttr.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Target/Cuda/Manifest.h"
#include "dialect/DFlashOps.h"
#include "kernels/Workspaces.h"
#include "schema/KernelEntryPoints.h"
#include "schema/Parameters.h"
#include "schema/StepBuffers.h"

#include "compiler/Target/Cuda/CudaText.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <array>

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace dflash::cuda_printer {

LogicalResult StepEmitter::nameBuffers() {
  func::FuncOp step = sig.func();
  for (unsigned i = 0; i < step.getNumArguments(); ++i) {
    ArgAttr info = sig.argInfo(i);
    std::string base = identifier(info.getName());
    switch (info.getRole()) {
    case ArgRole::Master:
      base += "_master";
      break;
    case ArgRole::Moment1:
      base += "_moment1";
      break;
    case ArgRole::Moment2:
      base += "_moment2";
      break;
    default:
      break;
    }
    std::string name = uniqueName("buffer", base);
    bufferName[i] = name;
    bufferNames += "constexpr int " + name + " = " + std::to_string(i) + ";\n";
  }
  return success();
}

LogicalResult StepEmitter::nameSlots() {
  for (Operation &op : sig.func().front().without_terminator()) {
    auto offsets = op.getAttrOfType<DenseI64ArrayAttr>(kOffsetsAttrName);
    if (!offsets)
      return op.emitOpError("has no memory plan: run dflash-plan-memory "
                            "before translation to CUDA");
    std::string base;
    if (auto loc = dyn_cast<NameLoc>(op.getLoc()))
      base = identifier(loc.getName().getValue()) + "_";
    base += identifier(op.getName().stripDialect());
    for (auto [i, r] : llvm::enumerate(op.getResults())) {
      if (storageRoot(r) != r || offsets[i] < 0)
        continue;
      std::string name = uniqueName(
          "slot", base + (op.getNumResults() > 1 ? "_" + std::to_string(i)
                                                 : std::string()));
      slotName[r] = name;
      slotNames += llvm::formatv("constexpr dflash::rt::ArenaSlot {0}{{{1}, "
                                 "{2}};\n",
                                 name, offsets[i], tensorBytes(r.getType()));
    }
    auto named = [&](StringRef attr, StringRef suffix, int64_t bytes,
                     llvm::DenseMap<Operation *, std::string> &names) {
      auto offset = op.getAttrOfType<IntegerAttr>(attr);
      if (!offset)
        return;
      std::string name = uniqueName("slot", base + suffix.str());
      slotNames += llvm::formatv("constexpr dflash::rt::ArenaSlot {0}{{{1}, "
                                 "{2}};\n",
                                 name, offset.getInt(), bytes);
      names[&op] = name;
    };
    if (KernelAttr kernel = kernelOf(&op)) {
      named(kWorkspaceOffsetAttrName, "_workspace", kernel.getWorkspace(),
            workspaceSlot);
      named(kTablesOffsetAttrName, "_tables", kernel.getTables(), tablesSlot);
    }
  }
  return success();
}

std::string StepEmitter::ptr(Value v) {
  std::string type = cType(tensorOf(v).getElementType());
  Value root = storageRoot(v);
  std::string base;
  if (auto arg = dyn_cast<BlockArgument>(root))
    base = "at<" + type + ">(" + bufferRef(arg) + ")";
  else if (auto it = outputBuffer.find(root); it != outputBuffer.end())
    base = "at<" + type + ">(buffer::" + it->second + ")";
  else
    base = "at<" + type + ">(slot::" + slotName.lookup(root) + ")";
  // A micro-batch's rows of a step-wide value.
  int64_t offset = viewByteOffset(v);
  if (offset == 0)
    return base;
  int64_t elementBytes =
      tensorBytes(v.getType()) / tensorOf(v).getNumElements();
  return "(" + base + " + " + std::to_string(offset / elementBytes) + ")";
}

std::string StepEmitter::workspace(Operation *op, StringRef type) {
  return "at<" + type.str() + ">(slot::" + workspaceSlot.lookup(op) + ")";
}

FailureOr<int64_t> StepEmitter::bufferIndex(unsigned i) {
  ArgAttr info = sig.argInfo(i);
  std::string name = info.getName().str();
  std::optional<int64_t> index;
  switch (bufferRole(info.getRole())) {
  case BufferRole::Input:
    if (auto input = parseStepInput(name))
      index = int64_t(*input);
    break;
  case BufferRole::Frozen:
    // A target decoder's weights are loaded by their checkpoint names.
    if (sig.isTarget())
      index = -1;
    else if (auto frozen = parseFrozenWeight(name))
      index = int64_t(*frozen);
    break;
  case BufferRole::Counter:
    if (auto counter = parseStepCounter(name))
      index = int64_t(*counter);
    break;
  case BufferRole::Metric:
    index = metricSchemaIndex(name);
    break;
  case BufferRole::Master:
  case BufferRole::Moment1:
  case BufferRole::Moment2:
    if (shardedOptimizer) {
      // ZeRO-1: the state is one buffer per bucket, in bucket order.
      AdamWShardedOp o = *shardedOptimizer;
      for (auto values : {o.getMasters(), o.getMoment1(), o.getMoment2()})
        for (auto [k, v] : llvm::enumerate(values))
          if (auto a = dyn_cast<BlockArgument>(v); a && a.getArgNumber() == i)
            index = int64_t(k);
      break;
    }
    [[fallthrough]];
  case BufferRole::Parameter:
    index = findParameter(config, name);
    break;
  }
  if (!index)
    return sig.func().emitError()
           << "@step argument " << i << " ('" << name << "', role "
           << nameOf(bufferRole(info.getRole()))
           << ") is not a buffer the schema knows";
  return *index;
}

std::string StepEmitter::optimizerTables() {
  // One row per trainable tensor: the bf16 gradient one GPU reads and its
  // fp32 bucket copy several GPUs all-reduce.
  std::string rows;
  AdamWMultiOp o = *optimizer;
  for (unsigned i = 0; i < o.getNumParams(); ++i) {
    Value g = o.getGrads()[i], bf16Grad = g;
    if (auto bucket = g.getDefiningOp<GradientBucketOp>())
      bf16Grad = bucket.getGrads()[cast<OpResult>(g).getResultNumber()];
    auto offsetOf = [&](Value v) {
      return "slot::" + slotName.lookup(storageRoot(v));
    };
    rows +=
        llvm::formatv("      {{{0}, {1}, {2}, {3}, {4}, {5}, {6}},\n",
                      bufferRef(o.getParams()[i]), bufferRef(o.getMasters()[i]),
                      bufferRef(o.getMoment1()[i]),
                      bufferRef(o.getMoment2()[i]), offsetOf(bf16Grad),
                      offsetOf(g), tensorOf(o.getParams()[i]).getNumElements());
  }
  return "  t.adamwRows = {\n      // {param, master, moment1, moment2, "
         "bf16 grad, fp32 grad, numel}\n" +
         rows + "  };\n";
}

std::string StepEmitter::shardTables() {
  AdamWShardedOp o = *shardedOptimizer;
  SmallVector<GradientBucketOp> buckets = shardedBuckets(o);
  std::string s;
  llvm::raw_string_ostream is(s);
  is << "  // ZeRO-1: which flat elements of each bucket hold which tensor\n"
     << "  // ({name, offset, numel, parameter}), and each rank's shard.\n"
     << "  t.sharded = true;\n"
     << "  t.shardLayout.worldSize = " << o.getWorldSizeAttr().getInt()
     << ";\n  t.shardLayout.buckets = {\n";
  std::string refs;
  for (auto [k, bucket] : llvm::enumerate(buckets)) {
    SmallVector<int64_t> offsets = bucketResultOffsets(bucket);
    is << "      {{\n";
    std::string params;
    for (auto [r, offset] : llvm::zip(bucket.getResults(), offsets)) {
      unsigned i = unsigned(llvm::find(o.getGrads(), r) - o.getGrads().begin());
      auto param = cast<BlockArgument>(o.getParams()[i]);
      std::string name = sig.argInfo(param.getArgNumber()).getName().str();
      is << "           {" << quoted(name) << ", " << offset / 4 << ", "
         << tensorOf(param).getNumElements() << ", "
         << findParameter(config, name).value_or(-1) << "},\n";
      params += (params.empty() ? "" : ", ") + bufferRef(param);
    }
    is << "       },\n       " << bucket.getShardElementsAttr().getInt()
       << "},\n";
    refs += llvm::formatv(
        "      {{slot::{0}, {1}, {2}, {3}, {{{4}}},\n",
        slotName.lookup(bucket.getResult(0)), bufferRef(o.getMasters()[k]),
        bufferRef(o.getMoment1()[k]), bufferRef(o.getMoment2()[k]), params);
  }
  is << "  };\n"
     << "  // {gradients, master, moment1, moment2, {parameters}} per bucket.\n"
     << "  t.shardRefs = {\n"
     << refs << "  };\n";
  return s;
}

FailureOr<std::string> StepEmitter::emit() {
  func::FuncOp step = sig.func();
  auto arena = module->getAttrOfType<IntegerAttr>(kArenaBytesAttrName);
  if (!arena)
    return module.emitError("the module has no memory plan: run "
                            "dflash-plan-memory before translation to CUDA");
  if (failed(nameBuffers()) || failed(nameSlots()))
    return failure();
  // A target program's results are buffers after the arguments: its
  // features, bound to the step's input of the same name, and metrics the
  // runtime only reports (a sparse layer's expert ids); the op that makes
  // one writes it there directly.
  func::ReturnOp ret = sig.returnOp();
  std::string outputSpecs;
  if (sig.isTarget()) {
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      ArgAttr info = sig.resultInfo(i);
      Value root = storageRoot(ret.getOperand(i));
      std::optional<StepInput> input = parseStepInput(info.getName().str());
      const bool reported = info.getRole() == ArgRole::Metric;
      if ((!reported && (info.getRole() != ArgRole::Input || !input)) ||
          isa<BlockArgument>(root) || outputBuffer.count(root))
        return step.emitError()
               << "result " << i << " ('" << info.getName()
               << "') of @target is neither a step input nor a metric "
                  "computed by the program";
      std::string name = uniqueName("buffer", identifier(info.getName()));
      bufferNames += "constexpr int " + name + " = " +
                     std::to_string(step.getNumArguments() + i) + ";\n";
      outputBuffer[root] = name;
      auto t = tensorOf(root);
      outputSpecs += "      {" + quoted(info.getName()) +
                     ", BufferRole::" + (reported ? "Metric" : "Input") +
                     ", DType::" + dtypeName(dtypeOf(t.getElementType())) +
                     ", " + intList(t.getShape()) + ", " +
                     std::to_string(reported ? int64_t(-1) : int64_t(*input)) +
                     "},\n";
    }
  }
  for (Operation &op : step.front().without_terminator())
    if (failed(emitOp(&op)))
      return failure();

  // Results: state must have been updated in place; metrics are copied
  // into their buffers, which follow the arguments.
  unsigned metricIndex = step.getNumArguments();
  std::string metricCopies, metricSpecs = outputSpecs;
  // An evaluation's draft slots, by micro-batch (schema DraftSlots), and a
  // "covered" objective's parts (schema ObjectivePart).
  std::array<int64_t, kNumDraftSlots> draftSlotsSeen{};
  for (unsigned i = 0; i < ret.getNumOperands() && !sig.isTarget(); ++i) {
    ArgAttr info = sig.resultInfo(i);
    Value v = ret.getOperand(i);
    if (info.getRole() == ArgRole::Metric) {
      const std::string metric = info.getName().str();
      std::optional<int64_t> named = metricSchemaIndex(metric);
      if (sig.isEval()) {
        if (std::optional<DraftSlots> slots = parseDraftSlots(metric))
          named = draftSlotsIndex(*slots, draftSlotsSeen[size_t(*slots)]++);
        else if (std::optional<ObjectivePart> part = parseObjectivePart(metric))
          // After every micro-batch's draft slots (MakeEvalProgram).
          named = objectivePartIndex(*part,
                                     draftSlotsSeen[size_t(DraftSlots::Hits)]);
      }
      std::string name = uniqueName("buffer", identifier(info.getName()));
      bufferNames += "constexpr int " + name + " = " +
                     std::to_string(metricIndex++) + ";\n";
      metricSpecs += "      {" + quoted(info.getName()) +
                     ", BufferRole::Metric, DType::" +
                     dtypeName(dtypeOf(tensorOf(v).getElementType())) + ", " +
                     intList(tensorOf(v).getShape()) + ", " +
                     std::to_string(named ? int64_t(*named) : -1) + "},\n";
      metricCopies +=
          llvm::formatv("    copy(at<float>(buffer::{0}), {1}, {2}, "
                        "stream, \"copy metric {3}\");\n",
                        name, ptr(v), tensorBytes(v.getType()), info.getName());
      continue;
    }
    std::optional<unsigned> arg = sig.findArg(info.getRole(), info.getName());
    auto root = dyn_cast<BlockArgument>(storageRoot(v));
    if (!arg || !root || root.getArgNumber() != *arg)
      return step.emitError() << "result '" << info.getName()
                              << "' is not updated in place in its argument";
  }

  // Buffers, in binding order: the arguments, then the metrics.
  std::string specs;
  for (unsigned i = 0; i < step.getNumArguments(); ++i) {
    ArgAttr info = sig.argInfo(i);
    auto t = tensorOf(step.getArgument(i));
    FailureOr<int64_t> index = bufferIndex(i);
    if (failed(index))
      return failure();
    specs += "      {" + quoted(info.getName()) +
             ", BufferRole::" + enumeratorOf(bufferRole(info.getRole())) +
             ", DType::" + dtypeName(dtypeOf(t.getElementType())) + ", " +
             intList(t.getShape()) + ", " + std::to_string(*index) + "},\n";
  }
  specs += metricSpecs;

  // The step's optimizer tables; an evaluation and a target have none.
  std::string optimizerInit;
  if (!sig.isEval() && !sig.isTarget()) {
    if (!optimizerKernel)
      return step.emitError("@step has no optimizer op with a dflash.kernel");
    Operation *optimizerOp = optimizer ? optimizer->getOperation()
                                       : shardedOptimizer->getOperation();
    std::string tablesName = tablesSlot.lookup(optimizerOp);
    if (tablesName.empty())
      return optimizerOp->emitOpError("has no planned tables slot: run "
                                      "dflash-plan-memory after "
                                      "dflash-select-kernels");
    optimizerInit =
        "  t.optimizerTables = slot::" + tablesName + ";\n" +
        "  t.maxChunks = " + std::to_string(optimizerKernel.getConstants()[1]) +
        ";\n" + (optimizer ? optimizerTables() : shardTables()) +
        "  t.numBuckets = " + std::to_string(numBuckets) + ";\n";
  } else if (optimizerKernel) {
    return step.emitError()
           << "@" << step.getSymName() << " has an optimizer op";
  }

  // The draft-block kernels' shapes: a micro-batch's rows (the step's
  // without gradient accumulation).
  const int64_t B = config.rowsPerGpu, S = config.seqLen,
                N = config.anchorsPerRow;
  double flops = double(FlopCount::of(step).step());
  // The step's block attention by kind of layer, which the trainer counts
  // again at the anchors it draws (schema/AttentionWork.h).
  std::string attentionInit;
  if (!sig.isEval() && !sig.isTarget()) {
    std::string kinds;
    for (const AttentionKindFlops &kind :
         attentionByKind(step, config.rowsPerStep()))
      kinds += llvm::formatv("      {{{0}, {1}, {2}, {3}},\n", kind.window,
                             kind.causal ? "true" : "false",
                             llvm::format("%.17g", kind.counted),
                             llvm::format("%.17g", kind.perPair))
                   .str();
    if (!kinds.empty())
      attentionInit = "  t.attentionKinds = {\n" + kinds + "  };\n";
  }
  std::string profileNames;
  for (size_t i = 0; i < opNames.size(); ++i)
    profileNames += "      " + quoted(opNames[i]) + ",\n";
  std::string configInit;
  forEachModelConfigField(
      config, [&](const char *, const char *member, const auto &value) {
        configInit +=
            std::string("  c.") + member + " = " + cppValue(value) + ";\n";
      });

  const bool eval = sig.isEval(), target = sig.isTarget();
  // Only a mixture-of-experts target's program instantiates its kernels,
  // only a hybrid target's the DeltaNet's, only a DFlash2 drafter's step
  // the selector's and the grouped convolution's.
  bool hasMoe = false, hasDeltaNet = false, hasSelector = false,
       hasGroupedConv = false;
  step.walk([&](Operation *op) {
    hasSelector |=
        isa<SelectorCandidatesOp, SelectorCandidatesGradOp, SelectorLossOp,
            SelectorLossGradOp, DraftPredecessorsOp, SelectorAlphaOp,
            SelectorObjectiveOp, SelectorObjectiveGradOp>(op);
    hasGroupedConv |= isa<GroupedConvOp, GroupedConvGradOp>(op);
    hasMoe |= isa<MoeRouteOp, MoePermuteOp, GroupedLinearOp,
                  GroupedLinearSwigluOp, MoeUnpermuteOp>(op);
    hasDeltaNet |= isa<CausalConvOp, GatedDeltaRuleOp, GatedRmsNormOp,
                       ZeroCentredRmsNormOp, PartialRopeOp, SigmoidGateOp>(op);
  });
  const std::string specFile = specFileOf(module);
  const char *className = target ? "GeneratedTarget"
                          : eval ? "GeneratedEval"
                                 : "GeneratedStep";
  const char *factory = target ? "createTargetProgram"
                        : eval ? "createEvalProgram"
                               : "createStepProgram";
  std::string s;
  llvm::raw_string_ostream cu(s);
  cu << "// Generated by dflashc from " << specFile << ": the "
     << (target ? "online target's forward (its tapped features into the "
                  "step's target_hidden)"
         : eval ? "evaluation program (the forward alone, its sums summed "
                  "over the GPUs)"
                : "training step")
     << " of \"" << config.name << "\".\n"
     << "// Do not edit; regenerate with `dflashc " << specFile
     << (target ? " --target DIR" : "") << " --emit=cuda`.\n"
     << "// Constant tables, then schedule(): the static launch sequence of "
        "one "
     << (eval || target ? "batch" : "step") << ".\n\n"
     << "#include \"kernels.h\"\n"
     << (hasGroupedConv ? "#include \"kernels/DFlash2Conv.cuh\"\n" : "")
     << (hasSelector ? "#include \"kernels/DFlash2Selector.cuh\"\n" : "")
     << "#include \"kernels/DraftBlocks.cuh\"\n"
     << "#include \"kernels/Embedding.cuh\"\n"
     << (hasDeltaNet ? "#include \"kernels/GatedDeltaRule.cuh\"\n" : "")
     << "#include \"kernels/Gemm.cuh\"\n"
     << (hasDeltaNet ? "#include \"kernels/HybridOps.cuh\"\n" : "")
     << "#include \"kernels/LmHeadCrossEntropy.cuh\"\n"
     << (hasMoe ? "#include \"kernels/Moe.cuh\"\n" : "")
     << "#include \"kernels/StepScalars.cuh\"\n"
     << "#include \"kernels/SwiGlu.cuh\"\n"
     << "#include \"kernels/SwiGluGemm.cuh\"\n"
     << "#include \"kernels/Workspaces.h\"\n"
     << "#include \"runtime/device/CompiledStep.h\"\n\n"
     << "namespace {\n\n"
     << "using dflash::BufferRole;\nusing dflash::DType;\n\n"
     << llvm::formatv("constexpr dflash::kernels::DraftBlocksShape kBlocks{{"
                      "{0}, {1}, {2}, {3}};\n\n",
                      B, S, N, config.blockSize)
     << "// The persistent buffers, by binding order.\n"
     << "namespace buffer {\n"
     << bufferNames << "} // namespace buffer\n\n"
     << "// Arena slots of dflash-plan-memory: {offset, bytes}.\n"
     << "namespace slot {\n"
     << slotNames << "} // namespace slot\n\n"
     << "dflash::ModelConfig modelConfig() {\n"
     << "  dflash::ModelConfig c;\n"
     << configInit << "  return c;\n}\n\n"
     << "dflash::rt::CompiledStepTables tables() {\n"
     << "  dflash::rt::CompiledStepTables t;\n"
     << "  t.config = modelConfig();\n"
     << "  t.buffers = {\n"
     << specs << "  };\n"
     << "  t.arenaBytes = " << arena.getInt() << ";\n"
     << "  t.gemmWorkspaceBytes = dflash::kernels::kGemmWorkspaceBytes;\n"
     << "  t.flopsPerStep = " << llvm::format("%.17g", flops) << ";\n"
     << attentionInit << optimizerInit << "  t.opNames = {\n"
     << profileNames << "  };\n"
     << "  return t;\n}\n\n"
     << "class " << className << " final : public dflash::rt::CompiledStep {\n"
     << "public:\n"
     << "  " << className << "() : CompiledStep(tables()) {}\n\n"
     << "private:\n"
     << "  void schedule(cudaStream_t stream) override {\n"
     << body << metricCopies << "  }\n"
     << "};\n\n"
     << "} // namespace\n\n"
     << "std::unique_ptr<dflash::rt::StepProgram> dflash::rt::" << factory
     << "() {\n"
     << "  return std::make_unique<" << className << ">();\n}\n";
  return s;
}

} // namespace dflash::cuda_printer
