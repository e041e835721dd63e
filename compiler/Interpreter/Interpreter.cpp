//===- Interpreter.cpp - Runs a dflash step on the CPU --------------------===//
//
// One case per op, each a call into kernels/reference with T = double. The
// interpreter only moves data and checks shapes; the math lives in the
// reference so that GPU kernel tests and this executor share one oracle.
//
//===----------------------------------------------------------------------===//

#include "compiler/Interpreter/Interpreter.h"
#include "compiler/Analysis/MemoryPlan.h"

#include "dialect/DFlashOps.h"
#include "kernels/Bf16.h"
#include "kernels/reference/DFlash2.h"
#include "kernels/reference/Reference.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

HostTensor::HostTensor(std::vector<int64_t> s) : shape(std::move(s)) {
  data.assign(numel(), 0.0);
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

namespace {

std::vector<int64_t> shapeOf(Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  return std::vector<int64_t>(t.getShape().begin(), t.getShape().end());
}

/// Rounds every element to what the element type can store.
void roundToStorage(HostTensor &t, Type elementType) {
  if (elementType.isBF16()) {
    for (double &x : t.data)
      x = double(bf16ToFloat(floatToBf16(float(x))));
  } else if (elementType.isF32()) {
    for (double &x : t.data)
      x = double(float(x));
  }
}

std::vector<int32_t> asIndices(const HostTensor &t) {
  std::vector<int32_t> out(t.data.size());
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = int32_t(t.data[i]);
  return out;
}

std::vector<uint8_t> asFlags(const HostTensor &t) {
  std::vector<uint8_t> out(t.data.size());
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = t.data[i] != 0 ? 1 : 0;
  return out;
}

/// rope (direction 1) or its transpose (-1) of x [B, T, heads, d], with
/// YaRN's frequencies where `yarn` is given.
void rope(const double *x, const int32_t *pos, double *y,
          const std::vector<int64_t> &shape, APFloat theta, YarnAttr yarn,
          int direction) {
  const int64_t rows = shape[0] * shape[1];
  if (!yarn) {
    if (direction > 0)
      ref::rope<double>(x, pos, y, rows, shape[2], shape[3],
                        theta.convertToDouble());
    else
      ref::ropeGrad<double>(x, pos, y, rows, shape[2], shape[3],
                            theta.convertToDouble());
    return;
  }
  ref::YarnScaling scaling =
      referenceYarnScaling(theta.convertToDouble(), yarn);
  if (direction > 0)
    ref::yarnRope<double>(x, pos, y, rows, shape[2], shape[3], scaling);
  else
    ref::yarnRopeGrad<double>(x, pos, y, rows, shape[2], shape[3], scaling);
}

HostTensor fromIndices(const std::vector<int32_t> &v,
                       std::vector<int64_t> shape) {
  HostTensor t(std::move(shape));
  for (size_t i = 0; i < v.size(); ++i)
    t.data[i] = v[i];
  return t;
}

ref::AttentionShape attentionShape(Value query, Value contextKeys,
                                   Value anchors, int64_t bs,
                                   IntegerAttr window, bool causal) {
  auto q = shapeOf(query), kc = shapeOf(contextKeys), a = shapeOf(anchors);
  ref::AttentionShape s;
  s.B = q[0];
  s.S = kc[1];
  s.N = a[1];
  s.bs = bs;
  s.nh = q[2];
  s.nkv = kc[2];
  s.d = q[3];
  s.window = window ? window.getInt() : 0;
  s.causal = causal;
  return s;
}

/// Evaluates one step. `env` maps every SSA value computed so far to its
/// tensor.
class Evaluator {
public:
  explicit Evaluator(Precision precision) : precision(precision) {}

  llvm::DenseMap<Value, HostTensor> env;

  LogicalResult eval(Operation *op);

private:
  Precision precision;

  const HostTensor &in(Value v) { return env.find(v)->second; }
  /// The result tensor of `v`, created by eval() before the op runs.
  HostTensor &out(Value v) { return env.find(v)->second; }
  const double *ptr(Value v) { return in(v).data.data(); }
  double *outPtr(Value v) { return out(v).data.data(); }
  static int64_t lastDim(Value v) { return shapeOf(v).back(); }
  static int64_t rows(Value v) {
    auto s = shapeOf(v);
    int64_t n = 1;
    for (size_t i = 0; i + 1 < s.size(); ++i)
      n *= s[i];
    return n;
  }
  double scalar(Value v) { return in(v).data[0]; }
  void setScalar(Value v, double x) { out(v).data[0] = x; }
  void setFlags(Value v, const std::vector<uint8_t> &flags) {
    HostTensor &t = out(v);
    for (size_t i = 0; i < flags.size(); ++i)
      t.data[i] = flags[i];
  }

  LogicalResult evalForward(Operation *op);
  /// A mixture-of-experts target's routing, grouping and expert GEMMs.
  LogicalResult evalMoe(Operation *op);
  /// The Qwen3.5 / Qwen3-Next hybrid target's ops (kernels/reference/
  /// DeltaNet.cpp).
  LogicalResult evalHybrid(Operation *op);
  LogicalResult evalGradient(Operation *op);
  /// A DFlash2 drafter's convolution and selector, forward and backward
  /// (kernels/reference/DFlash2.cpp).
  LogicalResult evalDFlash2(Operation *op);
  /// selector_loss or selector_loss_grad: ref::selectorForward (and
  /// selectorBackward) one row at a time.
  template <typename SelectorOp> LogicalResult selector(SelectorOp o);
  /// selector_candidates' top `K` of T(input @ weight^T), into `o`'s
  /// values, candidates and label values: the op's own, or those of an
  /// lm_head op it was folded into (with that op's T).
  template <typename CandidatesOp>
  LogicalResult topKCandidates(CandidatesOp o, int64_t K,
                               ref::UnaryTransform t);
  /// lm_head_ce's sums and hits, of it or of an op it was fused into.
  template <typename LossOp> LogicalResult lmHeadLoss(LossOp o);
  LogicalResult evalOptimizer(Operation *op);
  /// The ops of dflash-fuse-kernels, as the compositions they replace.
  LogicalResult evalFused(Operation *op);

  /// What the fused optimizers share: the gradients' global norm, the
  /// clip, the step's learning rate and the AdamW settings.
  struct OptimizerScalars {
    double norm = 0, clip = 1;
    int64_t stepIndex = 0;
    ref::AdamWConfig config;
  };
  template <typename OptimizerOp>
  OptimizerScalars optimizerScalars(OptimizerOp o,
                                    const std::vector<HostTensor> &grads) {
    OptimizerScalars k;
    double sumSq = 0;
    for (const HostTensor &g : grads)
      sumSq += ref::sumOfSquares<double>(g.data.data(), g.numel());
    k.norm = std::sqrt(sumSq);
    k.clip = ref::clipCoefficient(k.norm, o.getMaxGradNorm().convertToDouble());
    k.stepIndex = int64_t(scalar(o.getStep()));
    double lr = ref::learningRate(k.stepIndex, int64_t(scalar(o.getTotal())),
                                  o.getLr().convertToDouble(),
                                  o.getWarmupRatio().convertToDouble());
    if (precision == Precision::Storage)
      lr = double(float(lr));
    k.config.lr = lr;
    k.config.beta1 = o.getBeta1().convertToDouble();
    k.config.beta2 = o.getBeta2().convertToDouble();
    k.config.eps = o.getEps().convertToDouble();
    k.config.weightDecay = o.getWeightDecay().convertToDouble();
    return k;
  }

  /// Rounds `t` as a value of `type` is stored, in Storage precision.
  void store(HostTensor &t, Type type) {
    if (precision == Precision::Storage)
      roundToStorage(t, cast<RankedTensorType>(type).getElementType());
  }
};

LogicalResult Evaluator::eval(Operation *op) {
  // Every result exists before the op runs: the cases below hold references
  // into `env`, which an insertion could move.
  for (Value r : op->getResults())
    env.try_emplace(r, HostTensor(shapeOf(r)));
  LogicalResult result = success();
  if (isa<AllReduceOp, LossStatsOp, ConvertOp, GlobalNormOp, ClipCoefficientOp,
          LrScheduleOp, AdamWOp>(op))
    result = evalOptimizer(op);
  else if (isa<LinearGradInputOp, LinearGradWeightOp, RmsNormGradOp, RopeGradOp,
               BlockAttentionGradOp, SwigluGradOp, LmHeadCeGradOp>(op))
    result = evalGradient(op);
  else if (isa<MoeRouteOp, MoePermuteOp, GroupedLinearOp, GroupedLinearSwigluOp,
               MoeUnpermuteOp>(op))
    result = evalMoe(op);
  else if (isa<CausalConvOp, GatedDeltaRuleOp, GatedRmsNormOp,
               ZeroCentredRmsNormOp, PartialRopeOp, SplitLastOp, SigmoidGateOp>(
               op))
    result = evalHybrid(op);
  else if (isa<GroupedConvOp, GroupedConvGradOp, SelectorCandidatesOp,
               SelectorCandidatesGradOp, SelectorLossOp, SelectorLossGradOp,
               DraftPredecessorsOp, SelectorAlphaOp, SelectorObjectiveOp,
               SelectorObjectiveGradOp>(op))
    result = evalDFlash2(op);
  else if (isa<DraftEmbedOp, LinearResidualOp, LinearSwigluOp,
               ResidualRmsNormOp, QkNormRopeOp, QkNormRopeGradOp,
               RmsNormGradResidualOp, AccumulateLinearGradOp, LossSeedOp,
               LmHeadCeFusedOp, LmHeadCeTopKOp, AdamWMultiOp, AdamWShardedOp,
               GradientBucketOp>(op))
    result = evalFused(op);
  else
    result = evalForward(op);
  if (failed(result))
    return failure();
  if (precision == Precision::Storage)
    for (Value r : op->getResults())
      roundToStorage(env.find(r)->second,
                     cast<RankedTensorType>(r.getType()).getElementType());
  return success();
}

LogicalResult Evaluator::evalHybrid(Operation *op) {
  auto positions = [&](Value v) { return asIndices(in(v)); };
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](CausalConvOp o) {
        auto x = shapeOf(o.getInput());
        ref::causalConv(ptr(o.getInput()), ptr(o.getWeight()),
                        positions(o.getPositionIds()).data(),
                        outPtr(o.getResult()), x[0], x[1], x[2],
                        shapeOf(o.getWeight())[1]);
        return success();
      })
      .Case([&](GatedDeltaRuleOp o) {
        auto q = shapeOf(o.getQuery()), v = shapeOf(o.getValue());
        ref::gatedDeltaRule(
            ptr(o.getQuery()), ptr(o.getKey()), ptr(o.getValue()),
            ptr(o.getA()), ptr(o.getB()), ptr(o.getALog()), ptr(o.getDtBias()),
            positions(o.getPositionIds()).data(), outPtr(o.getResult()), q[0],
            q[1], q[2], v[2], q[3], v[3]);
        return success();
      })
      .Case([&](GatedRmsNormOp o) {
        ref::gatedRmsNorm(ptr(o.getInput()), ptr(o.getGate()),
                          ptr(o.getWeight()), outPtr(o.getResult()),
                          rows(o.getInput()), lastDim(o.getInput()),
                          o.getEps().convertToDouble());
        return success();
      })
      .Case([&](ZeroCentredRmsNormOp o) {
        ref::zeroCentredRmsNorm(ptr(o.getInput()), ptr(o.getWeight()),
                                outPtr(o.getResult()), rows(o.getInput()),
                                lastDim(o.getInput()),
                                o.getEps().convertToDouble());
        return success();
      })
      .Case([&](PartialRopeOp o) {
        auto x = shapeOf(o.getInput());
        ref::partialRope(ptr(o.getInput()), positions(o.getPositions()).data(),
                         outPtr(o.getResult()), x[0] * x[1], x[2], x[3],
                         int64_t(o.getRotaryDim()),
                         o.getTheta().convertToDouble());
        return success();
      })
      .Case([&](SplitLastOp o) {
        const std::vector<double> &x = in(o.getInput()).data;
        const size_t width = size_t(lastDim(o.getInput()));
        const size_t rowCount = x.size() / width;
        size_t offset = 0;
        for (Value part : o.getParts()) {
          std::vector<double> &y = out(part).data;
          const size_t n = size_t(lastDim(part));
          for (size_t r = 0; r < rowCount; ++r)
            std::copy_n(x.begin() + r * width + offset, n, y.begin() + r * n);
          offset += n;
        }
        return success();
      })
      .Case([&](SigmoidGateOp o) {
        const std::vector<double> &x = in(o.getInput()).data;
        const std::vector<double> &g = in(o.getGate()).data;
        std::vector<double> &y = out(o.getResult()).data;
        // A gate of last dimension 1 (one a row) is broadcast along it.
        const size_t per = x.size() / g.size();
        for (size_t i = 0; i < x.size(); ++i)
          y[i] = x[i] / (1.0 + std::exp(-g[i / per]));
        return success();
      })
      .Default([](Operation *o) {
        return o->emitOpError("is not a hybrid-target op");
      });
}

