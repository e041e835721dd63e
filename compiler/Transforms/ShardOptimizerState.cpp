//===- ShardOptimizerState.cpp - ZeRO-1: one shard of the state per GPU ---===//
//
// The fp32 master and two Adam moments take 12 bytes per parameter on every
// GPU: three times the bf16 weights and gradients together. With
// `[parallel] shard_optimizer_state`, each of the N GPUs keeps 1/N of that
// state. Shards are cut from the gradient buckets' flat fp32 ranges, so the
// collectives stay one per bucket: each bucket's all-reduce becomes a
// reduce-scatter, each GPU updates the part of every bucket it owns
// (`dflash.adamw_sharded`), and the bf16 parameters are all-gathered. A
// shard is rounded up to 64 elements (256 bytes) so that every rank's part
// of a bucket starts aligned for NCCL and for vector loads.
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/BitVector.h"

namespace dflash {
#define GEN_PASS_DEF_SHARDOPTIMIZERSTATE
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

constexpr int64_t kShardAlignElements = 64;

struct ShardOptimizerStatePass
    : public ::dflash::impl::ShardOptimizerStateBase<ShardOptimizerStatePass> {
  using ShardOptimizerStateBase::ShardOptimizerStateBase;
  void runOnOperation() override;
};

void ShardOptimizerStatePass::runOnOperation() {
  ModuleOp module = getOperation();
  MLIRContext *ctx = &getContext();
  int64_t world = worldSize;
  if (world <= 0)
    if (auto attr =
            module->getAttrOfType<IntegerAttr>(kShardOptimizerStateAttrName))
      world = attr.getInt();
  if (world <= 0)
    return; // Not asked for: every GPU keeps the whole state.

  FailureOr<StepSignature> sig = StepSignature::get(module);
  if (failed(sig))
    return signalPassFailure();
  func::FuncOp step = sig->func();
  SmallVector<AdamWMultiOp> multis;
  step.walk([&](AdamWMultiOp op) { multis.push_back(op); });
  if (multis.size() != 1) {
    module.emitError() << "@step has " << multis.size()
                       << " dflash.adamw_multi ops; sharding needs exactly "
                          "one (run dflash-fuse-kernels first)";
    return signalPassFailure();
  }
  AdamWMultiOp multi = multis.front();
  const unsigned n = multi.getNumParams();

  // Buckets in the order the gradients first name them: state group k.
  SmallVector<GradientBucketOp> buckets;
  for (auto [i, g] : llvm::enumerate(multi.getGrads())) {
    auto bucket = g.getDefiningOp<GradientBucketOp>();
    if (!bucket) {
      multi.emitOpError() << "gradient " << i
                          << " is not in a dflash.gradient_bucket: run "
                             "dflash-bucket-gradients before "
                             "dflash-shard-optimizer-state";
      return signalPassFailure();
    }
    if (!llvm::is_contained(buckets, bucket))
      buckets.push_back(bucket);
  }
  for (GradientBucketOp bucket : buckets)
    for (Value r : bucket.getResults())
      if (!r.hasOneUse() || *r.getUsers().begin() != multi.getOperation()) {
        bucket.emitOpError() << "result " << cast<OpResult>(r).getResultNumber()
                             << " must be read by the optimizer only, once";
        return signalPassFailure();
      }

  // The per-tensor state must be arguments and results of @step only.
  llvm::BitVector oldArgs(step.getNumArguments());
  unsigned firstStateArg = step.getNumArguments();
  for (ValueRange group :
       {multi.getMasters(), multi.getMoment1(), multi.getMoment2()})
    for (Value v : group) {
      auto arg = dyn_cast<BlockArgument>(v);
      if (!arg || arg.getOwner() != &step.front() || !v.hasOneUse()) {
        multi.emitOpError("expects each master and moment to be an argument "
                          "of @step that only it reads");
        return signalPassFailure();
      }
      oldArgs.set(arg.getArgNumber());
      firstStateArg = std::min(firstStateArg, arg.getArgNumber());
    }

  // Shard sizes.
  OpBuilder b(ctx);
  SmallVector<Type> shardTypes;
  for (GradientBucketOp bucket : buckets) {
    int64_t flat = bucketFlatElements(bucket);
    int64_t shard = (flat + world - 1) / world;
    shard = (shard + kShardAlignElements - 1) / kShardAlignElements *
            kShardAlignElements;
    bucket.setWorldSizeAttr(b.getI64IntegerAttr(world));
    bucket.setShardElementsAttr(b.getI64IntegerAttr(shard));
    shardTypes.push_back(RankedTensorType::get({shard}, b.getF32Type()));
  }

  // One master, moment1 and moment2 argument per bucket, where the
  // per-tensor state was.
  const unsigned k = buckets.size();
  SmallVector<unsigned> positions;
  SmallVector<Type> types;
  SmallVector<DictionaryAttr> attrs;
  SmallVector<Location> locs;
  const ArgRole roles[] = {ArgRole::Master, ArgRole::Moment1, ArgRole::Moment2};
  for (ArgRole role : roles)
    for (unsigned bucket = 0; bucket < k; ++bucket) {
      positions.push_back(firstStateArg);
      types.push_back(shardTypes[bucket]);
      attrs.push_back(
          argAttrDict(ctx, role, "bucket." + std::to_string(bucket)));
      locs.push_back(buckets[bucket].getLoc());
    }
  if (failed(step.insertArguments(positions, types, attrs, locs))) {
    step.emitError("cannot add the sharded optimizer state arguments");
    return signalPassFailure();
  }
  // insertArguments shifted every old argument at or after the position.
  llvm::BitVector erase(step.getNumArguments());
  for (unsigned i : oldArgs.set_bits())
    erase.set(i >= firstStateArg ? i + 3 * k : i);
  auto shardArg = [&](unsigned group, unsigned bucket) -> Value {
    return step.getArgument(firstStateArg + group * k + bucket);
  };

  SmallVector<Value> masters, m1, m2;
  for (unsigned bucket = 0; bucket < k; ++bucket) {
    masters.push_back(shardArg(0, bucket));
    m1.push_back(shardArg(1, bucket));
    m2.push_back(shardArg(2, bucket));
  }
  SmallVector<Type> stateTypes(multi.getParams().getTypes());
  for (unsigned group = 0; group < 3; ++group)
    stateTypes.append(shardTypes.begin(), shardTypes.end());
  b.setInsertionPoint(multi);
  Type scalar = RankedTensorType::get({}, b.getF32Type());
  auto sharded = AdamWShardedOp::create(
      b, multi.getLoc(), stateTypes, scalar, scalar, multi.getParams(),
      multi.getGrads(), masters, m1, m2, multi.getStep(), multi.getTotal(),
      b.getI64IntegerAttr(world), multi.getLrAttr(), multi.getWarmupRatioAttr(),
      multi.getMaxGradNormAttr(), multi.getBeta1Attr(), multi.getBeta2Attr(),
      multi.getEpsAttr(), multi.getWeightDecayAttr());
  for (unsigned i = 0; i < n; ++i)
    multi.getNewParam(i).replaceAllUsesWith(sharded.getNewParam(i));
  multi.getGradNorm().replaceAllUsesWith(sharded.getGradNorm());
  multi.getLrValue().replaceAllUsesWith(sharded.getLrValue());

  // Results: the per-tensor state goes, the per-bucket state comes where it
  // was.
  func::ReturnOp ret = sig->returnOp();
  SmallVector<Value> results;
  SmallVector<Attribute> resultAttrs;
  bool placed = false;
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    auto r = dyn_cast<OpResult>(v);
    if (r && r.getOwner() == multi.getOperation()) {
      if (!placed) {
        for (unsigned group = 0; group < 3; ++group)
          for (unsigned bucket = 0; bucket < k; ++bucket) {
            results.push_back(sharded.getNewState()[n + group * k + bucket]);
            resultAttrs.push_back(argAttrDict(
                ctx, roles[group], "bucket." + std::to_string(bucket)));
          }
        placed = true;
      }
      continue;
    }
    results.push_back(v);
    resultAttrs.push_back(step.getResultAttrDict(i));
  }
  if (!placed) {
    step.emitError("@step returns none of the masters and moments that "
                   "dflash.adamw_multi updates");
    return signalPassFailure();
  }
  b.setInsertionPoint(ret);
  func::ReturnOp::create(b, ret.getLoc(), results);
  ret.erase();
  if (!multi->use_empty()) {
    multi.emitOpError("has a master or moment result that an op other than "
                      "func.return reads");
    return signalPassFailure();
  }
  multi.erase();
  if (failed(step.eraseArguments(erase))) {
    step.emitError("cannot remove the per-tensor optimizer state");
    return signalPassFailure();
  }
  step.setType(FunctionType::get(ctx, step.getArgumentTypes(),
                                 ValueRange(results).getTypes()));
  step.setAllResultAttrs(resultAttrs);
}

} // namespace
