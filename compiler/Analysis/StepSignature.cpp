//===- StepSignature.cpp - Arguments and results of @step by role ---------===//

#include "compiler/Analysis/StepSignature.h"

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace dflash {
DictionaryAttr argAttrDict(MLIRContext *ctx, ArgRole role, StringRef name) {
  return DictionaryAttr::get(ctx,
                             {NamedAttribute(StringAttr::get(ctx, kArgAttrName),
                                             ArgAttr::get(ctx, role, name))});
}
} // namespace dflash

FailureOr<StepSignature> StepSignature::get(ModuleOp module) {
  auto step = module.lookupSymbol<func::FuncOp>(kStepFunctionName);
  if (!step)
    step = module.lookupSymbol<func::FuncOp>(kEvalFunctionName);
  if (!step)
    step = module.lookupSymbol<func::FuncOp>(kTargetFunctionName);
  if (!step || step.isExternal())
    return module.emitError("the module has no func.func @step (or @eval, "
                            "or @target) with a body");
  for (unsigned i = 0; i < step.getNumArguments(); ++i)
    if (!step.getArgAttrOfType<ArgAttr>(i, kArgAttrName))
      return step.emitError()
             << "argument " << i << " of @" << step.getSymName() << " has no '"
             << kArgAttrName << "' attribute";
  for (unsigned i = 0; i < step.getNumResults(); ++i)
    if (!step.getResultAttrOfType<ArgAttr>(i, kArgAttrName))
      return step.emitError() << "result " << i << " of @" << step.getSymName()
                              << " has no '" << kArgAttrName << "' attribute";
  return StepSignature(step);
}

bool StepSignature::isEval() const {
  return step.getSymName() == kEvalFunctionName;
}

bool StepSignature::isTarget() const {
  return step.getSymName() == kTargetFunctionName;
}

func::ReturnOp StepSignature::returnOp() const {
  return cast<func::ReturnOp>(step.front().getTerminator());
}

ArgAttr StepSignature::argInfo(unsigned i) const {
  return step.getArgAttrOfType<ArgAttr>(i, kArgAttrName);
}

ArgAttr StepSignature::resultInfo(unsigned i) const {
  return step.getResultAttrOfType<ArgAttr>(i, kArgAttrName);
}

std::optional<unsigned> StepSignature::findArg(ArgRole role,
                                               StringRef name) const {
  for (unsigned i = 0; i < step.getNumArguments(); ++i)
    if (argInfo(i).getRole() == role && argInfo(i).getName() == name)
      return i;
  return std::nullopt;
}

std::optional<unsigned> StepSignature::findResult(ArgRole role,
                                                  StringRef name) const {
  for (unsigned i = 0; i < step.getNumResults(); ++i)
    if (resultInfo(i).getRole() == role && resultInfo(i).getName() == name)
      return i;
  return std::nullopt;
}

SmallVector<unsigned> StepSignature::argsWithRole(ArgRole role) const {
  SmallVector<unsigned> out;
  for (unsigned i = 0; i < step.getNumArguments(); ++i)
    if (argInfo(i).getRole() == role)
      out.push_back(i);
  return out;
}

SmallVector<unsigned> StepSignature::resultsWithRole(ArgRole role) const {
  SmallVector<unsigned> out;
  for (unsigned i = 0; i < step.getNumResults(); ++i)
    if (resultInfo(i).getRole() == role)
      out.push_back(i);
  return out;
}