/// An embed's (or draft_embed's) optional scale (a DFlash2 drafter's
/// input_embedding_scale) applied to its n gathered values.
void scaleEmbedding(std::optional<APFloat> scale, double *x, int64_t n) {
  if (!scale)
    return;
  const double s = scale->convertToDouble();
  for (int64_t i = 0; i < n; ++i)
    x[i] *= s;
}

/// The reference's shape of a grouped_conv or grouped_conv_grad: `delta`
/// is the whole D, read at its slot stride from half `half`'s offset.
template <typename ConvOp> ref::GroupedConvShape convShape(ConvOp o) {
  auto x = shapeOf(o.getInput());
  ref::GroupedConvShape s;
  s.B = x[0];
  s.bs = o.getBlockSize();
  s.N = x[1] / s.bs;
  s.H = x[2];
  s.kc = o.getKernelSize();
  s.gs = o.getGroupSize();
  s.deltaStride = shapeOf(o.getDelta()).back();
  return s;
}

/// Offsets of the half a convolution reads in D and in base (a [kc, H]
/// base has one half, at 0).
template <typename ConvOp>
std::pair<int64_t, int64_t> convHalfOffsets(ConvOp o) {
  const int64_t half = o.getHalf(), kc = o.getKernelSize();
  const int64_t G = shapeOf(o.getInput())[2] / o.getGroupSize();
  const bool wholeBase = shapeOf(o.getBase()).size() == 3;
  return {half * kc * G, wholeBase ? half * kc * shapeOf(o.getInput())[2] : 0};
}

/// The reference's transform of an op with multiplier and softcap
/// (selector_candidates(_grad) and the lm_head ops).
template <typename Op> ref::UnaryTransform transformOf(Op o) {
  return {o.getMultiplier().convertToDouble(),
          o.getSoftcap().convertToDouble()};
}

