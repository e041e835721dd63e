//===- MemoryPlan.cpp - Sizes, aliases and lifetimes of step values -------===//

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "kernels/Workspaces.h"

#include "dialect/DFlashOps.h"
#include "mlir/IR/Builders.h"

#include <algorithm>
#include <map>
#include <optional>

namespace dflash {
using namespace mlir;
using namespace mlir::dflash;

/// Whether `op` is the last op that reads `v`, and reads it once: a value
/// that an op computed into storage of its own (not an argument or an
/// alias), so that op may write over it.
static bool isLastReadBy(Value v, Operation *op) {
  if (isa<BlockArgument>(v) || storageRoot(v) != v)
    return false;
  unsigned uses = 0;
  for (OpOperand &use : v.getUses()) {
    Operation *user = use.getOwner();
    if (user == op)
      ++uses;
    else if (user->getBlock() != op->getBlock() || !user->isBeforeInBlock(op))
      return false;
  }
  return uses == 1;
}

int64_t tensorBytes(Type type) {
  auto t = cast<RankedTensorType>(type);
  int64_t bits = t.getElementType().getIntOrFloatBitWidth();
  return t.getNumElements() * std::max<int64_t>(1, bits / 8);
}

std::optional<ProgramMemory> ProgramMemory::of(ModuleOp module) {
  auto arena = module->getAttrOfType<IntegerAttr>(kArenaBytesAttrName);
  FailureOr<StepSignature> sig = StepSignature::get(module);
  if (!arena || failed(sig))
    return std::nullopt;
  ProgramMemory m;
  m.arena = arena.getInt();
  m.workspace = int64_t(::dflash::kernels::kGemmWorkspaceBytes);
  func::FuncOp program = sig->func();
  for (unsigned i = 0; i < program.getNumArguments(); ++i) {
    int64_t bytes = tensorBytes(program.getArgument(i).getType());
    m.arguments += bytes;
    switch (sig->argInfo(i).getRole()) {
    case ArgRole::Input:
      m.inputs += bytes;
      break;
    case ArgRole::Frozen:
      m.frozen += bytes;
      break;
    case ArgRole::Master:
    case ArgRole::Moment1:
    case ArgRole::Moment2:
      m.optimizerState += bytes;
      break;
    default:
      break;
    }
  }
  // A target program writes its results into buffers of their own; a
  // step's results are its arguments updated or arena values.
  if (sig->isTarget())
    for (unsigned i = 0; i < program.getNumResults(); ++i)
      (sig->resultInfo(i).getName() == "target_hidden" ? m.features
                                                       : m.outputs) +=
          tensorBytes(program.getResultTypes()[i]);
  return m;
}

/// ProgramMemory's fields by their names in its attribute.
static std::pair<llvm::StringLiteral, int64_t ProgramMemory::*> const
    kMemoryFields[] = {{"arguments", &ProgramMemory::arguments},
                       {"inputs", &ProgramMemory::inputs},
                       {"frozen", &ProgramMemory::frozen},
                       {"optimizer_state", &ProgramMemory::optimizerState},
                       {"features", &ProgramMemory::features},
                       {"outputs", &ProgramMemory::outputs},
                       {"arena", &ProgramMemory::arena},
                       {"workspace", &ProgramMemory::workspace}};

DictionaryAttr ProgramMemory::toAttr(MLIRContext *context) const {
  Builder b(context);
  SmallVector<NamedAttribute> fields;
  for (auto [name, field] : kMemoryFields)
    fields.push_back(b.getNamedAttr(name, b.getI64IntegerAttr(this->*field)));
  return b.getDictionaryAttr(fields);
}

std::optional<ProgramMemory> ProgramMemory::fromAttr(Attribute attr) {
  auto dict = dyn_cast_or_null<DictionaryAttr>(attr);
  if (!dict)
    return std::nullopt;
  ProgramMemory m;
  for (auto [name, field] : kMemoryFields) {
    auto value = dict.getAs<IntegerAttr>(name);
    if (!value)
      return std::nullopt;
    m.*field = value.getInt();
  }
  return m;
}

/// The value `v` is a view of or is written over, one step; `v` itself
/// when it has storage of its own.
static Value storageSource(Value v) {
  auto result = dyn_cast<OpResult>(v);
  if (!result)
    return v;
  Operation *op = result.getOwner();
  if (auto reshape = dyn_cast<ReshapeOp>(op))
    return reshape.getInput();
  if (auto slice = dyn_cast<RowSliceOp>(op))
    return slice.getInput(); // at viewByteOffset
  if (auto reduce = dyn_cast<AllReduceOp>(op))
    return reduce.getInputs()[result.getResultNumber()]; // in place
  if (auto acc = dyn_cast<AccumulateLinearGradOp>(op)) {
    // beta = 1 GEMM into the accumulator, when nothing else reads it.
    Value a = acc.getAccumulator();
    return isa<BlockArgument>(a) || !a.hasOneUse() ? v : a;
  }
  if (auto sum = dyn_cast<LinearResidualOp>(op)) {
    // The same into the residual.
    Value r = sum.getResidual();
    return isa<BlockArgument>(r) || !r.hasOneUse() ? v : r;
  }
  if (auto grad = dyn_cast<SwigluGradOp>(op)) {
    // Elementwise, each element read before it is written: the gate's and
    // the up's gradients over the gate and the up, where this op reads
    // them last.
    Value in = result.getResultNumber() == 0 ? grad.getGate() : grad.getUp();
    return !isLastReadBy(in, op) || in.getType() != v.getType() ? v : in;
  }
  if (auto adamw = dyn_cast<AdamWMultiOp>(op)) {
    unsigned i = result.getResultNumber();
    unsigned n = adamw.getNumParams();
    if (i >= 4 * n)
      return v;
    ValueRange groups[] = {adamw.getParams(), adamw.getMasters(),
                           adamw.getMoment1(), adamw.getMoment2()};
    return groups[i / n][i % n];
  }
  if (auto sharded = dyn_cast<AdamWShardedOp>(op)) {
    unsigned i = result.getResultNumber();
    unsigned n = sharded.getNumParams(), k = sharded.getNumBuckets();
    if (i >= n + 3 * k)
      return v;
    if (i < n)
      return sharded.getParams()[i];
    ValueRange groups[] = {sharded.getMasters(), sharded.getMoment1(),
                           sharded.getMoment2()};
    return groups[(i - n) / k][(i - n) % k];
  }
  return v;
}

Value storageRoot(Value v) {
  for (Value source = storageSource(v); source != v; source = storageSource(v))
    v = source;
  return v;
}

int64_t viewByteOffset(Value v) {
  int64_t bytes = 0;
  for (Value source = storageSource(v); source != v;
       source = storageSource(v)) {
    if (auto slice = v.getDefiningOp<RowSliceOp>()) {
      auto rows = cast<RankedTensorType>(source.getType());
      bytes += slice.getOffset() * (tensorBytes(rows) / rows.getDimSize(0));
    }
    v = source; // views and in-place results start where their source does
  }
  return bytes;
}

SmallVector<int64_t> bucketResultOffsets(GradientBucketOp bucket) {
  SmallVector<int64_t> offsets;
  int64_t bytes = 0;
  for (Value r : bucket.getResults()) {
    offsets.push_back(bytes);
    int64_t size = tensorBytes(r.getType());
    bytes += (size + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  }
  return offsets;
}

int64_t bucketFlatElements(GradientBucketOp bucket) {
  Value last = bucket.getResults().back();
  return (bucketResultOffsets(bucket).back() + tensorBytes(last.getType())) / 4;
}

int64_t bucketSlotBytes(GradientBucketOp bucket) {
  int64_t bytes = bucketFlatElements(bucket) * 4;
  if (bucket.getWorldSizeAttr() && bucket.getShardElementsAttr())
    bytes = std::max(bytes, bucket.getWorldSizeAttr().getInt() *
                                bucket.getShardElementsAttr().getInt() * 4);
  return bytes;
}

KernelAttr kernelOf(Operation *op) {
  return op->getAttrOfType<KernelAttr>(kKernelAttrName);
}

namespace {

/// What each arena byte holds: disjoint [start, end) ranges, each with the
/// thing last written there (a value's content, a workspace, tables).
class ArenaContents {
public:
  void write(int64_t start, int64_t end, const void *what) {
    if (start >= end)
      return;
    split(start);
    split(end);
    ranges.erase(ranges.lower_bound(start), ranges.lower_bound(end));
    ranges[start] = {end, what};
  }
  /// The first byte of [start, end) that does not hold `what`, or -1.
  int64_t firstOther(int64_t start, int64_t end, const void *what) const {
    auto it = ranges.upper_bound(start);
    if (it != ranges.begin() && std::prev(it)->second.end > start)
      --it;
    for (int64_t at = start; at < end; ++it) {
      if (it == ranges.end() || it->first > at || it->second.what != what)
        return at; // never written, or written by something else
      at = it->second.end;
    }
    return -1;
  }

private:
  struct Range {
    int64_t end;
    const void *what;
  };
  void split(int64_t at) {
    auto it = ranges.upper_bound(at);
    if (it == ranges.begin())
      return;
    --it;
    if (it->first < at && it->second.end > at) {
      ranges[at] = {it->second.end, it->second.what};
      it->second.end = at;
    }
  }
  std::map<int64_t, Range> ranges;
};

} // namespace

LogicalResult checkPlannedArena(func::FuncOp step) {
  // A value's content: a view's is its source's, every other result's its
  // own.
  llvm::DenseMap<Value, const void *> contentOf;
  auto content = [&](Value v) -> const void * {
    auto it = contentOf.find(v);
    return it == contentOf.end() ? v.getAsOpaquePointer() : it->second;
  };
  // The arena range of an op's result, or none (an argument's buffer or an
  // output buffer).
  auto rangeOf = [](Value v) -> std::optional<std::pair<int64_t, int64_t>> {
    auto result = dyn_cast<OpResult>(v);
    if (!result)
      return std::nullopt;
    auto offsets =
        result.getOwner()->getAttrOfType<DenseI64ArrayAttr>(kOffsetsAttrName);
    if (!offsets || int64_t(result.getResultNumber()) >= offsets.size())
      return std::nullopt;
    int64_t offset = offsets[result.getResultNumber()];
    if (offset < 0)
      return std::nullopt;
    return std::make_pair(offset, offset + tensorBytes(v.getType()));
  };
  auto overlap = [](std::pair<int64_t, int64_t> a,
                    std::pair<int64_t, int64_t> b) {
    return a.first < b.second && b.first < a.second;
  };
  ArenaContents arena;
  Block &body = step.front();
  // Tables are written once, at bind, and read by their op at every step.
  for (Operation &op : body.without_terminator())
    if (auto at = op.getAttrOfType<IntegerAttr>(kTablesOffsetAttrName))
      if (KernelAttr kernel = kernelOf(&op))
        arena.write(at.getInt(), at.getInt() + kernel.getTables(), &op);
  bool ok = true;
  for (Operation &op : body.without_terminator()) {
    SmallVector<std::pair<Value, std::pair<int64_t, int64_t>>> reads;
    SmallVector<Value> operands(op.getOperands());
    // On one GPU the optimizer reads an unsharded bucket's bf16 gradients
    // in place of its fp32 results (the generated step skips the copy).
    for (Value operand : op.getOperands())
      if (auto bucket = operand.getDefiningOp<GradientBucketOp>();
          bucket && !bucket.getShardElementsAttr())
        operands.push_back(
            bucket.getGrads()[cast<OpResult>(operand).getResultNumber()]);
    for (Value operand : operands) {
      auto range = rangeOf(operand);
      if (!range)
        continue;
      reads.push_back({operand, *range});
      int64_t bad =
          arena.firstOther(range->first, range->second, content(operand));
      if (bad >= 0) {
        op.emitOpError() << "reads a value whose arena byte " << bad
                         << " another value was planned over before this "
                            "read (dflash-plan-memory)";
        ok = false;
      }
    }
    if (auto at = op.getAttrOfType<IntegerAttr>(kTablesOffsetAttrName))
      if (KernelAttr kernel = kernelOf(&op);
          kernel &&
          arena.firstOther(at.getInt(), at.getInt() + kernel.getTables(),
                           &op) >= 0) {
        op.emitOpError("reads kernel tables that a value was planned over");
        ok = false;
      }
    if (auto at = op.getAttrOfType<IntegerAttr>(kWorkspaceOffsetAttrName))
      if (KernelAttr kernel = kernelOf(&op)) {
        std::pair<int64_t, int64_t> ws{at.getInt(),
                                       at.getInt() + kernel.getWorkspace()};
        bool clash = false;
        for (auto &read : reads)
          clash |= overlap(ws, read.second);
        for (Value r : op.getResults())
          if (auto range = rangeOf(r))
            clash |= overlap(ws, *range);
        if (clash) {
          op.emitOpError("has a workspace that overlaps its own operands or "
                         "results (dflash-plan-memory)");
          ok = false;
        }
        arena.write(ws.first, ws.second, &op);
      }
    for (Value r : op.getResults()) {
      auto range = rangeOf(r);
      if (!range)
        continue;
      if (isa<ReshapeOp, RowSliceOp>(op)) {
        contentOf[r] = content(op.getOperand(0));
        continue; // a view writes nothing
      }
      for (auto &read : reads)
        if (overlap(*range, read.second) &&
            storageRoot(r) != storageRoot(read.first)) {
          op.emitOpError() << "result " << cast<OpResult>(r).getResultNumber()
                           << " is planned over an operand it is not "
                              "written in place of (dflash-plan-memory)";
          ok = false;
        }
      arena.write(range->first, range->second, content(r));
    }
  }
  return success(ok);
}

} // namespace dflash
