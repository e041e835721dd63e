//===- TranslateToCuda.cpp - Planned programs to step.cu, eval.cu ---------===//
//
// A printer. Everything it writes was decided by a pass and stored in the IR:
// the drafter (dflash.model_config), each op's kernel and constants
// (dflash.kernel, dflash-select-kernels), every arena offset
// (dflash-plan-memory). step.cu is constant tables (buffers, named arena
// slots, the optimizer's rows, the shard layout) and one launch per op in
// CompiledStep::schedule(); the logic around them is runtime code
// (runtime/device/CompiledStep.h). Templated kernels are called through
// wrappers in kernels.cu named after their constants
// ("block_attention_fwd_bf16_d64_bs8_nh4_nkv2_w32_causal"), so that each
// instantiation is compiled once, beside the schedule.
//
//===----------------------------------------------------------------------===//

#include "compiler/Target/Cuda/TranslateToCuda.h"

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

#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

std::string cType(Type elementType) {
  if (elementType.isBF16())
    return "__nv_bfloat16";
  if (elementType.isF32())
    return "float";
  if (elementType.isInteger(32))
    return "int32_t";
  if (elementType.isInteger(8))
    return "uint8_t";
  return "void";
}

RankedTensorType tensorOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}

int64_t rowsOf(Value v) {
  auto t = tensorOf(v);
  return t.getNumElements() / t.getShape().back();
}

std::string formatFloat(double v) {
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%.9g", v);
  if (s.find_first_of(".en") == std::string::npos)
    s += ".0";
  return s + "f";
}

/// A double as a C++ literal that reads back exactly.
std::string doubleText(double v) {
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%.17g", v);
  if (s.find_first_of(".en") == std::string::npos)
    s += ".0";
  return s;
}

std::string quoted(StringRef s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string intList(ArrayRef<int64_t> values) {
  std::string s = "{";
  for (size_t i = 0; i < values.size(); ++i)
    s += (i ? ", " : "") + std::to_string(values[i]);
  return s + "}";
}

/// "specs/tiny.toml:27 layers.0.self_attn", for comments.
std::string describeLoc(Location loc) {
  std::string s;
  llvm::raw_string_ostream os(s);
  if (auto name = dyn_cast<NameLoc>(loc)) {
    if (auto file = dyn_cast<FileLineColLoc>(name.getChildLoc()))
      os << file.getFilename().getValue() << ":" << file.getLine() << " ";
    os << name.getName().getValue();
  } else if (auto file = dyn_cast<FileLineColLoc>(loc)) {
    os << file.getFilename().getValue() << ":" << file.getLine();
  }
  return s;
}

/// A C++ identifier from a name: "layers.0.mlp" -> "layers_0_mlp".
std::string identifier(StringRef name) {
  std::string s;
  for (char c : name)
    s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])))
    s = "v_" + s;
  return s;
}

std::string cppValue(const std::string &v) { return quoted(v); }
std::string cppValue(int64_t v) { return std::to_string(v); }
std::string cppValue(double v) { return doubleText(v); }
std::string cppValue(bool v) { return v ? "true" : "false"; }
std::string cppValue(const std::vector<int64_t> &v) { return intList(v); }

/// The schema's dtype of an element type.
DType dtypeOf(Type elementType) {
  if (elementType.isBF16())
    return DType::BF16;
  if (elementType.isF32())
    return DType::F32;
  if (elementType.isInteger(32))
    return DType::I32;
  return DType::U8;
}

/// The schema's role of a #dflash.arg role.
BufferRole bufferRole(ArgRole role) {
  switch (role) {
  case ArgRole::Input:
    return BufferRole::Input;
  case ArgRole::Frozen:
    return BufferRole::Frozen;
  case ArgRole::Parameter:
    return BufferRole::Parameter;
  case ArgRole::Master:
    return BufferRole::Master;
  case ArgRole::Moment1:
    return BufferRole::Moment1;
  case ArgRole::Moment2:
    return BufferRole::Moment2;
  case ArgRole::Counter:
    return BufferRole::Counter;
  default:
    return BufferRole::Metric;
  }
}

