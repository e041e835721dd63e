//===- DFlashKernelOps.cpp - Verifiers and FLOPs of the fused ops ---------===//
//
// The fused ops come from dflash-fuse-kernels, not from users, but their
// verifiers still check what the kernels rely on, with numbered constraints
// like every other op (docs/dialect.md).
//
//===----------------------------------------------------------------------===//

#include "dialect/DFlashOps.h"
#include "dialect/VerifyHelpers.h"

#include "llvm/Support/Format.h"

using namespace mlir;
using namespace mlir::dflash;

namespace {

RankedTensorType tensorOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}

int64_t numElements(Value v) { return tensorOf(v).getNumElements(); }

LogicalResult sameType(Operation *op, StringRef c, StringRef a, Value va,
                       StringRef b, Value vb) {
  if (va.getType() == vb.getType())
    return success();
  return op->emitOpError() << "(" << c << ") " << a << " (" << va.getType()
                           << ") and " << b << " (" << vb.getType()
                           << ") must have the same type";
}

LogicalResult positive(Operation *op, StringRef c, StringRef what,
                       FloatAttr value) {
  if (value.getValueAsDouble() > 0)
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " must be positive";
}

/// The norm weight of a normalisation over the input's last dimension.
LogicalResult lastDimWeight(Operation *op, StringRef c, Value input,
                            Value weight) {
  auto x = tensorOf(input), w = tensorOf(weight);
  if (w.getRank() == 1 && x.getRank() >= 1 &&
      w.getDimSize(0) == x.getShape().back())
    return success();
  return op->emitOpError() << "(" << c << ") weight " << w
                           << " must be one value per element of the input's "
                              "last dimension";
}

} // namespace

LogicalResult DraftEmbedOp::verify() {
  auto table = tensorOf(getTable()), ids = tensorOf(getInputIds());
  auto anchors = tensorOf(getAnchors());
  // draft_embed C1
  if (table.getRank() != 2 || ids.getRank() != 2 || anchors.getRank() != 2)
    return emitOpError("(C1) table, input_ids and anchors must have rank 2");
  // draft_embed C2
  auto r = tensorOf(getResult());
  SmallVector<int64_t> want = {ids.getDimSize(0),
                               anchors.getDimSize(1) * int64_t(getBlockSize()),
                               table.getDimSize(1)};
  if (r.getShape() != ArrayRef<int64_t>(want) ||
      r.getElementType() != table.getElementType())
    return emitOpError() << "(C2) result must be [B, N*block_size, H] of the "
                            "table's element type, not "
                         << r;
  // draft_embed C3 (embed's C4, which it carries over)
  if (getScale() && !(getScale()->convertToDouble() > 0))
    return emitOpError() << "(C3) scale is "
                         << verify::formatDouble(getScale()->convertToDouble())
                         << " but must be positive";
  return success();
}

LogicalResult LinearResidualOp::verify() {
  Operation *op = *this;
  // linear_residual C1
  if (failed(
          sameType(op, "C1", "result", getResult(), "residual", getResidual())))
    return failure();
  // linear_residual C2
  auto x = tensorOf(getInput()), w = tensorOf(getWeight());
  auto r = tensorOf(getResidual());
  if (w.getRank() != 2 || x.getRank() < 2 ||
      x.getShape().back() != w.getDimSize(1) ||
      r.getShape().drop_back() != x.getShape().drop_back() ||
      r.getShape().back() != w.getDimSize(0))
    return emitOpError() << "(C2) residual " << r << ", input " << x
                         << " and weight " << w
                         << " do not form residual + input weight^T";
  // linear_residual C3
  if (x.getElementType() != r.getElementType() ||
      w.getElementType() != r.getElementType())
    return emitOpError("(C3) input, weight and residual must have one element "
                       "type");
  return success();
}

LogicalResult LinearSwigluOp::verify() {
  // linear_swiglu C1
  auto x = tensorOf(getInput()), wg = tensorOf(getGateWeight()),
       wu = tensorOf(getUpWeight());
  if (wg.getRank() != 2 || wg.getShape() != wu.getShape())
    return emitOpError() << "(C1) gate weight " << wg << " and up weight " << wu
                         << " must be one [F, K] shape";
  // linear_swiglu C2
  auto y = tensorOf(getResult());
  if (x.getRank() < 2 || x.getShape().back() != wg.getDimSize(1) ||
      y.getShape().drop_back() != x.getShape().drop_back() ||
      y.getShape().back() != wg.getDimSize(0))
    return emitOpError() << "(C2) result " << y << ", input " << x
                         << " and weights " << wg
                         << " do not form swiglu(input weight^T)";
  // linear_swiglu C3
  if (wg.getElementType() != x.getElementType() ||
      wu.getElementType() != x.getElementType() ||
      y.getElementType() != x.getElementType())
    return emitOpError("(C3) input, weights and result must have one element "
                       "type");
  return success();
}