/// One row of selector_loss in the reference's terms. The op gets the
/// candidates and values that selector_candidates took from the whole u;
/// ref::selectorForward takes u and redoes the top-K. So each row becomes
/// a vocabulary of K + 1 entries: the K candidates in their order, then the
/// label (-inf when it is among them). Its top-K are the candidates again,
/// in the same order (ties go to the lower index, and a label outside the
/// top-K has a value at most the K-th's), and entry K is the injected one.
struct CompactSelectorRow {
  std::vector<double> u, S;    ///< [K + 1], [K + 1, r]
  std::vector<int32_t> tokens; ///< entry -> token id
  int32_t label = 0, predecessor = 0;
};

template <typename SelectorOp> LogicalResult Evaluator::selector(SelectorOp o) {
  constexpr bool backward = std::is_same_v<SelectorOp, SelectorLossGradOp>;
  const int64_t K = lastDim(o.getValues()), n = rows(o.getValues());
  auto wh = shapeOf(o.getProjection());
  const int64_t r = wh[0], H = wh[1];
  const int64_t V = shapeOf(o.getPredecessorCodebook())[0];
  // t = input @ projection^T, stored as its GEMM stores it.
  HostTensor t({n, r});
  ref::linear<double>(ptr(o.getInput()), ptr(o.getProjection()), t.data.data(),
                      n, r, H);
  store(t, o.getInput().getType());
  const std::vector<int32_t> candidates = asIndices(in(o.getCandidates()));
  const std::vector<int32_t> labels = asIndices(in(o.getLabels()));
  const std::vector<int32_t> predecessors = asIndices(in(o.getPredecessors()));
  const double *values = ptr(o.getValues());
  const double *labelValues = ptr(o.getLabelValues());
  const double *weights = ptr(o.getWeights());
  const double *P = ptr(o.getPredecessorCodebook());
  const double *S = ptr(o.getSuccessorCodebook());
  auto inVocabulary = [V](int32_t id) { return id >= 0 && id < V; };
  double lossSum = 0, coveredWeight = 0;
  std::vector<uint8_t> hits(size_t(n), 0);
  CompactSelectorRow c;
  for (int64_t row = 0; row < n; ++row) {
    const double w = weights[row];
    if (w == 0)
      continue;
    const int32_t *rowCandidates = candidates.data() + row * K;
    const int32_t label = labels[row], p = predecessors[row];
    if (!inVocabulary(label) || !inVocabulary(p) ||
        !std::all_of(rowCandidates, rowCandidates + K, inVocabulary))
      return o.emitOpError()
             << "row " << row
             << " has a label, predecessor or candidate outside the "
                "vocabulary of "
             << V;
    c.tokens.assign(rowCandidates, rowCandidates + K);
    c.tokens.push_back(label);
    c.u.assign(size_t(K + 1), -std::numeric_limits<double>::infinity());
    c.label = int32_t(K);
    for (int64_t j = 0; j < K; ++j) {
      c.u[size_t(j)] = values[row * K + j];
      if (rowCandidates[j] == label)
        c.label = int32_t(j);
    }
    if (c.label == K)
      c.u[size_t(K)] = labelValues[row];
    c.S.resize(size_t((K + 1) * r));
    for (int64_t e = 0; e <= K; ++e)
      std::copy_n(S + int64_t(c.tokens[size_t(e)]) * r, r, c.S.begin() + e * r);
    ref::SelectorInputs<double> sel;
    sel.u = c.u.data();
    sel.t = t.data.data() + row * r;
    sel.predecessors = &c.predecessor;
    sel.labels = &c.label;
    sel.weights = &w;
    sel.P = P + int64_t(p) * r;
    sel.S = c.S.data();
    sel.rows = 1;
    sel.V = K + 1;
    sel.r = r;
    sel.K = K;
    sel.gold = o.getGold() == "inject" ? ref::SelectorGold::Inject
                                       : ref::SelectorGold::Skip;
    const ref::SelectorForward<double> f = ref::selectorForward(sel);
    lossSum += f.lossSum;
    coveredWeight += f.coveredWeight;
    hits[size_t(row)] = f.hits[0];
    if constexpr (backward) {
      std::vector<double> du(static_cast<size_t>(K + 1)),
          dt(static_cast<size_t>(r));
      ref::RowGradients<double> dP, dS;
      ref::selectorBackward(sel, f, scalar(o.getLossSumGrad()),
                            o.getStopGradient(), du.data(), dt.data(), dP, dS);
      std::copy_n(du.begin(), K, outPtr(o.getValuesGrad()) + row * K);
      outPtr(o.getLabelValuesGrad())[row] = du[size_t(K)];
      std::copy_n(dt.begin(), r, outPtr(o.getProjectedGrad()) + row * r);
      // Back from the row's entries to token ids.
      for (int32_t &e : dP.rows)
        e = p;
      for (int32_t &e : dS.rows)
        e = c.tokens[size_t(e)];
      ref::scatterAddRows(dP, outPtr(o.getPredecessorCodebookGrad()), V);
      ref::scatterAddRows(dS, outPtr(o.getSuccessorCodebookGrad()), V);
    }
  }
  if constexpr (!backward) {
    setScalar(o.getLossSum(), lossSum);
    setScalar(o.getCoveredWeight(), coveredWeight);
    setFlags(o.getHits(), hits);
  }
  return success();
}

template <typename CandidatesOp>
LogicalResult Evaluator::topKCandidates(CandidatesOp o, int64_t K,
                                        ref::UnaryTransform transform) {
  auto w = shapeOf(o.getWeight());
  const int64_t V = w[0], H = w[1];
  const int64_t n = rows(o.getInput());
  std::vector<int32_t> labels = asIndices(in(o.getLabels()));
  const double *weights = ptr(o.getWeights());
  // The logits of every row (the kernel streams them).
  std::vector<double> u(size_t(n * V));
  ref::linear<double>(ptr(o.getInput()), ptr(o.getWeight()), u.data(), n, V, H);
  ref::unaryTransform<double>(u.data(), u.data(), n * V, transform);
  double *values = outPtr(o.getValues());
  double *labelValues = outPtr(o.getLabelValues());
  std::vector<double> &tokens = out(o.getCandidates()).data;
  std::fill(tokens.begin(), tokens.end(), -1.0);
  std::vector<int32_t> top(static_cast<size_t>(K));
  for (int64_t row = 0; row < n; ++row) {
    if (weights[row] == 0)
      continue;
    if (labels[row] < 0 || labels[row] >= V)
      return o.emitOpError() << "label " << labels[row]
                             << " is outside the vocabulary of " << V;
    const double *uRow = u.data() + row * V;
    ref::topK(uRow, V, K, top.data());
    for (int64_t j = 0; j < K; ++j) {
      tokens[size_t(row * K + j)] = top[j];
      values[row * K + j] = uRow[top[j]];
    }
    labelValues[row] = uRow[labels[row]];
  }
  return success();
}

template <typename LossOp> LogicalResult Evaluator::lmHeadLoss(LossOp o) {
  auto w = shapeOf(o.getWeight());
  std::vector<int32_t> labels = asIndices(in(o.getLabels()));
  for (int32_t l : labels)
    if (l < 0 || l >= w[0])
      return o.emitOpError()
             << "label " << l << " is outside the vocabulary of " << w[0];
  std::vector<uint8_t> hits(labels.size());
  ref::CrossEntropySums sums = ref::lmHeadCrossEntropy<double>(
      ptr(o.getInput()), ptr(o.getWeight()), labels.data(), ptr(o.getWeights()),
      int64_t(labels.size()), w[0], w[1], hits.data(), transformOf(o));
  setScalar(o.getLossSum(), sums.lossSum);
  setScalar(o.getWeightSum(), sums.weightSum);
  setScalar(o.getCorrect(), sums.correct);
  setScalar(o.getCount(), sums.count);
  setFlags(o.getHits(), hits);
  return success();
}

