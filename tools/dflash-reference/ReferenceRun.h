//===- ReferenceRun.h - Trains a drafter on the CPU, exactly ----*- C++ -*-===//
//
// The CPU reference run behind `dflash-reference`: compiles a spec to its
// training step, then runs that IR step after step in the reference
// interpreter on the same data, anchors and initial weights the generated
// trainer would use (runtime/data/BatchLoader.h). It is the oracle of the GPU
// trainer, not a fast trainer.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TOOLS_DFLASHREFERENCE_REFERENCERUN_H
#define DFLASH_TOOLS_DFLASHREFERENCE_REFERENCERUN_H

#include "compiler/Interpreter/Interpreter.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <cstdint>
#include <optional>
#include <string>

namespace llvm {
class raw_ostream;
} // namespace llvm

namespace dflash {

/// What to run. The defaults are those of the dflash-reference command line.
struct ReferenceOptions {
  /// The drafter spec (TOML) to compile and train.
  std::string specFile;
  /// Optimizer steps to run; at least 1, or 0 with `initDir` and `evalRows`
  /// (the checkpoint evaluated as it is).
  int64_t steps = 1;
  /// Length of the learning-rate schedule; 0 or less: `steps`.
  int64_t totalSteps = 0;
  /// Hugging Face target directory with the frozen embedding and lm_head.
  /// Empty: the synthetic target (needs `data == "synthetic"`).
  std::string targetDir;
  /// "synthetic", or a directory or file of feature shards.
  std::string data = "synthetic";
  /// Rows of the synthetic data set; at least 1.
  int64_t syntheticRows = 64;
  /// Seed of data order, anchors and initial weights; negative: the spec's
  /// training.seed.
  int64_t seed = -1;
  /// Initial drafter checkpoint (docs/semantics.md section 6); empty:
  /// initialize from the seed.
  std::string initDir;
  /// Arithmetic of the interpreter.
  Precision precision = Precision::Storage;
  /// When set, the first step's inputs, weights, loss and gradients (of the
  /// global mean loss, before clipping) are written to this safetensors file
  /// for the PyTorch oracle.
  std::string dumpStep;
  /// When set, the parameters after the last step are exported as a
  /// checkpoint (docs/semantics.md section 6) into this directory.
  std::string saveDir;
  /// Compute target_hidden on the CPU from the target (`targetDir`, a full
  /// decoder checkpoint, compiled as the spec's @target) for every batch;
  /// `data` may then be token shards (no hidden_states).
  bool onlineTarget = false;
  /// Held-out synthetic rows (past the training set's) to evaluate on after
  /// the last step, as `train --eval-data synthetic --eval-rows` does; 0:
  /// none.
  int64_t evalRows = 0;
  /// Of those, the first rows whose serving-order acceptance the evaluation
  /// also reports (as `train --eval-serving-rows`): negative, the trainer's
  /// default (rt::defaultServingRows); 0, none.
  int64_t evalServingRows = -1;
  /// When set, every walked row's loss_mask, position_ids, candidates, the
  /// run at each and the anchors walked go to this file, a JSON line a row.
  std::string servingDump;
  /// When set, the evaluation takes its anchors from this file instead of
  /// sampling them: lines "ROW A1 A2 ..." (at most anchors_per_row,
  /// ascending), each evaluated on its own (ROW's other lines and the batch's
  /// other rows keep = 0), rows without a line not at all.
  std::string evalAnchors;
  /// The memory the run may use, in GiB: a run estimated to need more is
  /// refused before it loads anything. 0: what the machine has available.
  double memoryGiB = 0;
};

/// What a run needs, estimated from its programs before anything is
/// loaded.
struct RunEstimate {
  double bytes = 0;
  double secondsPerStep = 0;
};

/// The memory and time of running `step` in the reference interpreter,
/// which keeps every op's result, as doubles, to the end of its program;
/// with the first step's gradient program `dump` and the online `target`
/// (null where the run has none), which run one after another beside it.
RunEstimate estimateRun(mlir::func::FuncOp step, mlir::func::FuncOp dump,
                        mlir::func::FuncOp target);

/// The bytes of memory this machine has available now (Linux's
/// MemAvailable, else the free pages), or nothing where it cannot tell.
std::optional<double> availableMemoryBytes();

/// Runs `options`: prints one JSON line per step (step, loss, acc, tau,
/// acc_by_position, grad_norm, lr) to `out`, flushed after each line, and
/// writes the dump and the checkpoint asked for. Errors go to llvm::errs(),
/// where the MLIR context prints its diagnostics too: a spec error as the spec
/// loader words it, every other one as "dflash-reference: error: <message>".
/// Returns the process exit code: 0, or 1 after an error.
int runReference(const ReferenceOptions &options, llvm::raw_ostream &out);

} // namespace dflash

#endif // DFLASH_TOOLS_DFLASHREFERENCE_REFERENCERUN_H
