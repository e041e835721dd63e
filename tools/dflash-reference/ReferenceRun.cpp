//===- ReferenceRun.cpp - Trains a drafter on the CPU, exactly ------------===//
//
// The stages of a reference run, each reporting a Status: load the data,
// frozen weights and initial parameters; compile the step; run it step after
// step (dumping the first one for the oracle when asked); save the
// parameters. runReference prints what a stage reports.
//
//===----------------------------------------------------------------------===//

#include "tools/dflash-reference/ReferenceRun.h"

#include "compiler/Analysis/FlopCount.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Import/ImportSpec.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Support/HumanUnits.h"
#include "compiler/Transforms/Passes.h"
#include "kernels/Bf16.h"
#include "runtime/data/BatchLoader.h"
#include "runtime/data/FeatureShard.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/data/Synthetic.h"
#include "runtime/io/Checkpoint.h"
#include "runtime/io/Safetensors.h"
#include "runtime/io/TargetWeights.h"
#include "runtime/train/Progress.h"
#include "runtime/train/ServingWalk.h"
#include "schema/Parameters.h"
#include "schema/StepBuffers.h"
#include "tools/dflash-reference/TargetProgram.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <unistd.h>

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

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

/// The data, the frozen weights and the initial parameters of a run.
struct Problem {
  rt::SyntheticProblem synthetic;
  std::unique_ptr<rt::RowSource> rows;
  rt::TargetWeights loadedTarget;
  const rt::TargetWeights *target = nullptr;
  /// bf16 bits, in parameterTable order.
  std::vector<std::vector<uint16_t>> initial;

  Problem() = default;
  // `rows` and `target` may point into `synthetic` and `loadedTarget`.
  Problem(const Problem &) = delete;
  Problem &operator=(const Problem &) = delete;
};

Status loadProblem(const ReferenceOptions &options, const ModelConfig &config,
                   uint64_t seed, Problem &problem) {
  bool synthetic = options.data == "synthetic";
  if (synthetic) {
    DFLASH_RETURN_IF_ERROR(problem.synthetic.init(config, seed));
    problem.rows = std::make_unique<rt::SyntheticRowSource>(
        problem.synthetic, options.syntheticRows, /*pinAnchors=*/false);
  } else {
    auto reader = std::make_unique<rt::FeatureShardReader>();
    DFLASH_RETURN_IF_ERROR(reader->open(options.data, config,
                                        options.onlineTarget
                                            ? rt::ShardContents::Tokens
                                            : rt::ShardContents::Features));
    problem.rows = std::move(reader);
    if (options.targetDir.empty())
      return Status::error(
          "--data " + options.data +
          " needs --target DIR for the frozen embedding and lm_head");
  }
  problem.target = synthetic ? &problem.synthetic.target() : nullptr;
  if (!options.targetDir.empty()) {
    DFLASH_RETURN_IF_ERROR(
        rt::loadTargetWeights(options.targetDir, config, problem.loadedTarget));
    problem.target = &problem.loadedTarget;
  }
  if (!options.initDir.empty())
    return rt::loadCheckpoint(options.initDir, config, problem.initial);
  problem.initial = synthetic ? problem.synthetic.initialParameters()
                              : rt::initialParameters(config, seed);
  return Status::success();
}

/// Everything the step reads, by the #dflash.arg name of its argument.
struct StepState {
  std::map<std::string, std::vector<double>> input, frozen, param, master,
      moment1, moment2;
};

/// The state before the first step: the frozen weights, the initial
/// parameters, masters equal to them and zero moments.
StepState initialState(const ModelConfig &config, const Problem &problem,
                       const std::vector<ParamInfo> &table) {
  StepState state;
  size_t vh = size_t(config.vocabSize * config.hiddenSize);
  state.frozen["embed"] = widen(problem.target->embed.data(), vh);
  state.frozen["lm_head"] = widen(problem.target->lmHeadData(), vh);
  for (size_t i = 0; i < table.size(); ++i) {
    const std::string &name = table[i].name;
    const std::vector<uint16_t> &initial = problem.initial[i];
    state.param[name] = widen(initial.data(), initial.size());
    state.master[name] = state.param[name];
    state.moment1[name].assign(initial.size(), 0.0);
    state.moment2[name].assign(initial.size(), 0.0);
  }
  return state;
}

