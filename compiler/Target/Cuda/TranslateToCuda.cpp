//===- TranslateToCuda.cpp - Planned step to step.cu and kernels.cu -------===//
//
// One case per kernel-level op. Each op becomes a launch in
// StepProgram::enqueue() with every shape a constant; templated kernels are
// called through wrappers in kernels.cu named after their constants
// ("attention_fwd_d128_bs16_nh32_nkv8_w2048_causal"), so that each
// instantiation is compiled once and the schedule stays readable.
//
//===----------------------------------------------------------------------===//

#include "compiler/Target/Cuda/TranslateToCuda.h"

#include "compiler/Analysis/FlopCount.h"
#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/ModelConfigAttr.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Target/Cuda/Manifest.h"
#include "dialect/DFlashOps.h"
#include "kernels/AttentionLimits.h"
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

/// "specs/tiny.toml:27:11 layers.0.self_attn", for comments.
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

class StepEmitter {
public:
  StepEmitter(ModuleOp module, const ModelConfig &config,
              const StepSignature &sig)
      : module(module), config(config), sig(sig) {}

  LogicalResult emit(CudaTrainerSources &out);

private:
  ModuleOp module;
  const ModelConfig &config;
  const StepSignature &sig;
  std::string body, wrapperDecls, wrapperDefs;
  llvm::raw_string_ostream os{body};
  llvm::StringSet<> wrappers;
  /// Metric buffers follow the arguments: loss, acc, grad_norm, lr.
  llvm::SmallVector<std::pair<std::string, unsigned>> metrics;
  std::optional<AdamWMultiOp> optimizer;
  /// ZeRO-1: the optimizer updates this GPU's shards (instead of optimizer).
  std::optional<AdamWShardedOp> shardedOptimizer;
  /// C++ expressions whose maximum is the workspace the kernels need.
  std::vector<std::string> workspaceTerms;
  /// What each profiled op is, in schedule order.
  std::vector<std::string> opNames;
  size_t numBuckets = 0;

  /// A typed device pointer to `v`'s storage.
  std::string ptr(Value v) {
    std::string type = cType(tensorOf(v).getElementType());
    if (auto arg = dyn_cast<BlockArgument>(v))
      return "static_cast<" + type + " *>(buf[" +
             std::to_string(arg.getArgNumber()) + "])";
    auto res = cast<OpResult>(v);
    auto offsets =
        res.getOwner()->getAttrOfType<DenseI64ArrayAttr>(kOffsetsAttrName);
    int64_t off = offsets[res.getResultNumber()];
    if (off < 0)
      return "static_cast<" + type + " *>(buf[" + std::to_string(-off - 1) +
             "])";
    return "reinterpret_cast<" + type + " *>(arena + " + std::to_string(off) +
           ")";
  }

  /// Declares wrapper `name` once: `signature` is its parameter list,
  /// `call` its body.
  void wrapper(const std::string &name, const std::string &signature,
               const std::string &call) {
    if (!wrappers.insert(name).second)
      return;
    wrapperDecls += "void " + name + "(" + signature + ");\n";
    wrapperDefs += "void " + name + "(" + signature + ") {\n  " + call +
                   ";\n}\n\n";
  }

  /// The schema's index of argument `i` within its role (BufferSpec::index).
  FailureOr<int64_t> bufferIndex(unsigned i);
  LogicalResult emitOp(Operation *op);
  LogicalResult emitKernel(Operation *op);
  /// rms_norm_fwd_bf16 with an optional residual `delta` (written to `sum`).
  LogicalResult emitNorm(Operation *op, Value input, Value delta, Value weight,
                         Value sum, Value result, double eps);
  LogicalResult emitNormGrad(Operation *op, Value residualGrad);
  LogicalResult emitAttention(Operation *op, bool backward);
  std::string stepCu(int64_t arena, double flops);
  /// ZeRO-1: constructor code that fills shardLayout, and bind() code that
  /// cuts this rank's pieces into the optimizer tables and the copies of
  /// the parameter all-gather.
  std::string shardLayoutInit();
  std::string shardTablesBind();
  /// ZeRO-1: the members of the generated class that gather parameters.
  std::string shardedMembers();
};

LogicalResult StepEmitter::emitNorm(Operation *op, Value input, Value delta,
                                    Value weight, Value sum, Value result,
                                    double eps) {
  int64_t H = tensorOf(input).getShape().back();
  if (H % 8 != 0)
    return op->emitOpError() << "has no kernel for a normalised dimension "
                             << H << " (it must be a multiple of 8)";
  std::string name = "rms_norm_fwd_h" + std::to_string(H);
  wrapper(name,
          "const __nv_bfloat16 *x, const __nv_bfloat16 *delta, const "
          "__nv_bfloat16 *w, __nv_bfloat16 *xSum, __nv_bfloat16 *y, "
          "int64_t rows, float eps, cudaStream_t stream",
          "dflash::kernels::rms_norm_fwd_bf16<" + std::to_string(H) +
              ">(x, delta, w, xSum, y, rows, eps, stream)");
  os << llvm::formatv("    {0}({1}, {2}, {3}, {4}, {5}, {6}, {7}, stream);\n",
                      name, ptr(input), delta ? ptr(delta) : "nullptr",
                      ptr(weight), sum ? ptr(sum) : "nullptr", ptr(result),
                      rowsOf(input), formatFloat(eps));
  return success();
}

LogicalResult StepEmitter::emitNormGrad(Operation *op, Value residualGrad) {
  Value grad = op->getOperand(0), input = op->getOperand(1),
        weight = op->getOperand(2);
  int64_t H = tensorOf(input).getShape().back();
  if (H % 8 != 0)
    return op->emitOpError() << "has no kernel for a normalised dimension "
                             << H << " (it must be a multiple of 8)";
  std::string name = "rms_norm_bwd_h" + std::to_string(H);
  wrapper(name,
          "const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const "
          "__nv_bfloat16 *w, const __nv_bfloat16 *dResidual, __nv_bfloat16 "
          "*dx, __nv_bfloat16 *dw, int64_t rows, float eps, float "
          "*workspace, cudaStream_t stream",
          "dflash::kernels::rms_norm_bwd_bf16<" + std::to_string(H) +
              ", __nv_bfloat16>(dy, x, w, dResidual, dx, dw, rows, eps, "
              "workspace, stream)");
  double eps = op->getAttrOfType<FloatAttr>("eps").getValueAsDouble();
  os << llvm::formatv("    {0}({1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, "
                      "reinterpret_cast<float *>(workspace), stream);\n",
                      name, ptr(grad), ptr(input), ptr(weight),
                      residualGrad ? ptr(residualGrad) : "nullptr",
                      ptr(op->getResult(0)), ptr(op->getResult(1)),
                      rowsOf(input), formatFloat(eps));
  return success();
}

