//===- dflash-target-features.cpp - The target forward on the CPU ---------===//
//
// The CPU reference of the online target: builds the spec's @target from the
// target's config.json (compiler/Import/ImportTarget), loads its weights by
// Hugging Face name from the checkpoint, runs it in the reference
// interpreter on the rows of a safetensors file (input_ids and position_ids,
// [B, S] I32; packed rows restart their position_ids per conversation) and
// writes target_hidden [B, S, L*H] (bf16) beside those rows. It is the
// oracle of the compiled target, as dflash-reference is of the step; slow.
//
//===----------------------------------------------------------------------===//

#include "compiler/Import/ImportTarget.h"
#include "compiler/Interpreter/Interpreter.h"
#include "dialect/DFlashOps.h"
#include "kernels/Bf16.h"
#include "runtime/io/Safetensors.h"
#include "runtime/io/TargetWeights.h"

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
             cl::desc("safetensors file with input_ids and position_ids, "
                      "[B, S] I32 each"),
             cl::value_desc("file"), cl::Required, cl::cat(category));
cl::opt<std::string> outFile("o",
                             cl::desc("Output safetensors file: input_ids, "
                                      "position_ids and target_hidden"),
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
      "  dflash-target-features specs/tiny.toml --target DIR --rows rows.st "
      "-o features.st\n");

  SpecError specError;
  std::optional<DrafterSpec> spec = loadSpec(specFile, specError);
  if (!spec)
    return fail(specError.str());
  std::string dir = targetDirectory(*spec, targetDir);
  if (dir.empty())
    return fail("no target: give --target DIR or [target] path in '" +
                specFile + "'");
  std::string error;
  std::optional<TargetModelConfig> target = readTargetConfig(dir, error);
  if (!target || !checkTargetAgainstSpec(*target, *spec, error))
    return fail(error);

  rt::SafetensorsFile rowsIn;
  Status status = rowsIn.open(rowsFile);
  std::vector<int32_t> ids, positions;
  std::vector<int64_t> idsShape, positionsShape;
  if (status.ok())
    status = readRows(rowsIn, "input_ids", ids, idsShape);
  if (status.ok())
    status = readRows(rowsIn, "position_ids", positions, positionsShape);
  if (status.ok() && idsShape != positionsShape)
    status = Status::error(rowsFile + ": input_ids " + shapeString(idsShape) +
                           " and position_ids " + shapeString(positionsShape) +
                           " differ in shape");
  for (size_t i = 0; status.ok() && i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= target->vocabSize)
      status = Status::error(rowsFile + ": input_ids holds " +
                             std::to_string(ids[i]) + " at flat index " +
                             std::to_string(i) +
                             ", outside the vocabulary "
                             "of " +
                             std::to_string(target->vocabSize));
  if (!status.ok())
    return fail(status.message());

  // The rows fix the program's shapes.
  DrafterSpec shaped = *spec;
  shaped.rowsPerGpu = idsShape[0];
  shaped.seqLen = idsShape[1];
  mlir::MLIRContext context;
  mlir::OwningOpRef<mlir::ModuleOp> module =
      importTarget(context, shaped, *target);
  if (!module)
    return fail("the target graph built from '" + target->configPath +
                "' does not verify");
  auto func = llvm::cast<mlir::func::FuncOp>(module->getBody()->front());

  // Frozen arguments in order, by their checkpoint names.
  std::vector<rt::FrozenTensor> wanted;
  for (unsigned i = 0; i < func.getNumArguments(); ++i) {
    auto role = func.getArgAttrOfType<mlir::dflash::ArgAttr>(
        i, mlir::dflash::kArgAttrName);
    if (role.getRole() != mlir::dflash::ArgRole::Frozen)
      continue;
    auto type =
        llvm::cast<mlir::RankedTensorType>(func.getArgument(i).getType());
    wanted.push_back(
        {role.getName().str(),
         std::vector<int64_t>(type.getShape().begin(), type.getShape().end())});
  }
  std::vector<std::vector<uint16_t>> weights;
  status = rt::loadFrozenTensors(dir, wanted, "the target program", weights);
  if (!status.ok())
    return fail(status.message());

  std::vector<HostTensor> args;
  for (const std::vector<int32_t> *rows : {&ids, &positions}) {
    HostTensor t(idsShape);
    for (size_t i = 0; i < rows->size(); ++i)
      t.data[i] = (*rows)[i];
    args.push_back(std::move(t));
  }
  for (size_t w = 0; w < wanted.size(); ++w) {
    HostTensor t(wanted[w].shape);
    for (size_t i = 0; i < t.data.size(); ++i)
      t.data[i] = bf16ToFloat(weights[w][i]);
    args.push_back(std::move(t));
  }
  StepInterpreter interpreter(func, precision);
  mlir::FailureOr<std::vector<HostTensor>> out = interpreter.run(args);
  if (mlir::failed(out))
    return fail("running the target program failed");
  const HostTensor &features = (*out)[0];
  std::vector<uint16_t> bits(features.data.size());
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = floatToBf16(float(features.data[i]));
  status = rt::writeSafetensors(
      outFile, {{"input_ids", DType::I32, idsShape, ids.data()},
                {"position_ids", DType::I32, idsShape, positions.data()},
                {"target_hidden", DType::BF16, features.shape, bits.data()}});
  if (!status.ok())
    return fail(status.message());
  llvm::errs() << "dflash-target-features: wrote " << outFile << ": "
               << "target_hidden " << shapeString(features.shape) << " of "
               << target->modelType << " layers 0.."
               << spec->targetLayerIds.back() << "\n";
  return 0;
}