void setInputs(StepState &state, const rt::HostBatch &batch) {
  state.input["input_ids"] = widen(batch.inputIds);
  state.input["loss_mask"] = widen(batch.lossMask);
  state.input["target_hidden"] =
      widen(batch.hiddenStates.data(), batch.hiddenStates.size());
  state.input["anchors"] = widen(batch.anchors);
  state.input["keep"] = widen(batch.keep);
  state.input["position_ids"] = widen(batch.positionIds);
}

/// Binds the arguments of `step` from `state` and the counters.
FailureOr<std::vector<HostTensor>> bindArguments(const StepSignature &sig,
                                                 const StepState &state,
                                                 int64_t step, int64_t total,
                                                 double seed) {
  func::FuncOp f = sig.func();
  std::vector<HostTensor> args;
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    ArgAttr info = sig.argInfo(i);
    std::string name = info.getName().str();
    HostTensor t(shapeOf(f.getArgument(i).getType()));
    const std::map<std::string, std::vector<double>> *from = nullptr;
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

/// The compiled step: `train` (--emit=train) and, for the dump, the
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
/// loss, and the shapes the oracle needs as metadata (with a DFlash2
/// drafter's convolution, selector and objective, and the schedule's `total`
/// steps).
Status writeStepDump(const std::string &path, const StepSignature &sig,
                     const std::vector<HostTensor> &args,
                     const std::vector<HostTensor> &results,
                     const ModelConfig &config, int64_t total) {
  func::FuncOp f = sig.func();
  std::vector<rt::TensorData> tensors;
  std::vector<std::vector<double>> keepAlive;
  auto add = [&](std::string name, const HostTensor &t, double scale) {
    keepAlive.push_back(t.data);
    for (double &x : keepAlive.back())
      x *= scale;
    tensors.push_back(
        {std::move(name), DType::F64, t.shape, keepAlive.back().data()});
  };
  const char *prefix[] = {"input.", "frozen.", "param."};
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    ArgAttr info = sig.argInfo(i);
    int role = int(info.getRole());
    if (role <= int(ArgRole::Parameter) && info.getName() != "loss_sum_grad")
      add(prefix[role] + info.getName().str(), args[i], 1.0);
  }
  double lossSum =
      results[*sig.findResult(ArgRole::Metric, "loss_sum")].data[0];
  double weightSum =
      results[*sig.findResult(ArgRole::Metric, "weight_sum")].data[0];
  HostTensor loss(std::vector<int64_t>{});
  loss.data[0] = lossSum / weightSum;
  add("result.loss", loss, 1.0);
  // The acceptance length of the same step (docs/semantics.md section 10).
  double runSum = results[*sig.findResult(ArgRole::Metric, "run_sum")].data[0];
  double keptBlocks =
      results[*sig.findResult(ArgRole::Metric, "kept_blocks")].data[0];
  HostTensor tau(std::vector<int64_t>{});
  tau.data[0] = keptBlocks > 0 ? runSum / keptBlocks : 0.0;
  add("result.tau", tau, 1.0);
  int64_t numGradients = 0;
  for (unsigned r : sig.resultsWithRole(ArgRole::Gradient)) {
    add("gradient." + sig.resultInfo(r).getName().str(), results[r],
        1.0 / weightSum);
    ++numGradients;
  }
  std::string layers;
  for (size_t i = 0; i < config.layerWindows.size(); ++i)
    layers += std::string(i ? ", " : "") +
              "{\"window\": " + std::to_string(config.layerWindows[i]) + "}";
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
      ", \"layers\": [" + layers + "]";
  if (config.ropeScaled()) {
    // The oracle rotates as transformers does from the exported config.json;
    // these are what the step rotated by.
    std::snprintf(floats, sizeof(floats),
                  "\"factor\": %.17g, \"beta_fast\": %.17g, "
                  "\"beta_slow\": %.17g, \"attention_factor\": %.17g",
                  config.ropeScalingFactor, config.ropeScalingBetaFast,
                  config.ropeScalingBetaSlow,
                  config.ropeScalingAttentionFactor);
    json +=
        ", \"rope_scaling\": {\"rope_type\": \"yarn\", " + std::string(floats) +
        ", \"original_max_position_embeddings\": " +
        std::to_string(config.ropeScalingOriginalMaxPositions) +
        ", \"truncate\": " + (config.ropeScalingTruncate ? "true" : "false") +
        "}";
  }
  if (config.dflash2) {
    // Section 13's shapes and objective, and the counters alpha_t is
    // scheduled by: the oracle computes alpha_t itself.
    char d2[512];
    std::snprintf(
        d2, sizeof(d2),
        "\"conv_kernel_size\": %lld, \"conv_group_size\": %lld, "
        "\"selector_rank\": %lld, \"selector_top_k\": %lld, "
        "\"output_multiplier\": %.17g, \"final_logit_softcapping\": %.17g, "
        "\"input_embedding_scale\": %.17g, \"selector_alpha\": %.17g, "
        "\"selector_warmup_ratio\": %.17g, \"selector_ramp_ratio\": %.17g",
        (long long)config.convKernelSize, (long long)config.convGroupSize,
        (long long)config.selectorRank, (long long)config.selectorTopK,
        config.outputMultiplier, config.finalLogitSoftcapping,
        config.inputEmbeddingScale, config.selectorAlpha,
        config.selectorWarmupRatio, config.selectorRampRatio);
    json += ", \"dflash2\": {" + std::string(d2) +
            ", \"selector_stop_gradient\": " +
            (config.selectorStopGradient ? "true" : "false") +
            ", \"selector_gold\": " +
            (config.selectorGoldInject ? "\"inject\"" : "\"topk\"") +
            ", \"selector_denominator\": " +
            (config.selectorDenominatorCovered ? "\"covered\"" : "\"all\"") +
            ", \"step\": 0, \"total_steps\": " + std::to_string(total) + "}";
  }
  json += "}";
  return rt::writeSafetensors(path, tensors, {{"config", json}});
}

