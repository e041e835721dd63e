//===- CompiledStep.h - The runtime half of a generated step ----*- C++ -*-===//
//
// A generated step.cu is constant tables and a launch sequence; everything
// else it needs is here, compiled and unit-tested with the runtime:
// binding the buffers and the arena, writing the optimizer's device tables
// into their planned slot, the ZeRO-1 pieces and the copies that gather the
// parameters, the communication stream and the per-bucket events, the
// optimizer's launches, and a Status for every CUDA call the schedule makes
// (a failed copy is reported by enqueue(), never by exiting).
//
// The generated class derives from CompiledStep, hands it a
// CompiledStepTables in its constructor, and implements schedule(), which
// reads pointers through at() and launches kernels with constant shapes.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_COMPILEDSTEP_H
#define DFLASH_RUNTIME_COMPILEDSTEP_H

#include "kernels/AdamW.cuh"
#include "runtime/device/OptimizerShards.h"
#include "runtime/device/StepProfiler.h"
#include "runtime/device/StepProgram.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::rt {

/// A region of the arena: a planned value, workspace or table.
struct ArenaSlot {
  int64_t offset = 0;
  int64_t bytes = 0;
};

/// One trainable tensor of the whole-state optimizer: where its parameter,
/// master and moments are (buffer indices) and its gradients (arena slots:
/// the bf16 gradient one GPU reads, the fp32 bucket copy several GPUs
/// all-reduce).
struct AdamWRow {
  int param = -1, master = -1, moment1 = -1, moment2 = -1;
  ArenaSlot bf16Grad, f32Grad;
  int64_t numel = 0;
};

/// ZeRO-1, per bucket: its fp32 gradients (the bucket's arena slot), its
/// state shards (buffer indices) and its tensors' parameters
/// (buffer indices, in the layout's tensor order).
struct ShardedBucketRefs {
  ArenaSlot grads;
  int master = -1, moment1 = -1, moment2 = -1;
  std::vector<int> params;
};

/// What a generated step is, as plain data. Exactly one of adamwRows (the
/// whole state on every GPU) and shardLayout/shardRefs (ZeRO-1) is set,
/// except in an evaluation program (eval.cu), which has no optimizer.
struct CompiledStepTables {
  ModelConfig config;
  std::vector<BufferSpec> buffers; ///< binding order
  int64_t arenaBytes = 0;          ///< the memory plan's, scratch included
  int64_t gemmWorkspaceBytes = 0;
  double flopsPerStep = 0;
  /// Its block attention by kind of layer (the training step's only).
  std::vector<AttentionKindFlops> attentionKinds;
  /// The optimizer's device tables (kernels/AdamWTables.h layout).
  ArenaSlot optimizerTables;
  int64_t maxChunks = 0;
  std::vector<AdamWRow> adamwRows;
  bool sharded = false;
  OptimizerShardLayout shardLayout;
  std::vector<ShardedBucketRefs> shardRefs;
  /// Gradient buckets (one collective each).
  int64_t numBuckets = 0;
  /// What each profiled op is ("dflash.linear layers.0.self_attn").
  std::vector<std::string> opNames;

  bool hasOptimizer() const { return sharded || !adamwRows.empty(); }
};

class CompiledStep : public StepProgram {
public:
  explicit CompiledStep(CompiledStepTables tables);
  ~CompiledStep() override;
  CompiledStep(const CompiledStep &) = delete;
  CompiledStep &operator=(const CompiledStep &) = delete;

  const ModelConfig &config() const override { return t.config; }
  const std::vector<BufferSpec> &buffers() const override { return t.buffers; }
  size_t arenaBytes() const override { return size_t(t.arenaBytes); }
  size_t gemmWorkspaceBytes() const override {
    return size_t(t.gemmWorkspaceBytes);
  }
  double flopsPerStep() const override { return t.flopsPerStep; }
  const std::vector<AttentionKindFlops> &attentionKinds() const override {
    return t.attentionKinds;
  }
  const OptimizerShardLayout *optimizerShards() const override {
    return t.sharded ? &t.shardLayout : nullptr;
  }