LogicalResult ResidualRmsNormOp::verify() {
  Operation *op = *this;
  // residual_rms_norm C1
  if (failed(positive(op, "C1", "eps", getEpsAttr())))
    return failure();
  // residual_rms_norm C2
  if (failed(sameType(op, "C2", "delta", getDelta(), "input", getInput())) ||
      failed(sameType(op, "C2", "sum", getSum(), "input", getInput())) ||
      failed(sameType(op, "C2", "result", getResult(), "input", getInput())))
    return failure();
  // residual_rms_norm C3
  return lastDimWeight(op, "C3", getInput(), getWeight());
}

LogicalResult QkNormRopeOp::verify() {
  Operation *op = *this;
  // qk_norm_rope C1
  if (failed(positive(op, "C1", "eps", getEpsAttr())) ||
      failed(positive(op, "C1", "theta", getThetaAttr())))
    return failure();
  // qk_norm_rope C2
  auto x = tensorOf(getInput());
  auto pos = tensorOf(getPositions());
  if (x.getRank() != 4 || x.getDimSize(3) % 2 != 0 || pos.getRank() != 2 ||
      pos.getDimSize(0) != x.getDimSize(0) ||
      pos.getDimSize(1) != x.getDimSize(1))
    return emitOpError("(C2) input must be [B, T, heads, d] with d even and "
                       "positions [B, T]");
  // qk_norm_rope C3
  if (failed(lastDimWeight(op, "C3", getInput(), getWeight())))
    return failure();
  // qk_norm_rope C4
  return sameType(op, "C4", "result", getResult(), "input", getInput());
}

LogicalResult QkNormRopeGradOp::verify() {
  Operation *op = *this;
  // qk_norm_rope_grad C1
  if (failed(positive(op, "C1", "eps", getEpsAttr())) ||
      failed(positive(op, "C1", "theta", getThetaAttr())))
    return failure();
  // qk_norm_rope_grad C2
  auto x = tensorOf(getInput());
  if (x.getRank() != 4 || x.getDimSize(3) % 2 != 0)
    return emitOpError("(C2) input must be [B, T, heads, d] with d even");
  // qk_norm_rope_grad C3
  if (failed(lastDimWeight(op, "C3", getInput(), getWeight())))
    return failure();
  // qk_norm_rope_grad C4
  if (failed(sameType(op, "C4", "grad", getGrad(), "input", getInput())) ||
      failed(sameType(op, "C4", "input_grad", getInputGrad(), "input",
                      getInput())) ||
      failed(sameType(op, "C4", "weight_grad", getWeightGrad(), "weight",
                      getWeight())))
    return failure();
  return success();
}

LogicalResult RmsNormGradResidualOp::verify() {
  Operation *op = *this;
  // rms_norm_grad_residual C1
  if (failed(positive(op, "C1", "eps", getEpsAttr())))
    return failure();
  // rms_norm_grad_residual C2
  if (failed(sameType(op, "C2", "grad", getGrad(), "input", getInput())) ||
      failed(sameType(op, "C2", "residual_grad", getResidualGrad(), "input",
                      getInput())) ||
      failed(sameType(op, "C2", "input_grad", getInputGrad(), "input",
                      getInput())) ||
      failed(sameType(op, "C2", "weight_grad", getWeightGrad(), "weight",
                      getWeight())))
    return failure();
  // rms_norm_grad_residual C3
  return lastDimWeight(op, "C3", getInput(), getWeight());
}

LogicalResult AccumulateLinearGradOp::verify() {
  Operation *op = *this;
  // accumulate_linear_grad C1
  if (failed(sameType(op, "C1", "result", getResult(), "accumulator",
                      getAccumulator())))
    return failure();
  // accumulate_linear_grad C2
  auto dy = tensorOf(getGrad()), x = tensorOf(getOperand());
  auto acc = tensorOf(getAccumulator());
  bool ok;
  if (getWeightGrad()) // dW [N, K] += dy[.., N]^T x[.., K]
    ok = acc.getRank() == 2 && dy.getShape().back() == acc.getDimSize(0) &&
         x.getShape().back() == acc.getDimSize(1) &&
         dy.getShape().drop_back() == x.getShape().drop_back();
  else // dx [.., K] += dy [.., N] W [N, K]
    ok = x.getRank() == 2 && dy.getShape().back() == x.getDimSize(0) &&
         acc.getShape().back() == x.getDimSize(1) &&
         acc.getShape().drop_back() == dy.getShape().drop_back();
  if (!ok)
    return emitOpError() << "(C2) accumulator " << acc << ", grad " << dy
                         << " and operand " << x
                         << " do not form a linear layer's gradient";
  return success();
}