/// Runs the differentiated forward graph on the first step's state (seed 1:
/// the gradients of the loss sum) and writes it for the oracle.
Status dumpFirstStep(const std::string &path, const StepSignature &gradSig,
                     const StepState &state, int64_t total, Precision precision,
                     const ModelConfig &config) {
  auto args = bindArguments(gradSig, state, /*step=*/0, total, 1.0);
  if (failed(args))
    return Status::error("cannot bind the gradient step's arguments");
  StepInterpreter grads(gradSig.func(), precision);
  auto results = grads.run(*args);
  if (failed(results))
    return Status::error("the gradient step failed");
  return writeStepDump(path, gradSig, *args, *results, config, total);
}

/// Runs training step `step`: the new parameters and optimizer state go
/// back into `state`, the metrics into `metrics`.
Status trainStep(StepInterpreter &interpreter, const StepSignature &sig,
                 StepState &state, int64_t step, int64_t total,
                 std::map<std::string, std::vector<double>> &metrics) {
  auto args = bindArguments(sig, state, step, total, 0.0);
  if (failed(args))
    return Status::error("cannot bind the training step's arguments");
  auto results = interpreter.run(*args);
  if (failed(results))
    return Status::error("the training step failed at step " +
                         std::to_string(step));
  for (unsigned r = 0; r < results->size(); ++r) {
    ArgAttr info = sig.resultInfo(r);
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
      metrics[name] = std::move(value);
      break;
    default:
      break;
    }
  }
  return Status::success();
}

/// Exports the parameters of `state`, rounded to bf16, as a checkpoint.
Status saveParameters(const std::string &dir, const ModelConfig &config,
                      const std::vector<ParamInfo> &table,
                      const StepState &state) {
  std::vector<std::vector<uint16_t>> bits;
  std::vector<const uint16_t *> pointers;
  const std::vector<double> none;
  for (const ParamInfo &p : table) {
    auto it = state.param.find(p.name);
    const std::vector<double> &values =
        it != state.param.end() ? it->second : none;
    bits.emplace_back(values.size());
    for (size_t i = 0; i < values.size(); ++i)
      bits.back()[i] = floatToBf16(float(values[i]));
    pointers.push_back(bits.back().data());
  }
  return rt::exportCheckpoint(dir, config, pointers);
}

