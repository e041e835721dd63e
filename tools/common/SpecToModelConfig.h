//===- SpecToModelConfig.h - A parsed spec as a runtime config --*- C++ -*-===//
//
// The host tools read specs through compiler/Spec (plain C++, no MLIR) and
// hand the runtime a ModelConfig; the runtime itself never sees a spec.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TOOLS_COMMON_SPECTOMODELCONFIG_H
#define DFLASH_TOOLS_COMMON_SPECTOMODELCONFIG_H

#include "compiler/Spec/Spec.h"
#include "runtime/ModelConfig.h"

namespace dflash {

/// Copies every field the runtime needs; a full layer gets window 0.
rt::ModelConfig modelConfigFromSpec(const DrafterSpec &spec);

} // namespace dflash

#endif // DFLASH_TOOLS_COMMON_SPECTOMODELCONFIG_H
