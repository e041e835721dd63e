//===- TargetProgram.cpp - The online target on the CPU -------------------===//

#include "tools/dflash-reference/TargetProgram.h"

#include "compiler/Import/ImportTarget.h"
#include "dialect/DFlashOps.h"
#include "kernels/Bf16.h"
#include "runtime/io/TargetWeights.h"

using namespace ::dflash;

static mlir::func::FuncOp targetFunc(mlir::ModuleOp module) {
  return llvm::cast<mlir::func::FuncOp>(module.getBody()->front());
}

Status TargetProgram::load(mlir::MLIRContext &context, const DrafterSpec &spec,
                           const std::string &dir, int64_t rows,
                           int64_t seqLen) {
  DFLASH_RETURN_IF_ERROR(build(context, spec, dir, rows, seqLen));
  return loadWeights(dir);
}

mlir::func::FuncOp TargetProgram::func() const { return targetFunc(*module); }

Status TargetProgram::build(mlir::MLIRContext &context, const DrafterSpec &spec,
                            const std::string &dir, int64_t rows,
                            int64_t seqLen) {
  std::string error;
  std::optional<TargetModelConfig> config = readTargetConfig(dir, error);
  if (!config || !checkTargetAgainstSpec(*config, spec, error))
    return Status::error(error);
  target = *config;
  DrafterSpec shaped = spec;
  shaped.rowsPerGpu = rows;
  shaped.gradientAccumulation = 1; // `rows` are all the step's
  shaped.seqLen = seqLen;
  module = importTarget(context, shaped, target);
  if (!module)
    return Status::error("the target graph built from '" + target.configPath +
                         "' does not verify");
  return Status::success();
}

Status TargetProgram::loadWeights(const std::string &dir) {
  mlir::func::FuncOp func = targetFunc(*module);
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
  std::vector<std::vector<uint16_t>> bits;
  Status status =
      rt::loadFrozenTensors(dir, wanted, "the target program", bits);
  if (!status.ok())
    return status;
  weights.clear();
  for (size_t w = 0; w < wanted.size(); ++w) {
    HostTensor t(wanted[w].shape);
    for (size_t i = 0; i < t.data.size(); ++i)
      t.data[i] = bf16ToFloat(bits[w][i]);
    weights.push_back(std::move(t));
  }
  auto result = llvm::cast<mlir::RankedTensorType>(func.getResultTypes()[0]);
  shape.assign(result.getShape().begin(), result.getShape().end());
  return Status::success();
}

Status TargetProgram::run(const std::vector<int32_t> &ids,
                          const std::vector<int32_t> &positions,
                          Precision precision,
                          std::vector<uint16_t> &features) const {
  const int64_t rows = shape[0], seqLen = shape[1];
  if (int64_t(ids.size()) != rows * seqLen ||
      int64_t(positions.size()) != rows * seqLen)
    return Status::error("the target program takes " + std::to_string(rows) +
                         " x " + std::to_string(seqLen) + " tokens");
  std::vector<HostTensor> args;
  for (const std::vector<int32_t> *v : {&ids, &positions}) {
    HostTensor t({rows, seqLen});
    for (size_t i = 0; i < v->size(); ++i)
      t.data[i] = (*v)[i];
    args.push_back(std::move(t));
  }
  args.insert(args.end(), weights.begin(), weights.end());
  StepInterpreter interpreter(targetFunc(*module), precision);
  mlir::FailureOr<std::vector<HostTensor>> out = interpreter.run(args);
  if (mlir::failed(out))
    return Status::error("running the target program failed");
  const std::vector<double> &values = (*out)[0].data;
  features.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    features[i] = floatToBf16(float(values[i]));
  return Status::success();
}
