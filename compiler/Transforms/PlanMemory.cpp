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
#include "compiler/Analysis/ModelConfigAttr.h"
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

/// In GiB, or in MiB or KiB below: a part's size, however small.
std::string size(int64_t bytes) {
  if (bytes >= (int64_t(1) << 30))
    return gib(bytes);
  std::string s;
  bool mib = bytes >= (1 << 20);
  llvm::raw_string_ostream(s)
      << llvm::format(mib ? "%.2f MiB" : "%.2f KiB",
                      double(bytes) / double(mib ? 1 << 20 : 1 << 10));
  return s;
}

/// One part of what a GPU holds, named as the budget's messages name it:
/// "the online target's " and "frozen weights".
struct Part {
  std::string owner;
  std::string name;
  int64_t bytes;
};

/// What one GPU holds under the budget: its parts, and how many of their
/// bytes grow with the rows of a micro-batch (inputs, features and
/// activations; the weights, the optimizer state and the workspace do not).
struct GpuLoad {
  SmallVector<Part> parts;
  int64_t rowBytes = 0;
  int64_t total() const {
    int64_t sum = 0;
    for (const Part &p : parts)
      sum += p.bytes;
    return sum;
  }
  std::string list() const {
    std::string s;
    for (const Part &p : parts)
      if (p.bytes > 0)
        s += (s.empty() ? "" : ", ") + p.name + " " + size(p.bytes);
    return s;
  }
};

GpuLoad stepLoad(const ProgramMemory &m) {
  GpuLoad load;
  load.parts = {{"", "parameters and optimizer state", m.fixed() - m.frozen},
                {"", "frozen weights", m.frozen},
                {"", "inputs", m.inputs},
                {"", "activations", m.arena},
                {"", "GEMM workspace", m.workspace}};
  load.rowBytes = m.inputs + m.arena;
  return load;
}

/// The online target's parts; without its features where the step's
/// inputs hold them (the target writes them there).
GpuLoad targetLoad(const ProgramMemory &m, bool withFeatures) {
  GpuLoad load;
  const std::string owner = "the online target's ";
  load.parts = {{owner, "frozen weights", m.fixed()},
                {owner, "inputs", m.inputs},
                {owner, "features", withFeatures ? m.features : 0},
                {owner, "other results", m.outputs},
                {owner, "activations", m.arena},
                {owner, "GEMM workspace", m.workspace}};
  load.rowBytes = m.inputs + load.parts[2].bytes + m.outputs + m.arena;
  return load;
}

/// The notes of a load over the budget: its largest part, then what would
/// need less, cheapest first (docs/spec.md, [memory]): fewer rows, the
/// recomputed activations and MLP products, fewer anchors, the sharded
/// optimizer state and the target on GPUs of its own; levers already on
/// are left out.
void attachLevers(InFlightDiagnostic &diag, ModuleOp module,
                  const GpuLoad &load, int64_t limit, int64_t rows,
                  bool stepOnGpu, std::optional<int64_t> sharedTargetBytes,
                  int64_t optimizerState) {
  const Part *largest = &load.parts.front();
  for (const Part &p : load.parts)
    if (p.bytes > largest->bytes)
      largest = &p;
  diag.attachNote() << "the largest part: " << largest->owner << largest->name
                    << ", " << size(largest->bytes)
                    << "; what needs less, cheapest first:";
  // Everything that grows with the rows grows with rows_per_gpu, the rows
  // of one micro-batch (the gradient accumulation kept).
  int64_t perRow = load.rowBytes / std::max<int64_t>(1, rows);
  int64_t base = load.total() - perRow * rows;
  int64_t fit = perRow > 0 ? (limit - base) / perRow : 0;
  if (fit >= 1)
    diag.attachNote() << "rows_per_gpu = " << fit << " would fit (now " << rows
                      << ")";
  else
    diag.attachNote() << "fewer rows_per_gpu: not even 1 fits (about "
                      << size(base + perRow) << " with one row; now " << rows
                      << ")";
  if (stepOnGpu) {
    if (!module->hasAttr(kRecomputeActivationsAttrName))
      diag.attachNote() << "[memory] recompute_activations = true: the "
                           "norms, q/k norm + RoPE and SwiGLU computed again "
                           "in the backward pass instead of kept";
    if (!module->hasAttr(kRecomputeMlpProductsAttrName))
      diag.attachNote() << "[memory] recompute_mlp_products = true: the "
                           "MLP's gate and up products too (two more GEMMs a "
                           "layer)";
    auto config = module->getAttrOfType<DictionaryAttr>(kModelConfigAttrName);
    auto anchors =
        config ? config.getAs<IntegerAttr>("anchors_per_row") : IntegerAttr();
    Diagnostic &note = diag.attachNote();
    note << "fewer [training] anchors_per_row";
    if (anchors)
      note << " (now " << anchors.getInt() << ")";
    note << ": the draft slots' activations grow with them";
    if (!module->hasAttr(kShardOptimizerStateAttrName) && optimizerState > 0)
      diag.attachNote() << "[parallel] shard_optimizer_state = true: each of "
                           "the gpus_per_node x nodes GPUs keeps 1/N of the "
                        << size(optimizerState)
                        << " of fp32 masters and moments";
  }
  if (sharedTargetBytes)
    diag.attachNote() << "train --target-gpus: the online target ("
                      << size(*sharedTargetBytes)
                      << ") on GPUs of its own; compile with dflashc "
                         "--target-gpus to hold the step and the target to "
                         "the budget apart";
}

