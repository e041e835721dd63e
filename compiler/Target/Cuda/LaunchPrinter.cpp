//===- LaunchPrinter.cpp - One kernel launch an op ------------------------===//

#include "compiler/Target/Cuda/StepEmitter.h"

#include "compiler/Analysis/FlopCount.h"
#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/ModelConfigAttr.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Target/Cuda/Manifest.h"
#include "dialect/DFlashOps.h"
#include "kernels/RopeFrequencies.h"
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

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace dflash::cuda_printer {

namespace {
/// `wide`'s last dimension cut into `bands` side by side (concat_last's
/// inputs, split_last's results): f(band, its first column in bytes, the
/// row pitch of `wide` in bytes, the band's width in bytes), in order.
template <typename F>
void forEachColumnBand(Value wide, ValueRange bands, F f) {
  const int64_t elt =
      tensorBytes(wide.getType()) / tensorOf(wide).getNumElements();
  const int64_t pitch = tensorOf(wide).getShape().back() * elt;
  int64_t column = 0;
  for (Value band : bands) {
    const int64_t width = tensorOf(band).getShape().back() * elt;
    f(band, column, pitch, width);
    column += width;
  }
}

/// The RopeFrequencies of a YaRN rope, its ramp worked out here (the same
/// yarnRampRange the reference mirrors): the kernel gets plain numbers.
std::string yarnFrequencies(double theta, int64_t d, double factor,
                            double betaFast, double betaSlow,
                            int64_t originalMaxPositions, bool truncate,
                            double attentionFactor) {
  float low = 0, high = 0;
  ::dflash::kernels::yarnRampRange(int(d), theta, betaFast, betaSlow,
                                   double(originalMaxPositions), truncate, low,
                                   high);
  return llvm::formatv("{{{0}, 0.f, 1.f, 4.f, 8192.f, {1}, {2}, {3}, {4}}",
                       formatFloat(theta), formatFloat(factor),
                       formatFloat(double(low)), formatFloat(double(high)),
                       formatFloat(attentionFactor));
}

/// The RopeFrequencies of a rope of head dim d: theta alone, or with the
/// drafter's YaRN scaling.
std::string ropeFrequencies(double theta, int64_t d, YarnAttr yarn) {
  if (!yarn)
    return "{" + formatFloat(theta) + "}";
  return yarnFrequencies(theta, d, yarn.getFactor().getValueAsDouble(),
                         yarn.getBetaFast().getValueAsDouble(),
                         yarn.getBetaSlow().getValueAsDouble(),
                         yarn.getOriginalMaxPositions(), yarn.getTruncate(),
                         yarn.getAttentionFactor().getValueAsDouble());
}
/// An embedding kernel's float scale: the op's (a DFlash2 drafter's
/// input_embedding_scale), else 1, with which the kernels copy the rows.
std::string embedScale(std::optional<APFloat> scale) {
  return formatFloat(scale ? scale->convertToDouble() : 1.0);
}

/// The kernels::GroupedConvShape of a grouped_conv(_grad), as an
/// initializer: B, Q, H, bs, kc, gs, half, whether base is [2, kc, H].
template <typename ConvOp> std::string groupedConvShape(ConvOp o) {
  auto x = tensorOf(o.getInput());
  return llvm::formatv(
      "dflash::kernels::GroupedConvShape{{{0}, {1}, {2}, {3}, {4}, {5}, {6}, "
      "{7}}",
      x.getDimSize(0), x.getDimSize(1), x.getDimSize(2), o.getBlockSize(),
      o.getKernelSize(), o.getGroupSize(), o.getHalf(),
      tensorOf(o.getBase()).getRank() == 3 ? "true" : "false");
}
} // namespace

std::string StepEmitter::wrapper(KernelAttr kernel) {
  const KernelTemplate *form = kernelTemplate(kernel.getName().str());
  ArrayRef<int64_t> constants = kernel.getConstants().asArrayRef();
  std::string name = kernel.getName().str(), args;
  for (auto [i, c] : llvm::enumerate(constants)) {
    bool isBool = form && int(i) == form->boolAt;
    std::string label(form && i < form->labels.size() ? form->labels[i] : "");
    name += isBool ? (c ? "_" + label : std::string())
                   : "_" + label + std::to_string(c);
    args += (i ? ", " : "") +
            (isBool ? std::string(c ? "true" : "false") : std::to_string(c));
  }
  std::string parameters, arguments;
  if (form) {
    args += form->trailing;
    parameters = form->parameters;
    arguments = form->arguments;
  }
  if (wrappers.names.insert(name).second) {
    wrappers.decls += "void " + name + "(" + parameters + ");\n";
    wrappers.defs += "void " + name + "(" + parameters +
                     ") {\n  dflash::kernels::" + kernel.getName().str() + "<" +
                     args + ">(" + arguments + ");\n}\n\n";
  }
  return name;
}

std::string StepEmitter::blocks(Value perBlock) {
  int64_t rows = tensorOf(perBlock).getDimSize(0);
  if (rows == config.rowsPerGpu)
    return "kBlocks";
  // The step's rows, K micro-batches of kBlocks.B (gradient accumulation).
  return llvm::formatv("dflash::kernels::DraftBlocksShape{{{0}, kBlocks.S, "
                       "kBlocks.N, kBlocks.bs}",
                       rows);
}

void StepEmitter::emitNorm(KernelAttr kernel, Value input, Value delta,
                           Value weight, Value sum, Value result, double eps) {
  std::string name = wrapper(kernel);
  os << llvm::formatv("    {0}({1}, {2}, {3}, {4}, {5}, {6}, {7}, stream);\n",
                      name, ptr(input), delta ? ptr(delta) : "nullptr",
                      ptr(weight), sum ? ptr(sum) : "nullptr", ptr(result),
                      rowsOf(input), formatFloat(eps));
}

void StepEmitter::emitNormGrad(Operation *op, KernelAttr kernel,
                               Value residualGrad) {
  Value grad = op->getOperand(0), input = op->getOperand(1),
        weight = op->getOperand(2);
  std::string name = wrapper(kernel);
  double eps = op->getAttrOfType<FloatAttr>("eps").getValueAsDouble();
  os << llvm::formatv("    {0}({1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, "
                      "stream);\n",
                      name, ptr(grad), ptr(input), ptr(weight),
                      residualGrad ? ptr(residualGrad) : "nullptr",
                      ptr(op->getResult(0)), ptr(op->getResult(1)),
                      rowsOf(input), formatFloat(eps), workspace(op, "float"));
}

void StepEmitter::emitAttention(Operation *op, KernelAttr kernel,
                                bool backward) {
  os << "    {\n";
  if (!backward) {
    auto o = cast<BlockAttentionOp>(op);
    std::string name = wrapper(kernel);
    os << "      dflash::kernels::BlockAttentionFwdArgs a{};\n"
       << llvm::formatv("      a.q = {0};\n      a.contextKeys = {1};\n"
                        "      a.contextValues = {2};\n"
                        "      a.draftKeys = {3};\n"
                        "      a.draftValues = {4};\n      a.anchors = {5};\n"
                        "      a.keep = {6};\n      a.positionIds = {7};\n"
                        "      a.out = {8};\n      a.lse = {9};\n",
                        ptr(o.getQuery()), ptr(o.getContextKeys()),
                        ptr(o.getContextValues()), ptr(o.getDraftKeys()),
                        ptr(o.getDraftValues()), ptr(o.getAnchors()),
                        ptr(o.getKeep()), ptr(o.getPositionIds()),
                        ptr(o.getResult()), ptr(o.getLse()))
       << "      a.B = " << tensorOf(o.getAnchors()).getDimSize(0)
       << ";\n      a.S = kBlocks.S;\n      a.N = kBlocks.N;\n"
       << "      " << name << "(a, stream);\n";
  } else {
    auto o = cast<BlockAttentionGradOp>(op);
    std::string name = wrapper(kernel);
    ArrayRef<int64_t> c = kernel.getConstants().asArrayRef();
    auto q = tensorOf(o.getQuery());
    os << "      dflash::kernels::BlockAttentionBwdArgs a{};\n"
       << llvm::formatv(
              "      a.dOut = {0};\n      a.q = {1};\n"
              "      a.contextKeys = {2};\n      a.contextValues = {3};\n"
              "      a.draftKeys = {4};\n      a.draftValues = {5};\n"
              "      a.anchors = {6};\n      a.keep = {7};\n"
              "      a.positionIds = {8};\n"
              "      a.out = {9};\n      a.lse = {10};\n",
              ptr(o.getGrad()), ptr(o.getQuery()), ptr(o.getContextKeys()),
              ptr(o.getContextValues()), ptr(o.getDraftKeys()),
              ptr(o.getDraftValues()), ptr(o.getAnchors()), ptr(o.getKeep()),
              ptr(o.getPositionIds()), ptr(o.getOutput()), ptr(o.getLse()))
       << llvm::formatv(
              "      a.dq = {0};\n      a.dContextKeys = {1};\n"
              "      a.dContextValues = {2};\n      a.dDraftKeys = {3};\n"
              "      a.dDraftValues = {4};\n",
              ptr(o.getQueryGrad()), ptr(o.getContextKeysGrad()),
              ptr(o.getContextValuesGrad()), ptr(o.getDraftKeysGrad()),
              ptr(o.getDraftValuesGrad()))
       << "      a.dqAccum = " << workspace(op, "float") << ";\n"
       << llvm::formatv("      a.dOutDotOut = a.dqAccum + "
                        "dflash::kernels::blockAttentionBwdDotOffset({0}, "
                        "{1}, {2}, {3}, {4});\n",
                        c[0], c[1], c[2], q.getDimSize(0),
                        q.getDimSize(1) / c[1])
       << "      a.B = " << tensorOf(o.getAnchors()).getDimSize(0)
       << ";\n      a.S = kBlocks.S;\n      a.N = kBlocks.N;\n"
       << "      " << name << "(a, stream);\n";
  }
  os << "    }\n";
}

LogicalResult StepEmitter::emitOp(Operation *op) {
  std::string where = describeLoc(op->getLoc());
  os << "    // " << op->getName().getStringRef();
  if (!where.empty())
    os << " (" << where << ")";
  os << "\n";
  if (isa<ReshapeOp, RowSliceOp>(op))
    return success(); // a view: nothing runs
  if (auto reduce = dyn_cast<AllReduceOp>(op)) {
    // In place; the identity on one GPU.
    for (Value v : reduce.getInputs())
      os << llvm::formatv("    allReduce({0}, {1}, stream);\n", ptr(v),
                          tensorOf(v).getNumElements());
    return success();
  }
  KernelAttr kernel = kernelOf(op);
  if (!kernel)
    return op->emitOpError("has no dflash.kernel: run dflash-select-kernels "
                           "before translation to CUDA");
  size_t index = opNames.size();
  std::string name = op->getName().getStringRef().str();
  if (auto loc = dyn_cast<NameLoc>(op->getLoc()))
    name += " " + loc.getName().getValue().str();
  opNames.push_back(name);
  os << "    begin(" << index << ", stream);\n";
  LogicalResult result = emitKernel(op, kernel);
  os << "    end(" << index << ", stream);\n";
  return result;
}

LogicalResult StepEmitter::emitKernel(Operation *op, KernelAttr kernel) {
  // grouped_linear_swiglu_bf16's trailing arguments for gpt-oss's biases
  // and clamp ("" for Qwen3-MoE's plain form).
  auto gptOss = [&](GroupedLinearSwigluOp o) -> std::string {
    if (!o.getGateBias() && !o.getLimit())
      return "";
    std::string biases = o.getGateBias()
                             ? ptr(o.getGateBias()) + ", " + ptr(o.getUpBias())
                             : "nullptr, nullptr";
    if (!o.getLimit())
      return ", " + biases;
    return llvm::formatv(", {0}, true, {1}, {2}", biases,
                         formatFloat(o.getAlpha()->convertToDouble()),
                         formatFloat(o.getLimit()->convertToDouble()))
        .str();
  };
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](LinearOp o) {
        auto w = tensorOf(o.getWeight());
        os << llvm::formatv(
            "    gemm().linear({0}, {1}, {2}, {3}, {4}, {5}, stream);\n",
            ptr(o.getInput()), ptr(o.getWeight()), ptr(o.getResult()),
            rowsOf(o.getInput()), w.getDimSize(0), w.getDimSize(1));
        return success();
      })
      .Case([&](BiasedLinearOp o) {
        auto w = tensorOf(o.getWeight());
        os << llvm::formatv("    gemm().linearBias({0}, {1}, {2}, {3}, {4}, "
                            "{5}, {6}, stream);\n",
                            ptr(o.getInput()), ptr(o.getWeight()),
                            ptr(o.getBias()), ptr(o.getResult()),
                            rowsOf(o.getInput()), w.getDimSize(0),
                            w.getDimSize(1));
        return success();
      })
      .Case([&](LinearResidualOp o) {
        auto w = tensorOf(o.getWeight());
        os << llvm::formatv("    gemm().linearResidual({0}, {1}, {2}, {3}, "
                            "{4}, {5}, {6}, stream);\n",
                            ptr(o.getInput()), ptr(o.getWeight()),
                            ptr(o.getResidual()), ptr(o.getResult()),
                            rowsOf(o.getInput()), w.getDimSize(0),
                            w.getDimSize(1));
        return success();
      })
      .Case([&](LinearGradInputOp o) {
        auto w = tensorOf(o.getWeight());
        os << llvm::formatv("    gemm().linearGradInput({0}, {1}, {2}, {3}, "
                            "{4}, {5}, stream);\n",
                            ptr(o.getGrad()), ptr(o.getWeight()),
                            ptr(o.getResult()), rowsOf(o.getGrad()),
                            w.getDimSize(0), w.getDimSize(1));
        return success();
      })
      .Case([&](LinearGradWeightOp o) {
        auto dw = tensorOf(o.getResult());
        os << llvm::formatv("    gemm().linearGradWeight({0}, {1}, {2}, "
                            "{3}, {4}, {5}, stream);\n",
                            ptr(o.getGrad()), ptr(o.getInput()),
                            ptr(o.getResult()), rowsOf(o.getGrad()),
                            dw.getDimSize(0), dw.getDimSize(1));
        return success();
      })
      .Case([&](AccumulateLinearGradOp o) {
        std::string acc = ptr(o.getAccumulator()), out = ptr(o.getResult());
        if (acc != out)
          os << llvm::formatv("    copy({0}, {1}, {2}, stream, \"copy "
                              "accumulator\");\n",
                              out, acc, tensorBytes(o.getResult().getType()));
        if (o.getWeightGrad()) {
          auto dw = tensorOf(o.getResult());
          os << llvm::formatv("    gemm().linearGradWeight({0}, {1}, {2}, "
                              "{3}, {4}, {5}, stream, 1.f);\n",
                              ptr(o.getGrad()), ptr(o.getOperand()), out,
                              rowsOf(o.getGrad()), dw.getDimSize(0),
                              dw.getDimSize(1));
        } else {
          auto w = tensorOf(o.getOperand());
          os << llvm::formatv("    gemm().linearGradInput({0}, {1}, {2}, "
                              "{3}, {4}, {5}, stream, 1.f);\n",
                              ptr(o.getGrad()), ptr(o.getOperand()), out,
                              rowsOf(o.getGrad()), w.getDimSize(0),
                              w.getDimSize(1));
        }
        return success();
      })
      .Case([&](RmsNormOp o) {
        emitNorm(kernel, o.getInput(), Value(), o.getWeight(), Value(),
                 o.getResult(), o.getEps().convertToDouble());
        return success();
      })
      .Case([&](ResidualRmsNormOp o) {
        emitNorm(kernel, o.getInput(), o.getDelta(), o.getWeight(), o.getSum(),
                 o.getResult(), o.getEps().convertToDouble());
        return success();
      })
      .Case([&](RmsNormGradOp o) {
        emitNormGrad(o, kernel, Value());
        return success();
      })
      .Case([&](RmsNormGradResidualOp o) {
        emitNormGrad(o, kernel, o.getResidualGrad());
        return success();
      })
      .Case([&](QkNormRopeOp o) {
        auto x = tensorOf(o.getInput());
        std::string name = wrapper(kernel);
        os << llvm::formatv("    {0}({1}, {2}, {3}, {4}, {5}, {6}, {7}, "
                            "stream);\n",
                            name, ptr(o.getInput()), ptr(o.getWeight()),
                            ptr(o.getPositions()), ptr(o.getResult()),
                            x.getDimSize(0) * x.getDimSize(1),
                            formatFloat(o.getEps().convertToDouble()),
                            ropeFrequencies(o.getTheta().convertToDouble(),
                                            x.getDimSize(3), o.getYarnAttr()));
        return success();
      })
      .Case([&](QkNormRopeGradOp o) {
        auto x = tensorOf(o.getInput());
        std::string name = wrapper(kernel);
        os << llvm::formatv(
            "    {0}({1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, "
            "stream);\n",
            name, ptr(o.getGrad()), ptr(o.getInput()), ptr(o.getWeight()),
            ptr(o.getPositions()), ptr(o.getInputGrad()),
            ptr(o.getWeightGrad()), x.getDimSize(0) * x.getDimSize(1),
            formatFloat(o.getEps().convertToDouble()),
            ropeFrequencies(o.getTheta().convertToDouble(), x.getDimSize(3),
                            o.getYarnAttr()),
            workspace(o, "float"));
        return success();
      })
      .Case<RopeOp, ScaledRopeOp, YarnRopeOp>([&](auto o) {
        auto x = tensorOf(o.getInput());
        std::string name = wrapper(kernel);
        std::string freq =
            "{" + formatFloat(o.getTheta().convertToDouble()) + "}";
        if constexpr (std::is_same_v<decltype(o), ScaledRopeOp>)
          freq = llvm::formatv(
              "{{{0}, {1}, {2}, {3}, {4}}",
              formatFloat(o.getTheta().convertToDouble()),
              formatFloat(o.getFactor().convertToDouble()),
              formatFloat(o.getLowFreqFactor().convertToDouble()),
              formatFloat(o.getHighFreqFactor().convertToDouble()),
              formatFloat(double(o.getOriginalMaxPositions())));
        if constexpr (std::is_same_v<decltype(o), YarnRopeOp>)
          freq = yarnFrequencies(
              o.getTheta().convertToDouble(), x.getDimSize(3),
              o.getFactor().convertToDouble(),
              o.getBetaFast().convertToDouble(),
              o.getBetaSlow().convertToDouble(), o.getOriginalMaxPositions(),
              o.getTruncate(), o.getAttentionFactor().convertToDouble());
        if constexpr (std::is_same_v<decltype(o), RopeOp>)
          freq = ropeFrequencies(o.getTheta().convertToDouble(),
                                 x.getDimSize(3), o.getYarnAttr());
        os << llvm::formatv("    {0}({1}, {2}, {3}, {4}, {5}, stream);\n", name,
                            ptr(o.getInput()), ptr(o.getPositions()),
                            ptr(o.getResult()),
                            x.getDimSize(0) * x.getDimSize(1), freq);
        return success();
      })
      .Case([&](CausalAttentionOp o) {
        auto q = tensorOf(o.getQuery());
        std::string name = wrapper(kernel);
        os << "    {\n"
           << "      dflash::kernels::CausalAttentionFwdArgs a{};\n"
           << llvm::formatv("      a.q = {0};\n      a.k = {1};\n"
                            "      a.v = {2};\n      a.positionIds = {3};\n"
                            "      a.out = {4};\n      a.B = {5};\n"
                            "      a.S = {6};\n",
                            ptr(o.getQuery()), ptr(o.getKeys()),
                            ptr(o.getValues()), ptr(o.getPositionIds()),
                            ptr(o.getResult()), q.getDimSize(0),
                            q.getDimSize(1));
        if (o.getSinks())
          os << "      a.sinks = " << ptr(o.getSinks()) << ";\n";
        if (int64_t window = int64_t(o.getWindowAttr().getInt()))
          os << "      a.window = " << window << ";\n";
        os << "      " << name << "(a, stream);\n    }\n";
        return success();
      })
      .Case([&](EmbedOp o) {
        auto table = tensorOf(o.getTable());
        os << llvm::formatv("    dflash::kernels::embed_rows_bf16({0}, {1}, "
                            "{2}, {3}, {4}, {5}, stream);\n",
                            ptr(o.getTable()), ptr(o.getIds()),
                            ptr(o.getResult()),
                            tensorOf(o.getIds()).getNumElements(),
                            table.getDimSize(1), embedScale(o.getScale()));
        return success();
      })
      .Case([&](ConcatLastOp o) {
        // Each input is a column band of the result: one strided copy each.
        forEachColumnBand(
            o.getResult(), o.getInputs(),
            [&](Value in, int64_t column, int64_t pitch, int64_t width) {
              os << llvm::formatv(
                  "    copyColumns(reinterpret_cast<char *>({0}) "
                  "+ {1}, {2}, {3}, {4}, {5}, stream);\n",
                  ptr(o.getResult()), column, pitch, ptr(in), width,
                  rowsOf(in));
            });
        return success();
      })
      .Case([&](BlockAttentionOp o) {
        emitAttention(o, kernel, false);
        return success();
      })
      .Case([&](BlockAttentionGradOp o) {
        emitAttention(o, kernel, true);
        return success();
      })
      .Case([&](SwigluOp o) {
        int64_t cols = tensorOf(o.getGate()).getShape().back();
        os << llvm::formatv("    dflash::kernels::swiglu_fwd_bf16({{{0}, {3}}, "
                            "{{{1}, {3}}, {{{2}, {3}}, {4}, {3}, stream);\n",
                            ptr(o.getGate()), ptr(o.getUp()),
                            ptr(o.getResult()), cols, rowsOf(o.getGate()));
        return success();
      })
      .Case([&](LinearSwigluOp o) {
        auto w = tensorOf(o.getGateWeight());
        os << llvm::formatv("    dflash::kernels::swiglu_gemm_bf16({0}, {1}, "
                            "{2}, {{{3}, {4}, {5}, {6}}, stream);\n",
                            ptr(o.getInput()), ptr(o.getGateWeight()),
                            ptr(o.getUpWeight()), ptr(o.getResult()),
                            rowsOf(o.getInput()), w.getDimSize(0),
                            w.getDimSize(1));
        return success();
      })
      // The hybrid targets' ops (kernels/HybridOps.cuh, GatedDeltaRule.cuh).
      .Case([&](CausalConvOp o) {
        auto x = tensorOf(o.getInput());
        os << llvm::formatv("    dflash::kernels::causal_conv_bf16({0}, {1}, "
                            "{2}, {3}, {4}, {5}, {6}, {7}, stream);\n",
                            ptr(o.getInput()), ptr(o.getWeight()),
                            ptr(o.getPositionIds()), ptr(o.getResult()),
                            x.getDimSize(0), x.getDimSize(1), x.getDimSize(2),
                            tensorOf(o.getWeight()).getDimSize(1));
        return success();
      })
      // A DFlash2 drafter's convolutions (kernels/DFlash2Conv.cuh).
      .Case([&](GroupedConvOp o) {
        os << llvm::formatv("    dflash::kernels::grouped_conv_bf16({0}, {1}, "
                            "{2}, {3}, {4}, stream);\n",
                            ptr(o.getInput()), ptr(o.getDelta()),
                            ptr(o.getBase()), ptr(o.getResult()),
                            groupedConvShape(o));
        return success();
      })
      .Case([&](GroupedConvGradOp o) {
        os << llvm::formatv(
            "    dflash::kernels::grouped_conv_grad_bf16({0}, {1}, {2}, {3}, "
            "{4}, {5}, {6}, {7}, {8}, stream);\n",
            ptr(o.getGrad()), ptr(o.getInput()), ptr(o.getDelta()),
            ptr(o.getBase()), ptr(o.getInputGrad()), ptr(o.getDeltaGrad()),
            ptr(o.getBaseGrad()), workspace(o, "float"), groupedConvShape(o));
        return success();
      })
      .Case([&](GatedDeltaRuleOp o) {
        auto q = tensorOf(o.getQuery()), v = tensorOf(o.getValue());
        os << llvm::formatv(
            "    dflash::kernels::gated_delta_rule_bf16({0}, {1}, {2}, {3}, "
            "{4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, "
            "stream);\n",
            ptr(o.getQuery()), ptr(o.getKey()), ptr(o.getValue()),
            ptr(o.getA()), ptr(o.getB()), ptr(o.getALog()), ptr(o.getDtBias()),
            ptr(o.getPositionIds()), ptr(o.getResult()), q.getDimSize(0),
            q.getDimSize(1), q.getDimSize(2), v.getDimSize(2), q.getDimSize(3),
            v.getDimSize(3));
        return success();
      })
      .Case([&](GatedRmsNormOp o) {
        os << llvm::formatv("    dflash::kernels::gated_rms_norm_bf16({0}, "
                            "{1}, {2}, {3}, {4}, {5}, {6}, stream);\n",
                            ptr(o.getInput()), ptr(o.getGate()),
                            ptr(o.getWeight()), ptr(o.getResult()),
                            rowsOf(o.getInput()),
                            tensorOf(o.getInput()).getShape().back(),
                            formatFloat(o.getEps().convertToDouble()));
        return success();
      })
      .Case([&](ZeroCentredRmsNormOp o) {
        os << llvm::formatv(
            "    dflash::kernels::zero_centred_rms_norm_bf16({0}, {1}, {2}, "
            "{3}, {4}, {5}, stream);\n",
            ptr(o.getInput()), ptr(o.getWeight()), ptr(o.getResult()),
            rowsOf(o.getInput()), tensorOf(o.getInput()).getShape().back(),
            formatFloat(o.getEps().convertToDouble()));
        return success();
      })
      .Case([&](PartialRopeOp o) {
        auto x = tensorOf(o.getInput());
        os << llvm::formatv(
            "    dflash::kernels::partial_rope_bf16({0}, {1}, "
            "{2}, {3}, {4}, {5}, {6}, {7}, stream);\n",
            ptr(o.getInput()), ptr(o.getPositions()), ptr(o.getResult()),
            x.getDimSize(0) * x.getDimSize(1), x.getDimSize(2), x.getDimSize(3),
            o.getRotaryDim(), formatFloat(o.getTheta().convertToDouble()));
        return success();
      })
      .Case([&](SigmoidGateOp o) {
        const int64_t n = tensorOf(o.getInput()).getNumElements();
        os << llvm::formatv("    dflash::kernels::sigmoid_gate_bf16({0}, {1}, "
                            "{2}, {3}, {4}, stream);\n",
                            ptr(o.getInput()), ptr(o.getGate()),
                            ptr(o.getResult()), n,
                            n / tensorOf(o.getGate()).getNumElements());
        return success();
      })
      .Case([&](SplitLastOp o) {
        // Each result is a column band of the input: one strided copy each.
        forEachColumnBand(
            o.getInput(), o.getParts(),
            [&](Value part, int64_t column, int64_t pitch, int64_t width) {
              os << llvm::formatv(
                  "    copyBand({0}, reinterpret_cast<const char "
                  "*>({1}) + {2}, {3}, {4}, {5}, stream);\n",
                  ptr(part), ptr(o.getInput()), column, pitch, width,
                  rowsOf(part));
            });
        return success();
      })
      .Case([&](MoeRouteOp o) {
        auto logits = tensorOf(o.getLogits());
        os << llvm::formatv("    dflash::kernels::moe_route_bf16({0}, {1}, "
                            "{2}, {3}, {4}, {5}, {6}, stream{7});\n",
                            ptr(o.getLogits()), ptr(o.getWeights()),
                            ptr(o.getExperts()), logits.getDimSize(0),
                            logits.getDimSize(1), o.getTopK(),
                            o.getNormalize() ? "true" : "false",
                            o.getScoring() == "topk_softmax" ? ", true" : "");
        return success();
      })
      .Case([&](MoePermuteOp o) {
        auto x = tensorOf(o.getInput());
        os << llvm::formatv(
            "    dflash::kernels::moe_permute_bf16({0}, {1}, {2}, {3}, {4}, "
            "{5}, {6}, {7}, {8}, {9}, stream);\n",
            ptr(o.getInput()), ptr(o.getExperts()), ptr(o.getPermuted()),
            ptr(o.getOffsets()), ptr(o.getSource()), x.getDimSize(0),
            x.getDimSize(1), tensorOf(o.getExperts()).getDimSize(1),
            tensorOf(o.getOffsets()).getDimSize(0) - 1,
            workspace(o, "int32_t"));
        return success();
      })
      .Case([&](GroupedLinearOp o) {
        auto w = tensorOf(o.getWeight());
        os << llvm::formatv("    dflash::kernels::grouped_linear_bf16({0}, "
                            "{1}, {2}, {3}, {4}, {5}, {6}, {7}, stream{8});\n",
                            ptr(o.getInput()), ptr(o.getWeight()),
                            ptr(o.getOffsets()), ptr(o.getResult()),
                            rowsOf(o.getInput()), w.getDimSize(0),
                            w.getDimSize(1), w.getDimSize(2),
                            o.getBias() ? ", " + ptr(o.getBias()) : "");
        return success();
      })
      .Case([&](GroupedLinearSwigluOp o) {
        auto w = tensorOf(o.getGateWeight());
        os << llvm::formatv(
            "    dflash::kernels::grouped_linear_swiglu_bf16({0}, {1}, {2}, "
            "{3}, {4}, {5}, {6}, {7}, {8}, stream{9});\n",
            ptr(o.getInput()), ptr(o.getGateWeight()), ptr(o.getUpWeight()),
            ptr(o.getOffsets()), ptr(o.getResult()), rowsOf(o.getInput()),
            w.getDimSize(0), w.getDimSize(1), w.getDimSize(2), gptOss(o));
        return success();
      })
      .Case([&](MoeUnpermuteOp o) {
        auto w = tensorOf(o.getWeights());
        os << llvm::formatv(
            "    dflash::kernels::moe_unpermute_bf16({0}, {1}, {2}, {3}, {4}, "
            "{5}, {6}, {7}, stream);\n",
            ptr(o.getPermuted()), ptr(o.getSource()), ptr(o.getWeights()),
            ptr(o.getResult()), w.getDimSize(0),
            tensorOf(o.getResult()).getDimSize(1), w.getDimSize(1),
            workspace(o, "int32_t"));
        return success();
      })
      .Case([&](SwigluGradOp o) {
        int64_t cols = tensorOf(o.getGate()).getShape().back();
        os << llvm::formatv(
            "    dflash::kernels::swiglu_bwd_bf16({{{0}, {5}}, {{{1}, {5}}, "
            "{{{2}, {5}}, {{{3}, {5}}, {{{4}, {5}}, {6}, {5}, stream);\n",
            ptr(o.getGrad()), ptr(o.getGate()), ptr(o.getUp()),
            ptr(o.getGateGrad()), ptr(o.getUpGrad()), cols,
            rowsOf(o.getGate()));
        return success();
      })
      .Case([&](AddOp o) {
        os << llvm::formatv(
            "    dflash::kernels::{0}({1}, {2}, {3}, {4}, stream);\n",
            kernel.getName().str(), ptr(o.getLhs()), ptr(o.getRhs()),
            ptr(o.getResult()), tensorOf(o.getResult()).getNumElements());
        return success();
      })
      .Case([&](DraftEmbedOp o) {
        std::string name = wrapper(kernel);
        os << llvm::formatv("    {0}({1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, "
                            "stream);\n",
                            name, ptr(o.getTable()), ptr(o.getInputIds()),
                            ptr(o.getAnchors()), ptr(o.getKeep()),
                            ptr(o.getResult()), blocks(o.getAnchors()),
                            o.getMaskTokenId(), embedScale(o.getScale()));
        return success();
      })
      .Case([&](DraftPositionsOp o) {
        os << llvm::formatv("    dflash::kernels::draft_positions({0}, {1}, "
                            "{2}, {3}, stream);\n",
                            ptr(o.getAnchors()), ptr(o.getPositionIds()),
                            ptr(o.getResult()), blocks(o.getAnchors()));
        return success();
      })
      .Case([&](DraftTargetsOp o) {
        os << llvm::formatv(
            "    dflash::kernels::draft_targets({0}, {1}, {2}, {3}, {4}, {5}, "
            "{6}, {7}, {8}, stream);\n",
            ptr(o.getInputIds()), ptr(o.getLossMask()), ptr(o.getAnchors()),
            ptr(o.getKeep()), ptr(o.getPositionIds()), ptr(o.getLabels()),
            ptr(o.getWeights()), blocks(o.getAnchors()),
            doubleText(o.getGamma().convertToDouble()));
        return success();
      })
      .Case([&](LossSeedOp o) {
        os << llvm::formatv(
            "    dflash::kernels::sum_f32({0}, {1}, {2}, stream);\n"
            "    allReduce({2}, 1, stream);\n"
            "    dflash::kernels::reciprocal_f32({2}, {3}, stream);\n",
            ptr(o.getWeights()), tensorOf(o.getWeights()).getNumElements(),
            ptr(o.getWeightSum()), ptr(o.getLossSumGrad()));
        return success();
      })
      .Case<LmHeadCeFusedOp, LmHeadCeOp, LmHeadCeTopKOp>([&](auto o) {
        auto w = tensorOf(o.getWeight());
        using Op = decltype(o);
        // Without the gradient (an evaluation's): no seed, no dX.
        std::string seed = "nullptr", dy = "nullptr";
        if constexpr (std::is_same_v<Op, LmHeadCeFusedOp>) {
          seed = ptr(o.getLossSumGrad());
          dy = ptr(o.getInputGrad());
        }
        os << "    {\n"
           << "      dflash::kernels::LmHeadCrossEntropyArgs a{};\n"
           << llvm::formatv("      a.y = {0};\n      a.lmHead = {1};\n"
                            "      a.labels = {2};\n      a.weights = {3};\n"
                            "      a.dLossSum = {4};\n      a.dy = {5};\n"
                            "      a.hits = {6};\n",
                            ptr(o.getInput()), ptr(o.getWeight()),
                            ptr(o.getLabels()), ptr(o.getWeights()), seed, dy,
                            ptr(o.getHits()))
           << llvm::formatv("      a.rows = {0};\n      a.V = {1};\n"
                            "      a.H = {2};\n      a.chunkRows = {3};\n"
                            "      a.blockSize = {4};\n",
                            rowsOf(o.getInput()), w.getDimSize(0),
                            w.getDimSize(1), kernel.getConstants()[0],
                            kernel.getConstants()[1]);
        // A folded DFlash2 top-K (select-kernels' third constant).
        if constexpr (!std::is_same_v<Op, LmHeadCeOp>) {
          if (kernel.getConstants().size() > 2)
            os << llvm::formatv("      a.topK = {0};\n      a.values = {1};\n"
                                "      a.candidates = {2};\n"
                                "      a.labelValues = {3};\n",
                                kernel.getConstants()[2], ptr(o.getValues()),
                                ptr(o.getCandidates()),
                                ptr(o.getLabelValues()));
        }
        // A DFlash2 drafter's unary transform (the identity is the
        // arguments' default).
        const double multiplier = o.getMultiplier().convertToDouble();
        const double softcap = o.getSoftcap().convertToDouble();
        if (multiplier != 1.0 || softcap != 0.0)
          os << llvm::formatv("      a.multiplier = {0};\n"
                              "      a.softcap = {1};\n",
                              formatFloat(multiplier), formatFloat(softcap));
        os << "      dflash::kernels::useLmHeadWorkspace(a, "
           << workspace(o, "char") << ");\n"
           << "      dflash::kernels::lm_head_cross_entropy_bf16(gemm(), a, "
              "stream);\n";
        Value sums[] = {o.getLossSum(), o.getWeightSum(), o.getCorrect(),
                        o.getCount()};
        for (int i = 0; i < 4; ++i)
          os << llvm::formatv("      copy({0}, a.sums + {1}, 4, stream, "
                              "\"copy loss sums\");\n",
                              ptr(sums[i]), i);
        os << "    }\n";
        return success();
      })
      .Case([&](LossStatsOp o) {
        os << llvm::formatv(
            "    dflash::kernels::loss_stats_f32({0}, {1}, {2}, "
            "{3}, {4}, {5}, {6}, {7}, {8}, {9}, stream);\n",
            ptr(o.getLossSum()), ptr(o.getWeightSum()), ptr(o.getCorrect()),
            ptr(o.getCount()), ptr(o.getRunSum()), ptr(o.getKeptBlocks()),
            ptr(o.getLoss()), ptr(o.getAcc()), ptr(o.getTau()),
            ptr(o.getLossSumGrad()));
        return success();
      })
      .Case([&](DraftAcceptanceOp o) {
        // The bucket edges are plain data here: the compiler chose them.
        ArrayRef<int64_t> edges = o.getBucketEdges();
        std::string list;
        for (int64_t e : edges)
          list += (list.empty() ? "" : ", ") + std::to_string(e);
        std::string buckets =
            llvm::formatv("dflash::kernels::PositionBuckets<{0}>{{{{{1}}}",
                          edges.size() + 1, list);
        os << llvm::formatv(
            "    dflash::kernels::draft_acceptance_f32<{0}, {1}>({2}, {3}, "
            "{4}, {5}, {6},\n        {7},\n        {8}, {9}, {10}, {11}, "
            "{12}, {13}, {14}, {15}, {16}, stream);\n",
            o.getBlockSize(), edges.size() + 1, ptr(o.getHits()),
            ptr(o.getWeights()), ptr(o.getKeep()), ptr(o.getAnchors()),
            ptr(o.getPositionIds()), buckets, ptr(o.getRunSum()),
            ptr(o.getKeptBlocks()), ptr(o.getPositionHits()),
            ptr(o.getPositionCounts()), ptr(o.getBucketRuns()),
            ptr(o.getBucketBlocks()), ptr(o.getBucketHits()),
            ptr(o.getBucketCounts()), blocks(o.getKeep()));
        return success();
      })
      .Case([&](GradientBucketOp o) {
        // fp32 copies, then one in-place collective on the communication
        // stream while the backward pass goes on (CompiledStep::reduceBucket).
        size_t k = numBuckets++;
        const bool sharded = bool(o.getShardElementsAttr());
        os << "    if (reducesGradients()) {\n";
        for (auto [g, r] : llvm::zip(o.getGrads(), o.getResults()))
          os << llvm::formatv("      dflash::kernels::convert_bf16_f32({0}, "
                              "{1}, {2}, stream);\n",
                              ptr(g), ptr(r), tensorOf(r).getNumElements());
        int64_t count =
            sharded ? o.getShardElementsAttr().getInt() : bucketFlatElements(o);
        os << llvm::formatv("      reduceBucket({0}, {1}, {2}, stream);\n"
                            "    }\n",
                            k, ptr(o.getResult(0)), count);
        return success();
      })
      .Case([&](AdamWMultiOp o) {
        optimizer = o;
        optimizerKernel = kernel;
        os << llvm::formatv("    optimizerStep({0}, {1}, {2}, {3}, stream);\n",
                            ptr(o.getStep()), ptr(o.getTotal()),
                            ptr(o.getLrValue()), ptr(o.getGradNorm()));
        return success();
      })
      .Case([&](AdamWShardedOp o) {
        shardedOptimizer = o;
        optimizerKernel = kernel;
        os << llvm::formatv("    optimizerStep({0}, {1}, {2}, {3}, stream);\n",
                            ptr(o.getStep()), ptr(o.getTotal()),
                            ptr(o.getLrValue()), ptr(o.getGradNorm()));
        return success();
      })
      // The DFlash2 selector (kernels/DFlash2Selector.cuh).
      .Case<SelectorCandidatesOp, SelectorCandidatesGradOp, SelectorLossOp,
            SelectorLossGradOp, DraftPredecessorsOp, SelectorAlphaOp,
            SelectorObjectiveOp, SelectorObjectiveGradOp>(
          [&](Operation *o) { return emitSelector(o, kernel); })
      .Default([&](Operation *other) {
        return other->emitOpError("has no CUDA translation");
      });
}

