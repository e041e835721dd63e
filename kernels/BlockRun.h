//===- BlockRun.h - The tokens greedy verification accepts in a block -----===//
//
// Plain C++, shared by the CPU reference's acceptance (kernels/reference/
// Acceptance.cpp) and the trainer's serving walk (runtime/train/
// ServingWalk.cpp), so that both count a block's run one way.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKRUN_H
#define DFLASH_KERNELS_BLOCKRUN_H

#include <cstdint>

namespace dflash::kernels {

/// docs/semantics.md section 10: how many drafted slots of one block of `bs`
/// greedy verification accepts, from slot 1 up to its first miss or its
/// first slot of weight 0 (past the conversation or the row). Slot 0 holds
/// the anchor's own token, given and never drafted, so it is not looked at.
template <typename Weight>
inline int64_t blockRun(const uint8_t *hits, const Weight *weights,
                        int64_t bs) {
  int64_t run = 0;
  while (run + 1 < bs && weights[run + 1] > 0 && hits[run + 1])
    ++run;
  return run;
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKRUN_H
