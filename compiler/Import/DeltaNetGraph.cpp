//===- DeltaNetGraph.cpp - A Gated DeltaNet layer in the dialect ----------===//

#include "compiler/Import/DeltaNetGraph.h"

#include "compiler/Import/GraphBuilding.h"
#include "dialect/DFlashOps.h"

using namespace mlir;
using namespace mlir::dflash;

namespace dflash::import {

Value gatedDeltaNet(OpBuilder &b, Location l, const TargetModelConfig &target,
                    Value h, const DeltaNetWeights &w, Value positions) {
  auto t = [](ArrayRef<int64_t> shape, Type elt) {
    return RankedTensorType::get(shape, elt);
  };
  auto bf16 = [&] { return b.getBF16Type(); };
  auto linear = [&](Value x, Value weight, Location at) {
    return ::dflash::import::linear(b, at, x, weight);
  };
  auto reshape = [&](Value x, ArrayRef<int64_t> shape, Location at) {
    return ::dflash::import::reshape(b, at, x, shape);
  };
  auto shape = cast<RankedTensorType>(h.getType()).getShape();
  const int64_t B = shape[0], S = shape[1];
  const int64_t Hk = target.linearKeyHeads, Hv = target.linearValueHeads;
  const int64_t dk = target.linearKeyHeadDim, dv = target.linearValueHeadDim;
  const int64_t Kd = target.linearKeyDim(), Vd = target.linearValueDim();
  Value qkv, z, beta, a;
  if (target.fusedLinearProjections) {
    // Per key-head group g: [q_g | k_g | v_g (r heads) | z_g (r heads)]
    // and [b_g (r) | a_g (r)]; regrouped as Qwen3.5 lays them out.
    const int64_t r = Hv / Hk;
    auto groups = SplitLastOp::create(
        b, l,
        TypeRange{t({B, S, Hk, dk}, bf16()), t({B, S, Hk, dk}, bf16()),
                  t({B, S, Hk, r * dv}, bf16()), t({B, S, Hk, r * dv}, bf16())},
        reshape(linear(h, w.inProjQkv, l), {B, S, Hk, 2 * dk + 2 * r * dv}, l),
        b.getDenseI64ArrayAttr({dk, dk, r * dv, r * dv}));
    qkv = ConcatLastOp::create(
        b, l, t({B, S, 2 * Kd + Vd}, bf16()),
        ValueRange{reshape(groups.getResult(0), {B, S, Kd}, l),
                   reshape(groups.getResult(1), {B, S, Kd}, l),
                   reshape(groups.getResult(2), {B, S, Vd}, l)});
    z = reshape(groups.getResult(3), {B, S, Hv, dv}, l);
    auto ba = SplitLastOp::create(
        b, l, TypeRange{t({B, S, Hk, r}, bf16()), t({B, S, Hk, r}, bf16())},
        reshape(linear(h, w.inProjB, l), {B, S, Hk, 2 * r}, l),
        b.getDenseI64ArrayAttr({r, r}));
    beta = reshape(ba.getResult(0), {B, S, Hv}, l);
    a = reshape(ba.getResult(1), {B, S, Hv}, l);
  } else {
    qkv = linear(h, w.inProjQkv, l);
    z = reshape(linear(h, w.inProjZ, l), {B, S, Hv, dv}, l);
    beta = linear(h, w.inProjB, l);
    a = linear(h, w.inProjA, l);
  }
  Value mixed =
      CausalConvOp::create(b, l, qkv.getType(), qkv, w.conv, positions);
  auto parts = SplitLastOp::create(b, l,
                                   TypeRange{t({B, S, Kd}, bf16()),
                                             t({B, S, Kd}, bf16()),
                                             t({B, S, Vd}, bf16())},
                                   mixed, b.getDenseI64ArrayAttr({Kd, Kd, Vd}));
  Value q = reshape(parts.getResult(0), {B, S, Hk, dk}, l);
  Value k = reshape(parts.getResult(1), {B, S, Hk, dk}, l);
  Value v = reshape(parts.getResult(2), {B, S, Hv, dv}, l);
  Value o = GatedDeltaRuleOp::create(b, l, v.getType(), q, k, v, a, beta,
                                     w.aLog, w.dtBias, positions);
  Value y = GatedRmsNormOp::create(b, l, o.getType(), o, z, w.norm,
                                   b.getF64FloatAttr(target.rmsNormEps));
  return linear(reshape(y, {B, S, Vd}, l), w.outProj, l);
}

} // namespace dflash::import
