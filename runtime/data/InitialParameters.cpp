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
    switch (table[t].kind) {
    case ParamKind::Linear:
      break;
    case ParamKind::Norm:
      std::fill(values.begin(), values.end(), one);
      continue;
    case ParamKind::Zero:
      std::fill(values.begin(), values.end(), uint16_t(0));
      continue;
    case ParamKind::ConvBase: {
      // [2, kc, H]: tap 0 of each half is 1, so the convolution starts as
      // the identity (docs/semantics.md section 13).
      const std::vector<int64_t> &shape = table[t].shape;
      const size_t kc = size_t(shape[1]), H = size_t(shape[2]);
      std::fill(values.begin(), values.end(), uint16_t(0));
      for (size_t half = 0; half < 2; ++half)
        std::fill_n(values.begin() + half * kc * H, H, one);
      continue;
    }
    }
    // One stream per tensor: a tensor's values do not depend on the sizes
    // of the tensors before it.
    Rng rng = Rng::forStream(seed, 0x1000 + t);
    for (uint16_t &value : values)
      value = floatToBf16(float(rng.normal() * config.initStd));
  }
  return params;
}