/// Lines "ROW A1 A2 ..." of `path`: the anchors of each evaluation of a row
/// (ReferenceOptions::evalAnchors).
Status readPinnedAnchors(const std::string &path, int64_t N,
                         std::multimap<int64_t, std::vector<int32_t>> &out) {
  std::ifstream in(path);
  if (!in)
    return Status::error(path + ": cannot open the evaluation anchors");
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line);
    int64_t row = -1;
    if (!(words >> row))
      continue; // a blank line
    std::vector<int32_t> anchors;
    int64_t a = 0;
    while (words >> a)
      anchors.push_back(int32_t(a));
    if (row < 0 || !words.eof() || int64_t(anchors.size()) > N ||
        !std::is_sorted(anchors.begin(), anchors.end()))
      return Status::error(path + ":" + std::to_string(number) +
                           ": expected ROW and at most " + std::to_string(N) +
                           " ascending anchors");
    out.emplace(row, std::move(anchors));
  }
  return Status::success();
}

/// One pass of the evaluation program over `state`'s inputs: its results
/// by name.
Status runEvalPass(StepInterpreter &interpreter, const StepSignature &sig,
                   const StepState &state, int64_t g,
                   std::map<std::string, std::vector<double>> &results) {
  auto args = bindArguments(sig, state, 0, 0, 0.0);
  if (failed(args))
    return Status::error("cannot bind the evaluation's arguments");
  auto values = interpreter.run(*args);
  if (failed(values))
    return Status::error("the evaluation failed at batch " + std::to_string(g));
  results.clear();
  for (unsigned r = 0; r < values->size(); ++r) {
    std::vector<double> &to = results[sig.resultInfo(r).getName().str()];
    const std::vector<double> &value = (*values)[r].data;
    to.insert(to.end(), value.begin(), value.end()); // micro-batches in order
  }
  return Status::success();
}

/// "[1, 0, 3]".
template <typename T> std::string jsonInts(const T *values, size_t n) {
  std::string text = "[";
  for (size_t i = 0; i < n; ++i)
    text += (i ? ", " : "") + std::to_string(int64_t(values[i]));
  return text + "]";
}

