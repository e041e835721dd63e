//===- Driver.cpp - The dflashc compiler driver ---------------------------===//
//
// spec -> (--emit=spec) canonical TOML
//      -> (--emit=graph) forward graph in the dflash dialect
//      -> (--emit=train) the whole training step at graph level
//      -> (--emit=fused) grouped into kernels
//      -> (--emit=planned) with a static memory plan
//      -> (--emit=cuda) a trainer directory (step.cu, kernels.cu, ...)
//      -> (default) that directory built into DIR/train with nvcc
//
//===----------------------------------------------------------------------===//

#include "compiler/Driver/Driver.h"

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Driver/Summary.h"
#include "compiler/Import/ImportSpec.h"
#include "compiler/Import/ImportTarget.h"
#include "compiler/Import/TargetConfig.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Spec/Spec.h"
#include "compiler/Support/OutOfMemory.h"
#include "compiler/Target/Cuda/TranslateToCuda.h"
#include "compiler/Transforms/Passes.h"
#include "dialect/DFlashOps.h"
#include "schema/KernelEntryPoints.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

using namespace ::dflash;
namespace cl = llvm::cl;

namespace {

enum class EmitStage { Spec, Graph, Train, Fused, Planned, Cuda, Trainer };
enum class Program { Step, Eval, Target };

cl::OptionCategory category("dflashc options");

cl::opt<std::string> inputFile(cl::Positional, cl::desc("<spec.toml>"),
                               cl::Required, cl::cat(category));

cl::opt<EmitStage> emitStage(
    "emit", cl::desc("Stage to stop at (default: build the trainer)"),
    cl::init(EmitStage::Trainer),
    cl::values(clEnumValN(EmitStage::Spec, "spec",
                          "the spec with every default resolved, as TOML"),
               clEnumValN(EmitStage::Graph, "graph",
                          "the forward graph in the dflash dialect"),
               clEnumValN(EmitStage::Train, "train",
                          "the whole step: forward, backward and optimizer"),
               clEnumValN(EmitStage::Fused, "fused",
                          "the step grouped into kernels"),
               clEnumValN(EmitStage::Planned, "planned",
                          "the kernels with their static memory plan"),
               clEnumValN(EmitStage::Cuda, "cuda",
                          "write the trainer's sources to the -o directory"),
               clEnumValN(EmitStage::Trainer, "trainer",
                          "write the sources and build DIR/train with nvcc "
                          "(default)")),
    cl::cat(category));

cl::opt<Program> program(
    "program", cl::desc("Which program an IR stage prints (default: the step)"),
    cl::init(Program::Step),
    cl::values(clEnumValN(Program::Step, "step", "the training step"),
               clEnumValN(Program::Eval, "eval",
                          "the evaluation program of train --eval-data: the "
                          "forward alone, its sums all-reduced (the same at "
                          "graph and train)"),
               clEnumValN(Program::Target, "target",
                          "the online target's forward up to its last "
                          "tapped layer (needs --target or [target] path; "
                          "graph, fused or planned)")),
    cl::cat(category));

cl::opt<std::string> outputFile(
    "o",
    cl::desc("Output: a file for IR stages (default: stdout), a directory "
             "for --emit=cuda and the trainer (default: dflash-<spec name>)"),
    cl::value_desc("path"), cl::cat(category));

cl::opt<std::string> targetDir(
    "target",
    cl::desc("The target model's Hugging Face directory (config.json): "
             "checked against the spec and compiled as the online target "
             "(default: the spec's [target] path)"),
    cl::value_desc("dir"), cl::cat(category));

cl::opt<double> gpuMemoryGiB(
    "gpu-memory",
    cl::desc("GPU memory budget in GiB that the step, and the online target "
             "beside it, must fit (default: the spec's [memory] "
             "gpu_memory_gib, else none)"),
    cl::value_desc("GiB"), cl::init(0), cl::cat(category));

cl::opt<bool> targetGpus(
    "target-gpus",
    cl::desc("The trainer will run the online target on GPUs of its own "
             "(train --target-gpus): the memory budget then holds for the "
             "step and for the target each alone, not for both on one GPU"),
    cl::init(false), cl::cat(category));

cl::opt<std::string> sourceDir(
    "source-dir",
    cl::desc("dflashc source tree whose runtime/ and kernels/ the trainer "
             "is built from (default: the tree dflashc was built from)"),
    cl::value_desc("dir"), cl::init(DFLASH_SOURCE_DIR), cl::cat(category));

cl::opt<bool> allowUnvalidatedKernels(
    "allow-unvalidated-kernels",
    cl::desc(
        "Pick, and write a trainer that runs, kernels not yet "
        "validated by their GPU test on a GPU (schema/KernelEntryPoints.h, "
        "kUnvalidatedKernels): for running those tests and checks on "
        "the GPU machine, not for training"),
    cl::init(false), cl::cat(category));

cl::list<std::string> allowUnvalidatedKernel(
    "allow-unvalidated-kernel",
    cl::desc("Like --allow-unvalidated-kernels for the kernel named only "
             "(repeatable): a trainer that times one kernel awaiting its GPU "
             "test against the step it would replace"),
    cl::value_desc("name"), cl::cat(category));

cl::opt<bool> printSummary(
    "summary",
    cl::desc("Print a one-screen summary (shapes, windows per layer, "
             "parameters, FLOPs per step; once planned, the memory per GPU "
             "of the step and of the online target beside it) to stderr"),
    cl::init(false), cl::cat(category));

int fail(const llvm::Twine &msg) {
  llvm::WithColor::error(llvm::errs(), "dflashc") << msg << "\n";
  return 1;
}

/// The GPU test that has yet to pass for the kernel `op` runs, if any.
std::optional<std::string_view> pendingGpuTest(mlir::Operation *op) {
  auto kernel = op->getAttrOfType<mlir::dflash::KernelAttr>(kKernelAttrName);
  if (!kernel)
    return std::nullopt;
  std::string_view test = ::dflash::pendingGpuTest(
      std::string_view(kernel.getName().data(), kernel.getName().size()));
  return test.empty() ? std::nullopt : std::optional<std::string_view>(test);
}

/// Refuses, op by op, kernels whose GPU tests have not passed on a GPU and
/// that `allowed` does not let run: one error per kernel, at the first op
/// that runs it.
bool refuseUnvalidatedKernels(llvm::ArrayRef<mlir::ModuleOp> programs,
                              const UnvalidatedKernelAllowance &allowed) {
  llvm::StringSet<> named;
  for (mlir::ModuleOp program : programs) {
    if (!program)
      continue;
    program.walk([&](mlir::Operation *op) {
      std::optional<std::string_view> test = pendingGpuTest(op);
      if (!test)
        return;
      auto kernel =
          op->getAttrOfType<mlir::dflash::KernelAttr>(kKernelAttrName);
      if (allowed.allows(std::string_view(kernel.getName().data(),
                                          kernel.getName().size())) ||
          !named.insert(kernel.getName().str()).second)
        return;
      op->emitError() << "runs " << kernel.getName()
                      << ", which has not passed its GPU test ("
                      << std::string(*test)
                      << ") on a GPU yet: dflashc writes no trainer with "
                         "it (--allow-unvalidated-kernels builds one for "
                         "that test)";
    });
  }
  return !named.empty();
}

} // namespace

