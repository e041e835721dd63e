//===- InitialParameters.cpp - The drafter's weights at step 0 -----------===//

#include "runtime/data/InitialParameters.h"

#include "kernels/Bf16.h"
#include "runtime/data/Rng.h"

#include <algorithm>

using namespace dflash;
using namespace dflash::rt;

std::vector<std::vector<uint16_t>>
dflash::rt::initialParameters(const ModelConfig &config, uint64_t seed) {
  std::vector<ParamInfo> table = parameterTable(config);
  std::vector<std::vector<uint16_t>> params(table.size());
  const uint16_t one = floatToBf16(1.0f);
  for (size_t t = 0; t < table.size(); ++t) {
    std::vector<uint16_t> &values = params[t];
    values.resize(size_t(table[t].numel()));
    if (table[t].isNorm()) {
      std::fill(values.begin(), values.end(), one);
      continue;
    }
    // One stream per tensor: a tensor's values do not depend on the sizes
    // of the tensors before it.
    Rng rng = Rng::forStream(seed, 0x1000 + t);
    for (uint16_t &value : values)
      value = floatToBf16(float(rng.normal() * config.initStd));
  }
  return params;
}