LogicalResult Evaluator::evalDFlash2(Operation *op) {
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](GroupedConvOp o) {
        auto [deltaAt, baseAt] = convHalfOffsets(o);
        ref::groupedConv<double>(ptr(o.getInput()), ptr(o.getDelta()) + deltaAt,
                                 ptr(o.getBase()) + baseAt,
                                 outPtr(o.getResult()), convShape(o));
        return success();
      })
      .Case([&](GroupedConvGradOp o) {
        // The gradients start at 0 (eval() makes them): the half of D and
        // of a [2, kc, H] base this convolution does not read stays 0.
        auto [deltaAt, baseAt] = convHalfOffsets(o);
        ref::groupedConvGrad<double>(
            ptr(o.getGrad()), ptr(o.getInput()), ptr(o.getDelta()) + deltaAt,
            ptr(o.getBase()) + baseAt, outPtr(o.getInputGrad()),
            outPtr(o.getDeltaGrad()) + deltaAt,
            outPtr(o.getBaseGrad()) + baseAt, convShape(o));
        return success();
      })
      .Case([&](SelectorCandidatesOp o) {
        return topKCandidates(o, int64_t(o.getTopK()), transformOf(o));
      })
      .Case([&](SelectorCandidatesGradOp o) -> LogicalResult {
        auto w = shapeOf(o.getWeight());
        const int64_t V = w[0], H = w[1], K = o.getTopK();
        const int64_t n = rows(o.getInput());
        std::vector<int32_t> labels = asIndices(in(o.getLabels()));
        std::vector<int32_t> candidates = asIndices(in(o.getCandidates()));
        const double *weights = ptr(o.getWeights());
        const double *dValues =
            o.getValuesGrad() ? ptr(o.getValuesGrad()) : nullptr;
        const double *dLabel =
            o.getLabelValuesGrad() ? ptr(o.getLabelValuesGrad()) : nullptr;
        // du [rows, V]: the K + 1 entries of each row (dense only here).
        std::vector<double> du(size_t(n * V), 0.0);
        for (int64_t row = 0; row < n; ++row) {
          if (weights[row] == 0)
            continue;
          double *duRow = du.data() + row * V;
          for (int64_t j = 0; dValues && j < K; ++j) {
            const int32_t c = candidates[size_t(row * K + j)];
            if (c < 0 || c >= V)
              return o.emitOpError() << "candidate " << c
                                     << " is outside the vocabulary of " << V;
            duRow[c] += dValues[row * K + j];
          }
          if (dLabel) {
            if (labels[row] < 0 || labels[row] >= V)
              return o.emitOpError() << "label " << labels[row]
                                     << " is outside the vocabulary of " << V;
            duRow[labels[row]] += dLabel[row];
          }
        }
        std::vector<double> z(du.size());
        ref::linear<double>(ptr(o.getInput()), ptr(o.getWeight()), z.data(), n,
                            V, H);
        ref::unaryTransformGrad<double>(du.data(), z.data(), du.data(), n * V,
                                        transformOf(o));
        ref::linearGradInput<double>(du.data(), ptr(o.getWeight()),
                                     outPtr(o.getResult()), n, V, H);
        return success();
      })
      .Case([&](SelectorLossOp o) { return selector(o); })
      .Case([&](SelectorLossGradOp o) { return selector(o); })
      .Case([&](DraftPredecessorsOp o) {
        auto ids = shapeOf(o.getInputIds()), a = shapeOf(o.getAnchors());
        std::vector<int32_t> p(size_t(a[0] * a[1] * o.getBlockSize()));
        ref::draftPredecessors(asIndices(in(o.getInputIds())).data(),
                               asIndices(in(o.getAnchors())).data(),
                               asFlags(in(o.getKeep())).data(), p.data(),
                               ids[0], ids[1], a[1], o.getBlockSize());
        env[o.getResult()] = fromIndices(p, shapeOf(o.getResult()));
        return success();
      })
      .Case([&](SelectorAlphaOp o) {
        setScalar(o.getResult(),
                  ref::selectorAlphaAt(int64_t(scalar(o.getStep())),
                                       int64_t(scalar(o.getTotal())),
                                       o.getAlpha().convertToDouble(),
                                       o.getWarmupRatio().convertToDouble(),
                                       o.getRampRatio().convertToDouble()));
        return success();
      })
      .Case([&](SelectorObjectiveOp o) {
        setScalar(o.getResult(),
                  scalar(o.getUnarySum()) +
                      scalar(o.getSelectorSum()) *
                          ref::selectorTermScale(
                              scalar(o.getAlpha()), scalar(o.getWeightSum()),
                              scalar(o.getCoveredWeight()), o.getCovered()));
        return success();
      })
      .Case([&](SelectorObjectiveGradOp o) {
        setScalar(o.getResult(),
                  scalar(o.getGrad()) *
                      ref::selectorTermScale(
                          scalar(o.getAlpha()), scalar(o.getWeightSum()),
                          scalar(o.getCoveredWeight()), o.getCovered()));
        return success();
      })
      .Default([](Operation *other) {
        return other->emitOpError("is not a DFlash2 op");
      });
}

LogicalResult Evaluator::evalMoe(Operation *op) {
  auto indices = [&](Value v) { return asIndices(in(v)); };
  // A grouped GEMM's offsets: ascending from 0 to its rows.
  auto groupOffsets =
      [&](Operation *o, Value input,
          Value offsetsValue) -> FailureOr<std::vector<int32_t>> {
    std::vector<int32_t> offsets = indices(offsetsValue);
    if (offsets.front() != 0 || offsets.back() != shapeOf(input)[0])
      return o->emitOpError("has offsets that do not cover its rows");
    for (size_t e = 0; e + 1 < offsets.size(); ++e)
      if (offsets[e + 1] < offsets[e])
        return o->emitOpError("has offsets that are not ascending");
    return offsets;
  };
  auto writeIndices = [&](Value v, const std::vector<int32_t> &ix) {
    HostTensor &t = out(v);
    for (size_t i = 0; i < ix.size(); ++i)
      t.data[i] = ix[i];
  };
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](MoeRouteOp o) {
        auto s = shapeOf(o.getLogits());
        int64_t k = int64_t(o.getTopK());
        std::vector<int32_t> experts(size_t(s[0] * k));
        ref::moeRoute(ptr(o.getLogits()), outPtr(o.getWeights()),
                      experts.data(), s[0], s[1], k, o.getNormalize(),
                      o.getScoring() == "topk_softmax"
                          ? ref::MoeScoring::TopKSoftmax
                          : ref::MoeScoring::SoftmaxTopK);
        writeIndices(o.getExperts(), experts);
        return success();
      })
      .Case([&](MoePermuteOp o) -> LogicalResult {
        auto x = shapeOf(o.getInput()), e = shapeOf(o.getExperts());
        int64_t E = shapeOf(o.getOffsets())[0] - 1;
        std::vector<int32_t> experts = indices(o.getExperts());
        for (int32_t id : experts)
          if (id < 0 || id >= E)
            return o.emitOpError()
                   << "routes a token to expert " << id << " of " << E;
        std::vector<int32_t> offsets(size_t(E + 1)), source(experts.size());
        ref::moePermute(ptr(o.getInput()), experts.data(),
                        outPtr(o.getPermuted()), offsets.data(), source.data(),
                        x[0], x[1], e[1], E);
        writeIndices(o.getOffsets(), offsets);
        writeIndices(o.getSource(), source);
        return success();
      })
      .Case([&](GroupedLinearOp o) -> LogicalResult {
        auto w = shapeOf(o.getWeight());
        FailureOr<std::vector<int32_t>> offsets =
            groupOffsets(o, o.getInput(), o.getOffsets());
        if (failed(offsets))
          return failure();
        ref::groupedLinear(ptr(o.getInput()), ptr(o.getWeight()),
                           offsets->data(), outPtr(o.getResult()), w[0], w[1],
                           w[2], o.getBias() ? ptr(o.getBias()) : nullptr);
        return success();
      })
      .Case([&](GroupedLinearSwigluOp o) -> LogicalResult {
        // Both products in double, SwiGLU on them unrounded and the result
        // rounded once, as the grouped GEMM's epilogue does.
        auto w = shapeOf(o.getGateWeight());
        FailureOr<std::vector<int32_t>> offsets =
            groupOffsets(o, o.getInput(), o.getOffsets());
        if (failed(offsets))
          return failure();
        const size_t n = size_t(shapeOf(o.getInput())[0] * w[1]);
        std::vector<double> gate(n), up(n);
        const bool biased = bool(o.getGateBias());
        ref::groupedLinear(ptr(o.getInput()), ptr(o.getGateWeight()),
                           offsets->data(), gate.data(), w[0], w[1], w[2],
                           biased ? ptr(o.getGateBias()) : nullptr);
        ref::groupedLinear(ptr(o.getInput()), ptr(o.getUpWeight()),
                           offsets->data(), up.data(), w[0], w[1], w[2],
                           biased ? ptr(o.getUpBias()) : nullptr);
        if (o.getLimit())
          ref::clampedSwiglu<double>(
              gate.data(), up.data(), outPtr(o.getResult()), int64_t(n),
              o.getAlpha()->convertToDouble(), o.getLimit()->convertToDouble());
        else
          ref::swiglu<double>(gate.data(), up.data(), outPtr(o.getResult()),
                              int64_t(n));
        return success();
      })
      .Case([&](MoeUnpermuteOp o) {
        auto w = shapeOf(o.getWeights());
        std::vector<int32_t> source = indices(o.getSource());
        ref::moeUnpermute(ptr(o.getPermuted()), source.data(),
                          ptr(o.getWeights()), outPtr(o.getResult()), w[0],
                          lastDim(o.getPermuted()), w[1]);
        return success();
      })
      .Default([](Operation *other) {
        return other->emitOpError("is not a mixture-of-experts op");
      });
}

