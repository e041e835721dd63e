//===- Driver.cpp - The dflashc compiler driver ---------------------------===//
//
// spec -> (--emit=spec) canonical TOML
//      -> (--emit=graph) forward graph in the dflash dialect
//      -> (--emit=train) the whole training step at graph level
//
//===----------------------------------------------------------------------===//

#include "compiler/Driver/Driver.h"

#include "compiler/Driver/Summary.h"
#include "compiler/Import/ImportSpec.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Spec/Spec.h"
#include "dialect/DFlashOps.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

using namespace ::dflash;
namespace cl = llvm::cl;

namespace {

enum class EmitStage { Spec, Graph, Train };

cl::OptionCategory category("dflashc options");

cl::opt<std::string> inputFile(cl::Positional, cl::desc("<spec.toml>"),
                               cl::Required, cl::cat(category));

cl::opt<EmitStage> emitStage(
    "emit", cl::desc("Stage to stop at and print"), cl::init(EmitStage::Graph),
    cl::values(
        clEnumValN(EmitStage::Spec, "spec",
                   "the spec with every default resolved, as TOML"),
        clEnumValN(EmitStage::Graph, "graph",
                   "the forward graph in the dflash dialect"),
        clEnumValN(EmitStage::Train, "train",
                   "the whole step: forward, backward and optimizer")),
    cl::cat(category));

cl::opt<std::string> outputFile("o", cl::desc("Output file (default: stdout)"),
                                cl::value_desc("file"), cl::init("-"),
                                cl::cat(category));

cl::opt<bool> printSummary(
    "summary",
    cl::desc("Print a one-screen summary (shapes, windows per layer, "
             "parameters, FLOPs per step) to stderr"),
    cl::init(false), cl::cat(category));

int fail(const llvm::Twine &msg) {
  llvm::WithColor::error(llvm::errs(), "dflashc") << msg << "\n";
  return 1;
}

} // namespace

int dflash::runCompilerDriver(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  mlir::registerAsmPrinterCLOptions();
  mlir::registerMLIRContextCLOptions();
  mlir::registerPassManagerCLOptions();
  cl::HideUnrelatedOptions({&category, &cl::getGeneralCategory()});
  cl::ParseCommandLineOptions(
      argc, argv,
      "dflashc: ahead-of-time compiler for DFlash drafter training\n\n"
      "Reads a drafter spec (TOML, see docs/spec.md) and lowers its training "
      "step\nthrough the dflash dialect.\n\n"
      "  dflashc specs/tiny.toml --emit=spec     canonical spec\n"
      "  dflashc specs/tiny.toml --emit=graph    forward graph (default)\n"
      "  dflashc specs/tiny.toml --emit=train    forward, backward, optimizer\n");

  SpecError specError;
  std::optional<DrafterSpec> spec = loadSpec(inputFile, specError);
  if (!spec) {
    llvm::errs() << specError.str() << "\n";
    return 1;
  }

  std::string errorMessage;
  std::unique_ptr<llvm::ToolOutputFile> output =
      mlir::openOutputFile(outputFile, &errorMessage);
  if (!output)
    return fail("cannot open output file '" + outputFile +
                "': " + errorMessage);

  if (emitStage == EmitStage::Spec) {
    output->os() << printCanonicalSpec(*spec);
    output->keep();
    return 0;
  }

  mlir::MLIRContext context;
  // Diagnostics point into the spec file: "specs/x.toml:14:3: error: ...".
  llvm::SourceMgr sourceMgr;
  if (auto buffer = llvm::MemoryBuffer::getFile(inputFile))
    sourceMgr.AddNewSourceBuffer(std::move(*buffer), llvm::SMLoc());
  mlir::SourceMgrDiagnosticHandler diagHandler(sourceMgr, &context);

  mlir::OwningOpRef<mlir::ModuleOp> module = importSpec(context, *spec);
  if (!module)
    return fail("the graph built from '" + inputFile + "' does not verify");

  auto compileTrainStep = [&](mlir::ModuleOp m) {
    mlir::PassManager pm(&context);
    if (failed(mlir::applyPassManagerCLOptions(pm)))
      return false;
    buildTrainStepPipeline(pm);
    return succeeded(pm.run(m));
  };
  if (emitStage >= EmitStage::Train && !compileTrainStep(*module))
    return fail("compiling the training step of '" + inputFile + "' failed");

  module->print(output->os());
  output->os() << "\n";
  output->keep();
  if (printSummary) {
    // The summary counts the whole step's FLOPs, whatever stage is printed.
    mlir::OwningOpRef<mlir::ModuleOp> whole = module->clone();
    if (emitStage < EmitStage::Train && !compileTrainStep(*whole))
      return fail("compiling the training step of '" + inputFile + "' failed");
    printStepSummary(llvm::errs(), *spec, *whole);
  }
  return 0;
}