int dflash::runCompilerDriver(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  installOutOfMemoryHandler("dflashc", "compiling this spec needs more memory "
                                       "than this machine has");
  mlir::registerAsmPrinterCLOptions();
  mlir::registerMLIRContextCLOptions();
  mlir::registerPassManagerCLOptions();
  // libLLVM registers hundreds of backend options; show only ours.
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "dflashc: ahead-of-time compiler for DFlash drafter training\n\n"
      "Reads a drafter spec (TOML, see docs/spec.md) and lowers its training "
      "step\nthrough the dflash dialect.\n\n"
      "  dflashc specs/tiny.toml --emit=spec     canonical spec\n"
      "  dflashc specs/tiny.toml --emit=graph    forward graph\n"
      "  dflashc specs/tiny.toml --emit=train    forward, backward, optimizer\n"
      "  dflashc specs/tiny.toml --emit=planned  kernels and memory plan\n"
      "  dflashc specs/tiny.toml --emit=planned --program=eval\n"
      "                                          the evaluation program's\n"
      "  dflashc specs/tiny.toml -o out/tiny     build out/tiny/train "
      "(default)\n\n"
      "MLIR's printing options (--mlir-print-debuginfo, ...) also apply; "
      "--help-hidden lists them.\n");

  SpecError specError;
  std::optional<DrafterSpec> spec = loadSpec(inputFile, specError);
  if (!spec) {
    llvm::errs() << specError.str() << "\n";
    return 1;
  }
  for (const SpecError &warning : spec->warnings)
    llvm::errs() << warning.str() << "\n";
  // 0 is the option's default (no budget given); inf and nan parse as
  // doubles, and a budget past every GPU would accept any step.
  if (gpuMemoryGiB.getNumOccurrences() &&
      !(gpuMemoryGiB > 0 && gpuMemoryGiB <= kMaxGpuMemoryGiB)) {
    std::string msg;
    llvm::raw_string_ostream(msg)
        << "--gpu-memory is " << llvm::format("%g", gpuMemoryGiB.getValue())
        << "; it must be a number of GiB above 0 and at most "
        << llvm::format("%g", kMaxGpuMemoryGiB)
        << " (no GPU has more): 80 for an 80 GB card";
    return fail(msg);
  }

  UnvalidatedKernelAllowance allowed;
  allowed.all = allowUnvalidatedKernels;
  for (const std::string &name : allowUnvalidatedKernel) {
    if (::dflash::pendingGpuTest(name).empty()) {
      std::string awaiting;
      for (const UnvalidatedKernel &k : kUnvalidatedKernels)
        awaiting += (awaiting.empty() ? "" : ", ") + std::string(k.name);
      return fail("--allow-unvalidated-kernel=" + name +
                  ": no kernel of that name awaits its GPU test; those that "
                  "do: " +
                  (awaiting.empty() ? std::string("none") : awaiting));
    }
    allowed.names.push_back(name);
  }

  // The online target: its config.json against the spec, before anything
  // is written.
  std::optional<TargetModelConfig> target;
  if (std::string dir = targetDirectory(*spec, targetDir); !dir.empty()) {
    std::string error;
    target = readTargetConfig(dir, error);
    if (!target || !checkTargetAgainstSpec(*target, *spec, error))
      return fail(error);
  }
  if (program == Program::Target && !target)
    return fail("--program=target needs the target model: --target DIR or "
                "[target] path in '" +
                inputFile + "'");
  if (targetGpus && !target)
    return fail("--target-gpus budgets the online target apart from the "
                "step: it needs the target model, --target DIR or [target] "
                "path in '" +
                inputFile + "'");
  if (program == Program::Target && emitStage == EmitStage::Train)
    return fail("--program=target has no training step (the target is "
                "frozen): print it with --emit=graph, fused or planned");

  bool directoryOutput = emitStage >= EmitStage::Cuda;
  std::string outputPath = outputFile;
  if (outputPath.empty())
    outputPath = directoryOutput ? "dflash-" + spec->name : "-";
  std::unique_ptr<llvm::ToolOutputFile> output;
  if (!directoryOutput) {
    std::string errorMessage;
    output = mlir::openOutputFile(outputPath, &errorMessage);
    if (!output)
      return fail("cannot open output file '" + outputPath +
                  "': " + errorMessage);
  }

  if (emitStage == EmitStage::Spec) {
    output->os() << printCanonicalSpec(*spec);
    output->keep();
    return 0;
  }

  mlir::MLIRContext context;
  // Errors name a spec line; the op behind them is for compiler developers,
  // who ask for it with --mlir-print-op-on-diagnostic.
  auto &options = llvm::cl::getRegisteredOptions();
  auto printOp = options.find("mlir-print-op-on-diagnostic");
  if (printOp == options.end() || !printOp->second->getNumOccurrences())
    context.printOpOnDiagnostic(false);
  // Diagnostics point into the spec file: "specs/x.toml:14:3: error: ...".
  llvm::SourceMgr sourceMgr;
  if (auto buffer = llvm::MemoryBuffer::getFile(inputFile))
    sourceMgr.AddNewSourceBuffer(std::move(*buffer), llvm::SMLoc());
  mlir::SourceMgrDiagnosticHandler diagHandler(sourceMgr, &context);

  // The online target: its own module, lowered like the evaluation program.
  // The step's memory budget and the summary count it beside the step, so
  // it is planned whenever the step is, or a summary asks for its memory.
  // A summary of an earlier stage shows what it can: a target that does not
  // lower is said to, and --emit=planned says why.
  const bool summaryOnly =
      printSummary && !directoryOutput && emitStage < EmitStage::Planned;
  const bool targetForStep =
      directoryOutput || (program == Program::Step &&
                          (emitStage >= EmitStage::Planned || printSummary));
  mlir::OwningOpRef<mlir::ModuleOp> targetModule;
  if (target && (program == Program::Target || targetForStep)) {
    targetModule = importTarget(context, *spec, *target);
    if (!targetModule)
      return fail("the target graph built from '" + target->configPath +
                  "' does not verify");
    EmitStage stage = program == Program::Target && !directoryOutput
                          ? emitStage
                          : EmitStage::Planned;
    mlir::PassManager pm(&context);
    if (failed(mlir::applyPassManagerCLOptions(pm)))
      return fail("invalid pass manager options");
    if (stage == EmitStage::Fused)
      pm.addPass(createFuseKernels());
    else if (stage >= EmitStage::Planned)
      buildLowerEvalToKernelsPipeline(pm, allowed);
    const bool quiet = program == Program::Step && summaryOnly;
    std::optional<mlir::ScopedDiagnosticHandler> silence;
    if (quiet)
      silence.emplace(&context,
                      [](mlir::Diagnostic &) { return mlir::success(); });
    if (failed(pm.run(*targetModule))) {
      if (!quiet)
        return fail("compiling the online target of '" + target->configPath +
                    "' failed");
      targetModule = nullptr;
    }
  }
  if (program == Program::Target && !directoryOutput) {
    targetModule->print(output->os());
    output->os() << "\n";
    output->keep();
    return 0;
  }

  mlir::OwningOpRef<mlir::ModuleOp> module = importSpec(context, *spec);
  if (!module)
    return fail("the graph built from '" + inputFile + "' does not verify");

  // The evaluation program: its own module, from the forward graph.
  mlir::OwningOpRef<mlir::ModuleOp> evalModule;
  if (program == Program::Eval || directoryOutput) {
    evalModule = module->clone();
    mlir::PassManager pm(&context);
    if (failed(mlir::applyPassManagerCLOptions(pm)))
      return fail("invalid pass manager options");
    pm.addPass(createMakeEvalProgram());
    if (emitStage == EmitStage::Fused)
      pm.addPass(createFuseKernels());
    else if (emitStage >= EmitStage::Planned)
      buildLowerEvalToKernelsPipeline(pm, allowed);
    if (failed(pm.run(*evalModule)))
      return fail("compiling the evaluation program of '" + inputFile +
                  "' failed");
  }
  if (program == Program::Eval && !directoryOutput) {
    evalModule->print(output->os());
    output->os() << "\n";
    output->keep();
    return 0;
  }

  auto compileTrainStep = [&](mlir::ModuleOp m) {
    mlir::PassManager pm(&context);
    if (failed(mlir::applyPassManagerCLOptions(pm)))
      return false;
    buildTrainStepPipeline(pm);
    return succeeded(pm.run(m));
  };
  if (emitStage >= EmitStage::Train && !compileTrainStep(*module))
    return fail("compiling the training step of '" + inputFile + "' failed");
  if (emitStage >= EmitStage::Fused) {
    mlir::PassManager pm(&context);
    if (failed(mlir::applyPassManagerCLOptions(pm)))
      return fail("invalid pass manager options");
    if (emitStage == EmitStage::Fused)
      pm.addPass(createFuseKernels());
    else
      buildLowerToKernelsPipeline(pm, gpuMemoryGiB, allowed);
    // dflash-plan-memory holds the step and the online target to the
    // budget, together or, with --target-gpus, each alone.
    if (std::optional<ProgramMemory> online =
            targetModule && emitStage >= EmitStage::Planned
                ? ProgramMemory::of(*targetModule)
                : std::nullopt) {
      (*module)->setAttr(kOnlineTargetMemoryAttrName, online->toAttr(&context));
      if (targetGpus)
        (*module)->setAttr(kOnlineTargetApartAttrName,
                           mlir::UnitAttr::get(&context));
    }
    if (failed(pm.run(*module)))
      return fail("lowering the training step of '" + inputFile +
                  "' to kernels failed");
  }

  if (directoryOutput) {
    if (refuseUnvalidatedKernels(
            {*module, *evalModule,
             targetModule ? *targetModule : mlir::ModuleOp()},
            allowed))
      return fail("'" + inputFile +
                  "' needs kernels that have not passed their GPU tests");
    mlir::FailureOr<CudaTrainerSources> sources = translateToCuda(
        *module, *evalModule, targetModule ? *targetModule : mlir::ModuleOp());
    if (failed(sources))
      return fail("translating '" + inputFile + "' to CUDA failed");
    CudaTrainerOptions options;
    options.outputDir = outputPath;
    options.sourceDir = sourceDir;
    std::string error;
    if (failed(writeCudaTrainer(*sources, options, error)))
      return fail(error);
    llvm::errs() << "dflashc: wrote " << outputPath
                 << "/{step.cu,eval.cu,target.cu,kernels.cu,kernels.h,main.cpp,"
                    "manifest.json,CMakeLists.txt}\n";
    if (printSummary)
      printStepSummary(llvm::errs(), *spec, *module,
                       targetModule ? *targetModule : mlir::ModuleOp(),
                       target.has_value());
    if (emitStage == EmitStage::Trainer &&
        failed(buildCudaTrainer(options, llvm::errs(), error)))
      return fail(error);
    return 0;
  }

  module->print(output->os());
  output->os() << "\n";
  output->keep();
  if (printSummary) {
    // The summary counts the whole step's FLOPs and memory, whatever stage
    // is printed: before planning, of a copy lowered without the budget
    // (these stages check none) and quietly (a step that does not lower is
    // said to; --emit=planned says why).
    mlir::OwningOpRef<mlir::ModuleOp> whole;
    if (emitStage >= EmitStage::Planned) {
      whole = module->clone();
    } else {
      whole = importSpec(context, *spec);
      if (!whole || !compileTrainStep(*whole))
        return fail("compiling the training step of '" + inputFile +
                    "' failed");
      mlir::OwningOpRef<mlir::ModuleOp> planned = whole->clone();
      (*planned)->removeAttr(kBudgetAttrName);
      mlir::PassManager pm(&context);
      buildLowerToKernelsPipeline(pm, 0, allowed);
      mlir::ScopedDiagnosticHandler silence(
          &context, [](mlir::Diagnostic &) { return mlir::success(); });
      if (succeeded(pm.run(*planned)))
        whole = std::move(planned);
    }
    printStepSummary(llvm::errs(), *spec, *whole,
                     targetModule ? *targetModule : mlir::ModuleOp(),
                     target.has_value());
  }
  return 0;
}