LogicalResult Evaluator::evalForward(Operation *op) {
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](DraftPositionsOp o) {
        auto a = shapeOf(o.getAnchors()), s = shapeOf(o.getPositionIds());
        std::vector<int32_t> p(a[0] * a[1] * o.getBlockSize());
        ref::draftPositions(asIndices(in(o.getAnchors())).data(),
                            asIndices(in(o.getPositionIds())).data(), p.data(),
                            a[0], s[1], a[1], o.getBlockSize());
        env[o.getResult()] = fromIndices(p, shapeOf(o.getResult()));
        return success();
      })
      .Case([&](DraftTokensOp o) {
        auto ids = shapeOf(o.getInputIds()), a = shapeOf(o.getAnchors());
        std::vector<int32_t> t(a[0] * a[1] * o.getBlockSize());
        ref::draftTokens(asIndices(in(o.getInputIds())).data(),
                         asIndices(in(o.getAnchors())).data(),
                         asFlags(in(o.getKeep())).data(), t.data(), ids[0],
                         ids[1], a[1], o.getBlockSize(), o.getMaskTokenId());
        env[o.getResult()] = fromIndices(t, shapeOf(o.getResult()));
        return success();
      })
      .Case([&](DraftTargetsOp o) {
        auto ids = shapeOf(o.getInputIds()), a = shapeOf(o.getAnchors());
        std::vector<int32_t> labels(a[0] * a[1] * o.getBlockSize());
        ref::draftTargets<double>(asIndices(in(o.getInputIds())).data(),
                                  asFlags(in(o.getLossMask())).data(),
                                  asIndices(in(o.getAnchors())).data(),
                                  asFlags(in(o.getKeep())).data(),
                                  asIndices(in(o.getPositionIds())).data(),
                                  labels.data(), outPtr(o.getWeights()), ids[0],
                                  ids[1], a[1], o.getBlockSize(),
                                  o.getGamma().convertToDouble());
        env[o.getLabels()] = fromIndices(labels, shapeOf(o.getLabels()));
        return success();
      })
      .Case([&](EmbedOp o) -> LogicalResult {
        auto table = shapeOf(o.getTable());
        std::vector<int32_t> ids = asIndices(in(o.getIds()));
        for (int32_t id : ids)
          if (id < 0 || id >= table[0])
            return o.emitOpError()
                   << "token id " << id << " is outside the table of "
                   << table[0] << " rows";
        double *x = outPtr(o.getResult());
        ref::embed<double>(ptr(o.getTable()), ids.data(), x,
                           int64_t(ids.size()), table[1]);
        scaleEmbedding(o.getScale(), x, int64_t(ids.size()) * table[1]);
        return success();
      })
      .Case([&](LinearOp o) {
        auto w = shapeOf(o.getWeight());
        ref::linear<double>(ptr(o.getInput()), ptr(o.getWeight()),
                            outPtr(o.getResult()), rows(o.getInput()), w[0],
                            w[1]);
        return success();
      })
      .Case([&](RmsNormOp o) {
        ref::rmsNorm<double>(ptr(o.getInput()), ptr(o.getWeight()),
                             outPtr(o.getResult()), rows(o.getInput()),
                             lastDim(o.getInput()),
                             o.getEps().convertToDouble());
        return success();
      })
      .Case([&](ReshapeOp o) {
        out(o.getResult()).data = in(o.getInput()).data;
        return success();
      })
      .Case([&](RowSliceOp o) {
        const std::vector<double> &from = in(o.getInput()).data;
        auto type = cast<RankedTensorType>(o.getResult().getType());
        size_t n = size_t(type.getNumElements());
        size_t rowElems = n / size_t(type.getDimSize(0));
        auto begin =
            from.begin() + std::ptrdiff_t(size_t(o.getOffset()) * rowElems);
        out(o.getResult()).data.assign(begin, begin + std::ptrdiff_t(n));
        return success();
      })
      .Case([&](RopeOp o) {
        auto x = shapeOf(o.getInput());
        rope(ptr(o.getInput()), asIndices(in(o.getPositions())).data(),
             outPtr(o.getResult()), x, o.getTheta(), o.getYarnAttr(), 1);
        return success();
      })
      .Case([&](ScaledRopeOp o) {
        auto x = shapeOf(o.getInput());
        ref::scaledRope<double>(
            ptr(o.getInput()), asIndices(in(o.getPositions())).data(),
            outPtr(o.getResult()), x[0] * x[1], x[2], x[3],
            o.getTheta().convertToDouble(), o.getFactor().convertToDouble(),
            o.getLowFreqFactor().convertToDouble(),
            o.getHighFreqFactor().convertToDouble(),
            o.getOriginalMaxPositions());
        return success();
      })
      .Case([&](CausalAttentionOp o) {
        auto q = shapeOf(o.getQuery()), k = shapeOf(o.getKeys());
        ref::causalAttention<double>(
            ptr(o.getQuery()), ptr(o.getKeys()), ptr(o.getValues()),
            asIndices(in(o.getPositionIds())).data(), outPtr(o.getResult()),
            q[0], q[1], q[2], k[2], q[3],
            o.getSinks() ? ptr(o.getSinks()) : nullptr,
            int64_t(o.getWindowAttr().getInt()));
        return success();
      })
      .Case([&](BiasedLinearOp o) {
        auto w = shapeOf(o.getWeight());
        ref::biasedLinear<double>(ptr(o.getInput()), ptr(o.getWeight()),
                                  ptr(o.getBias()), outPtr(o.getResult()),
                                  rows(o.getInput()), w[0], w[1]);
        return success();
      })
      .Case([&](YarnRopeOp o) {
        auto x = shapeOf(o.getInput());
        ref::yarnRope<double>(
            ptr(o.getInput()), asIndices(in(o.getPositions())).data(),
            outPtr(o.getResult()), x[0] * x[1], x[2], x[3],
            ref::YarnScaling{
                o.getTheta().convertToDouble(), o.getFactor().convertToDouble(),
                o.getBetaFast().convertToDouble(),
                o.getBetaSlow().convertToDouble(),
                int64_t(o.getOriginalMaxPositions()), o.getTruncate(),
                o.getAttentionFactor().convertToDouble()});
        return success();
      })
      .Case([&](ClampedSwigluOp o) {
        ref::clampedSwiglu<double>(
            ptr(o.getGate()), ptr(o.getUp()), outPtr(o.getResult()),
            in(o.getGate()).numel(), o.getAlpha().convertToDouble(),
            o.getLimit().convertToDouble());
        return success();
      })
      .Case([&](ConcatLastOp o) {
        // Each input's rows side by side: result row r is the inputs' row r.
        HostTensor &r = out(o.getResult());
        const int64_t width = lastDim(o.getResult());
        const int64_t rowCount = rows(o.getResult());
        int64_t offset = 0;
        for (Value v : o.getInputs()) {
          const HostTensor &x = in(v);
          const int64_t w = lastDim(v);
          for (int64_t row = 0; row < rowCount; ++row)
            std::copy_n(x.data.begin() + row * w, w,
                        r.data.begin() + row * width + offset);
          offset += w;
        }
        return success();
      })
      .Case([&](BlockAttentionOp o) {
        ref::AttentionShape s =
            attentionShape(o.getQuery(), o.getContextKeys(), o.getAnchors(),
                           o.getBlockSize(), o.getWindowAttr(), o.getCausal());
        ref::blockAttention<double>(
            ptr(o.getQuery()), ptr(o.getContextKeys()),
            ptr(o.getContextValues()), ptr(o.getDraftKeys()),
            ptr(o.getDraftValues()), asIndices(in(o.getAnchors())).data(),
            asFlags(in(o.getKeep())).data(),
            asIndices(in(o.getPositionIds())).data(), outPtr(o.getResult()),
            outPtr(o.getLse()), s);
        return success();
      })
      .Case([&](SwigluOp o) {
        ref::swiglu<double>(ptr(o.getGate()), ptr(o.getUp()),
                            outPtr(o.getResult()), in(o.getGate()).numel());
        return success();
      })
      .Case([&](AddOp o) {
        const HostTensor &a = in(o.getLhs()), &b = in(o.getRhs());
        HostTensor &r = out(o.getResult());
        for (size_t i = 0; i < r.data.size(); ++i)
          r.data[i] = a.data[i] + b.data[i];
        return success();
      })
      .Case([&](LmHeadCeOp o) { return lmHeadLoss(o); })
      .Case([&](DraftAcceptanceOp o) {
        auto keep = shapeOf(o.getKeep());
        std::vector<int32_t> anchors = asIndices(in(o.getAnchors()));
        std::vector<int32_t> positionIds = asIndices(in(o.getPositionIds()));
        ArrayRef<int64_t> edges = o.getBucketEdges();
        ref::AnchorPositions where{anchors.data(), positionIds.data(),
                                   shapeOf(o.getPositionIds())[1], edges.data(),
                                   int64_t(edges.size())};
        ref::AcceptanceSums sums = ref::draftAcceptance<double>(
            asFlags(in(o.getHits())).data(), ptr(o.getWeights()),
            asFlags(in(o.getKeep())).data(), keep[0], keep[1], o.getBlockSize(),
            where);
        setScalar(o.getRunSum(), sums.runSum);
        setScalar(o.getKeptBlocks(), sums.keptBlocks);
        std::vector<double> &hitsK = out(o.getPositionHits()).data;
        std::vector<double> &countsK = out(o.getPositionCounts()).data;
        for (int64_t k = 0; k < int64_t(o.getBlockSize()); ++k) {
          hitsK[size_t(k)] = sums.positionHits[k];
          countsK[size_t(k)] = sums.positionCounts[k];
        }
        for (size_t j = 0; j <= edges.size(); ++j) {
          out(o.getBucketRuns()).data[j] = sums.bucketRuns[j];
          out(o.getBucketBlocks()).data[j] = sums.bucketBlocks[j];
          out(o.getBucketHits()).data[j] = sums.bucketHits[j];
          out(o.getBucketCounts()).data[j] = sums.bucketCounts[j];
        }
        return success();
      })
      .Default([&](Operation *other) {
        return other->emitOpError("is not supported by the reference "
                                  "interpreter");
      });
}