/// The evaluation program over `options.evalRows` held-out synthetic rows
/// (those past the training set's, as `train --eval-data synthetic` reads
/// them) with the parameters of `state`: one line as the trainer logs it,
/// with the serving-order acceptance of its first rows (ServingWalk.h).
Status evaluate(MLIRContext &ctx, const DrafterSpec &spec,
                const ReferenceOptions &options, Problem &problem,
                StepState &state, uint64_t seed, llvm::raw_ostream &out) {
  if (options.data != "synthetic")
    return Status::error("--eval-rows needs --data synthetic");
  OwningOpRef<ModuleOp> module = importSpec(ctx, spec);
  if (!module)
    return Status::error("the forward graph does not verify");
  PassManager pm(&ctx);
  pm.addPass(createMakeEvalProgram());
  if (failed(pm.run(*module)))
    return Status::error("compiling the evaluation program failed");
  FailureOr<StepSignature> sig = StepSignature::get(*module);
  if (failed(sig))
    return Status::error("the evaluation program has no usable signature");
  const ModelConfig &config = spec;
  const int64_t B = config.rowsPerStep(), S = config.seqLen,
                N = config.anchorsPerRow, bs = config.blockSize;
  std::multimap<int64_t, std::vector<int32_t>> pinned;
  if (!options.evalAnchors.empty())
    DFLASH_RETURN_IF_ERROR(readPinnedAnchors(options.evalAnchors, N, pinned));
  const int64_t servingRows =
      options.evalAnchors.empty()
          ? std::min(options.evalRows, options.evalServingRows < 0
                                           ? rt::defaultServingRows(S)
                                           : options.evalServingRows)
          : 0;
  std::unique_ptr<llvm::raw_fd_ostream> dump;
  if (!options.servingDump.empty()) {
    std::error_code error;
    dump = std::make_unique<llvm::raw_fd_ostream>(options.servingDump, error);
    if (error)
      return Status::error(options.servingDump + ": " + error.message());
  }
  rt::SyntheticRowSource rows(problem.synthetic, options.evalRows,
                              /*pinAnchors=*/false,
                              /*firstRow=*/options.syntheticRows);
  rt::BatchLoader loader(rows, config, seed);
  loader.setEvaluationOrder();
  StepInterpreter interpreter(sig->func(), options.precision);
  std::map<std::string, std::vector<double>> sums, results;
  for (int k = 0; k < ::dflash::kNumForwardSums; ++k) {
    const auto sum = ::dflash::ForwardSum(k);
    std::vector<int64_t> shape = ::dflash::shapeOf(sum, config);
    sums[::dflash::nameOf(sum)].assign(shape.empty() ? 1 : size_t(shape[0]),
                                       0.0);
  }
  // A "covered" DFlash2 objective's parts, where the program reports them.
  bool hasParts = false;
  for (unsigned r = 0; r < sig->func().getNumResults(); ++r)
    if (auto part =
            ::dflash::parseObjectivePart(sig->resultInfo(r).getName().str())) {
      sums[::dflash::nameOf(*part)].assign(1, 0.0);
      hasParts = true;
    }
  auto addSums = [&]() {
    for (auto &[name, total] : sums) {
      const std::vector<double> &value = results[name];
      for (size_t i = 0; i < total.size() && i < value.size(); ++i)
        total[i] += value[i];
    }
  };
  rt::ServingWalk walk(B, S, N, bs);
  rt::ServingSums serving;
  rt::HostBatch batch;
  for (int64_t g = 0; g < loader.batchesPerPass(); ++g) {
    DFLASH_RETURN_IF_ERROR(loader.next(batch));
    if (options.evalAnchors.empty()) {
      setInputs(state, batch);
      DFLASH_RETURN_IF_ERROR(runEvalPass(interpreter, *sig, state, g, results));
      addSums();
    }
    // Pinned anchors: each line on its own, the batch's other rows unkept.
    for (int64_t b = 0; b < B; ++b) {
      auto [first, last] = pinned.equal_range(batch.rows[size_t(b)]);
      for (auto it = first; it != last; ++it) {
        rt::HostBatch one = batch;
        std::fill(one.keep.begin(), one.keep.end(), uint8_t(0));
        std::fill(one.anchors.begin(), one.anchors.end(), 0);
        for (size_t n = 0; n < it->second.size(); ++n) {
          one.anchors[size_t(b * N) + n] = it->second[n];
          one.keep[size_t(b * N) + n] = 1;
        }
        setInputs(state, one);
        DFLASH_RETURN_IF_ERROR(
            runEvalPass(interpreter, *sig, state, g, results));
        addSums();
      }
    }
    // The serving walk of the batch's rows among the first servingRows.
    std::vector<bool> walked(size_t(B), false);
    bool any = false;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t row = batch.rows[size_t(b)];
      walked[size_t(b)] = row >= 0 && row < servingRows;
      any |= walked[size_t(b)];
    }
    if (!any)
      continue;
    walk.start(batch.lossMask.data(), batch.positionIds.data(), walked);
    rt::HostBatch pass = batch;
    for (int64_t p = 0; p < walk.passes(); ++p) {
      walk.anchorsOfPass(p, pass.anchors.data(), pass.keep.data());
      setInputs(state, pass);
      DFLASH_RETURN_IF_ERROR(runEvalPass(interpreter, *sig, state, g, results));
      const std::vector<double> &hits =
          results[::dflash::nameOf(::dflash::DraftSlots::Hits)];
      const std::vector<double> &weights =
          results[::dflash::nameOf(::dflash::DraftSlots::Weights)];
      if (hits.size() != size_t(B * N * bs) || weights.size() != hits.size())
        return Status::error(
            "the evaluation program reports " + std::to_string(hits.size()) +
            " draft slots, not B * N * bs = " + std::to_string(B * N * bs));
      std::vector<uint8_t> hit(hits.size());
      std::vector<float> weight(weights.size());
      for (size_t i = 0; i < hits.size(); ++i) {
        hit[i] = hits[i] != 0 ? 1 : 0;
        weight[i] = float(weights[i]);
      }
      walk.record(p, hit.data(), weight.data());
    }
    serving += walk.sums();
    for (int64_t b = 0; dump && b < B; ++b) {
      if (!walked[size_t(b)])
        continue;
      const std::vector<int32_t> &c = walk.candidatesOf(b);
      const std::vector<int32_t> &r = walk.runsOf(b);
      *dump << "{\"row\": " << batch.rows[size_t(b)] << ", \"loss_mask\": "
            << jsonInts(batch.lossMask.data() + b * S, size_t(S))
            << ", \"position_ids\": "
            << jsonInts(batch.positionIds.data() + b * S, size_t(S))
            << ", \"candidates\": " << jsonInts(c.data(), c.size())
            << ", \"runs\": " << jsonInts(r.data(), r.size()) << "}\n";
    }
  }
  std::array<const double *, ::dflash::kNumForwardSums> byIndex{};
  for (int k = 0; k < ::dflash::kNumForwardSums; ++k)
    byIndex[size_t(k)] = sums[::dflash::nameOf(::dflash::ForwardSum(k))].data();
  rt::EvalMetrics metrics;
  metrics.step = options.steps - 1;
  double parts[::dflash::kNumObjectiveParts] = {};
  for (int k = 0; hasParts && k < ::dflash::kNumObjectiveParts; ++k)
    parts[k] = sums[::dflash::nameOf(::dflash::ObjectivePart(k))][0];
  rt::setEvalFigures(metrics, byIndex, config.blockSize,
                     config.numPositionBuckets(), hasParts ? parts : nullptr);
  metrics.rows = options.evalRows;
  metrics.batches = loader.batchesPerPass();
  metrics.servingRows = servingRows;
  metrics.servingTau = serving.tau();
  metrics.servingBlocks = int64_t(serving.blocks);
  out << rt::evalJsonLine(metrics) << "\n";
  return Status::success();
}