  Status bind(const std::vector<void *> &buffers, void *arena,
              const DeviceResources &resources,
              const StepHyper &hyper) override;
  Status enqueue(cudaStream_t stream) final;
  void beforeReplay() final { profiler.beforeReplay(); }

protected:
  /// The launch sequence of one step (generated).
  virtual void schedule(cudaStream_t stream) = 0;

  template <class T> T *at(int buffer) const {
    return static_cast<T *>(bound[size_t(buffer)]);
  }
  template <class T> T *at(ArenaSlot slot) const {
    return reinterpret_cast<T *>(arena + slot.offset);
  }
  kernels::CublasLtGemm &gemm() const { return *res.gemm; }

  void begin(size_t op, cudaStream_t stream) { profiler.begin(op, stream); }
  void end(size_t op, cudaStream_t stream) { profiler.end(op, stream); }

  /// A device-to-device copy on `stream`.
  void copy(void *to, const void *from, size_t bytes, cudaStream_t stream,
            const char *what);
  /// `rows` rows of `widthBytes` from a dense `from` into `to`, whose rows
  /// are `toPitch` bytes apart (a band of columns: dflash.concat_last).
  void copyColumns(void *to, size_t toPitch, const void *from,
                   size_t widthBytes, size_t rows, cudaStream_t stream);
  /// `rows` rows of `widthBytes` from `from`, whose rows are `fromPitch`
  /// bytes apart, into a dense `to` (a band of columns out:
  /// dflash.split_last).
  void copyBand(void *to, const void *from, size_t fromPitch, size_t widthBytes,
                size_t rows, cudaStream_t stream);
  /// Sums `count` floats over every GPU in place; nothing on one GPU.
  void allReduce(float *data, size_t count, cudaStream_t stream);
  /// Whether the gradients go through the fp32 buckets and a collective
  /// (several GPUs, or ZeRO-1); on one GPU without ZeRO-1 the optimizer
  /// reads the bf16 gradients and the buckets are skipped.
  bool reducesGradients() const;
  /// Bucket `k` is complete on `stream`: its collective (an all-reduce of
  /// `count` floats, or with ZeRO-1 a reduce-scatter of `count` per shard)
  /// starts on the communication stream while the backward pass goes on.
  void reduceBucket(int64_t k, float *data, size_t count, cudaStream_t stream);
  /// The optimizer step: the learning rate of this step into `lr`, then the
  /// clip and AdamW over every tensor (after the buckets' collectives), and
  /// the gradients' global norm into `gradNorm`.
  void optimizerStep(const int32_t *step, const int32_t *totalSteps, float *lr,
                     float *gradNorm, cudaStream_t stream);

private:
  Status bindWholeState();
  Status bindShards();
  Status uploadTables(const std::vector<kernels::AdamWTensor> &tensors,
                      const std::vector<kernels::AdamWTensor> &tensorsF32);
  void gatherParameters(cudaStream_t stream);
  /// Keeps the first failure of a CUDA call the schedule made.
  void note(cudaError_t status, const char *what);

  struct ShardCopy {
    void *to;
    const void *from;
    size_t bytes;
  };
  struct ShardGather {
    void *data;
    size_t shardBytes;
  };

  CompiledStepTables t;
  std::vector<void *> bound;
  char *arena = nullptr;
  DeviceResources res;
  StepHyper hyper;
  kernels::AdamWHyper adamwHyper;
  kernels::AdamWTables adamwTables{}, adamwTablesF32{};
  kernels::AdamWStepState *adamwState = nullptr;
  std::vector<kernels::AdamWChunk> chunks;
  float *squareSum = nullptr;
  std::vector<ShardCopy> packCopies, unpackCopies;
  std::vector<ShardGather> gathers;
  cudaStream_t commStream = nullptr;
  std::vector<cudaEvent_t> bucketReady, bucketDone;
  StepProfiler profiler;
  /// The first failure of a call schedule() made, empty when none.
  std::string scheduleError;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_COMPILEDSTEP_H