LogicalResult Evaluator::evalGradient(Operation *op) {
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](LinearGradInputOp o) {
        auto w = shapeOf(o.getWeight());
        ref::linearGradInput<double>(ptr(o.getGrad()), ptr(o.getWeight()),
                                     outPtr(o.getResult()), rows(o.getGrad()),
                                     w[0], w[1]);
        return success();
      })
      .Case([&](LinearGradWeightOp o) {
        auto dw = shapeOf(o.getResult());
        ref::linearGradWeight<double>(ptr(o.getGrad()), ptr(o.getInput()),
                                      outPtr(o.getResult()), rows(o.getGrad()),
                                      dw[0], dw[1]);
        return success();
      })
      .Case([&](RmsNormGradOp o) {
        ref::rmsNormGrad<double>(ptr(o.getGrad()), ptr(o.getInput()),
                                 ptr(o.getWeight()), outPtr(o.getInputGrad()),
                                 outPtr(o.getWeightGrad()), rows(o.getInput()),
                                 lastDim(o.getInput()),
                                 o.getEps().convertToDouble());
        return success();
      })
      .Case([&](RopeGradOp o) {
        auto x = shapeOf(o.getGrad());
        rope(ptr(o.getGrad()), asIndices(in(o.getPositions())).data(),
             outPtr(o.getResult()), x, o.getTheta(), o.getYarnAttr(), -1);
        return success();
      })
      .Case([&](BlockAttentionGradOp o) {
        ref::AttentionShape s =
            attentionShape(o.getQuery(), o.getContextKeys(), o.getAnchors(),
                           o.getBlockSize(), o.getWindowAttr(), o.getCausal());
        ref::blockAttentionGrad<double>(
            ptr(o.getGrad()), ptr(o.getQuery()), ptr(o.getContextKeys()),
            ptr(o.getContextValues()), ptr(o.getDraftKeys()),
            ptr(o.getDraftValues()), asIndices(in(o.getAnchors())).data(),
            asFlags(in(o.getKeep())).data(),
            asIndices(in(o.getPositionIds())).data(), ptr(o.getOutput()),
            ptr(o.getLse()), outPtr(o.getQueryGrad()),
            outPtr(o.getContextKeysGrad()), outPtr(o.getContextValuesGrad()),
            outPtr(o.getDraftKeysGrad()), outPtr(o.getDraftValuesGrad()), s);
        return success();
      })
      .Case([&](SwigluGradOp o) {
        ref::swigluGrad<double>(ptr(o.getGrad()), ptr(o.getGate()),
                                ptr(o.getUp()), outPtr(o.getGateGrad()),
                                outPtr(o.getUpGrad()), in(o.getGate()).numel());
        return success();
      })
      .Case([&](LmHeadCeGradOp o) {
        auto w = shapeOf(o.getWeight());
        std::vector<int32_t> labels = asIndices(in(o.getLabels()));
        ref::lmHeadCrossEntropyGrad<double>(
            ptr(o.getInput()), ptr(o.getWeight()), labels.data(),
            ptr(o.getWeights()), scalar(o.getLossSumGrad()),
            outPtr(o.getResult()), int64_t(labels.size()), w[0], w[1],
            transformOf(o));
        return success();
      })
      .Default([&](Operation *other) { return failure(); });
}

