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

#include "runtime/io/Safetensors.h"
#include "tools/dflash-reference/TargetProgram.h"

#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/WithColor.h"

#include <cstring>

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

/// The I32 tensor `name` [B, S] of `file`, as integers.
Status readRows(const rt::SafetensorsFile &file, const std::string &name,
                std::vector<int32_t> &out, std::vector<int64_t> &shape) {
  const rt::TensorView *view = file.find(name);
  if (!view)
    return Status::error(file.path() + ": has no tensor '" + name + "'");
  if (view->dtype != DType::I32 || view->shape.size() != 2)
    return Status::error(
        file.path() + ": tensor '" + name + "' must be I32 [B, S], but is " +
        dtypeName(view->dtype) + " " + shapeString(view->shape));
  out.resize(size_t(view->numel()));
  std::memcpy(out.data(), view->data, out.size() * sizeof(int32_t));
  shape = view->shape;
  return Status::success();
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
  Status status = rowsIn.open(rowsFile);
  std::vector<int32_t> ids, positions;
  std::vector<int64_t> idsShape, positionsShape;
  if (status.ok())
    status = readRows(rowsIn, "input_ids", ids, idsShape);
  if (status.ok() && rowsIn.find("position_ids")) {
    status = readRows(rowsIn, "position_ids", positions, positionsShape);
  } else if (status.ok()) { // unpacked rows
    positionsShape = idsShape;
    positions.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i)
      positions[i] = int32_t(int64_t(i) % idsShape[1]);
  }
  if (status.ok() && idsShape != positionsShape)
    status = Status::error(rowsFile + ": input_ids " + shapeString(idsShape) +
                           " and position_ids " + shapeString(positionsShape) +
                           " differ in shape");
  for (size_t i = 0; status.ok() && i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= spec->vocabSize)
      status = Status::error(rowsFile + ": input_ids holds " +
                             std::to_string(ids[i]) + " at flat index " +
                             std::to_string(i) +
                             ", outside the vocabulary "
                             "of " +
                             std::to_string(spec->vocabSize));
  if (!status.ok())
    return fail(status.message());

  // The rows fix the program's shapes.
  mlir::MLIRContext context;
  TargetProgram target;
  status = target.load(context, *spec, dir, idsShape[0], idsShape[1]);
  std::vector<uint16_t> bits;
  if (status.ok())
    status = target.run(ids, positions, precision, bits);
  if (!status.ok())
    return fail(status.message());
  // The token shard's tensors as they are, the features beside them.
  std::vector<rt::TensorData> tensors;
  for (const rt::TensorView &view : rowsIn.tensors())
    if (view.name != "hidden_states")
      tensors.push_back({view.name, view.dtype, view.shape, view.data});
  tensors.push_back(
      {"hidden_states", DType::BF16, target.featureShape(), bits.data()});
  std::map<std::string, std::string> metadata = rowsIn.metadata();
  if (!metadata.empty()) {
    metadata["format"] = "dflash-feature-shard";
    metadata["target_dir"] = dir;
  }
  status = rt::writeSafetensors(outFile, tensors, metadata);
  if (!status.ok())
    return fail(status.message());
  llvm::errs() << "dflash-target-features: wrote " << outFile << ": "
               << "hidden_states " << shapeString(target.featureShape())
               << " of " << target.config().modelType << " layers 0.."
               << spec->targetLayerIds.back() << "\n";
  return 0;
}
