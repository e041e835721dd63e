//===- dflash-translate.cpp - A planned module to the trainer's sources ---===//
//
// The last stage of dflashc on its own: reads a module after
// dflash-plan-memory (`dflashc SPEC --emit=planned`, or IR written by hand)
// and writes the trainer's sources, from the IR alone. Tests of the emitter
// start here, from an .mlir file.
//
//   dflash-translate planned.mlir -o DIR          step.cu, kernels.cu, ...
//   dflash-translate planned.mlir --print=step.cu one of them, to stdout
//   dflash-translate planned.mlir --eval=planned-eval.mlir -o DIR
//                                  with the evaluation program (without it,
//                                  the trainer refuses --eval-data)
//   dflash-translate planned.mlir --target=planned-target.mlir -o DIR
//                                  with the online target (without it, the
//                                  trainer reads features from its shards)
//
//===----------------------------------------------------------------------===//

#include "compiler/Target/Cuda/TranslateToCuda.h"
#include "dialect/DFlashOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;

namespace {
cl::OptionCategory category("dflash-translate options");
cl::opt<std::string> inputFile(cl::Positional, cl::desc("<planned.mlir>"),
                               cl::init("-"), cl::cat(category));
cl::opt<std::string> outputDir("o",
                               cl::desc("Directory to write the sources to"),
                               cl::value_desc("dir"), cl::cat(category));
cl::opt<std::string>
    printFile("print",
              cl::desc("Print one source to stdout instead: step.cu, "
                       "eval.cu, target.cu, kernels.cu, kernels.h, main.cpp, "
                       "target_features_main.cpp or manifest.json"),
              cl::value_desc("file"), cl::cat(category));
cl::opt<std::string> evalFile(
    "eval",
    cl::desc("The planned evaluation program (dflashc SPEC --emit=planned "
             "--program=eval) to build in as eval.cu"),
    cl::value_desc("planned-eval.mlir"), cl::cat(category));
cl::opt<std::string> targetFile(
    "target",
    cl::desc("The planned online target (dflashc SPEC --target DIR "
             "--emit=planned --program=target) to build in as target.cu"),
    cl::value_desc("planned-target.mlir"), cl::cat(category));
cl::opt<std::string> sourceDir(
    "source-dir",
    cl::desc("dflashc source tree whose schema/, runtime/ and kernels/ the "
             "trainer is built from (default: the tree this tool was built "
             "from)"),
    cl::value_desc("dir"), cl::init(DFLASH_SOURCE_DIR), cl::cat(category));

int fail(const Twine &message) {
  errs() << "dflash-translate: error: " << message << "\n";
  return 1;
}
} // namespace

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "dflash-translate: a planned dflash module to the trainer's sources\n");
  if (outputDir.empty() == printFile.empty())
    return fail("give exactly one of -o DIR and --print=FILE");

  mlir::MLIRContext context;
  context.loadDialect<mlir::dflash::DFlashDialect, mlir::func::FuncDialect>();
  std::string error;
  std::unique_ptr<MemoryBuffer> input = mlir::openInputFile(inputFile, &error);
  if (!input)
    return fail(error);
  SourceMgr sources;
  sources.AddNewSourceBuffer(std::move(input), SMLoc());
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceFile<mlir::ModuleOp>(sources, &context);
  if (!module)
    return fail("cannot parse '" + inputFile + "'");
  // The companion programs; parseSourceFile reads a SourceMgr's main
  // buffer, so one manager each.
  SourceMgr evalSources, targetSources;
  auto parseCompanion = [&](const std::string &file, SourceMgr &manager,
                            mlir::OwningOpRef<mlir::ModuleOp> &out) -> bool {
    if (file.empty())
      return true;
    std::unique_ptr<MemoryBuffer> text = mlir::openInputFile(file, &error);
    if (!text)
      return false;
    manager.AddNewSourceBuffer(std::move(text), SMLoc());
    out = mlir::parseSourceFile<mlir::ModuleOp>(manager, &context);
    if (!out)
      error = "cannot parse '" + file + "'";
    return bool(out);
  };
  mlir::OwningOpRef<mlir::ModuleOp> evalModule, targetModule;
  if (!parseCompanion(evalFile, evalSources, evalModule) ||
      !parseCompanion(targetFile, targetSources, targetModule))
    return fail(error);

  FailureOr<dflash::CudaTrainerSources> out = dflash::translateToCuda(
      *module, evalModule ? *evalModule : mlir::ModuleOp(),
      targetModule ? *targetModule : mlir::ModuleOp());
  if (failed(out))
    return fail("translating '" + inputFile + "' to CUDA failed");
  if (!printFile.empty()) {
    const std::pair<const char *, const std::string *> files[] = {
        {"step.cu", &out->stepCu},
        {"eval.cu", &out->evalCu},
        {"target.cu", &out->targetCu},
        {"kernels.cu", &out->kernelsCu},
        {"kernels.h", &out->kernelsH},
        {"main.cpp", &out->mainCpp},
        {"target_features_main.cpp", &out->targetMainCpp},
        {"manifest.json", &out->manifestJson}};
    for (auto [name, text] : files)
      if (printFile == name) {
        outs() << *text;
        return 0;
      }
    return fail("--print: no source named '" + printFile +
                "' (step.cu, eval.cu, target.cu, kernels.cu, kernels.h, "
                "main.cpp, target_features_main.cpp, manifest.json)");
  }
  dflash::CudaTrainerOptions options;
  options.outputDir = outputDir;
  options.sourceDir = sourceDir;
  if (failed(dflash::writeCudaTrainer(*out, options, error)))
    return fail(error);
  errs() << "dflash-translate: wrote " << outputDir << "\n";
  return 0;
}