/// Holds a planned step, and the online target beside it where the module
/// has its needs, to `budget` GiB per GPU: the two together on one GPU, or
/// each alone where the target has GPUs of its own. Fails with an error
/// naming the sizes and notes naming the largest part and the levers.
LogicalResult checkBudget(ModuleOp module, func::FuncOp step, double budget) {
  const ProgramMemory memory = *ProgramMemory::of(module);
  const int64_t limit = int64_t(budget * double(int64_t(1) << 30));
  std::optional<ProgramMemory> target =
      ProgramMemory::fromAttr(module->getAttr(kOnlineTargetMemoryAttrName));
  const bool apart = module->hasAttr(kOnlineTargetApartAttrName);
  // The rows of one micro-batch: the spec's, or the step's when it has no
  // config (a test's module).
  int64_t rows = 1;
  if (auto config = module->getAttrOfType<DictionaryAttr>(kModelConfigAttrName);
      config && config.getAs<IntegerAttr>("rows_per_gpu"))
    rows = config.getAs<IntegerAttr>("rows_per_gpu").getInt();
  else if (FailureOr<StepSignature> sig = StepSignature::get(module);
           succeeded(sig))
    if (std::optional<unsigned> ids = sig->findArg(ArgRole::Input, "input_ids"))
      rows = cast<RankedTensorType>(step.getArgument(*ids).getType())
                 .getDimSize(0);

  bool ok = true;
  GpuLoad alone = stepLoad(memory);
  if (target && !apart) {
    GpuLoad both = alone;
    GpuLoad t = targetLoad(*target, /*withFeatures=*/false);
    both.parts.append(t.parts.begin(), t.parts.end());
    both.rowBytes += t.rowBytes;
    if (both.total() <= limit)
      return success();
    InFlightDiagnostic diag =
        step.emitError() << "the step (" << size(alone.total())
                         << ") and the online target (" << size(t.total())
                         << " besides the features it writes into the step's "
                            "inputs) on one GPU need "
                         << size(both.total()) << " but the memory budget is "
                         << gib(limit);
    diag.attachNote() << "the step: " << alone.list();
    diag.attachNote() << "the online target: " << t.list();
    attachLevers(diag, module, both, limit, rows, /*stepOnGpu=*/true, t.total(),
                 memory.optimizerState);
    return failure();
  }
  if (alone.total() > limit) {
    InFlightDiagnostic diag = step.emitError()
                              << "the step needs " << size(alone.total())
                              << " per GPU (" << alone.list()
                              << ") but the memory budget is " << gib(limit);
    attachLevers(diag, module, alone, limit, rows, /*stepOnGpu=*/true,
                 std::nullopt, memory.optimizerState);
    ok = false;
  }
  if (target) {
    GpuLoad t = targetLoad(*target, /*withFeatures=*/true);
    if (t.total() > limit) {
      InFlightDiagnostic diag = step.emitError()
                                << "the online target needs " << size(t.total())
                                << " on a GPU of its own (" << t.list()
                                << ") but the memory budget is " << gib(limit);
      attachLevers(diag, module, t, limit, rows, /*stepOnGpu=*/false,
                   std::nullopt, 0);
      ok = false;
    }
  }
  return success(ok);
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
  // weights), the arena (kernel scratch included) and cuBLASLt's workspace,
  // and the online target's beside them. An evaluation program shares the
  // step's buffers and runs only when asked for: the trainer reports its
  // arena with the step's.
  if (sig->isEval())
    return;
  double budget = budgetGiB;
  if (budget <= 0)
    if (auto attr = module->getAttrOfType<FloatAttr>(kBudgetAttrName))
      budget = attr.getValueAsDouble();
  if (budget > 0 && failed(checkBudget(module, step, budget)))
    signalPassFailure();
}

} // namespace