LogicalResult LossSeedOp::verify() { return success(); }

/// lm_head_ce_fused's C1-C2, which lm_head_ce_top_k checks too.
static LogicalResult verifyLmHeadOperands(Operation *op, Value input,
                                          Value weight, Value labels,
                                          Value weights, Value hits) {
  auto y = tensorOf(input), w = tensorOf(weight);
  // lm_head_ce_fused C1
  if (w.getRank() != 2 || y.getRank() < 2 ||
      w.getDimSize(1) != y.getShape().back())
    return op->emitOpError("(C1) weight must be [V, H] with H the input's "
                           "last dimension");
  // lm_head_ce_fused C2
  ArrayRef<int64_t> rows = y.getShape().drop_back();
  if (tensorOf(labels).getShape() != rows ||
      tensorOf(weights).getShape() != rows || tensorOf(hits).getShape() != rows)
    return op->emitOpError(
        "(C2) labels, weights and hits must have one entry per row");
  return success();
}

/// The folded top-K's attribute and results (lm_head_ce_fused C4-C5,
/// lm_head_ce_top_k C3-C4): 1 <= top_k <= V; values [rows, K] f32,
/// candidates [rows, K] i32, label_values [rows] f32.
static LogicalResult verifyLmHeadTopK(Operation *op, StringRef rangeC,
                                      StringRef shapeC, Value input,
                                      Value weight, int64_t topK, Value values,
                                      Value candidates, Value labelValues) {
  const int64_t V = tensorOf(weight).getDimSize(0);
  if (topK < 1 || topK > V)
    return op->emitOpError()
           << "(" << rangeC << ") top_k is " << topK << " but must lie in 1.."
           << V << " (the vocabulary)";
  SmallVector<int64_t> rows(tensorOf(input).getShape().drop_back());
  SmallVector<int64_t> perCandidate(rows);
  perCandidate.push_back(topK);
  auto expect = [&](StringRef name, Value v, ArrayRef<int64_t> shape,
                    Type element) -> LogicalResult {
    auto t = tensorOf(v);
    if (t.getShape() == shape && t.getElementType() == element)
      return success();
    return op->emitOpError()
           << "(" << shapeC << ") " << name << " is " << t << " but must be "
           << RankedTensorType::get(shape, element);
  };
  Builder b(op->getContext());
  if (failed(expect("values", values, perCandidate, b.getF32Type())) ||
      failed(expect("candidates", candidates, perCandidate,
                    b.getIntegerType(32))) ||
      failed(expect("label_values", labelValues, rows, b.getF32Type())))
    return failure();
  return success();
}

LogicalResult LmHeadCeFusedOp::verify() {
  Operation *op = *this;
  if (failed(verifyLmHeadOperands(op, getInput(), getWeight(), getLabels(),
                                  getWeights(), getHits())))
    return failure();
  // lm_head_ce_fused C3
  if (failed(sameType(op, "C3", "input_grad", getInputGrad(), "input",
                      getInput())))
    return failure();
  // lm_head_ce_fused C4
  const size_t n = getTopKResults().size();
  if (getTopK() ? n != 3 : n != 0)
    return emitOpError() << "(C4) has " << n
                         << " top_k_results but needs 3 with top_k, else none";
  // lm_head_ce_fused C5
  if (getTopK() &&
      failed(verifyLmHeadTopK(op, "C5", "C5", getInput(), getWeight(),
                              int64_t(*getTopK()), getValues(), getCandidates(),
                              getLabelValues())))
    return failure();
  // lm_head_ce_fused C6
  return verify::expectUnaryTransform(op, "C6",
                                      getMultiplier().convertToDouble(),
                                      getSoftcap().convertToDouble());
}

