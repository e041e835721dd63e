//===- StepProgram.h - What generated code gives the runtime ----*- C++ -*-===//
//
// The contract between `dflashc`'s generated step.cu and the runtime. The
// compiler emits one class implementing StepProgram for a spec: its static
// shapes, the persistent buffers it reads and writes, the size of its
// activation arena, and enqueue(), which issues the whole training step
// (forward, backward, optimizer) on one stream without synchronising with
// the host, so that the runtime can capture it once in a CUDA graph and
// replay it.
//
// The runtime owns every allocation: it allocates the buffers in the order of
// buffers(), the arena and the workspace, fills inputs, frozen weights,
// parameters and optimizer state, binds them once, and reads the metrics
// back after each step.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_STEPPROGRAM_H
#define DFLASH_RUNTIME_STEPPROGRAM_H

#include "runtime/device/OptimizerShards.h"
#include "runtime/device/StepBuffers.h"
#include "schema/AttentionWork.h"
#include "schema/ModelConfig.h"
#include "schema/StepBuffers.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

namespace dflash::kernels {
class CublasLtGemm;
}

namespace dflash::rt {

/// Per-GPU resources the generated code uses: one stream is given to
/// enqueue(); GEMMs go through `gemm` (cuBLASLt, algorithm cached per shape).
/// Collectives are the identity on one GPU; with several they sum over the
/// data-parallel group (allReduceSum may be called from inside a capture).
struct DeviceResources {
  kernels::CublasLtGemm *gemm = nullptr;
  /// Sums `count` floats in place over every rank; nullptr on one GPU.
  void (*allReduceSum)(void *self, float *data, size_t count,
                       cudaStream_t stream) = nullptr;
  void *collectives = nullptr; ///< `self` of every collective hook
  /// ZeRO-1: `data` holds worldSize * shardCount floats; afterwards shard
  /// `rank` ([rank * shardCount, (rank + 1) * shardCount)) holds their sum
  /// over every rank, the rest is unspecified. In place; nullptr on one GPU.
  void (*reduceScatterSum)(void *self, float *data, size_t shardCount,
                           cudaStream_t stream) = nullptr;
  /// ZeRO-1: `data` holds worldSize * shardBytes bytes; every rank sends
  /// its part `rank` and receives all the others'. In place; nullptr on
  /// one GPU.
  void (*allGather)(void *self, void *data, size_t shardBytes,
                    cudaStream_t stream) = nullptr;
  int64_t rank = 0, worldSize = 1;
};

class StepProgram {
public:
  virtual ~StepProgram() = default;

  /// The drafter this step was compiled for.
  virtual const ModelConfig &config() const = 0;
  /// Every buffer that lives across steps, in binding order.
  virtual const std::vector<BufferSpec> &buffers() const = 0;
  /// Bytes of scratch memory for activations (its offsets are static).
  virtual size_t arenaBytes() const = 0;
  /// Bytes of the cuBLASLt workspace the step's GEMMs need.
  virtual size_t gemmWorkspaceBytes() const = 0;
  /// FLOPs of one step on one GPU, as the compiler counts them.
  virtual double flopsPerStep() const = 0;
  /// Their block attention by kind of layer, for counting it again at the
  /// anchors a step drew (schema/AttentionWork.h); empty where not known.
  virtual const std::vector<AttentionKindFlops> &attentionKinds() const {
    static const std::vector<AttentionKindFlops> none;
    return none;
  }
  /// With ZeRO-1 (spec `[parallel] shard_optimizer_state`): how the
  /// optimizer state is split over the GPUs; its Master and Moment buffers
  /// are then one shard per bucket ("bucket.<k>"), and the step runs only
  /// on exactly layout.worldSize GPUs. nullptr when every GPU holds the
  /// whole state (one Master/Moment buffer per trainable tensor).
  virtual const OptimizerShardLayout *optimizerShards() const {
    return nullptr;
  }

  /// Binds device pointers once: one per buffers() entry, and the arena
  /// (256-byte aligned). Pointers must stay valid and fixed while the step
  /// is used, since a captured graph holds them. Fails, with a message,
  /// when the step cannot run with what it was given.
  virtual Status bind(const std::vector<void *> &buffers, void *arena,
                      const DeviceResources &resources,
                      const StepHyper &hyper) = 0;
  /// Issues one whole step on `stream`. It reads the inputs and the step
  /// counter, updates parameters and optimizer state in place and writes
  /// the metrics. No host synchronisation, no allocation: capturable.
  /// Fails when a call it makes fails (launch errors are the caller's to
  /// check with cudaGetLastError).
  virtual Status enqueue(cudaStream_t stream) = 0;
  /// Called before each replay of a graph captured from enqueue()
  /// (launchProgram): DFLASH_PROFILE's per-op times of the replay before.
  virtual void beforeReplay() {}
};

/// Defined by the generated step.cu.
std::unique_ptr<StepProgram> createStepProgram();
/// Defined by the generated eval.cu: the evaluation program (the forward
/// alone, over held-out rows: `train --eval-data`), a StepProgram whose
/// buffers are the step's inputs, frozen weights and parameters (bound to
/// the step's own) and whose metrics are the ForwardSums of one batch,
/// summed over the GPUs; enqueue() changes nothing but its metrics and
/// arena. nullptr when the trainer was built without one.
std::unique_ptr<StepProgram> createEvalProgram();
/// Defined by the generated target.cu: the online target's forward (train
/// --target on token shards), a StepProgram whose buffers are its inputs
/// (input_ids, position_ids: bound to the step's), its frozen weights (by
/// their checkpoint names, BufferSpec::index -1) and, after them, its output
/// target_hidden (bound to the step's input). No metrics; enqueue() writes
/// target_hidden and its arena only. nullptr when the trainer was built
/// without one.
std::unique_ptr<StepProgram> createTargetProgram();

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_STEPPROGRAM_H