LogicalResult Evaluator::evalOptimizer(Operation *op) {
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](AllReduceOp o) {
        // One process is the whole data-parallel group here.
        for (auto [i, r] : llvm::zip(o.getInputs(), o.getResults()))
          out(r).data = in(i).data;
        return success();
      })
      .Case([&](LossStatsOp o) {
        double ls = scalar(o.getLossSum()), ws = scalar(o.getWeightSum());
        double c = scalar(o.getCorrect()), n = scalar(o.getCount());
        double runs = scalar(o.getRunSum()), blocks = scalar(o.getKeptBlocks());
        setScalar(o.getLoss(), ls / ws);
        setScalar(o.getAcc(), n > 0 ? c / n : 0.0);
        setScalar(o.getTau(), blocks > 0 ? runs / blocks : 0.0);
        setScalar(o.getLossSumGrad(), 1.0 / ws);
        return success();
      })
      .Case([&](ConvertOp o) {
        out(o.getResult()).data = in(o.getInput()).data;
        return success();
      })
      .Case([&](GlobalNormOp o) {
        double sum = 0;
        for (Value v : o.getInputs())
          sum += ref::sumOfSquares<double>(ptr(v), in(v).numel());
        setScalar(o.getResult(), std::sqrt(sum));
        return success();
      })
      .Case([&](ClipCoefficientOp o) {
        setScalar(o.getResult(),
                  ref::clipCoefficient(scalar(o.getNorm()),
                                       o.getMaxNorm().convertToDouble()));
        return success();
      })
      .Case([&](LrScheduleOp o) {
        setScalar(o.getResult(),
                  ref::learningRate(int64_t(scalar(o.getStep())),
                                    int64_t(scalar(o.getTotal())),
                                    o.getLr().convertToDouble(),
                                    o.getWarmupRatio().convertToDouble()));
        return success();
      })
      .Case([&](AdamWOp o) {
        HostTensor &master = out(o.getNewMaster());
        HostTensor &m = out(o.getNewMoment1());
        HostTensor &v = out(o.getNewMoment2());
        master.data = in(o.getMaster()).data;
        m.data = in(o.getMoment1()).data;
        v.data = in(o.getMoment2()).data;
        ref::AdamWConfig config;
        config.lr = scalar(o.getLr());
        config.beta1 = o.getBeta1().convertToDouble();
        config.beta2 = o.getBeta2().convertToDouble();
        config.eps = o.getEps().convertToDouble();
        config.weightDecay = o.getWeightDecay().convertToDouble();
        ref::adamw<double>(master.data.data(), ptr(o.getGrad()), m.data.data(),
                           v.data.data(), master.numel(),
                           int64_t(scalar(o.getStep())) + 1,
                           scalar(o.getClip()), config);
        out(o.getNewParameter()).data = master.data;
        return success();
      })
      .Default([&](Operation *other) { return failure(); });
}