LogicalResult LmHeadCeTopKOp::verify() {
  Operation *op = *this;
  // lm_head_ce_top_k C1-C2: lm_head_ce_fused's.
  if (failed(verifyLmHeadOperands(op, getInput(), getWeight(), getLabels(),
                                  getWeights(), getHits())))
    return failure();
  // lm_head_ce_top_k C3, C4
  if (failed(verifyLmHeadTopK(op, "C3", "C4", getInput(), getWeight(),
                              int64_t(getTopK()), getValues(), getCandidates(),
                              getLabelValues())))
    return failure();
  // lm_head_ce_top_k C5
  return verify::expectUnaryTransform(op, "C5",
                                      getMultiplier().convertToDouble(),
                                      getSoftcap().convertToDouble());
}

LogicalResult AdamWMultiOp::verify() {
  unsigned n = getParams().size();
  // adamw_multi C1
  if (getMasters().size() != n || getMoment1().size() != n ||
      getMoment2().size() != n || getGrads().size() != n)
    return emitOpError() << "(C1) params, masters, moment1, moment2 and "
                            "grads must have one entry per parameter ("
                         << n << ")";
  // adamw_multi C2
  if (getNewState().size() != 4 * n)
    return emitOpError() << "(C2) has " << getNewState().size()
                         << " state results; it needs 4 x " << n;
  // adamw_multi C3
  for (unsigned i = 0; i < n; ++i) {
    auto p = tensorOf(getParams()[i]);
    auto m = tensorOf(getMasters()[i]);
    if (p.getShape() != m.getShape() || getMoment1()[i].getType() != m ||
        getMoment2()[i].getType() != m ||
        tensorOf(getGrads()[i]).getShape() != p.getShape() ||
        getNewParam(i).getType() != p || getNewMaster(i).getType() != m ||
        getNewMoment1(i).getType() != m || getNewMoment2(i).getType() != m)
      return emitOpError() << "(C3) the state of parameter " << i
                           << " must share its shape, fp32 for masters and "
                              "moments";
  }
  return success();
}

LogicalResult GradientBucketOp::verify() {
  // gradient_bucket C1
  if (getGrads().empty() || getGrads().size() != getResults().size())
    return emitOpError() << "(C1) needs one result per gradient and at least "
                            "one gradient, not "
                         << getGrads().size() << " gradients and "
                         << getResults().size() << " results";
  // gradient_bucket C2
  for (auto [g, r] : llvm::zip(getGrads(), getResults()))
    if (tensorOf(g).getShape() != tensorOf(r).getShape())
      return emitOpError() << "(C2) result " << r.getType()
                           << " must have the shape of its gradient "
                           << g.getType();
  // gradient_bucket C3
  if (bool(getWorldSizeAttr()) != bool(getShardElementsAttr()))
    return emitOpError() << "(C3) needs both world_size and shard_elements "
                            "or neither";
  if (getWorldSizeAttr()) {
    int64_t world = getWorldSizeAttr().getInt();
    int64_t shard = getShardElementsAttr().getInt();
    if (world < 1 || shard < 1)
      return emitOpError() << "(C3) world_size (" << world
                           << ") and shard_elements (" << shard
                           << ") must be positive";
    // gradient_bucket C4
    int64_t elements = 0;
    for (Value r : getResults())
      elements += numElements(r);
    if (world * shard < elements)
      return emitOpError() << "(C4) " << world << " shards of " << shard
                           << " elements cannot hold its " << elements
                           << " gradient elements";
  }
  return success();
}

SmallVector<GradientBucketOp> mlir::dflash::shardedBuckets(AdamWShardedOp op) {
  SmallVector<GradientBucketOp> buckets;
  for (Value g : op.getGrads())
    if (auto bucket = g.getDefiningOp<GradientBucketOp>())
      if (!llvm::is_contained(buckets, bucket))
        buckets.push_back(bucket);
  return buckets;
}