/// The wrappers of kernel template instantiations that kernels.cu holds,
/// shared by the programs of a trainer (the step and the evaluation), so
/// that each instantiation is compiled once.
struct KernelWrappers {
  std::string decls, defs;
  llvm::StringSet<> names;
};

/// Prints one program: the step (step.cu) or the evaluation (eval.cu).
class StepEmitter {
public:
  StepEmitter(ModuleOp module, const ModelConfig &config,
              const StepSignature &sig, KernelWrappers &wrappers)
      : module(module), config(config), sig(sig), wrappers(wrappers) {}

  /// The program's source file.
  FailureOr<std::string> emit();

private:
  ModuleOp module;
  const ModelConfig &config;
  const StepSignature &sig;
  KernelWrappers &wrappers;
  std::string body;
  llvm::raw_string_ostream os{body};
  /// The named constants of step.cu: buffers, then arena slots.
  std::string bufferNames, slotNames;
  llvm::DenseMap<unsigned, std::string> bufferName; ///< by argument number
  llvm::DenseMap<Value, std::string> slotName;      ///< by storage root
  /// A target program's results: written straight into their buffers.
  llvm::DenseMap<Value, std::string> outputBuffer;
  /// The slots of each op's workspace and tables.
  llvm::DenseMap<Operation *, std::string> workspaceSlot, tablesSlot;
  llvm::StringSet<> usedNames;
  std::optional<AdamWMultiOp> optimizer;
  /// ZeRO-1: the optimizer updates this GPU's shards (instead of optimizer).
  std::optional<AdamWShardedOp> shardedOptimizer;
  KernelAttr optimizerKernel;
  int64_t optimizerTablesOffset = 0;
  /// What each profiled op is, in schedule order.
  std::vector<std::string> opNames;
  size_t numBuckets = 0;

  /// A fresh C++ name for `base` in the namespace `ns`.
  std::string uniqueName(StringRef ns, const std::string &base) {
    std::string name = base;
    for (int i = 2; !usedNames.insert((ns + "::" + name).str()).second; ++i)
      name = base + "_" + std::to_string(i);
    return name;
  }

  LogicalResult nameBuffers();
  LogicalResult nameSlots();
  /// The schema's index of argument `i` within its role (BufferSpec::index).
  FailureOr<int64_t> bufferIndex(unsigned i);
  /// A metric's index: its StepMetric, or in an evaluation its ForwardSum.
  std::optional<int64_t> metricSchemaIndex(const std::string &name) const {
    if (sig.isEval()) {
      if (auto sum = parseForwardSum(name))
        return int64_t(*sum);
    } else if (auto metric = parseStepMetric(name)) {
      return int64_t(*metric);
    }
    return std::nullopt;
  }

  /// A typed device pointer to `v`'s storage.
  std::string ptr(Value v);
  /// The named slot of `op`'s workspace.
  std::string workspace(Operation *op, StringRef type);
  std::string bufferRef(Value arg) {
    return "buffer::" +
           bufferName.lookup(cast<BlockArgument>(arg).getArgNumber());
  }

  /// The wrapper of `kernel`'s template instantiation (its form:
  /// schema/KernelEntryPoints.h), declared once.
  std::string wrapper(KernelAttr kernel);

  LogicalResult emitOp(Operation *op);
  LogicalResult emitKernel(Operation *op, KernelAttr kernel);
  void emitNorm(KernelAttr kernel, Value input, Value delta, Value weight,
                Value sum, Value result, double eps);
  void emitNormGrad(Operation *op, KernelAttr kernel, Value residualGrad);
  void emitAttention(Operation *op, KernelAttr kernel, bool backward);
  std::string optimizerTables();
  std::string shardTables();
};

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
  if (auto arg = dyn_cast<BlockArgument>(root))
    return "at<" + type + ">(" + bufferRef(arg) + ")";
  if (auto it = outputBuffer.find(root); it != outputBuffer.end())
    return "at<" + type + ">(buffer::" + it->second + ")";
  return "at<" + type + ">(slot::" + slotName.lookup(root) + ")";
}