LogicalResult Evaluator::evalFused(Operation *op) {
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](DraftEmbedOp o) -> LogicalResult {
        auto ids = shapeOf(o.getInputIds()), a = shapeOf(o.getAnchors());
        auto table = shapeOf(o.getTable());
        std::vector<int32_t> tokens(a[0] * a[1] * o.getBlockSize());
        ref::draftTokens(asIndices(in(o.getInputIds())).data(),
                         asIndices(in(o.getAnchors())).data(),
                         asFlags(in(o.getKeep())).data(), tokens.data(), ids[0],
                         ids[1], a[1], o.getBlockSize(), o.getMaskTokenId());
        for (int32_t id : tokens)
          if (id < 0 || id >= table[0])
            return o.emitOpError()
                   << "token id " << id << " is outside the table of "
                   << table[0] << " rows";
        double *x = outPtr(o.getResult());
        ref::embed<double>(ptr(o.getTable()), tokens.data(), x,
                           int64_t(tokens.size()), table[1]);
        scaleEmbedding(o.getScale(), x, int64_t(tokens.size()) * table[1]);
        return success();
      })
      .Case([&](ResidualRmsNormOp o) {
        const HostTensor &x = in(o.getInput()), &d = in(o.getDelta());
        HostTensor &sum = out(o.getSum());
        for (size_t i = 0; i < sum.data.size(); ++i)
          sum.data[i] = x.data[i] + d.data[i];
        store(sum, o.getSum().getType());
        ref::rmsNorm<double>(sum.data.data(), ptr(o.getWeight()),
                             outPtr(o.getResult()), rows(o.getInput()),
                             lastDim(o.getInput()),
                             o.getEps().convertToDouble());
        return success();
      })
      .Case([&](QkNormRopeOp o) {
        auto x = shapeOf(o.getInput());
        HostTensor normed(x);
        ref::rmsNorm<double>(ptr(o.getInput()), ptr(o.getWeight()),
                             normed.data.data(), rows(o.getInput()), x[3],
                             o.getEps().convertToDouble());
        store(normed, o.getInput().getType());
        rope(normed.data.data(), asIndices(in(o.getPositions())).data(),
             outPtr(o.getResult()), x, o.getTheta(), o.getYarnAttr(), 1);
        return success();
      })
      .Case([&](QkNormRopeGradOp o) {
        auto x = shapeOf(o.getInput());
        HostTensor dNormed(x);
        rope(ptr(o.getGrad()), asIndices(in(o.getPositions())).data(),
             dNormed.data.data(), x, o.getTheta(), o.getYarnAttr(), -1);
        ref::rmsNormGrad<double>(dNormed.data.data(), ptr(o.getInput()),
                                 ptr(o.getWeight()), outPtr(o.getInputGrad()),
                                 outPtr(o.getWeightGrad()), rows(o.getInput()),
                                 x[3], o.getEps().convertToDouble());
        return success();
      })
      .Case([&](RmsNormGradResidualOp o) {
        ref::rmsNormGrad<double>(ptr(o.getGrad()), ptr(o.getInput()),
                                 ptr(o.getWeight()), outPtr(o.getInputGrad()),
                                 outPtr(o.getWeightGrad()), rows(o.getInput()),
                                 lastDim(o.getInput()),
                                 o.getEps().convertToDouble());
        HostTensor &dx = out(o.getInputGrad());
        const HostTensor &res = in(o.getResidualGrad());
        for (size_t i = 0; i < dx.data.size(); ++i)
          dx.data[i] += res.data[i];
        return success();
      })
      .Case([&](LinearResidualOp o) {
        // The sum in double, rounded once as the GEMM's epilogue does.
        auto w = shapeOf(o.getWeight());
        HostTensor &r = out(o.getResult());
        ref::linear<double>(ptr(o.getInput()), ptr(o.getWeight()),
                            r.data.data(), rows(o.getInput()), w[0], w[1]);
        const HostTensor &residual = in(o.getResidual());
        for (size_t i = 0; i < r.data.size(); ++i)
          r.data[i] += residual.data[i];
        return success();
      })
      .Case([&](LinearSwigluOp o) {
        // Both products in double, SwiGLU on them unrounded and the result
        // rounded once, as the GEMM's epilogue does.
        auto w = shapeOf(o.getGateWeight());
        const int64_t m = rows(o.getInput());
        std::vector<double> gate(size_t(m * w[0])), up(gate.size());
        ref::linear<double>(ptr(o.getInput()), ptr(o.getGateWeight()),
                            gate.data(), m, w[0], w[1]);
        ref::linear<double>(ptr(o.getInput()), ptr(o.getUpWeight()), up.data(),
                            m, w[0], w[1]);
        ref::swiglu<double>(gate.data(), up.data(), outPtr(o.getResult()),
                            int64_t(gate.size()));
        return success();
      })
      .Case([&](AccumulateLinearGradOp o) {
        HostTensor g(shapeOf(o.getResult()));
        if (o.getWeightGrad()) {
          auto dw = shapeOf(o.getResult());
          ref::linearGradWeight<double>(ptr(o.getGrad()), ptr(o.getOperand()),
                                        g.data.data(), rows(o.getGrad()), dw[0],
                                        dw[1]);
        } else {
          auto w = shapeOf(o.getOperand());
          ref::linearGradInput<double>(ptr(o.getGrad()), ptr(o.getOperand()),
                                       g.data.data(), rows(o.getGrad()), w[0],
                                       w[1]);
        }
        const HostTensor &acc = in(o.getAccumulator());
        HostTensor &r = out(o.getResult());
        for (size_t i = 0; i < r.data.size(); ++i)
          r.data[i] = acc.data[i] + g.data[i];
        return success();
      })
      .Case([&](GradientBucketOp o) {
        // fp32 copies; one process is the whole data-parallel group.
        for (auto [g, r] : llvm::zip(o.getGrads(), o.getResults()))
          out(r).data = in(g).data;
        return success();
      })
      .Case([&](LossSeedOp o) {
        double sum = 0;
        for (double w : in(o.getWeights()).data)
          sum += w;
        setScalar(o.getWeightSum(), sum);
        setScalar(o.getLossSumGrad(), 1.0 / sum);
        return success();
      })
      .Case([&](LmHeadCeFusedOp o) -> LogicalResult {
        if (failed(lmHeadLoss(o)))
          return failure();
        auto w = shapeOf(o.getWeight());
        std::vector<int32_t> labels = asIndices(in(o.getLabels()));
        ref::lmHeadCrossEntropyGrad<double>(
            ptr(o.getInput()), ptr(o.getWeight()), labels.data(),
            ptr(o.getWeights()), scalar(o.getLossSumGrad()),
            outPtr(o.getInputGrad()), int64_t(labels.size()), w[0], w[1],
            transformOf(o));
        // A folded selector_candidates: the same transformed logits.
        if (std::optional<uint64_t> K = o.getTopK())
          return topKCandidates(o, int64_t(*K), transformOf(o));
        return success();
      })
      .Case([&](LmHeadCeTopKOp o) -> LogicalResult {
        if (failed(lmHeadLoss(o)))
          return failure();
        return topKCandidates(o, int64_t(o.getTopK()), transformOf(o));
      })
      .Case([&](AdamWMultiOp o) {
        unsigned n = o.getNumParams();
        std::vector<HostTensor> grads;
        for (Value g : o.getGrads())
          grads.push_back(in(g));
        OptimizerScalars k = optimizerScalars(o, grads);
        for (unsigned i = 0; i < n; ++i) {
          HostTensor &master = out(o.getNewMaster(i));
          HostTensor &m = out(o.getNewMoment1(i));
          HostTensor &v = out(o.getNewMoment2(i));
          master.data = in(o.getMasters()[i]).data;
          m.data = in(o.getMoment1()[i]).data;
          v.data = in(o.getMoment2()[i]).data;
          ref::adamw<double>(master.data.data(), grads[i].data.data(),
                             m.data.data(), v.data.data(), master.numel(),
                             k.stepIndex + 1, k.clip, k.config);
          out(o.getNewParam(i)).data = master.data;
        }
        setScalar(o.getGradNorm(), k.norm);
        setScalar(o.getLrValue(), k.config.lr);
        return success();
      })
      .Case([&](AdamWShardedOp o) -> LogicalResult {
        // One process is one rank: with one GPU its shard of each bucket
        // is the bucket's whole flat range, laid out as the memory plan
        // lays out the bucket's results.
        if (o.getWorldSizeAttr().getInt() != 1)
          return o.emitOpError()
                 << "is sharded over " << o.getWorldSizeAttr().getInt()
                 << " GPUs; the interpreter runs one";
        std::vector<HostTensor> grads;
        for (Value g : o.getGrads())
          grads.push_back(in(g));
        OptimizerScalars k = optimizerScalars(o, grads);
        SmallVector<GradientBucketOp> buckets = shardedBuckets(o);
        for (unsigned b = 0; b < buckets.size(); ++b) {
          HostTensor &master = out(o.getNewMaster(b));
          HostTensor &m = out(o.getNewMoment1(b));
          HostTensor &v = out(o.getNewMoment2(b));
          master.data = in(o.getMasters()[b]).data;
          m.data = in(o.getMoment1()[b]).data;
          v.data = in(o.getMoment2()[b]).data;
          SmallVector<int64_t> offsets = bucketResultOffsets(buckets[b]);
          for (auto [r, offset] : llvm::zip(buckets[b].getResults(), offsets)) {
            unsigned i =
                unsigned(llvm::find(o.getGrads(), r) - o.getGrads().begin());
            int64_t at = offset / 4, count = grads[i].numel();
            ref::adamw<double>(master.data.data() + at, grads[i].data.data(),
                               m.data.data() + at, v.data.data() + at, count,
                               k.stepIndex + 1, k.clip, k.config);
            HostTensor &param = out(o.getNewParam(i));
            param.data.assign(master.data.begin() + at,
                              master.data.begin() + at + count);
          }
        }
        setScalar(o.getGradNorm(), k.norm);
        setScalar(o.getLrValue(), k.config.lr);
        return success();
      })
      .Default([&](Operation *other) { return failure(); });
}

} // namespace

FailureOr<std::vector<HostTensor>>
StepInterpreter::run(const std::vector<HostTensor> &args) {
  if (args.size() != step.getNumArguments())
    return step.emitError()
           << "the interpreter got " << args.size() << " arguments for @step's "
           << step.getNumArguments();
  Evaluator eval(precision);
  unsigned numValues = args.size();
  for (Operation &op : step.front())
    numValues += op.getNumResults();
  eval.env.reserve(numValues);
  for (unsigned i = 0; i < args.size(); ++i) {
    BlockArgument arg = step.getArgument(i);
    if (args[i].shape != shapeOf(arg) ||
        int64_t(args[i].data.size()) != args[i].numel())
      return step.emitError()
             << "argument " << i << " has the wrong shape for type "
             << arg.getType();
    eval.env[arg] = args[i];
  }
  for (Operation &op : step.front().without_terminator())
    if (failed(eval.eval(&op)))
      return failure();
  std::vector<HostTensor> results;
  for (Value v : step.front().getTerminator()->getOperands())
    results.push_back(eval.env.find(v)->second);
  return results;
}

namespace dflash {
ref::YarnScaling referenceYarnScaling(double theta,
                                      mlir::dflash::YarnAttr yarn) {
  return {theta,
          yarn.getFactor().getValueAsDouble(),
          yarn.getBetaFast().getValueAsDouble(),
          yarn.getBetaSlow().getValueAsDouble(),
          yarn.getOriginalMaxPositions(),
          yarn.getTruncate(),
          yarn.getAttentionFactor().getValueAsDouble()};
}
} // namespace dflash