LogicalResult StepEmitter::emitAttention(Operation *op, bool backward) {
  unsigned base = backward ? 1 : 0; // the gradient op starts with dOut
  Value q = op->getOperand(base), kc = op->getOperand(base + 1);
  auto qt = tensorOf(q), kt = tensorOf(kc);
  int64_t D = qt.getDimSize(3), NH = qt.getDimSize(2), NKV = kt.getDimSize(2);
  int64_t BS = op->getAttrOfType<IntegerAttr>("block_size").getInt();
  auto windowAttr = op->getAttrOfType<IntegerAttr>("window");
  int64_t window = windowAttr ? windowAttr.getInt() : 0;
  bool causal = op->hasAttr("causal");
  if (D != 64 && D != 128)
    return op->emitOpError() << "has no attention kernel for head_dim " << D
                             << " (64 or 128)";
  int64_t blockRows = BS * (NH / NKV);
  if (blockRows > 128 || (blockRows > 64 && blockRows % 64 != 0))
    return op->emitOpError()
           << "has no attention kernel for " << blockRows
           << " query rows per block and kv head (block_size x num_heads / "
              "num_kv_heads must be at most 64, or 128)";
  std::string suffix = llvm::formatv("d{0}_bs{1}_nh{2}_nkv{3}_w{4}{5}", D, BS,
                                     NH, NKV, window,
                                     causal ? "_causal" : "");
  std::string templateArgs = llvm::formatv("{0}, {1}, {2}, {3}, {4}, {5}", D,
                                           BS, NH, NKV, window,
                                           causal ? "true" : "false");
  os << "    {\n";
  if (!backward) {
    auto o = cast<BlockAttentionOp>(op);
    std::string name = "attention_fwd_" + suffix;
    wrapper(name,
            "const dflash::kernels::BlockAttentionFwdArgs &args, "
            "cudaStream_t stream",
            "dflash::kernels::block_attention_fwd_bf16<" + templateArgs +
                ">(args, stream)");
    os << "      dflash::kernels::BlockAttentionFwdArgs a{};\n"
       << llvm::formatv("      a.q = {0};\n      a.contextKeys = {1};\n"
                        "      a.contextValues = {2};\n      a.draftKeys = {3};\n"
                        "      a.draftValues = {4};\n      a.anchors = {5};\n"
                        "      a.keep = {6};\n      a.out = {7};\n"
                        "      a.lse = {8};\n",
                        ptr(o.getQuery()), ptr(o.getContextKeys()),
                        ptr(o.getContextValues()), ptr(o.getDraftKeys()),
                        ptr(o.getDraftValues()), ptr(o.getAnchors()),
                        ptr(o.getKeep()), ptr(o.getResult()), ptr(o.getLse()))
       << "      a.B = kBlocks.B;\n      a.S = kBlocks.S;\n"
          "      a.N = kBlocks.N;\n"
       << "      " << name << "(a, stream);\n";
  } else {
    // The backward keeps every block's anchor in shared memory: reject what
    // the GPU cannot launch here, naming the spec field, not at run time.
    const int64_t N = qt.getDimSize(1) / BS;
    const int64_t limit = ::dflash::kernels::kSharedMemoryPerBlockOptIn;
    auto smemFor = [&](int64_t n) {
      return ::dflash::kernels::blockAttentionBwdSmemBytes(D, BS, NH, NKV, n);
    };
    if (smemFor(N) > limit) {
      int64_t fits = N;
      while (fits > 1 && smemFor(fits) > limit)
        --fits;
      return op->emitOpError()
             << "needs " << (smemFor(N) + 1023) / 1024
             << " KiB of shared memory per CTA for " << N
             << " anchors per row; sm_90 allows " << limit / 1024
             << " KiB: 'training.anchors_per_row' must be at most " << fits;
    }
    auto o = cast<BlockAttentionGradOp>(op);
    std::string name = "attention_bwd_" + suffix;
    wrapper(name,
            "const dflash::kernels::BlockAttentionBwdArgs &args, "
            "cudaStream_t stream",
            "dflash::kernels::block_attention_bwd_bf16<" + templateArgs +
                ">(args, stream)");
    int64_t rows = qt.getNumElements() / D;
    os << "      dflash::kernels::BlockAttentionBwdArgs a{};\n"
       << llvm::formatv(
              "      a.dOut = {0};\n      a.q = {1};\n"
              "      a.contextKeys = {2};\n      a.contextValues = {3};\n"
              "      a.draftKeys = {4};\n      a.draftValues = {5};\n"
              "      a.anchors = {6};\n      a.keep = {7};\n"
              "      a.out = {8};\n      a.lse = {9};\n",
              ptr(o.getGrad()), ptr(o.getQuery()), ptr(o.getContextKeys()),
              ptr(o.getContextValues()), ptr(o.getDraftKeys()),
              ptr(o.getDraftValues()), ptr(o.getAnchors()), ptr(o.getKeep()),
              ptr(o.getOutput()), ptr(o.getLse()))
       << llvm::formatv(
              "      a.dq = {0};\n      a.dContextKeys = {1};\n"
              "      a.dContextValues = {2};\n      a.dDraftKeys = {3};\n"
              "      a.dDraftValues = {4};\n",
              ptr(o.getQueryGrad()), ptr(o.getContextKeysGrad()),
              ptr(o.getContextValuesGrad()), ptr(o.getDraftKeysGrad()),
              ptr(o.getDraftValuesGrad()))
       << "      a.dqAccum = reinterpret_cast<float *>(workspace);\n"
       << llvm::formatv("      a.dOutDotOut = reinterpret_cast<float *>("
                        "workspace) + {0};\n",
                        rows * D)
       << "      a.B = kBlocks.B;\n      a.S = kBlocks.S;\n"
          "      a.N = kBlocks.N;\n"
       << "      " << name << "(a, stream);\n";
    workspaceTerms.push_back(
        llvm::formatv("dflash::kernels::blockAttentionBwdWorkspaceBytes<{0}, "
                      "{1}, {2}, {3}>({4}, {5})",
                      D, BS, NH, NKV, qt.getDimSize(0),
                      qt.getDimSize(1) / BS));
  }
  os << "    }\n";
  return success();
}

LogicalResult StepEmitter::emitOp(Operation *op) {
  std::string where = describeLoc(op->getLoc());
  os << "    // " << op->getName().getStringRef();
  if (!where.empty())
    os << " (" << where << ")";
  os << "\n";
  if (isa<ReshapeOp>(op))
    return success(); // a view: nothing runs
  size_t index = opNames.size();
  std::string name = op->getName().getStringRef().str();
  if (auto loc = dyn_cast<NameLoc>(op->getLoc()))
    name += " " + loc.getName().getValue().str();
  opNames.push_back(name);
  os << "    profiler.begin(" << index << ", stream);\n";
  LogicalResult result = emitKernel(op);
  os << "    profiler.end(" << index << ", stream);\n";
  return result;
}

