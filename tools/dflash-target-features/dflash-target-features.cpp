//===- dflash-target-features.cpp - The target forward on the CPU ---------===//
//
// The CPU reference of the online target: builds the spec's @target from the
// target's config.json (compiler/Import/ImportTarget), loads its weights by
// Hugging Face name from the checkpoint, runs it in the reference
// interpreter on the rows of a token shard (input_ids [R, S] I32, and
// position_ids where rows are packed, else arange(S)) and writes a feature
// shard: the token shard's tensors and metadata with hidden_states [R, S,
// L*H] (bf16) added and `format` set to dflash-feature-shard. The CPU
// counterpart of `dflash-prepare features`, and the oracle of the compiled
// target, as dflash-reference is of the step; slow.
//
//===----------------------------------------------------------------------===//

#include "runtime/data/FeatureShard.h"
#include "runtime/io/Safetensors.h"
#include "tools/dflash-reference/TargetProgram.h"

#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/WithColor.h"

using namespace ::dflash;
namespace cl = llvm::cl;

namespace {

cl::OptionCategory category("dflash-target-features options");
cl::opt<std::string> specFile(cl::Positional, cl::desc("<spec.toml>"),
                              cl::Required, cl::cat(category));
cl::opt<std::string>
    targetDir("target",
              cl::desc("The target's Hugging Face directory (config.json and "
                       "safetensors; default: the spec's [target] path)"),
              cl::value_desc("dir"), cl::cat(category));
cl::opt<std::string>
    rowsFile("rows",
             cl::desc("token shard: input_ids [R, S] I32 (position_ids "
                      "[R, S] I32 where rows are packed)"),
             cl::value_desc("file"), cl::Required, cl::cat(category));
cl::opt<std::string> outFile("o",
                             cl::desc("Output feature shard: the token "
                                      "shard's tensors and hidden_states"),
                             cl::value_desc("file"), cl::Required,
                             cl::cat(category));
cl::opt<Precision> precision(
    "precision", cl::desc("Arithmetic of the interpreter"),
    cl::values(clEnumValN(Precision::Storage, "storage",
                          "round every op result to bf16, as the GPU stores "
                          "it (default)"),
               clEnumValN(Precision::Exact, "exact", "fp64 throughout")),
    cl::init(Precision::Storage), cl::cat(category));

int fail(const std::string &msg) {
  llvm::WithColor::error(llvm::errs(), "dflash-target-features") << msg << "\n";
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "dflash-target-features: the online target's features on the CPU\n\n"
      "  dflash-target-features SPEC --target DIR --rows tokens.safetensors "
      "-o features.safetensors\n");

  SpecError specError;
  std::optional<DrafterSpec> spec = loadSpec(specFile, specError);
  if (!spec)
    return fail(specError.str());
  std::string dir = targetDirectory(*spec, targetDir);
  if (dir.empty())
    return fail("no target: give --target DIR or [target] path in '" +
                specFile + "'");
  rt::SafetensorsFile rowsIn;
  rt::TokenRows rows;
  Status status = rowsIn.open(rowsFile);
  if (status.ok())
    status = rt::readTokenRows(rowsIn, /*seqLen=*/0, spec->vocabSize, rows);
  if (!status.ok())
    return fail(status.message());

  // The rows fix the program's shapes.
  mlir::MLIRContext context;
  TargetProgram target;
  status = target.load(context, *spec, dir, rows.rows, rows.seqLen);
  std::vector<uint16_t> bits;
  if (status.ok())
    status = target.run(rows.ids, rows.positions, precision, bits);
  if (!status.ok())
    return fail(status.message());
  // The token shard's tensors as they are, the features beside them.
  status = rt::writeFeatureShard(outFile, rowsIn, bits,
                                 target.featureShape().back(), dir);
  if (!status.ok())
    return fail(status.message());
  llvm::errs() << "dflash-target-features: wrote " << outFile << ": "
               << "hidden_states " << shapeString(target.featureShape())
               << " of " << target.config().modelType << " layers 0.."
               << spec->targetLayerIds.back() << "\n";
  return 0;
}
