//===- dflash-reference.cpp - Trains a drafter on the CPU, exactly --------===//
//
// Compiles a spec to its training step, then runs that IR step after step in
// the reference interpreter on the same data, anchors and initial weights the
// generated trainer would use (runtime/BatchLoader.h). Prints one JSON line
// per step. It is the oracle of the GPU trainer, not a fast trainer.
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/StepSignature.h"
#include "schema/Parameters.h"
#include "compiler/Import/ImportSpec.h"
#include "compiler/Interpreter/Interpreter.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Transforms/Passes.h"
#include "kernels/Bf16.h"
#include "runtime/BatchLoader.h"
#include "runtime/FeatureShard.h"
#include "runtime/Safetensors.h"
#include "runtime/Synthetic.h"
#include "runtime/TargetWeights.h"
#include "runtime/InitialParameters.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;
namespace cl = llvm::cl;

namespace {

cl::OptionCategory category("dflash-reference options");
cl::opt<std::string> specFile(cl::Positional, cl::desc("<spec.toml>"),
                              cl::Required, cl::cat(category));
cl::opt<int64_t> numSteps("steps", cl::desc("Optimizer steps to run"),
                          cl::init(1), cl::cat(category));
cl::opt<int64_t> totalSteps(
    "total-steps",
    cl::desc("Length of the learning-rate schedule (default: --steps)"),
    cl::init(0), cl::cat(category));
cl::opt<std::string> targetDir(
    "target",
    cl::desc("Hugging Face target directory with the frozen embedding and "
             "lm_head (default with --data synthetic: the synthetic target)"),
    cl::value_desc("dir"), cl::cat(category));
cl::opt<std::string> dataSource(
    "data", cl::desc("'synthetic', or a directory or file of feature shards"),
    cl::value_desc("synthetic|dir"), cl::init("synthetic"), cl::cat(category));
cl::opt<int64_t> syntheticRows(
    "rows", cl::desc("Rows of the synthetic data set (default 64)"),
    cl::init(64), cl::cat(category));
cl::opt<int64_t> seedOption(
    "seed", cl::desc("Seed of data order, anchors and initial weights "
                     "(default: the spec's training.seed)"),
    cl::init(-1), cl::cat(category));
cl::opt<std::string> initDir(
    "init", cl::desc("Initial drafter checkpoint (SEMANTICS.md section 6)"),
    cl::value_desc("dir"), cl::cat(category));
cl::opt<Precision> precision(
    "precision", cl::desc("Arithmetic of the interpreter"),
    cl::values(clEnumValN(Precision::Storage, "storage",
                          "round every op result to its type, as the GPU "
                          "stores it (default)"),
               clEnumValN(Precision::Exact, "exact",
                          "fp64 throughout, no rounding")),
    cl::init(Precision::Storage), cl::cat(category));
cl::opt<std::string> dumpStep(
    "dump-step",
    cl::desc("Write the first step's inputs, weights, loss and gradients (of "
             "the global mean loss, before clipping) to this safetensors "
             "file, for the PyTorch oracle"),
    cl::value_desc("file"), cl::cat(category));

cl::opt<std::string> saveDir(
    "save",
    cl::desc("Export the parameters after the last step as a checkpoint "
             "(SEMANTICS.md section 6) into this directory"),
    cl::value_desc("dir"), cl::cat(category));

int fail(const std::string &msg) {
  llvm::errs() << "dflash-reference: error: " << msg << "\n";
  return 1;
}

std::vector<double> widen(const uint16_t *bf16, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = bf16ToFloat(bf16[i]);
  return out;
}

template <typename T> std::vector<double> widen(const std::vector<T> &v) {
  return std::vector<double>(v.begin(), v.end());
}

std::vector<int64_t> shapeOf(Type t) {
  auto r = cast<RankedTensorType>(t);
  return std::vector<int64_t>(r.getShape().begin(), r.getShape().end());
}

/// Everything the step reads, by the #dflash.arg name of its argument.
struct StepState {
  std::map<std::string, std::vector<double>> input, frozen, param, master,
      moment1, moment2;
};

/// Binds the arguments of `step` from `state` and the counters.
FailureOr<std::vector<HostTensor>> bindArguments(const StepSignature &sig,
                                                 StepState &state,
                                                 int64_t step, int64_t total,
                                                 double seed) {
  func::FuncOp f = sig.func();
  std::vector<HostTensor> args;
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    ArgAttr info = sig.argInfo(i);
    std::string name = info.getName().str();
    HostTensor t(shapeOf(f.getArgument(i).getType()));
    std::map<std::string, std::vector<double>> *from = nullptr;
    switch (info.getRole()) {
    case ArgRole::Input:
      if (name == "loss_sum_grad") {
        t.data[0] = seed;
        break;
      }
      from = &state.input;
      break;
    case ArgRole::Frozen:
      from = &state.frozen;
      break;
    case ArgRole::Parameter:
      from = &state.param;
      break;
    case ArgRole::Master:
      from = &state.master;
      break;
    case ArgRole::Moment1:
      from = &state.moment1;
      break;
    case ArgRole::Moment2:
      from = &state.moment2;
      break;
    case ArgRole::Counter:
      t.data[0] = double(name == "step" ? step : total);
      break;
    default:
      f.emitError() << "argument '" << name << "' has a role the reference "
                    << "run cannot bind";
      return failure();
    }
    if (from) {
      auto it = from->find(name);
      if (it == from->end() || int64_t(it->second.size()) != t.numel()) {
        f.emitError() << "no value of the right size for argument '" << name
                      << "'";
        return failure();
      }
      t.data = it->second;
    }
    args.push_back(std::move(t));
  }
  return args;
}