LogicalResult AdamWShardedOp::verify() {
  unsigned n = getParams().size(), k = getMasters().size();
  // adamw_sharded C1
  if (getGrads().size() != n || getMoment1().size() != k ||
      getMoment2().size() != k)
    return emitOpError() << "(C1) needs one grad per parameter (" << n
                         << ") and one master, moment1 and moment2 per bucket ("
                         << k << ")";
  // adamw_sharded C2
  if (getNewState().size() != n + 3 * k)
    return emitOpError() << "(C2) has " << getNewState().size()
                         << " state results; it needs " << n << " + 3 x " << k;
  // adamw_sharded C3
  for (unsigned i = 0; i < n; ++i)
    if (tensorOf(getGrads()[i]).getShape() !=
            tensorOf(getParams()[i]).getShape() ||
        getNewParam(i).getType() != getParams()[i].getType())
      return emitOpError() << "(C3) the grad and new value of parameter " << i
                           << " must have its shape";
  // adamw_sharded C4
  const int64_t world = getWorldSizeAttr().getInt();
  if (world < 1)
    return emitOpError() << "(C4) world_size must be positive, not " << world;
  for (auto [i, g] : llvm::enumerate(getGrads())) {
    auto bucket = g.getDefiningOp<GradientBucketOp>();
    if (!bucket || !bucket.getWorldSizeAttr() ||
        bucket.getWorldSizeAttr().getInt() != world)
      return emitOpError() << "(C4) grad " << i
                           << " must be a result of a gradient_bucket sharded "
                              "over world_size "
                           << world;
  }
  // adamw_sharded C5
  SmallVector<GradientBucketOp> buckets = shardedBuckets(*this);
  if (buckets.size() != k)
    return emitOpError() << "(C5) the grads come from " << buckets.size()
                         << " buckets but there are " << k
                         << " groups of shard state";
  for (GradientBucketOp bucket : buckets)
    for (Value r : bucket.getResults())
      if (llvm::count(getGrads(), r) != 1)
        return emitOpError()
               << "(C5) every result of a bucket must be "
                  "exactly one grad; result "
               << cast<OpResult>(r).getResultNumber() << " of a bucket is not";
  // adamw_sharded C6
  for (unsigned b = 0; b < k; ++b) {
    auto shard =
        RankedTensorType::get({buckets[b].getShardElementsAttr().getInt()},
                              Float32Type::get(getContext()));
    for (Value v : {getMasters()[b], getMoment1()[b], getMoment2()[b],
                    getNewMaster(b), getNewMoment1(b), getNewMoment2(b)})
      if (v.getType() != shard)
        return emitOpError() << "(C6) the state of bucket " << b << " must be "
                             << shard << ", not " << v.getType();
  }
  return success();
}

int64_t GradientBucketOp::getFlopCount() { return 0; }
int64_t DraftEmbedOp::getFlopCount() { return 0; }
int64_t LinearResidualOp::getFlopCount() {
  auto w = tensorOf(getWeight());
  int64_t rows = numElements(getInput()) / w.getDimSize(1);
  return 2 * rows * w.getDimSize(0) * w.getDimSize(1) +
         numElements(getResidual());
}
int64_t LinearSwigluOp::getFlopCount() {
  // Both products and the elementwise SwiGLU (SwigluOp's count).
  auto w = tensorOf(getGateWeight());
  int64_t rows = numElements(getInput()) / w.getDimSize(1);
  return 2 * 2 * rows * w.getDimSize(0) * w.getDimSize(1) +
         5 * numElements(getResult());
}
int64_t ResidualRmsNormOp::getFlopCount() {
  return 5 * numElements(getInput());
}
int64_t QkNormRopeOp::getFlopCount() { return 7 * numElements(getInput()); }
int64_t QkNormRopeGradOp::getFlopCount() {
  return 11 * numElements(getInput());
}
int64_t RmsNormGradResidualOp::getFlopCount() {
  return 9 * numElements(getInput());
}
int64_t AccumulateLinearGradOp::getFlopCount() {
  int64_t n = tensorOf(getGrad()).getShape().back();
  int64_t rows = numElements(getGrad()) / n;
  int64_t k = getWeightGrad() ? tensorOf(getOperand()).getShape().back()
                              : tensorOf(getOperand()).getDimSize(1);
  return 2 * rows * n * k + numElements(getAccumulator());
}
int64_t LossSeedOp::getFlopCount() { return numElements(getWeights()); }
// Logits once, then the input gradient: two GEMMs (the graph counted three,
// since lm_head_ce_grad recomputes the logits).
int64_t LmHeadCeFusedOp::getFlopCount() {
  auto w = tensorOf(getWeight());
  return 4 * numElements(getLabels()) * w.getDimSize(0) * w.getDimSize(1);
}
// The logits' GEMM, once for the loss and the top-K.
int64_t LmHeadCeTopKOp::getFlopCount() {
  auto w = tensorOf(getWeight());
  return 2 * numElements(getLabels()) * w.getDimSize(0) * w.getDimSize(1);
}
int64_t AdamWMultiOp::getFlopCount() {
  int64_t n = 0;
  for (Value p : getParams())
    n += numElements(p);
  return 14 * n;
}
// Each GPU updates only its shards.
int64_t AdamWShardedOp::getFlopCount() {
  int64_t n = 0;
  for (Value m : getMasters())
    n += numElements(m);
  return 14 * n;
}
