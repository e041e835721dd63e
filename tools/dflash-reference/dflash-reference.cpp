//===- dflash-reference.cpp - Trains a drafter on the CPU, exactly --------===//
//
// The command line of the CPU reference run (ReferenceRun.h beside it):
// compiles a spec to its training step and runs it step after step in the
// reference interpreter. Prints one JSON line per step. It is the oracle of the
// GPU trainer, not a fast trainer.
//
//===----------------------------------------------------------------------===//

#include "tools/dflash-reference/ReferenceRun.h"

#include "compiler/Support/OutOfMemory.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

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
cl::opt<int64_t> evalRows(
    "eval-rows",
    cl::desc("After the last step, evaluate on this many held-out synthetic "
             "rows (past --rows) and print the line train --eval-data "
             "synthetic logs (0: none)"),
    cl::init(0), cl::cat(category));
cl::opt<int64_t> evalServingRows(
    "eval-serving-rows",
    cl::desc("Of the held-out rows, the first this many are also walked in "
             "serving order: the line's eval_serving_tau (default: as train, "
             "the rows of 131072 tokens; 0: none)"),
    cl::init(-1), cl::cat(category));
cl::opt<std::string> servingDump(
    "eval-serving-dump",
    cl::desc("Write each walked row's loss_mask, position_ids, anchor "
             "candidates and the run at each to this file, a JSON line a row"),
    cl::value_desc("file"), cl::cat(category));
cl::opt<std::string> evalAnchors(
    "eval-anchors",
    cl::desc("Evaluate at the anchors of this file instead of sampled ones: "
             "lines 'ROW A1 A2 ...' (at most anchors_per_row, ascending), "
             "each evaluated on its own; rows without a line are left out"),
    cl::value_desc("file"), cl::cat(category));
cl::opt<int64_t>
    syntheticRows("rows",
                  cl::desc("Rows of the synthetic data set (default 64)"),
                  cl::init(64), cl::cat(category));
cl::opt<int64_t>
    seedOption("seed",
               cl::desc("Seed of data order, anchors and initial weights "
                        "(default: the spec's training.seed)"),
               cl::init(-1), cl::cat(category));
cl::opt<std::string>
    initDir("init",
            cl::desc("Initial drafter checkpoint (docs/semantics.md "
                     "section 6)"),
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

cl::opt<bool> onlineTarget(
    "online-target",
    cl::desc("Compute each batch's target features from --target (a full "
             "Qwen3 or Llama-3 checkpoint, compiled as the spec's @target) "
             "instead of reading them; --data may then be token shards"),
    cl::init(false), cl::cat(category));

cl::opt<double> memoryGiB(
    "memory-gib",
    cl::desc("The memory the run may use, in GiB: a run whose estimate "
             "(printed either way) is more is refused before it loads "
             "anything (default: what this machine has available now)"),
    cl::value_desc("GiB"), cl::init(0), cl::cat(category));

cl::opt<std::string> saveDir(
    "save",
    cl::desc("Export the parameters after the last step as a checkpoint "
             "(docs/semantics.md section 6) into this directory"),
    cl::value_desc("dir"), cl::cat(category));

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  installOutOfMemoryHandler(
      "dflash-reference",
      "this run needs more memory than this machine has (its estimate is "
      "above); a smaller spec (rows_per_gpu, seq_len, anchors_per_row) needs "
      "less");
  // libLLVM registers hundreds of backend options; show only ours.
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "dflash-reference: runs a drafter's compiled training step on the CPU\n\n"
      "Prints one JSON line per step: step, loss, acc, tau, acc_by_position "
      "(block\npositions 1, 2, ...), tau_by_bucket, acc_by_bucket and "
      "blocks_by_bucket (per\nanchor-position bucket, with more than one), "
      "grad_norm, lr.\n");
  ReferenceOptions options;
  options.specFile = specFile;
  options.steps = numSteps;
  options.totalSteps = totalSteps;
  options.targetDir = targetDir;
  options.data = dataSource;
  options.syntheticRows = syntheticRows;
  options.evalRows = evalRows;
  options.evalServingRows = evalServingRows;
  options.servingDump = servingDump;
  options.evalAnchors = evalAnchors;
  options.seed = seedOption;
  options.initDir = initDir;
  options.precision = precision;
  options.dumpStep = dumpStep;
  options.saveDir = saveDir;
  options.onlineTarget = onlineTarget;
  options.memoryGiB = memoryGiB;
  return runReference(options, llvm::outs());
}