/// The compiled step: `train` (--emit=train) and, for --dump-step, the
/// differentiated forward graph.
struct CompiledStep {
  OwningOpRef<ModuleOp> train, gradients;
};

FailureOr<CompiledStep> compile(MLIRContext &ctx, const DrafterSpec &spec) {
  CompiledStep out;
  OwningOpRef<ModuleOp> forward = importSpec(ctx, spec);
  if (!forward)
    return failure();
  out.gradients = forward->clone();
  PassManager grads(&ctx);
  grads.addPass(createGenerateBackward());
  if (failed(grads.run(*out.gradients)))
    return failure();
  out.train = std::move(forward);
  PassManager train(&ctx);
  buildTrainStepPipeline(train);
  if (failed(train.run(*out.train)))
    return failure();
  return out;
}

/// Writes the first step for the PyTorch oracle: inputs, frozen weights and
/// parameters as the step saw them, the loss and the gradients of the mean
/// loss, and the shapes the oracle needs as metadata.
Status writeStepDump(const std::string &path, const StepSignature &sig,
                         const std::vector<HostTensor> &args,
                         const std::vector<HostTensor> &results,
                         const ModelConfig &config) {
  func::FuncOp f = sig.func();
  std::vector<rt::TensorData> tensors;
  std::vector<std::vector<double>> keepAlive;
  auto add = [&](std::string name, const HostTensor &t, double scale) {
    keepAlive.push_back(t.data);
    for (double &x : keepAlive.back())
      x *= scale;
    tensors.push_back({std::move(name), DType::F64, t.shape,
                       keepAlive.back().data()});
  };
  const char *prefix[] = {"input.", "frozen.", "param."};
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    ArgAttr info = sig.argInfo(i);
    int role = int(info.getRole());
    if (role <= int(ArgRole::Parameter) && info.getName() != "loss_sum_grad")
      add(prefix[role] + info.getName().str(), args[i], 1.0);
  }
  double lossSum = results[*sig.findResult(ArgRole::Metric, "loss_sum")].data[0];
  double weightSum =
      results[*sig.findResult(ArgRole::Metric, "weight_sum")].data[0];
  HostTensor loss(std::vector<int64_t>{});
  loss.data[0] = lossSum / weightSum;
  add("result.loss", loss, 1.0);
  int64_t numGradients = 0;
  for (unsigned r : sig.resultsWithRole(ArgRole::Gradient)) {
    add("gradient." + sig.resultInfo(r).getName().str(), results[r],
        1.0 / weightSum);
    ++numGradients;
  }
  std::string layers;
  for (size_t i = 0; i < config.layerWindows.size(); ++i)
    layers += std::string(i ? ", " : "") + "{\"window\": " +
              std::to_string(config.layerWindows[i]) + "}";
  char floats[256];
  std::snprintf(floats, sizeof(floats),
                "\"rms_norm_eps\": %.17g, \"rope_theta\": %.17g, "
                "\"gamma\": %.17g",
                config.rmsNormEps, config.ropeTheta, config.gamma);
  std::string json =
      "{\"block_size\": " + std::to_string(config.blockSize) +
      ", \"num_heads\": " + std::to_string(config.numHeads) +
      ", \"num_kv_heads\": " + std::to_string(config.numKvHeads) +
      ", \"head_dim\": " + std::to_string(config.headDim) + ", " + floats +
      ", \"mask_token_id\": " + std::to_string(config.maskTokenId) +
      ", \"num_parameters\": " + std::to_string(numGradients) +
      ", \"layers\": [" + layers + "]}";
  return rt::writeSafetensors(path, tensors, {{"config", json}});
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  // libLLVM registers hundreds of backend options; show only ours.
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "dflash-reference: runs a drafter's compiled training step on the CPU\n\n"
      "Prints one JSON line per step: step, loss, acc, grad_norm, lr.\n");
  if (numSteps < 1)
    return fail("--steps must be at least 1");
  if (syntheticRows < 1)
    return fail("--rows must be at least 1");

  SpecError specError;
  std::optional<DrafterSpec> spec = loadSpec(specFile, specError);
  if (!spec) {
    llvm::errs() << specError.str() << "\n";
    return 1;
  }
  const ModelConfig &config = *spec;
  uint64_t seed = seedOption >= 0 ? uint64_t(seedOption) : uint64_t(spec->seed);
  int64_t total = totalSteps > 0 ? int64_t(totalSteps) : int64_t(numSteps);

  // Data, frozen weights and initial parameters.
  bool synthetic = dataSource == "synthetic";
  rt::SyntheticProblem problem;
  std::unique_ptr<rt::RowSource> rows;
  if (synthetic) {
    if (Status s = problem.init(config, seed); !s.ok())
      return fail(s.message());
    rows = std::make_unique<rt::SyntheticRowSource>(problem, syntheticRows,
                                                    /*pinAnchors=*/false);
  } else {
    auto reader = std::make_unique<rt::FeatureShardReader>();
    if (Status s = reader->open(dataSource, config); !s.ok())
      return fail(s.message());
    rows = std::move(reader);
    if (targetDir.empty())
      return fail("--data " + dataSource +
                  " needs --target DIR for the frozen embedding and lm_head");
  }
  rt::TargetWeights loadedTarget;
  const rt::TargetWeights *target = synthetic ? &problem.target() : nullptr;
  if (!targetDir.empty()) {
    if (Status s = rt::loadTargetWeights(targetDir, config, loadedTarget);
        !s.ok())
      return fail(s.message());
    target = &loadedTarget;
  }
  std::vector<ParamInfo> table = parameterTable(config);
  std::vector<std::vector<uint16_t>> initial;
  if (!initDir.empty()) {
    if (Status s = rt::loadCheckpoint(initDir, config, initial); !s.ok())
      return fail(s.message());
  } else {
    initial = synthetic ? problem.initialParameters()
                        : rt::initialParameters(config, seed);
  }

  StepState state;
  size_t vh = size_t(config.vocabSize * config.hiddenSize);
  state.frozen["embed"] = widen(target->embed.data(), vh);
  state.frozen["lm_head"] = widen(target->lmHeadData(), vh);
  for (size_t i = 0; i < table.size(); ++i) {
    const std::string &name = table[i].name;
    state.param[name] = widen(initial[i].data(), initial[i].size());
    state.master[name] = state.param[name];
    state.moment1[name].assign(initial[i].size(), 0.0);
    state.moment2[name].assign(initial[i].size(), 0.0);
  }

  MLIRContext ctx;
  FailureOr<CompiledStep> compiled = compile(ctx, *spec);
  if (failed(compiled))
    return fail("compiling the training step of '" + specFile + "' failed");
  FailureOr<StepSignature> trainSig = StepSignature::get(*compiled->train);
  FailureOr<StepSignature> gradSig = StepSignature::get(*compiled->gradients);
  if (failed(trainSig) || failed(gradSig))
    return fail("the compiled step has no usable signature");

  rt::BatchLoader loader(*rows, config, seed);
  rt::HostBatch batch;
  StepInterpreter interpreter(trainSig->func(), precision);
  for (int64_t step = 0; step < numSteps; ++step) {
    if (Status s = loader.next(batch); !s.ok())
      return fail(s.message());
    state.input["input_ids"] = widen(batch.inputIds);
    state.input["loss_mask"] = widen(batch.lossMask);
    state.input["target_hidden"] =
        widen(batch.hiddenStates.data(), batch.hiddenStates.size());
    state.input["anchors"] = widen(batch.anchors);
    state.input["keep"] = widen(batch.keep);

    if (step == 0 && !dumpStep.empty()) {
      auto args = bindArguments(*gradSig, state, step, total, 1.0);
      if (failed(args))
        return fail("cannot bind the gradient step's arguments");
      StepInterpreter grads(gradSig->func(), precision);
      auto results = grads.run(*args);
      if (failed(results))
        return fail("the gradient step failed");
      if (Status s =
              writeStepDump(dumpStep, *gradSig, *args, *results, config);
          !s.ok())
        return fail(s.message());
    }

    auto args = bindArguments(*trainSig, state, step, total, 0.0);
    if (failed(args))
      return fail("cannot bind the training step's arguments");
    auto results = interpreter.run(*args);
    if (failed(results))
      return fail("the training step failed at step " + std::to_string(step));
    std::map<std::string, double> metrics;
    for (unsigned r = 0; r < results->size(); ++r) {
      ArgAttr info = trainSig->resultInfo(r);
      std::string name = info.getName().str();
      std::vector<double> &value = (*results)[r].data;
      switch (info.getRole()) {
      case ArgRole::Parameter:
        state.param[name] = std::move(value);
        break;
      case ArgRole::Master:
        state.master[name] = std::move(value);
        break;
      case ArgRole::Moment1:
        state.moment1[name] = std::move(value);
        break;
      case ArgRole::Moment2:
        state.moment2[name] = std::move(value);
        break;
      case ArgRole::Metric:
        metrics[name] = value[0];
        break;
      default:
        break;
      }
    }
    std::printf("{\"step\": %lld, \"loss\": %.9g, \"acc\": %.6g, "
                "\"grad_norm\": %.9g, \"lr\": %.9g}\n",
                (long long)step, metrics["loss"], metrics["acc"],
                metrics["grad_norm"], metrics["lr"]);
    std::fflush(stdout);
    if (!std::isfinite(metrics["loss"]))
      return fail("the loss is not finite at step " + std::to_string(step));
  }
  if (!saveDir.empty()) {
    std::vector<std::vector<uint16_t>> bits;
    std::vector<const uint16_t *> pointers;
    for (const ParamInfo &p : table) {
      const std::vector<double> &values = state.param[p.name];
      bits.emplace_back(values.size());
      for (size_t i = 0; i < values.size(); ++i)
        bits.back()[i] = floatToBf16(float(values[i]));
      pointers.push_back(bits.back().data());
    }
    if (Status s = rt::exportCheckpoint(saveDir, config, pointers); !s.ok())
      return fail(s.message());
  }
  return 0;
}
