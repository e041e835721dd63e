//===- PlanMemory.cpp - Static arena offsets from liveness ----------------===//
//
// Every value the step computes lives from its defining op to its last use
// (values returned by @step to the end). Values whose lifetimes do not
// overlap may share bytes. Offsets are chosen greedily, largest value first,
// each at the lowest offset that clashes with no live neighbour: simple,
// deterministic, and close to the peak of live bytes for this kind of
// straight-line program. A target program's results take no arena bytes:
// the op that makes one writes it straight into its output buffer (buffer
// numArgs + k, after the arguments), encoded like an argument's storage.
// A view (reshape, a micro-batch's row slice) uses its source's bytes from
// where it starts; only its offset in the arena is recorded, and a view of
// an argument is the argument's buffer (the emitter adds the rows before).
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"
#include "kernels/Workspaces.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/Format.h"

#include <algorithm>

namespace dflash {
#define GEN_PASS_DEF_PLANMEMORY
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

struct PlanMemoryPass : public ::dflash::impl::PlanMemoryBase<PlanMemoryPass> {
  using PlanMemoryBase::PlanMemoryBase;
  void runOnOperation() override;
};

struct Slot {
  Value root;
  /// Set for an op's workspace or tables instead of a value.
  Operation *scratchOf = nullptr;
  bool tables = false;
  int64_t bytes = 0;
  int64_t def = 0, last = 0;
  int64_t offset = -1;
};

int64_t alignUp(int64_t x) {
  return (x + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

std::string gib(int64_t bytes) {
  std::string s;
  llvm::raw_string_ostream(s)
      << llvm::format("%.2f GiB", double(bytes) / double(1 << 30));
  return s;
}

void PlanMemoryPass::runOnOperation() {
  ModuleOp module = getOperation();
  FailureOr<StepSignature> sig = StepSignature::get(module);
  if (failed(sig))
    return signalPassFailure();
  func::FuncOp step = sig->func();
  Block &body = step.front();

  // Lifetimes of storage roots, in op indices.
  llvm::DenseMap<Operation *, int64_t> index;
  int64_t n = 0;
  for (Operation &op : body)
    index[&op] = n++;
  llvm::DenseMap<Value, unsigned> slotOf;
  // A target program's results: their output buffers, by storage root.
  llvm::DenseMap<Value, int64_t> outputBufferOf;
  if (sig->isTarget()) {
    func::ReturnOp ret = sig->returnOp();
    for (unsigned k = 0; k < ret.getNumOperands(); ++k) {
      Value root = storageRoot(ret.getOperand(k));
      if (!isa<BlockArgument>(root))
        outputBufferOf.try_emplace(root, int64_t(step.getNumArguments() + k));
    }
  }
  // Offsets inside a slot: the results of a gradient bucket share one slot,
  // contiguous, so that one collective covers them.
  llvm::DenseMap<Value, int64_t> offsetInSlot;
  std::vector<Slot> slots;
  for (Operation &op : body.without_terminator()) {
    if (auto bucket = dyn_cast<GradientBucketOp>(op)) {
      Slot s;
      s.root = bucket.getResult(0);
      s.def = s.last = index[&op];
      SmallVector<int64_t> offsets = bucketResultOffsets(bucket);
      for (auto [r, offset] : llvm::zip(bucket.getResults(), offsets)) {
        slotOf[r] = slots.size();
        offsetInSlot[r] = offset;
      }
      s.bytes = alignUp(bucketSlotBytes(bucket));
      slots.push_back(s);
      continue;
    }
    for (Value r : op.getResults()) {
      Value root = storageRoot(r);
      if (isa<BlockArgument>(root) || slotOf.count(root) ||
          outputBufferOf.count(root))
        continue;
      slotOf[root] = slots.size();
      Slot s;
      s.root = root;
      s.bytes = alignUp(tensorBytes(root.getType()));
      s.def = s.last = index[root.getDefiningOp()];
      slots.push_back(s);
    }
  }
  for (Operation &op : body)
    for (Value operand : op.getOperands()) {
      auto it = slotOf.find(storageRoot(operand));
      if (it != slotOf.end())
        slots[it->second].last = std::max(slots[it->second].last, index[&op]);
    }

  // Kernel scratch (dflash-select-kernels): a workspace lives while its op
  // runs, tables for the whole step (they are written once, at bind).
  for (Operation &op : body.without_terminator()) {
    KernelAttr kernel = kernelOf(&op);
    if (!kernel)
      continue;
    if (kernel.getWorkspace() > 0) {
      Slot s;
      s.scratchOf = &op;
      s.bytes = alignUp(kernel.getWorkspace());
      s.def = s.last = index[&op];
      slots.push_back(s);
    }
    if (kernel.getTables() > 0) {
      Slot s;
      s.scratchOf = &op;
      s.tables = true;
      s.bytes = alignUp(kernel.getTables());
      s.def = 0;
      s.last = n;
      slots.push_back(s);
    }
  }

  // On one GPU the optimizer reads a bucket's bf16 gradients, not its fp32
  // copies (the generated step skips the conversion): they live until the
  // bucket's results are last read. Sharded buckets are always converted.
  for (Operation &op : body.without_terminator())
    if (auto bucket = dyn_cast<GradientBucketOp>(op);
        bucket && !bucket.getShardElementsAttr()) {
      int64_t last = index[&op];
      for (Value r : bucket.getResults())
        for (Operation *user : r.getUsers())
          last = std::max(last, index[user]);
      for (Value g : bucket.getGrads()) {
        auto it = slotOf.find(storageRoot(g));
        if (it != slotOf.end())
          slots[it->second].last = std::max(slots[it->second].last, last);
      }
    }

  // Largest first, lowest free offset.
  std::vector<unsigned> order(slots.size());
  for (unsigned i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](unsigned a, unsigned b) {
    return slots[a].bytes > slots[b].bytes;
  });
  std::vector<unsigned> placed;
  int64_t arena = 0;
  for (unsigned i : order) {
    Slot &s = slots[i];
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (unsigned j : placed) {
      const Slot &o = slots[j];
      if (o.def <= s.last && s.def <= o.last)
        busy.push_back({o.offset, o.offset + o.bytes});
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (auto [lo, hi] : busy) {
      if (offset + s.bytes <= lo)
        break;
      offset = std::max(offset, hi);
    }
    s.offset = offset;
    arena = std::max(arena, offset + s.bytes);
    placed.push_back(i);
  }

  OpBuilder b(module.getContext());
  for (Operation &op : body.without_terminator()) {
    SmallVector<int64_t> offsets;
    for (Value r : op.getResults()) {
      Value root = storageRoot(r);
      if (auto arg = dyn_cast<BlockArgument>(root))
        offsets.push_back(-int64_t(arg.getArgNumber()) - 1);
      else if (auto out = outputBufferOf.find(root);
               out != outputBufferOf.end())
        offsets.push_back(-out->second - 1);
      else
        offsets.push_back(slots[slotOf[root]].offset +
                          offsetInSlot.lookup(root) + viewByteOffset(r));
    }
    op.setAttr(kOffsetsAttrName, b.getDenseI64ArrayAttr(offsets));
  }
  for (const Slot &s : slots)
    if (s.scratchOf)
      s.scratchOf->setAttr(s.tables ? kTablesOffsetAttrName
                                    : kWorkspaceOffsetAttrName,
                           b.getI64IntegerAttr(s.offset));
  module->setAttr(kArenaBytesAttrName, b.getI64IntegerAttr(arena));

  // The budget: arguments (parameters, optimizer state, inputs, frozen
  // weights), the arena (kernel scratch included) and cuBLASLt's workspace.
  // An evaluation program shares the step's buffers and runs only when
  // asked for: the trainer reports its arena with the step's.
  if (sig->isEval())
    return;
  double budget = budgetGiB;
  if (budget <= 0)
    if (auto attr = module->getAttrOfType<FloatAttr>(kBudgetAttrName))
      budget = attr.getValueAsDouble();
  if (budget <= 0)
    return;
  const ProgramMemory memory = *ProgramMemory::of(module);
  const int64_t inputBytes = memory.inputs, workspace = memory.workspace;
  int64_t total = memory.total();
  int64_t limit = int64_t(budget * double(int64_t(1) << 30));
  if (total <= limit)
    return;
  // Inputs, activations and workspaces grow with the rows per GPU; the
  // parameters, optimizer state and frozen weights do not.
  std::optional<unsigned> ids = sig->findArg(ArgRole::Input, "input_ids");
  int64_t rows = ids ? cast<RankedTensorType>(step.getArgument(*ids).getType())
                           .getDimSize(0)
                     : 1;
  int64_t perRow = (inputBytes + arena) / std::max<int64_t>(1, rows);
  int64_t fixed = memory.fixed() + workspace;
  int64_t fit = perRow > 0 ? (limit - fixed) / perRow : 0;
  InFlightDiagnostic diag = step.emitError()
                            << "the step needs " << gib(total)
                            << " per GPU (parameters, optimizer state and "
                               "frozen weights "
                            << gib(fixed) << ", inputs " << gib(inputBytes)
                            << ", activations " << gib(arena)
                            << ", GEMM workspace " << gib(workspace)
                            << ") but the memory budget is " << gib(limit);
  if (fit >= 1)
    diag.attachNote() << "rows_per_gpu = " << fit << " would fit (now " << rows
                      << ")";
  else
    diag.attachNote() << "not even one row fits: the parameters and optimizer "
                         "state alone need "
                      << gib(fixed)
                      << "; shard it over the GPUs ([parallel] "
                         "shard_optimizer_state) or raise the budget";
  signalPassFailure();
}

} // namespace