std::string StepEmitter::workspace(Operation *op, StringRef type) {
  return "at<" + type.str() + ">(slot::" + workspaceSlot.lookup(op) + ")";
}

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
       << "      a.B = kBlocks.B;\n      a.S = kBlocks.S;\n"
          "      a.N = kBlocks.N;\n"
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
       << "      a.B = kBlocks.B;\n      a.S = kBlocks.S;\n"
          "      a.N = kBlocks.N;\n"
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
  if (isa<ReshapeOp>(op))
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
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](LinearOp o) {
        auto w = tensorOf(o.getWeight());
        os << llvm::formatv(
            "    gemm().linear({0}, {1}, {2}, {3}, {4}, {5}, stream);\n",
            ptr(o.getInput()), ptr(o.getWeight()), ptr(o.getResult()),
            rowsOf(o.getInput()), w.getDimSize(0), w.getDimSize(1));
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
                            formatFloat(o.getTheta().convertToDouble()));
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
            formatFloat(o.getTheta().convertToDouble()), workspace(o, "float"));
        return success();
      })
      .Case<RopeOp, ScaledRopeOp>([&](auto o) {
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
                            q.getDimSize(1))
           << "      " << name << "(a, stream);\n    }\n";
        return success();
      })
      .Case([&](EmbedOp o) {
        auto table = tensorOf(o.getTable());
        os << llvm::formatv(
            "    dflash::kernels::embed_rows_bf16({0}, {1}, "
            "{2}, {3}, {4}, stream);\n",
            ptr(o.getTable()), ptr(o.getIds()), ptr(o.getResult()),
            tensorOf(o.getIds()).getNumElements(), table.getDimSize(1));
        return success();
      })
      .Case([&](ConcatLastOp o) {
        // Each input is a column band of the result: one strided copy each.
        const int64_t elt = tensorBytes(o.getResult().getType()) /
                            tensorOf(o.getResult()).getNumElements();
        const int64_t pitch = tensorOf(o.getResult()).getShape().back() * elt;
        int64_t column = 0;
        for (Value in : o.getInputs()) {
          const int64_t width = tensorOf(in).getShape().back() * elt;
          os << llvm::formatv("    copyColumns(reinterpret_cast<char *>({0}) + "
                              "{1}, {2}, {3}, {4}, {5}, stream);\n",
                              ptr(o.getResult()), column, pitch, ptr(in), width,
                              rowsOf(in));
          column += width;
        }
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
            "    dflash::kernels::add_bf16({0}, {1}, {2}, {3}, stream);\n",
            ptr(o.getLhs()), ptr(o.getRhs()), ptr(o.getResult()),
            tensorOf(o.getResult()).getNumElements());
        return success();
      })
      .Case([&](DraftEmbedOp o) {
        std::string name = wrapper(kernel);
        os << llvm::formatv("    {0}({1}, {2}, {3}, {4}, {5}, kBlocks, {6}, "
                            "stream);\n",
                            name, ptr(o.getTable()), ptr(o.getInputIds()),
                            ptr(o.getAnchors()), ptr(o.getKeep()),
                            ptr(o.getResult()), o.getMaskTokenId());
        return success();
      })
      .Case([&](DraftPositionsOp o) {
        os << llvm::formatv("    dflash::kernels::draft_positions({0}, {1}, "
                            "{2}, kBlocks, stream);\n",
                            ptr(o.getAnchors()), ptr(o.getPositionIds()),
                            ptr(o.getResult()));
        return success();
      })
      .Case([&](DraftTargetsOp o) {
        os << llvm::formatv(
            "    dflash::kernels::draft_targets({0}, {1}, {2}, {3}, {4}, {5}, "
            "{6}, kBlocks, {7}, stream);\n",
            ptr(o.getInputIds()), ptr(o.getLossMask()), ptr(o.getAnchors()),
            ptr(o.getKeep()), ptr(o.getPositionIds()), ptr(o.getLabels()),
            ptr(o.getWeights()), doubleText(o.getGamma().convertToDouble()));
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
      .Case<LmHeadCeFusedOp, LmHeadCeOp>([&](auto o) {
        auto w = tensorOf(o.getWeight());
        // Without the gradient (an evaluation's): no seed, no dX.
        std::string seed = "nullptr", dy = "nullptr";
        if constexpr (std::is_same_v<decltype(o), LmHeadCeFusedOp>) {
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
                            kernel.getConstants()[1])
           << "      dflash::kernels::useLmHeadWorkspace(a, "
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
        os << llvm::formatv(
            "    dflash::kernels::draft_acceptance_f32<{0}>({1}, "
            "{2}, {3}, {4}, {5}, {6}, {7}, kBlocks, stream);\n",
            o.getBlockSize(), ptr(o.getHits()), ptr(o.getWeights()),
            ptr(o.getKeep()), ptr(o.getRunSum()), ptr(o.getKeptBlocks()),
            ptr(o.getPositionHits()), ptr(o.getPositionCounts()));
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
      .Default([&](Operation *other) {
        return other->emitOpError("has no CUDA translation");
      });
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
  // A target program's results (its features) are buffers after the
  // arguments, bound to the step's inputs of the same name; the op that
  // makes one writes it there directly.
  func::ReturnOp ret = sig.returnOp();
  std::string outputSpecs;
  if (sig.isTarget()) {
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      ArgAttr info = sig.resultInfo(i);
      Value root = storageRoot(ret.getOperand(i));
      std::optional<StepInput> input = parseStepInput(info.getName().str());
      if (info.getRole() != ArgRole::Input || !input ||
          isa<BlockArgument>(root) || outputBuffer.count(root))
        return step.emitError()
               << "result " << i << " ('" << info.getName()
               << "') of @target is not a step input computed by the program";
      std::string name = uniqueName("buffer", identifier(info.getName()));
      bufferNames += "constexpr int " + name + " = " +
                     std::to_string(step.getNumArguments() + i) + ";\n";
      outputBuffer[root] = name;
      auto t = tensorOf(root);
      outputSpecs += "      {" + quoted(info.getName()) +
                     ", BufferRole::Input, DType::" +
                     dtypeName(dtypeOf(t.getElementType())) + ", " +
                     intList(t.getShape()) + ", " +
                     std::to_string(int64_t(*input)) + "},\n";
    }
  }
  for (Operation &op : step.front().without_terminator())
    if (failed(emitOp(&op)))
      return failure();

  // Results: state must have been updated in place; metrics are copied
  // into their buffers, which follow the arguments.
  unsigned metricIndex = step.getNumArguments();
  std::string metricCopies, metricSpecs = outputSpecs;
  for (unsigned i = 0; i < ret.getNumOperands() && !sig.isTarget(); ++i) {
    ArgAttr info = sig.resultInfo(i);
    Value v = ret.getOperand(i);
    if (info.getRole() == ArgRole::Metric) {
      std::optional<int64_t> named = metricSchemaIndex(info.getName().str());
      std::string name = uniqueName("buffer", identifier(info.getName()));
      bufferNames += "constexpr int " + name + " = " +
                     std::to_string(metricIndex++) + ";\n";
      metricSpecs += "      {" + quoted(info.getName()) +
                     ", BufferRole::Metric, DType::F32, " +
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

  // The draft-block kernels' shapes.
  const int64_t B = config.rowsPerGpu, S = config.seqLen,
                N = config.anchorsPerRow;
  double flops = double(FlopCount::of(step).step());
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
     << "#include \"kernels/DraftBlocks.cuh\"\n"
     << "#include \"kernels/Embedding.cuh\"\n"
     << "#include \"kernels/Gemm.cuh\"\n"
     << "#include \"kernels/LmHeadCrossEntropy.cuh\"\n"
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
     << optimizerInit << "  t.opNames = {\n"
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

/// One more program of the trainer (the evaluation or the target) from its
/// own module: `what` names it in errors, `isKind` tells its signature.
FailureOr<std::string> emitCompanion(ModuleOp module, const ModelConfig &step,
                                     KernelWrappers &wrappers, StringRef what,
                                     bool (StepSignature::*isKind)() const) {
  FailureOr<StepSignature> sig = StepSignature::get(module);
  if (failed(sig))
    return failure();
  if (!((*sig).*isKind)())
    return module.emitError()
           << "the " << what << " module holds @" << sig->func().getSymName();
  FailureOr<ModelConfig> config = modelConfigOf(module);
  if (failed(config))
    return failure();
  if (config->name != step.name)
    return module.emitError() << "the " << what << " is of '" << config->name
                              << "' but the step of '" << step.name << "'";
  return StepEmitter(module, *config, *sig, wrappers).emit();
}

/// A program the trainer was built without: its factory returns null.
std::string absentProgram(StringRef factory, StringRef why) {
  return ("// Generated by dflashc: " + why +
          ".\n\n#include \"runtime/device/StepProgram.h\"\n\n"
          "std::unique_ptr<dflash::rt::StepProgram> dflash::rt::" +
          factory + "() {\n  return nullptr;\n}\n")
      .str();
}

} // namespace

namespace dflash {
FailureOr<CudaTrainerSources> translateToCuda(ModuleOp stepModule,
                                              ModuleOp evalModule,
                                              ModuleOp targetModule) {
  FailureOr<StepSignature> sig = StepSignature::get(stepModule);
  if (failed(sig))
    return failure();
  if (sig->isEval() || sig->isTarget())
    return stepModule.emitError()
           << "the step module holds @" << sig->func().getSymName();
  FailureOr<ModelConfig> config = modelConfigOf(stepModule);
  if (failed(config))
    return failure();
  CudaTrainerSources out;
  KernelWrappers wrappers;
  FailureOr<std::string> stepCu =
      StepEmitter(stepModule, *config, *sig, wrappers).emit();
  if (failed(stepCu))
    return failure();
  out.stepCu = std::move(*stepCu);
  if (evalModule) {
    FailureOr<std::string> evalCu =
        emitCompanion(evalModule, *config, wrappers, "evaluation program",
                      &StepSignature::isEval);
    if (failed(evalCu))
      return failure();
    out.evalCu = std::move(*evalCu);
  } else {
    out.evalCu =
        absentProgram("createEvalProgram", "no evaluation program was built in "
                                           "(dflash-translate without --eval)");
  }
  if (targetModule) {
    FailureOr<std::string> targetCu =
        emitCompanion(targetModule, *config, wrappers, "online target",
                      &StepSignature::isTarget);
    if (failed(targetCu))
      return failure();
    out.targetCu = std::move(*targetCu);
  } else {
    out.targetCu = absentProgram("createTargetProgram",
                                 "no online target was built in (dflashc "
                                 "without --target); the trainer reads "
                                 "features from its shards");
  }
  out.kernelsH = "// Generated by dflashc: one wrapper per kernel template "
                 "instantiation of the step and the evaluation.\n#pragma "
                 "once\n\n"
                 "#include \"kernels/BlockAttentionArgs.h\"\n"
                 "#include \"kernels/CausalAttentionArgs.h\"\n"
                 "#include \"kernels/DraftBlocks.cuh\"\n"
                 "#include \"kernels/RopeFrequencies.h\"\n\n" +
                 wrappers.decls;
  out.kernelsCu = "// Generated by dflashc: the kernel templates of the step "
                  "and the evaluation, instantiated with their constants.\n\n"
                  "#include \"kernels.h\"\n"
                  "#include \"kernels/BlockAttentionBwd.cuh\"\n"
                  "#include \"kernels/BlockAttentionFwd.cuh\"\n"
                  "#include \"kernels/CausalAttention.cuh\"\n"
                  "#include \"kernels/QkNormRope.cuh\"\n"
                  "#include \"kernels/RmsNorm.cuh\"\n\n" +
                  wrappers.defs;
  out.manifestJson = writeManifest(stepModule, *config, *sig);
  out.mainCpp = "// Generated by dflashc: the train command of \"" +
                config->name +
                "\".\n\n#include \"runtime/device/StepProgram.h\"\n"
                "#include \"runtime/cli/TrainMain.h\"\n\n"
                "int main(int argc, char **argv) {\n"
                "  return dflash::rt::trainMain(argc, argv, "
                "{&dflash::rt::createStepProgram, "
                "&dflash::rt::createEvalProgram, "
                "&dflash::rt::createTargetProgram});\n}\n";
  out.targetMainCpp =
      "// Generated by dflashc: the target-features command of \"" +
      config->name +
      "\" (its online target alone).\n\n"
      "#include \"runtime/cli/TargetFeaturesMain.h\"\n\n"
      "int main(int argc, char **argv) {\n"
      "  return dflash::rt::targetFeaturesMain(argc, argv, "
      "&dflash::rt::createTargetProgram);\n}\n";
  return out;
}
} // namespace dflash