/// The interpreter's rate on one core, in the FLOPs that FlopCount counts:
/// specs/tiny.toml's step (2.1 GFLOP at --emit=train), Storage precision,
/// took 0.28 s of CPU time a step on the CI machine's x86-64 cores (40
/// steps, 2026-12).
constexpr double kInterpreterFlopsPerSecond = 7e9;
/// What the process holds besides the programs' values: the libraries, the
/// MLIR context and the compiled programs (90 MiB for tiny's run).
constexpr double kProcessBytes = 90.0 * (1 << 20);

int64_t elements(Type t) {
  auto r = dyn_cast<RankedTensorType>(t);
  return r ? r.getNumElements() : 0;
}

/// One interpretation of `f`: its arguments, and the elements it holds while
/// it runs besides them: their bound copy and the interpreter's own, every
/// op's result, and the results copied out.
struct RunCount {
  int64_t arguments = 0, running = 0;
};

RunCount countRun(func::FuncOp f) {
  RunCount c;
  int64_t values = 0, results = 0;
  for (BlockArgument a : f.getArguments())
    c.arguments += elements(a.getType());
  for (Operation &op : f.front())
    for (Value r : op.getResults())
      values += elements(r.getType());
  for (Type t : f.getResultTypes())
    results += elements(t);
  c.running = 2 * c.arguments + values + results;
  return c;
}

std::string humanSeconds(double seconds) {
  std::string s;
  llvm::raw_string_ostream os(s);
  if (seconds < 120)
    os << llvm::format("%.2g s", seconds);
  else if (seconds < 2 * 3600)
    os << llvm::format("%.0f min", seconds / 60);
  else
    os << llvm::format("%.1f h", seconds / 3600);
  return s;
}

} // namespace

namespace dflash {

RunEstimate estimateRun(func::FuncOp step, func::FuncOp dump,
                        func::FuncOp target) {
  // Held all run: the step's state (its arguments between steps) and the
  // target's weights; the programs run one at a time beside them.
  RunCount s = countRun(step);
  int64_t held = s.arguments, peak = s.running;
  int64_t flops = FlopCount::of(step).step();
  if (dump)
    peak = std::max(peak, countRun(dump).running);
  if (target) {
    RunCount t = countRun(target);
    held += t.arguments;
    peak = std::max(peak, t.running);
    flops += FlopCount::of(target).step();
  }
  RunEstimate e;
  e.bytes = kProcessBytes + double(held + peak) * double(sizeof(double));
  e.secondsPerStep = double(flops) / kInterpreterFlopsPerSecond;
  return e;
}

std::optional<double> availableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:")
      return kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && size > 0)
    return double(pages) * double(size);
  return std::nullopt;
}

} // namespace dflash

