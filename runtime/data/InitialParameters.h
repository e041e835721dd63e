//===- InitialParameters.h - The drafter's weights at step 0 ----*- C++ -*-===//

#ifndef DFLASH_RUNTIME_INITIALPARAMETERS_H
#define DFLASH_RUNTIME_INITIALPARAMETERS_H

#include "schema/Parameters.h"

#include <cstdint>
#include <vector>

namespace dflash::rt {

/// The initial bf16 parameters, in parameterTable order: linear weights
/// N(0, initStd) from Rng::forStream(seed, 0x1000 + tensor index), rounded
/// to bf16; norm weights 1. fp32 masters start as the bf16 values widened,
/// so every implementation that loads the same init checkpoint starts from
/// the same numbers.
std::vector<std::vector<uint16_t>> initialParameters(const ModelConfig &config,
                                                     uint64_t seed);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_INITIALPARAMETERS_H