LogicalResult StepEmitter::emitSelector(Operation *op, KernelAttr kernel) {
  // selector_candidates(_grad)'s fields after the pointers.
  auto candidateShape = [&](auto o) {
    auto w = tensorOf(o.getWeight());
    os << llvm::formatv("      a.rows = {0};\n      a.V = {1};\n"
                        "      a.H = {2};\n      a.K = {3};\n"
                        "      a.multiplier = {4};\n      a.softcap = {5};\n",
                        rowsOf(o.getInput()), w.getDimSize(0), w.getDimSize(1),
                        o.getTopK(),
                        formatFloat(o.getMultiplier().convertToDouble()),
                        formatFloat(o.getSoftcap().convertToDouble()));
  };
  // selector_loss(_grad)'s operands and shape.
  auto lossOperands = [&](auto o) {
    auto codebook = tensorOf(o.getPredecessorCodebook());
    os << "      dflash::kernels::SelectorLossArgs a{};\n"
       << llvm::formatv(
              "      a.values = {0};\n      a.candidates = {1};\n"
              "      a.labelValues = {2};\n      a.y = {3};\n"
              "      a.projection = {4};\n      a.predecessors = {5};\n"
              "      a.labels = {6};\n      a.weights = {7};\n"
              "      a.predecessorCodebook = {8};\n"
              "      a.successorCodebook = {9};\n",
              ptr(o.getValues()), ptr(o.getCandidates()),
              ptr(o.getLabelValues()), ptr(o.getInput()),
              ptr(o.getProjection()), ptr(o.getPredecessors()),
              ptr(o.getLabels()), ptr(o.getWeights()),
              ptr(o.getPredecessorCodebook()), ptr(o.getSuccessorCodebook()))
       << llvm::formatv("      a.inject = {0};\n      a.stopGradient = {1};\n",
                        o.getGold() == "inject" ? "true" : "false",
                        o.getStopGradient() ? "true" : "false")
       << llvm::formatv("      a.rows = {0};\n      a.V = {1};\n"
                        "      a.H = {2};\n      a.r = {3};\n"
                        "      a.K = {4};\n",
                        rowsOf(o.getValues()), codebook.getDimSize(0),
                        tensorOf(o.getInput()).getShape().back(),
                        codebook.getDimSize(1),
                        tensorOf(o.getValues()).getShape().back());
  };
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](SelectorCandidatesOp o) {
        os << "    {\n"
           << "      dflash::kernels::SelectorCandidatesArgs a{};\n"
           << llvm::formatv(
                  "      a.y = {0};\n      a.lmHead = {1};\n"
                  "      a.labels = {2};\n      a.weights = {3};\n"
                  "      a.values = {4};\n      a.candidates = {5};\n"
                  "      a.labelValues = {6};\n      a.logitsChunk = {7};\n"
                  "      a.chunk = {8};\n",
                  ptr(o.getInput()), ptr(o.getWeight()), ptr(o.getLabels()),
                  ptr(o.getWeights()), ptr(o.getValues()),
                  ptr(o.getCandidates()), ptr(o.getLabelValues()),
                  workspace(o, "float"), kernel.getConstants()[0]);
        candidateShape(o);
        os << "      dflash::kernels::selector_candidates_bf16(gemm(), a, "
              "stream);\n"
           << "    }\n";
        return success();
      })
      .Case([&](SelectorCandidatesGradOp o) {
        os << "    {\n"
           << "      dflash::kernels::SelectorCandidatesGradArgs a{};\n"
           << llvm::formatv(
                  "      a.y = {0};\n      a.lmHead = {1};\n"
                  "      a.candidates = {2};\n      a.labels = {3};\n"
                  "      a.weights = {4};\n      a.valuesGrad = {5};\n"
                  "      a.labelValuesGrad = {6};\n      a.dy = {7};\n",
                  ptr(o.getInput()), ptr(o.getWeight()), ptr(o.getCandidates()),
                  ptr(o.getLabels()), ptr(o.getWeights()),
                  o.getValuesGrad() ? ptr(o.getValuesGrad()) : "nullptr",
                  o.getLabelValuesGrad() ? ptr(o.getLabelValuesGrad())
                                         : "nullptr",
                  ptr(o.getResult()));
        candidateShape(o);
        os << "      dflash::kernels::selector_candidates_grad_bf16(a, "
              "stream);\n"
           << "    }\n";
        return success();
      })
      .Case([&](SelectorLossOp o) {
        os << "    {\n";
        lossOperands(o);
        os << llvm::formatv("      a.lossSum = {0};\n"
                            "      a.coveredWeight = {1};\n"
                            "      a.hits = {2};\n",
                            ptr(o.getLossSum()), ptr(o.getCoveredWeight()),
                            ptr(o.getHits()))
           << "      dflash::kernels::useSelectorLossWorkspace(a, "
           << workspace(o, "char") << ", false);\n"
           << "      dflash::kernels::selector_loss_bf16(gemm(), a, stream);\n"
           << "    }\n";
        return success();
      })
      .Case([&](SelectorLossGradOp o) {
        os << "    {\n";
        lossOperands(o);
        os << llvm::formatv(
                  "      a.lossSumGrad = {0};\n      a.valuesGrad = {1};\n"
                  "      a.labelValuesGrad = {2};\n"
                  "      a.projectedGrad = {3};\n"
                  "      a.predecessorCodebookGrad = {4};\n"
                  "      a.successorCodebookGrad = {5};\n",
                  ptr(o.getLossSumGrad()), ptr(o.getValuesGrad()),
                  ptr(o.getLabelValuesGrad()), ptr(o.getProjectedGrad()),
                  ptr(o.getPredecessorCodebookGrad()),
                  ptr(o.getSuccessorCodebookGrad()))
           << "      dflash::kernels::useSelectorLossWorkspace(a, "
           << workspace(o, "char") << ", true);\n"
           << "      dflash::kernels::selector_loss_grad_bf16(gemm(), a, "
              "stream);\n"
           << "    }\n";
        return success();
      })
      .Case([&](DraftPredecessorsOp o) {
        os << llvm::formatv("    dflash::kernels::draft_predecessors({0}, {1}, "
                            "{2}, {3}, {4}, stream);\n",
                            ptr(o.getInputIds()), ptr(o.getAnchors()),
                            ptr(o.getKeep()), ptr(o.getResult()),
                            blocks(o.getAnchors()));
        return success();
      })
      .Case([&](SelectorAlphaOp o) {
        // The step counter and the step count are device scalars: alpha_t
        // follows the step without a host round trip.
        os << llvm::formatv("    dflash::kernels::selector_alpha_f32({0}, {1}, "
                            "{2}, {3}, {4}, {5}, stream);\n",
                            ptr(o.getStep()), ptr(o.getTotal()),
                            doubleText(o.getAlpha().convertToDouble()),
                            doubleText(o.getWarmupRatio().convertToDouble()),
                            doubleText(o.getRampRatio().convertToDouble()),
                            ptr(o.getResult()));
        return success();
      })
      .Case([&](SelectorObjectiveOp o) {
        os << llvm::formatv(
            "    dflash::kernels::selector_objective_f32({0}, {1}, {2}, {3}, "
            "{4}, {5}, {6}, stream);\n",
            ptr(o.getUnarySum()), ptr(o.getSelectorSum()), ptr(o.getAlpha()),
            ptr(o.getWeightSum()), ptr(o.getCoveredWeight()),
            o.getCovered() ? "true" : "false", ptr(o.getResult()));
        return success();
      })
      .Case([&](SelectorObjectiveGradOp o) {
        os << llvm::formatv(
            "    dflash::kernels::selector_objective_grad_f32({0}, {1}, {2}, "
            "{3}, {4}, {5}, stream);\n",
            ptr(o.getGrad()), ptr(o.getAlpha()), ptr(o.getWeightSum()),
            ptr(o.getCoveredWeight()), o.getCovered() ? "true" : "false",
            ptr(o.getResult()));
        return success();
      })
      .Default([](Operation *other) {
        return other->emitOpError("is not a DFlash2 selector op");
      });
}

} // namespace dflash::cuda_printer