int ::dflash::runReference(const ReferenceOptions &options,
                           llvm::raw_ostream &out) {
  // --steps 0 evaluates an --init checkpoint as it is.
  const bool evaluateOnly =
      options.steps == 0 && !options.initDir.empty() && options.evalRows > 0;
  if (options.steps < 1 && !evaluateOnly)
    return fail("--steps must be at least 1 (0 only with --init and "
                "--eval-rows: evaluating a checkpoint)");
  if (options.syntheticRows < 1)
    return fail("--rows must be at least 1");
  if (!(options.memoryGiB >= 0 && std::isfinite(options.memoryGiB)))
    return fail(
        "--memory-gib must be a number of GiB (0: what this machine has "
        "available)");

  SpecError specError;
  std::optional<DrafterSpec> spec = loadSpec(options.specFile, specError);
  if (!spec) {
    llvm::errs() << specError.str() << "\n";
    return 1;
  }
  for (const SpecError &warning : spec->warnings)
    llvm::errs() << warning.str() << "\n";
  const ModelConfig &config = *spec;
  uint64_t seed =
      options.seed >= 0 ? uint64_t(options.seed) : uint64_t(spec->seed);
  int64_t total = options.totalSteps > 0 ? options.totalSteps : options.steps;

  // The programs first: what they need is known before anything is loaded.
  MLIRContext ctx;
  FailureOr<CompiledStep> compiled = compile(ctx, *spec);
  if (failed(compiled))
    return fail("compiling the training step of '" + options.specFile +
                "' failed");
  FailureOr<StepSignature> trainSig = StepSignature::get(*compiled->train);
  FailureOr<StepSignature> gradSig = StepSignature::get(*compiled->gradients);
  if (failed(trainSig) || failed(gradSig))
    return fail("the compiled step has no usable signature");

  TargetProgram target;
  if (options.onlineTarget) {
    if (options.data == "synthetic" || options.targetDir.empty())
      return fail("--online-target needs --target DIR (the target's "
                  "checkpoint) and --data (token or feature shards)");
    if (Status s = target.build(ctx, *spec, options.targetDir,
                                config.rowsPerStep(), config.seqLen);
        !s.ok())
      return fail(s.message());
  }

  // One line on what the run needs, and no run that cannot fit: the
  // interpreter would fail at an allocation after minutes of loading.
  RunEstimate estimate =
      estimateRun(trainSig->func(),
                  options.dumpStep.empty() ? func::FuncOp() : gradSig->func(),
                  options.onlineTarget ? target.func() : func::FuncOp());
  std::optional<double> available =
      options.memoryGiB > 0
          ? std::optional<double>(options.memoryGiB * double(1 << 30))
          : availableMemoryBytes();
  std::string limit =
      !available ? ""
      : options.memoryGiB > 0
          ? "--memory-gib allows " + humanBytes(*available)
          : "this machine has " + humanBytes(*available) + " available";
  llvm::errs() << "dflash-reference: this run needs about "
               << humanBytes(estimate.bytes) << " of memory and about "
               << humanSeconds(estimate.secondsPerStep) << " a step; "
               << (available ? limit : "the memory available is unknown")
               << "\n";
  if (available && estimate.bytes > *available)
    return fail("this run needs about " + humanBytes(estimate.bytes) +
                " of memory but " + limit +
                ": a smaller spec (rows_per_gpu, seq_len, anchors_per_row) "
                "needs less; --memory-gib sets what it may use");

  Problem problem;
  if (Status s = loadProblem(options, config, seed, problem); !s.ok())
    return fail(s.message());
  std::vector<ParamInfo> table = parameterTable(config);
  StepState state = initialState(config, problem, table);
  if (options.onlineTarget)
    if (Status s = target.loadWeights(options.targetDir); !s.ok())
      return fail(s.message());

  rt::BatchLoader loader(*problem.rows, config, seed);
  rt::HostBatch batch;
  StepInterpreter interpreter(trainSig->func(), options.precision);
  for (int64_t step = 0; step < options.steps; ++step) {
    if (Status s = loader.next(batch); !s.ok())
      return fail(s.message());
    // Online: the batch's features come from the target, not the shards.
    if (options.onlineTarget)
      if (Status s = target.run(batch.inputIds, batch.positionIds,
                                options.precision, batch.hiddenStates);
          !s.ok())
        return fail(s.message());
    setInputs(state, batch);
    if (step == 0 && !options.dumpStep.empty())
      if (Status s = dumpFirstStep(options.dumpStep, *gradSig, state, total,
                                   options.precision, config);
          !s.ok())
        return fail(s.message());
    std::map<std::string, std::vector<double>> metrics;
    if (Status s =
            trainStep(interpreter, *trainSig, state, step, total, metrics);
        !s.ok())
      return fail(s.message());
    auto scalar = [&](const char *name) {
      auto it = metrics.find(name);
      return it == metrics.end() ? std::nan("") : it->second.at(0);
    };
    // The accuracy at block positions 1 .. bs - 1, as the trainer logs it.
    std::string byPosition;
    const std::vector<double> &hits = metrics["position_hits"];
    const std::vector<double> &counts = metrics["position_counts"];
    if (hits.size() == size_t(config.blockSize) && counts.size() == hits.size())
      for (double acc : rt::accuracyByPosition(hits.data(), counts.data(),
                                               config.blockSize)) {
        char value[32] = "null";
        if (std::isfinite(acc))
          std::snprintf(value, sizeof(value), "%.6g", acc);
        byPosition += std::string(byPosition.empty() ? "" : ", ") + value;
      }
    // Tau and the accuracy per anchor-position bucket, as the trainer logs
    // them (with more than one bucket).
    std::string byBucket;
    const int64_t numBuckets = config.numPositionBuckets();
    const std::vector<double> *bucketSums[4] = {
        &metrics["bucket_runs"], &metrics["bucket_blocks"],
        &metrics["bucket_hits"], &metrics["bucket_counts"]};
    bool haveBuckets = true;
    for (const std::vector<double> *v : bucketSums)
      haveBuckets &= v->size() == size_t(numBuckets);
    if (haveBuckets) {
      rt::BucketFigures f = rt::figuresByBucket(
          bucketSums[0]->data(), bucketSums[1]->data(), bucketSums[2]->data(),
          bucketSums[3]->data(), numBuckets);
      auto list = [&](const char *key, const std::vector<double> &values) {
        if (values.empty())
          return;
        byBucket += std::string("\"") + key + "\": [";
        for (size_t j = 0; j < values.size(); ++j) {
          char value[32] = "null";
          if (std::isfinite(values[j]))
            std::snprintf(value, sizeof(value), "%.6g", values[j]);
          byBucket += std::string(j ? ", " : "") + value;
        }
        byBucket += "], ";
      };
      list("tau_by_bucket", f.tau);
      list("acc_by_bucket", f.acc);
      list("blocks_by_bucket", f.blocks);
    }
    out << llvm::format("{\"step\": %lld, \"loss\": %.9g, \"acc\": %.6g, "
                        "\"tau\": %.6g, ",
                        (long long)step, scalar("loss"), scalar("acc"),
                        scalar("tau"))
        << "\"acc_by_position\": [" << byPosition << "], " << byBucket
        << llvm::format("\"grad_norm\": %.9g, \"lr\": %.9g}\n",
                        scalar("grad_norm"), scalar("lr"));
    out.flush();
    if (!std::isfinite(scalar("loss")))
      return fail("the loss is not finite at step " + std::to_string(step));
  }
  if (!options.saveDir.empty())
    if (Status s = saveParameters(options.saveDir, config, table, state);
        !s.ok())
      return fail(s.message());
  if (options.evalRows > 0)
    if (Status s = evaluate(ctx, *spec, options, problem, state, seed, out);
        !s.ok())
      return fail(s.message());
  return 0;
}