LogicalResult StepEmitter::emitKernel(Operation *op) {
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](ReshapeOp) { return success(); }) // a view
      .Case([&](AllReduceOp o) {
        // In place; the identity on one GPU.
        for (Value v : o.getInputs())
          os << llvm::formatv("    allReduce({0}, {1}, stream);\n", ptr(v),
                              tensorOf(v).getNumElements());
        return success();
      })
      .Case([&](LinearOp o) {
        auto w = tensorOf(o.getWeight());
        os << llvm::formatv(
            "    res.gemm->linear({0}, {1}, {2}, {3}, {4}, {5}, stream);\n",
            ptr(o.getInput()), ptr(o.getWeight()), ptr(o.getResult()),
            rowsOf(o.getInput()), w.getDimSize(0), w.getDimSize(1));
        return success();
      })
      .Case([&](LinearGradInputOp o) {
        auto w = tensorOf(o.getWeight());
        os << llvm::formatv("    res.gemm->linearGradInput({0}, {1}, {2}, {3}, "
                            "{4}, {5}, stream);\n",
                            ptr(o.getGrad()), ptr(o.getWeight()),
                            ptr(o.getResult()), rowsOf(o.getGrad()),
                            w.getDimSize(0), w.getDimSize(1));
        return success();
      })
      .Case([&](LinearGradWeightOp o) {
        auto dw = tensorOf(o.getResult());
        os << llvm::formatv("    res.gemm->linearGradWeight({0}, {1}, {2}, "
                            "{3}, {4}, {5}, stream);\n",
                            ptr(o.getGrad()), ptr(o.getInput()),
                            ptr(o.getResult()), rowsOf(o.getGrad()),
                            dw.getDimSize(0), dw.getDimSize(1));
        return success();
      })
      .Case([&](AccumulateLinearGradOp o) {
        std::string acc = ptr(o.getAccumulator()), out = ptr(o.getResult());
        if (acc != out)
          os << llvm::formatv(
              "    check(cudaMemcpyAsync({0}, {1}, {2}, "
              "cudaMemcpyDeviceToDevice, stream), \"copy accumulator\");\n",
              out, acc, tensorBytes(o.getResult().getType()));
        if (o.getWeightGrad()) {
          auto dw = tensorOf(o.getResult());
          os << llvm::formatv("    res.gemm->linearGradWeight({0}, {1}, {2}, "
                              "{3}, {4}, {5}, stream, 1.f);\n",
                              ptr(o.getGrad()), ptr(o.getOperand()), out,
                              rowsOf(o.getGrad()), dw.getDimSize(0),
                              dw.getDimSize(1));
        } else {
          auto w = tensorOf(o.getOperand());
          os << llvm::formatv("    res.gemm->linearGradInput({0}, {1}, {2}, "
                              "{3}, {4}, {5}, stream, 1.f);\n",
                              ptr(o.getGrad()), ptr(o.getOperand()), out,
                              rowsOf(o.getGrad()), w.getDimSize(0),
                              w.getDimSize(1));
        }
        return success();
      })
      .Case([&](RmsNormOp o) {
        return emitNorm(o, o.getInput(), Value(), o.getWeight(), Value(),
                        o.getResult(), o.getEps().convertToDouble());
      })
      .Case([&](ResidualRmsNormOp o) {
        return emitNorm(o, o.getInput(), o.getDelta(), o.getWeight(),
                        o.getSum(), o.getResult(),
                        o.getEps().convertToDouble());
      })
      .Case([&](RmsNormGradOp o) { return emitNormGrad(o, Value()); })
      .Case([&](RmsNormGradResidualOp o) {
        return emitNormGrad(o, o.getResidualGrad());
      })
      .Case([&](QkNormRopeOp o) {
        auto x = tensorOf(o.getInput());
        int64_t heads = x.getDimSize(2), D = x.getDimSize(3);
        std::string name = llvm::formatv("qk_norm_rope_fwd_d{0}_h{1}", D,
                                         heads);
        wrapper(name,
                "const __nv_bfloat16 *x, const __nv_bfloat16 *w, const "
                "int32_t *pos, __nv_bfloat16 *y, int64_t rows, float eps, "
                "float theta, cudaStream_t stream",
                llvm::formatv("dflash::kernels::qk_norm_rope_fwd_bf16<{0}, "
                              "{1}>(x, w, pos, y, rows, eps, theta, stream)",
                              D, heads));
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
        int64_t heads = x.getDimSize(2), D = x.getDimSize(3);
        std::string name = llvm::formatv("qk_norm_rope_bwd_d{0}_h{1}", D,
                                         heads);
        wrapper(name,
                "const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const "
                "__nv_bfloat16 *w, const int32_t *pos, __nv_bfloat16 *dx, "
                "__nv_bfloat16 *dw, int64_t rows, float eps, float theta, "
                "float *workspace, cudaStream_t stream",
                llvm::formatv("dflash::kernels::qk_norm_rope_bwd_bf16<{0}, "
                              "{1}, __nv_bfloat16>(dy, x, w, pos, dx, dw, "
                              "rows, eps, theta, workspace, stream)",
                              D, heads));
        os << llvm::formatv(
            "    {0}({1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, "
            "reinterpret_cast<float *>(workspace), stream);\n",
            name, ptr(o.getGrad()), ptr(o.getInput()), ptr(o.getWeight()),
            ptr(o.getPositions()), ptr(o.getInputGrad()),
            ptr(o.getWeightGrad()), x.getDimSize(0) * x.getDimSize(1),
            formatFloat(o.getEps().convertToDouble()),
            formatFloat(o.getTheta().convertToDouble()));
        return success();
      })
      .Case([&](BlockAttentionOp o) { return emitAttention(o, false); })
      .Case([&](BlockAttentionGradOp o) { return emitAttention(o, true); })
      .Case([&](SwigluOp o) {
        int64_t cols = tensorOf(o.getGate()).getShape().back();
        os << llvm::formatv("    dflash::kernels::swiglu_fwd_bf16({{{0}, {3}}, "
                            "{{{1}, {3}}, {{{2}, {3}}, {4}, {3}, stream);\n",
                            ptr(o.getGate()), ptr(o.getUp()),
                            ptr(o.getResult()), cols, rowsOf(o.getGate()));
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
        auto table = tensorOf(o.getTable());
        int64_t H = table.getDimSize(1);
        std::string name = "draft_embed_h" + std::to_string(H);
        wrapper(name,
                "const __nv_bfloat16 *embed, const int32_t *ids, const "
                "int32_t *anchors, const uint8_t *keep, __nv_bfloat16 *out, "
                "dflash::kernels::DraftBlocksShape shape, int mask, "
                "cudaStream_t stream",
                "dflash::kernels::draft_embed_bf16<" + std::to_string(H) +
                    ">(embed, ids, anchors, keep, out, nullptr, shape, mask, "
                    "stream)");
        os << llvm::formatv("    {0}({1}, {2}, {3}, {4}, {5}, kBlocks, {6}, "
                            "stream);\n",
                            name, ptr(o.getTable()), ptr(o.getInputIds()),
                            ptr(o.getAnchors()), ptr(o.getKeep()),
                            ptr(o.getResult()), o.getMaskTokenId());
        return success();
      })
      .Case([&](DraftPositionsOp o) {
        os << llvm::formatv("    dflash::kernels::draft_positions({0}, {1}, "
                            "kBlocks, stream);\n",
                            ptr(o.getAnchors()), ptr(o.getResult()));
        return success();
      })
      .Case([&](SequencePositionsOp o) {
        auto t = tensorOf(o.getResult());
        os << llvm::formatv("    dflash::kernels::sequence_positions({0}, {1}, "
                            "{2}, stream);\n",
                            ptr(o.getResult()), t.getDimSize(0),
                            t.getDimSize(1));
        return success();
      })
      .Case([&](DraftTargetsOp o) {
        os << llvm::formatv(
            "    dflash::kernels::draft_targets({0}, {1}, {2}, {3}, {4}, {5}, "
            "kBlocks, {6}, stream);\n",
            ptr(o.getInputIds()), ptr(o.getLossMask()), ptr(o.getAnchors()),
            ptr(o.getKeep()), ptr(o.getLabels()), ptr(o.getWeights()),
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
      .Case([&](LmHeadCeFusedOp o) {
        auto w = tensorOf(o.getWeight());
        int64_t rows = rowsOf(o.getInput());
        int64_t chunk = lmHeadChunkRows(rows, w.getDimSize(0));
        os << "    {\n"
           << "      dflash::kernels::LmHeadCrossEntropyArgs a{};\n"
           << llvm::formatv("      a.y = {0};\n      a.lmHead = {1};\n"
                            "      a.labels = {2};\n      a.weights = {3};\n"
                            "      a.dLossSum = {4};\n      a.dy = {5};\n",
                            ptr(o.getInput()), ptr(o.getWeight()),
                            ptr(o.getLabels()), ptr(o.getWeights()),
                            ptr(o.getLossSumGrad()), ptr(o.getInputGrad()))
           << llvm::formatv(
                  "      a.sums = reinterpret_cast<float *>(workspace);\n"
                  "      a.rowTerms = reinterpret_cast<float *>(workspace + "
                  "256);\n"
                  "      a.logitsChunk = reinterpret_cast<__nv_bfloat16 *>("
                  "workspace + 256 + kLmHeadRowTermBytes);\n"
                  "      a.rows = {0};\n      a.V = {1};\n      a.H = {2};\n"
                  "      a.chunkRows = {3};\n"
                  "      dflash::kernels::lm_head_cross_entropy_bf16(*res.gemm, "
                  "a, stream);\n",
                  rows, w.getDimSize(0), w.getDimSize(1), chunk);
        Value sums[] = {o.getLossSum(), o.getWeightSum(), o.getCorrect(),
                        o.getCount()};
        for (int i = 0; i < 4; ++i)
          os << llvm::formatv("      check(cudaMemcpyAsync({0}, a.sums + {1}, "
                              "4, cudaMemcpyDeviceToDevice, stream), "
                              "\"copy loss sums\");\n",
                              ptr(sums[i]), i);
        os << "    }\n";
        return success();
      })
      .Case([&](LossStatsOp o) {
        os << llvm::formatv("    dflash::kernels::loss_stats_f32({0}, {1}, {2}, "
                            "{3}, {4}, {5}, {6}, stream);\n",
                            ptr(o.getLossSum()), ptr(o.getWeightSum()),
                            ptr(o.getCorrect()), ptr(o.getCount()),
                            ptr(o.getLoss()), ptr(o.getAcc()),
                            ptr(o.getLossSumGrad()));
        return success();
      })
      .Case([&](GradientBucketOp o) {
        // fp32 copies, then one in-place collective on the communication
        // stream while the backward pass goes on: an all-reduce, or with
        // ZeRO-1 a reduce-scatter (whose shards exist even on one GPU). On
        // one GPU without shards the optimizer reads the bf16 gradients.
        size_t k = numBuckets++;
        const bool sharded = bool(o.getShardElementsAttr());
        os << (sharded ? "    {\n" : "    if (res.allReduceSum) {\n");
        for (auto [g, r] : llvm::zip(o.getGrads(), o.getResults()))
          os << llvm::formatv("      dflash::kernels::convert_bf16_f32({0}, "
                              "{1}, {2}, stream);\n",
                              ptr(g), ptr(r),
                              tensorOf(r).getNumElements());
        const char *hook = sharded ? "reduceScatterSum" : "allReduceSum";
        int64_t count = sharded ? o.getShardElementsAttr().getInt()
                                : bucketFlatElements(o);
        os << llvm::formatv(
            "      if (res.{3}) {{\n"
            "        check(cudaEventRecord(bucketReady[{0}], stream), "
            "\"bucket event\");\n"
            "        check(cudaStreamWaitEvent(commStream, bucketReady[{0}], "
            "0), \"bucket wait\");\n"
            "        res.{3}(res.collectives, {1}, {2}, commStream);\n"
            "        check(cudaEventRecord(bucketDone[{0}], commStream), "
            "\"bucket event\");\n"
            "      }\n"
            "    }\n",
            k, ptr(o.getResult(0)), count, hook);
        return success();
      })
      .Case([&](AdamWMultiOp o) {
        optimizer = o;
        os << llvm::formatv(
            "    dflash::kernels::lr_schedule({0}, {1}, hyper.lr, "
            "hyper.warmupRatio, adamwState, {2}, stream);\n"
            "    if (res.allReduceSum) {{\n"
            "      for (cudaEvent_t done : bucketDone)\n"
            "        check(cudaStreamWaitEvent(stream, done, 0), "
            "\"bucket join\");\n"
            "      dflash::kernels::adamw_multi_tensor_step<float>("
            "adamwTablesF32, adamwState, adamwHyper, stream);\n"
            "    } else {{\n"
            "      dflash::kernels::adamw_multi_tensor_step<__nv_bfloat16>("
            "adamwTables, adamwState, adamwHyper, stream);\n"
            "    }\n"
            "    check(cudaMemcpyAsync({3}, adamwTables.normAndClip, 4, "
            "cudaMemcpyDeviceToDevice, stream), \"copy grad norm\");\n",
            ptr(o.getStep()), ptr(o.getTotal()), ptr(o.getLrValue()),
            ptr(o.getGradNorm()));
        return success();
      })
      .Case([&](AdamWShardedOp o) {
        // ZeRO-1: each rank's sum of squares, summed over the ranks, gives
        // the global norm; each rank updates its pieces, then every rank
        // gathers the others' parameters.
        shardedOptimizer = o;
        os << llvm::formatv(
            "    dflash::kernels::lr_schedule({0}, {1}, hyper.lr, "
            "hyper.warmupRatio, adamwState, {2}, stream);\n"
            "    if (res.reduceScatterSum)\n"
            "      for (cudaEvent_t done : bucketDone)\n"
            "        check(cudaStreamWaitEvent(stream, done, 0), "
            "\"bucket join\");\n"
            "    dflash::kernels::adamw_grad_square_sum<float>(adamwTables, "
            "squareSum, stream);\n"
            "    allReduce(squareSum, 1, stream);\n"
            "    dflash::kernels::adamw_clip_from_square_sum(adamwTables, "
            "squareSum, adamwHyper, stream);\n"
            "    dflash::kernels::adamw_update<float>(adamwTables, "
            "adamwState, adamwHyper, stream);\n"
            "    gatherParameters(stream);\n"
            "    check(cudaMemcpyAsync({3}, adamwTables.normAndClip, 4, "
            "cudaMemcpyDeviceToDevice, stream), \"copy grad norm\");\n",
            ptr(o.getStep()), ptr(o.getTotal()), ptr(o.getLrValue()),
            ptr(o.getGradNorm()));
        return success();
      })
      .Default([&](Operation *other) {
        return other->emitOpError("has no CUDA translation");
      });
}

} // namespace

namespace {

std::string quoted(StringRef s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

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

std::string shapeList(ArrayRef<int64_t> shape) {
  std::string s = "{";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "}";
}


std::string cppValue(const std::string &v) { return quoted(v); }
std::string cppValue(int64_t v) { return std::to_string(v); }
std::string cppValue(double v) { return doubleText(v); }
std::string cppValue(bool v) { return v ? "true" : "false"; }
std::string cppValue(const std::vector<int64_t> &v) {
  std::string r = "{";
  for (size_t i = 0; i < v.size(); ++i)
    r += (i ? ", " : "") + std::to_string(v[i]);
  return r + "}";
}

/// The ModelConfig constructor body: one assignment per schema field.
std::string modelConfigInit(const ModelConfig &config) {
  std::string o;
  forEachModelConfigField(config, [&](const char *, const char *member,
                                      const auto &value) {
    o += std::string("    cfg.") + member + " = " + cppValue(value) + ";\n";
  });
  return o;
}

int64_t alignUp(int64_t x) {
  return (x + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

} // namespace

/// For each bucket of the sharded optimizer, its tensors in flat order:
/// the index of each one's grad (and parameter) in the op.
static SmallVector<SmallVector<unsigned>> bucketTensors(AdamWShardedOp o) {
  SmallVector<SmallVector<unsigned>> out;
  for (GradientBucketOp bucket : shardedBuckets(o)) {
    SmallVector<unsigned> &tensors = out.emplace_back();
    for (Value r : bucket.getResults())
      tensors.push_back(
          unsigned(llvm::find(o.getGrads(), r) - o.getGrads().begin()));
  }
  return out;
}

std::string StepEmitter::shardLayoutInit() {
  AdamWShardedOp o = *shardedOptimizer;
  SmallVector<GradientBucketOp> buckets = shardedBuckets(o);
  SmallVector<SmallVector<unsigned>> tensors = bucketTensors(o);
  std::string init;
  llvm::raw_string_ostream is(init);
  is << "    // ZeRO-1: which flat elements of each bucket hold which "
        "tensor.\n"
     << "    shardLayout.worldSize = " << o.getWorldSizeAttr().getInt()
     << ";\n    shardLayout.buckets = {\n";
  for (auto [k, bucket] : llvm::enumerate(buckets)) {
    SmallVector<int64_t> offsets = bucketResultOffsets(bucket);
    is << "        {{\n";
    for (auto [i, offset] : llvm::zip(tensors[k], offsets)) {
      auto param = cast<BlockArgument>(o.getParams()[i]);
      std::string name = sig.argInfo(param.getArgNumber()).getName().str();
      is << "             {" << quoted(name) << ", " << offset / 4 << ", "
         << tensorOf(param).getNumElements() << ", "
         << findParameter(config, name).value_or(-1) << "},\n";
    }
    is << "         },\n         " << bucket.getShardElementsAttr().getInt()
       << "},\n";
  }
  is << "    };\n";
  return init;
}

std::string StepEmitter::shardTablesBind() {
  AdamWShardedOp o = *shardedOptimizer;
  SmallVector<GradientBucketOp> buckets = shardedBuckets(o);
  SmallVector<SmallVector<unsigned>> tensors = bucketTensors(o);
  std::string bind;
  llvm::raw_string_ostream bs(bind);
  bs << "    // ZeRO-1: this rank's pieces of every bucket's shard, and the\n"
     << "    // copies that gather the others' parameters.\n"
     << "    if (res.worldSize != shardLayout.worldSize || res.rank < 0 ||\n"
     << "        res.rank >= res.worldSize) {\n"
     << "      std::fprintf(stderr, \"train: error: this step shards the "
        "optimizer state over %lld GPUs but runs as rank %lld of %lld\\n\",\n"
     << "                   (long long)shardLayout.worldSize, "
        "(long long)res.rank, (long long)res.worldSize);\n"
     << "      std::quick_exit(1);\n    }\n"
     << "    struct BucketRefs {\n      float *grads, *master, *m, *v;\n"
     << "      std::vector<__nv_bfloat16 *> params;\n    };\n"
     << "    const BucketRefs refs[] = {\n";
  for (auto [k, bucket] : llvm::enumerate(buckets)) {
    bs << "        {" << ptr(bucket.getResult(0)) << ",\n         "
       << ptr(o.getMasters()[k]) << ",\n         " << ptr(o.getMoment1()[k])
       << ",\n         " << ptr(o.getMoment2()[k]) << ",\n         {";
    for (auto [j, i] : llvm::enumerate(tensors[k]))
      bs << (j ? ", " : "") << ptr(o.getParams()[i]);
    bs << "}},\n";
  }
  bs << "    };\n"
     << "    std::vector<dflash::kernels::AdamWTensor> tensors;\n"
     << "    std::vector<int64_t> lengths;\n"
     << "    packCopies.clear();\n    unpackCopies.clear();\n"
     << "    gathers.clear();\n"
     << "    for (size_t k = 0; k < shardLayout.buckets.size(); ++k) {\n"
     << "      const dflash::rt::ShardedBucket &bucket = "
        "shardLayout.buckets[k];\n"
     << "      const BucketRefs &r = refs[k];\n"
     << "      auto *staging = reinterpret_cast<__nv_bfloat16 *>(r.grads);\n"
     << "      const int64_t own = res.rank * bucket.shardElements;\n"
     << "      for (const dflash::rt::ShardPiece &p :\n"
     << "           dflash::rt::shardPieces(bucket, res.rank)) {\n"
     << "        const dflash::rt::ShardedTensor &t = "
        "bucket.tensors[p.tensor];\n"
     << "        __nv_bfloat16 *param = r.params[p.tensor] + "
        "p.tensorOffset;\n"
     << "        tensors.push_back({param, r.master + p.shardOffset,\n"
     << "                           r.grads + t.offset + p.tensorOffset,\n"
     << "                           r.m + p.shardOffset, r.v + "
        "p.shardOffset, p.length});\n"
     << "        lengths.push_back(p.length);\n"
     << "        packCopies.push_back({staging + own + p.shardOffset, param,\n"
     << "                              size_t(p.length) * 2});\n"
     << "      }\n"
     << "      for (size_t t = 0; t < bucket.tensors.size(); ++t)\n"
     << "        unpackCopies.push_back({r.params[t], staging + "
        "bucket.tensors[t].offset,\n"
     << "                                size_t(bucket.tensors[t].numel) * "
        "2});\n"
     << "      gathers.push_back({r.grads, size_t(bucket.shardElements) * "
        "2});\n"
     << "    }\n"
     << "    chunks = dflash::kernels::buildAdamWChunks(lengths);\n";
  return bind;
}

std::string StepEmitter::shardedMembers() {
  // gatherParameters() and what it and shardTablesBind() fill.
  return R"(  // ZeRO-1: every rank's updated shards to every rank, through the
  // buckets' slots (dead once the update has read them) as bf16.
  void gatherParameters(cudaStream_t stream) {
    if (!res.allGather)
      return; // one GPU: its pieces are all the parameters
    for (const ShardCopy &c : packCopies)
      check(cudaMemcpyAsync(c.to, c.from, c.bytes, cudaMemcpyDeviceToDevice,
                            stream), "pack a parameter shard");
    for (const ShardGather &g : gathers)
      res.allGather(res.collectives, g.data, g.shardBytes, stream);
    for (const ShardCopy &c : unpackCopies)
      check(cudaMemcpyAsync(c.to, c.from, c.bytes, cudaMemcpyDeviceToDevice,
                            stream), "unpack gathered parameters");
  }

  struct ShardCopy {
    void *to;
    const void *from;
    size_t bytes;
  };
  struct ShardGather {
    void *data;
    size_t shardBytes;
  };
  dflash::rt::OptimizerShardLayout shardLayout;
  std::vector<ShardCopy> packCopies, unpackCopies;
  std::vector<ShardGather> gathers;
  float *squareSum = nullptr;
)";
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
    if (auto frozen = parseFrozenWeight(name))
      index = int64_t(*frozen);
    break;
  case BufferRole::Counter:
    if (auto counter = parseStepCounter(name))
      index = int64_t(*counter);
    break;
  case BufferRole::Metric:
    if (auto metric = parseStepMetric(name))
      index = int64_t(*metric);
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

LogicalResult StepEmitter::emit(CudaTrainerSources &out) {
  func::FuncOp step = sig.func();
  auto arena = module->getAttrOfType<IntegerAttr>(kArenaBytesAttrName);
  if (!arena)
    return module.emitError("the module has no memory plan: run "
                            "dflash-plan-memory before translation to CUDA");
  for (Operation &op : step.front().without_terminator())
    if (failed(emitOp(&op)))
      return failure();

  // Results: state must have been updated in place; metrics are copied
  // into their buffers.
  func::ReturnOp ret = sig.returnOp();
  unsigned metricIndex = step.getNumArguments();
  std::string metricCopies, metricSpecs;
  for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
    ArgAttr info = sig.resultInfo(i);
    Value v = ret.getOperand(i);
    if (info.getRole() == ArgRole::Metric) {
      std::optional<StepMetric> named = parseStepMetric(info.getName().str());
      metricSpecs += "        {" + quoted(info.getName()) +
                     ", BufferRole::Metric, DType::F32, {}, " +
                     std::to_string(named ? int64_t(*named) : -1) + "},\n";
      metricCopies += llvm::formatv(
          "    check(cudaMemcpyAsync(buf[{0}], {1}, 4, "
          "cudaMemcpyDeviceToDevice, stream), \"copy metric {2}\");\n",
          metricIndex++, ptr(v), info.getName());
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
    specs += "        {" + quoted(info.getName()) + ", BufferRole::" +
             enumeratorOf(bufferRole(info.getRole())) + ", DType::" +
             dtypeName(dtypeOf(t.getElementType())) + ", " +
             shapeList(t.getShape()) + ", " + std::to_string(*index) +
             "},\n";
  }
  specs += metricSpecs;

  // Shapes shared by the draft-block kernels.
  std::optional<unsigned> ids = sig.findArg(ArgRole::Input, "input_ids");
  std::optional<unsigned> anchors = sig.findArg(ArgRole::Input, "anchors");
  if (!ids || !anchors)
    return step.emitError("@step has no input_ids or anchors argument");
  auto idsType = tensorOf(step.getArgument(*ids));
  auto anchorsType = tensorOf(step.getArgument(*anchors));
  int64_t B = idsType.getDimSize(0), S = idsType.getDimSize(1),
          N = anchorsType.getDimSize(1);
  int64_t rows = B * N * config.blockSize;

  // Kernel workspaces (kernels run one at a time and share them).
  workspaceTerms.push_back("size_t(256) + kLmHeadRowTermBytes + "
                           "dflash::kernels::lmHeadCrossEntropyChunkBytes(" +
                           std::to_string(lmHeadChunkRows(rows,
                                                          config.vocabSize)) +
                           ", " + std::to_string(config.vocabSize) + ")");
  workspaceTerms.push_back(
      "dflash::kernels::rmsNormBwdWorkspaceBytes(" +
      std::to_string(config.hiddenSize) + ")");
  workspaceTerms.push_back("dflash::kernels::qkNormRopeBwdWorkspaceBytes(" +
                           std::to_string(config.headDim) + ")");

  // Optimizer tables: one entry per parameter, built at bind time.
  // Two tables: the bf16 gradients (one GPU) and their all-reduced fp32
  // bucket copies (several GPUs).
  std::string sizes, tensors, tensorsF32;
  if (optimizer) {
    AdamWMultiOp o = *optimizer;
    for (unsigned i = 0; i < o.getNumParams(); ++i) {
      Value g = o.getGrads()[i], bf16Grad = g;
      if (auto bucket = g.getDefiningOp<GradientBucketOp>())
        bf16Grad = bucket.getGrads()[cast<OpResult>(g).getResultNumber()];
      if (!tensorOf(bf16Grad).getElementType().isBF16())
        return o.emitOpError("expects bf16 gradients or gradient buckets of "
                             "them");
      sizes += (i ? ", " : "") +
               std::to_string(tensorOf(o.getParams()[i]).getNumElements());
      auto row = [&](Value grad) {
        return llvm::formatv("        {{{0}, {1}, {2}, {3}, {4}, {5}},\n",
                             ptr(o.getParams()[i]), ptr(o.getMasters()[i]),
                             ptr(grad), ptr(o.getMoment1()[i]),
                             ptr(o.getMoment2()[i]),
                             tensorOf(o.getParams()[i]).getNumElements())
            .str();
      };
      tensors += row(bf16Grad);
      tensorsF32 += row(g);
    }
  }
  unsigned numTensors = optimizer          ? optimizer->getNumParams()
                        : shardedOptimizer ? shardedOptimizer->getNumParams()
                                           : 0;
  std::string workspaceMax = "std::max<size_t>({";
  for (size_t i = 0; i < workspaceTerms.size(); ++i)
    workspaceMax += (i ? ", " : "") + workspaceTerms[i];
  workspaceMax += "})";

  double flops = double(FlopCount::of(step).step());
  std::string profileNames;
  for (size_t i = 0; i < opNames.size(); ++i)
    profileNames += std::string(i ? ", " : "") + quoted(opNames[i]);
  std::string s;
  llvm::raw_string_ostream cu(s);
  const std::string specFile = specFileOf(module);
  cu << "// Generated by dflashc from " << specFile << ": the training step "
     << "of \"" << config.name << "\".\n"
     << "// Do not edit; regenerate with `dflashc " << specFile
     << " --emit=cuda`.\n"
     << "// Every shape is a constant; enqueue() is the static schedule of "
        "one step.\n\n"
     << "#include \"kernels.h\"\n"
     << "#include \"kernels/AdamW.cuh\"\n"
     << "#include \"kernels/DraftBlocks.cuh\"\n"
     << "#include \"kernels/Gemm.cuh\"\n"
     << "#include \"kernels/LmHeadCrossEntropy.cuh\"\n"
     << "#include \"kernels/QkNormRope.cuh\"\n"
     << "#include \"kernels/RmsNorm.cuh\"\n"
     << "#include \"kernels/StepScalars.cuh\"\n"
     << "#include \"kernels/SwiGlu.cuh\"\n"
     << "#include \"runtime/StepProfiler.h\"\n"
     << "#include \"runtime/StepProgram.h\"\n\n"
     << "#include <algorithm>\n#include <cstdio>\n#include <cstdlib>\n\n"
     << "namespace {\n\n"
     << "using dflash::BufferRole;\nusing dflash::DType;\n\n"
     << llvm::formatv("constexpr dflash::kernels::DraftBlocksShape kBlocks{{"
                      "{0}, {1}, {2}, {3}};\n",
                      B, S, N, config.blockSize)
     << "constexpr size_t kPlannedBytes = " << arena.getInt() << ";\n"
     << "constexpr size_t kLmHeadRowTermBytes = " << alignUp(rows * 16)
     << ";\n\n"
     << "void check(cudaError_t status, const char *what) {\n"
     << "  if (status == cudaSuccess)\n    return;\n"
     << "  std::fprintf(stderr, \"train: error: %s: %s\\n\", what,\n"
     << "               cudaGetErrorString(status));\n"
     << "  std::quick_exit(1);\n}\n\n"
     << "size_t alignArena(size_t x) { return (x + 255) / 256 * 256; }\n\n"
     << "class GeneratedStep final : public dflash::rt::StepProgram {\n"
     << "public:\n"
     << "  GeneratedStep() {\n"
     << modelConfigInit(config)
     << "    specs = {\n" << specs << "    };\n"
     << "    workspaceBytes = alignArena(" << workspaceMax << ");\n"
     << "    size_t numTensors = " << numTensors << ";\n"
     << (shardedOptimizer
             ? shardLayoutInit() +
                   "    // A rank's pieces: at most one per tensor, and "
                   "their chunks.\n"
                   "    maxChunks = numTensors;\n"
                   "    for (const auto &bucket : shardLayout.buckets)\n"
                   "      maxChunks += (bucket.shardElements + "
                   "dflash::kernels::kAdamWChunkElems - 1) /\n"
                   "                   dflash::kernels::kAdamWChunkElems;\n"
             : "    chunks = dflash::kernels::buildAdamWChunks({" + sizes +
                   "});\n    maxChunks = chunks.size();\n")
     << "    optimizerBytes = alignArena(2 * numTensors * "
        "sizeof(dflash::kernels::AdamWTensor)) +\n"
     << "                     alignArena(maxChunks * "
        "sizeof(dflash::kernels::AdamWChunk)) +\n"
     << "                     alignArena(maxChunks * sizeof(double)) + "
        "2 * 256;\n"
     << "  }\n\n"
     << "  const dflash::ModelConfig &config() const override { return "
        "cfg; }\n"
     << "  const std::vector<dflash::BufferSpec> &buffers() const "
        "override {\n    return specs;\n  }\n"
     << "  size_t arenaBytes() const override {\n"
     << "    return kPlannedBytes + workspaceBytes + optimizerBytes;\n  }\n"
     << "  size_t gemmWorkspaceBytes() const override { return size_t(32) << "
        "20; }\n"
     << "  double flopsPerStep() const override { return "
     << llvm::format("%.17g", flops) << "; }\n"
     << (shardedOptimizer
             ? "  const dflash::rt::OptimizerShardLayout *optimizerShards() "
               "const override {\n    return &shardLayout;\n  }\n"
             : "")
     << "\n"
     << "  void bind(const std::vector<void *> &buffers, void *arenaBase,\n"
     << "            const dflash::rt::DeviceResources &resources,\n"
     << "            const dflash::rt::StepHyper &stepHyper) override {\n"
     << "    std::copy(buffers.begin(), buffers.end(), buf);\n"
     << "    arena = static_cast<char *>(arenaBase);\n"
     << "    workspace = arena + kPlannedBytes;\n"
     << "    res = resources;\n    hyper = stepHyper;\n"
     << "    adamwHyper.beta1 = hyper.beta1;\n"
     << "    adamwHyper.beta2 = hyper.beta2;\n"
     << "    adamwHyper.eps = hyper.eps;\n"
     << "    adamwHyper.weightDecay = hyper.weightDecay;\n"
     << "    adamwHyper.maxNorm = hyper.maxGradNorm;\n"
     << "    // The optimizer's device tables, after the workspace.\n"
     << "    char *opt = workspace + workspaceBytes;\n"
     << (shardedOptimizer
             ? shardTablesBind()
             : "    std::vector<dflash::kernels::AdamWTensor> tensors = {\n" +
                   tensors + "    };\n")
     << "    auto *tensorTable = "
        "reinterpret_cast<dflash::kernels::AdamWTensor *>(opt);\n"
     << "    opt += alignArena(2 * tensors.size() * "
        "sizeof(dflash::kernels::AdamWTensor));\n"
     << "    auto *chunkTable = "
        "reinterpret_cast<dflash::kernels::AdamWChunk *>(opt);\n"
     << "    opt += alignArena(chunks.size() * "
        "sizeof(dflash::kernels::AdamWChunk));\n"
     << "    adamwTables.partials = reinterpret_cast<double *>(opt);\n"
     << "    opt += alignArena(chunks.size() * sizeof(double));\n"
     << "    adamwTables.normAndClip = reinterpret_cast<float *>(opt);\n"
     << "    adamwState = reinterpret_cast<dflash::kernels::AdamWStepState "
        "*>(opt + 256);\n"
     << (shardedOptimizer ? "    squareSum = adamwTables.normAndClip + 2;\n"
                          : "")
     << "    adamwTables.tensors = tensorTable;\n"
     << "    adamwTables.chunks = chunkTable;\n"
     << "    adamwTables.numChunks = int(chunks.size());\n"
     << "    check(cudaMemcpy(tensorTable, tensors.data(), tensors.size() * "
        "sizeof(tensors[0]), cudaMemcpyHostToDevice), \"optimizer table\");\n"
     << "    check(cudaMemcpy(chunkTable, chunks.data(), chunks.size() * "
        "sizeof(chunks[0]), cudaMemcpyHostToDevice), \"optimizer chunks\");\n"
     << "    // The same update reading the all-reduced fp32 buckets.\n"
     << "    std::vector<dflash::kernels::AdamWTensor> tensorsF32 = {\n"
     << tensorsF32 << "    };\n"
     << "    check(cudaMemcpy(tensorTable + tensors.size(), tensorsF32.data(), "
        "tensorsF32.size() * sizeof(tensorsF32[0]), cudaMemcpyHostToDevice), "
        "\"optimizer table\");\n"
     << "    adamwTablesF32 = adamwTables;\n"
     << "    adamwTablesF32.tensors = tensorTable + tensors.size();\n"
     << "    if (res.allReduceSum) {\n"
     << "      check(cudaStreamCreateWithFlags(&commStream, "
        "cudaStreamNonBlocking), \"communication stream\");\n"
     << "      for (cudaEvent_t *e : {bucketReady, bucketDone})\n"
     << "        for (size_t k = 0; k < kBuckets; ++k)\n"
     << "          check(cudaEventCreateWithFlags(&e[k], "
        "cudaEventDisableTiming), \"bucket events\");\n"
     << "    }\n"
     << "  }\n\n"
     << "  void enqueue(cudaStream_t stream) override {\n"
     << "    profiler.beginStep(stream);\n"
     << body << metricCopies << "  }\n\n"
     << "private:\n"
     << "  void allReduce(float *data, size_t count, cudaStream_t stream) {\n"
     << "    if (res.allReduceSum)\n"
     << "      res.allReduceSum(res.collectives, data, count, stream);\n"
     << "  }\n\n"
     << (shardedOptimizer ? shardedMembers() : std::string())
     << "  size_t maxChunks = 0;\n"
     << "  dflash::ModelConfig cfg;\n"
     << "  std::vector<dflash::BufferSpec> specs;\n"
     << "  std::vector<dflash::kernels::AdamWChunk> chunks;\n"
     << "  size_t workspaceBytes = 0, optimizerBytes = 0;\n"
     << "  void *buf[" << step.getNumArguments() + 4 << "] = {};\n"
     << "  char *arena = nullptr, *workspace = nullptr;\n"
     << "  dflash::rt::DeviceResources res;\n"
     << "  dflash::rt::StepHyper hyper;\n"
     << "  dflash::kernels::AdamWHyper adamwHyper;\n"
     << "  dflash::kernels::AdamWTables adamwTables{}, adamwTablesF32{};\n"
     << "  static constexpr size_t kBuckets = " << std::max<size_t>(numBuckets, 1)
     << ";\n"
     << "  cudaStream_t commStream = nullptr;\n"
     << "  cudaEvent_t bucketReady[kBuckets] = {}, bucketDone[kBuckets] = {};\n"
     << "  dflash::kernels::AdamWStepState *adamwState = nullptr;\n"
     << "  dflash::rt::StepProfiler profiler{{" << profileNames << "}};\n"
     << "};\n\n"
     << "} // namespace\n\n"
     << "std::unique_ptr<dflash::rt::StepProgram> "
        "dflash::rt::createStepProgram() {\n"
     << "  return std::make_unique<GeneratedStep>();\n}\n";
  out.stepCu = s;

  out.kernelsH = "// Generated by dflashc: one wrapper per kernel template "
                 "instantiation of the step.\n#pragma once\n\n"
                 "#include \"kernels/BlockAttention.cuh\"\n"
                 "#include \"kernels/DraftBlocks.cuh\"\n\n" +
                 wrapperDecls;
  out.kernelsCu = "// Generated by dflashc: the kernel templates of the step, "
                  "instantiated with its constants.\n\n"
                  "#include \"kernels.h\"\n"
                  "#include \"kernels/BlockAttentionBwdWgmma.cuh\"\n"
                  "#include \"kernels/BlockAttentionWgmma.cuh\"\n"
                  "#include \"kernels/QkNormRope.cuh\"\n"
                  "#include \"kernels/RmsNorm.cuh\"\n\n" +
                  wrapperDefs;
  out.manifestJson = writeManifest(module, config, sig);
  return success();
}

namespace dflash {
FailureOr<CudaTrainerSources>
translateToCuda(ModuleOp module) {
  FailureOr<StepSignature> sig = StepSignature::get(module);
  if (failed(sig))
    return failure();
  FailureOr<ModelConfig> config = modelConfigOf(module);
  if (failed(config))
    return failure();
  CudaTrainerSources out;
  StepEmitter emitter(module, *config, *sig);
  if (failed(emitter.emit(out)))
    return failure();
  out.mainCpp =
      "// Generated by dflashc: the train command of \"" + config->name +
      "\".\n\n#include \"runtime/StepProgram.h\"\n"
      "#include \"runtime/TrainMain.h\"\n\n"
      "int main(int argc, char **argv) {\n"
      "  return dflash::rt::trainMain(argc, argv, "
      "&dflash::rt::createStepProgram);\n}\n";
  return out;
}
} // namespace dflash
