//===- CompiledStep.cu - The runtime half of a generated step -------------===//

#include "runtime/device/CompiledStep.h"

#include "kernels/AdamWTables.h"
#include "kernels/StepScalars.cuh"

#include <algorithm>

using namespace dflash;
using namespace dflash::rt;

namespace {
Status cudaStatus(cudaError_t status, const std::string &what) {
  if (status == cudaSuccess)
    return Status::success();
  return Status::error("step program: " + what + ": " +
                       cudaGetErrorString(status));
}
} // namespace

CompiledStep::CompiledStep(CompiledStepTables tables)
    : t(std::move(tables)), profiler(t.opNames) {}

CompiledStep::~CompiledStep() {
  for (std::vector<cudaEvent_t> *events : {&bucketReady, &bucketDone})
    for (cudaEvent_t e : *events)
      if (e)
        (void)cudaEventDestroy(e);
  if (commStream)
    (void)cudaStreamDestroy(commStream);
}

Status CompiledStep::bind(const std::vector<void *> &buffers, void *arenaBase,
                          const DeviceResources &resources,
                          const StepHyper &stepHyper) {
  if (buffers.size() != t.buffers.size())
    return Status::error(
        "step program: bound " + std::to_string(buffers.size()) +
        " buffers but the step has " + std::to_string(t.buffers.size()));
  bound = buffers;
  arena = static_cast<char *>(arenaBase);
  res = resources;
  hyper = stepHyper;
  adamwHyper.beta1 = hyper.beta1;
  adamwHyper.beta2 = hyper.beta2;
  adamwHyper.eps = hyper.eps;
  adamwHyper.weightDecay = hyper.weightDecay;
  adamwHyper.maxNorm = hyper.maxGradNorm;

  // An evaluation program has no optimizer: only its buffers and arena.
  if (!t.hasOptimizer())
    return Status::success();
  DFLASH_RETURN_IF_ERROR(t.sharded ? bindShards() : bindWholeState());

  if (reducesGradients() && (res.allReduceSum || res.reduceScatterSum)) {
    DFLASH_RETURN_IF_ERROR(cudaStatus(
        cudaStreamCreateWithFlags(&commStream, cudaStreamNonBlocking),
        "creating the communication stream"));
    const size_t buckets = size_t(std::max<int64_t>(t.numBuckets, 1));
    for (std::vector<cudaEvent_t> *events : {&bucketReady, &bucketDone}) {
      events->assign(buckets, nullptr);
      for (cudaEvent_t &e : *events)
        DFLASH_RETURN_IF_ERROR(
            cudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                       "creating the bucket events"));
    }
  }
  return Status::success();
}

Status CompiledStep::uploadTables(
    const std::vector<kernels::AdamWTensor> &tensors,
    const std::vector<kernels::AdamWTensor> &tensorsF32) {
  const int64_t numTensors = int64_t(tensors.size());
  if (int64_t(chunks.size()) > t.maxChunks)
    return Status::error(
        "step program: the optimizer has " + std::to_string(chunks.size()) +
        " chunks but its tables hold " + std::to_string(t.maxChunks));
  const kernels::AdamWTableLayout l =
      kernels::adamwTableLayout(numTensors, t.maxChunks);
  if (l.bytes > t.optimizerTables.bytes)
    return Status::error(
        "step program: the optimizer's tables need " + std::to_string(l.bytes) +
        " bytes but their slot has " + std::to_string(t.optimizerTables.bytes));
  char *base = arena + t.optimizerTables.offset;
  auto *tensorTable =
      reinterpret_cast<kernels::AdamWTensor *>(base + l.tensors);
  auto *chunkTable = reinterpret_cast<kernels::AdamWChunk *>(base + l.chunks);
  adamwTables.tensors = tensorTable;
  adamwTables.chunks = chunkTable;
  adamwTables.numChunks = int(chunks.size());
  adamwTables.partials = reinterpret_cast<double *>(base + l.partials);
  adamwTables.normAndClip = reinterpret_cast<float *>(base + l.normAndClip);
  adamwState = reinterpret_cast<kernels::AdamWStepState *>(base + l.state);
  adamwTablesF32 = adamwTables;
  adamwTablesF32.tensors = tensorTable + numTensors;
  DFLASH_RETURN_IF_ERROR(cudaStatus(
      cudaMemcpy(tensorTable, tensors.data(),
                 tensors.size() * sizeof(tensors[0]), cudaMemcpyHostToDevice),
      "writing the optimizer's tensor table"));
  if (!tensorsF32.empty())
    DFLASH_RETURN_IF_ERROR(
        cudaStatus(cudaMemcpy(tensorTable + numTensors, tensorsF32.data(),
                              tensorsF32.size() * sizeof(tensorsF32[0]),
                              cudaMemcpyHostToDevice),
                   "writing the optimizer's tensor table"));
  return cudaStatus(cudaMemcpy(chunkTable, chunks.data(),
                               chunks.size() * sizeof(chunks[0]),
                               cudaMemcpyHostToDevice),
                    "writing the optimizer's chunk table");
}

Status CompiledStep::bindWholeState() {
  // Two tables: the update reading the bf16 gradients (one GPU) and the one
  // reading their all-reduced fp32 bucket copies (several GPUs).
  std::vector<kernels::AdamWTensor> tensors, tensorsF32;
  std::vector<int64_t> sizes;
  for (const AdamWRow &r : t.adamwRows) {
    kernels::AdamWTensor row{at<__nv_bfloat16>(r.param), at<float>(r.master),
                             at<char>(r.bf16Grad),       at<float>(r.moment1),
                             at<float>(r.moment2),       r.numel};
    tensors.push_back(row);
    row.grad = at<char>(r.f32Grad);
    tensorsF32.push_back(row);
    sizes.push_back(r.numel);
  }
  chunks = kernels::buildAdamWChunks(sizes);
  return uploadTables(tensors, tensorsF32);
}

Status CompiledStep::bindShards() {
  const OptimizerShardLayout &layout = t.shardLayout;
  if (res.worldSize != layout.worldSize || res.rank < 0 ||
      res.rank >= res.worldSize)
    return Status::error("step program: this step shards the optimizer "
                         "state over " +
                         std::to_string(layout.worldSize) +
                         " GPUs but runs as rank " + std::to_string(res.rank) +
                         " of " + std::to_string(res.worldSize));
  if (t.shardRefs.size() != layout.buckets.size())
    return Status::error("step program: " + std::to_string(t.shardRefs.size()) +
                         " bucket references for " +
                         std::to_string(layout.buckets.size()) + " buckets");
  // This rank's pieces of every bucket's shard, and the copies that gather
  // the others' parameters through the buckets' slots (dead once the update
  // has read them) as bf16.
  for (size_t k = 0; k < layout.buckets.size(); ++k)
    if (t.shardRefs[k].params.size() != layout.buckets[k].tensors.size())
      return Status::error(
          "step program: bucket " + std::to_string(k) + " has " +
          std::to_string(layout.buckets[k].tensors.size()) + " tensors but " +
          std::to_string(t.shardRefs[k].params.size()) + " parameter buffers");
  // The bucket's fp32 slot, read as bf16, stages the gathered parameters.
  auto grads = [&](size_t k) { return at<float>(t.shardRefs[k].grads); };
  auto staging = [&](size_t k) {
    return reinterpret_cast<__nv_bfloat16 *>(grads(k));
  };
  std::vector<kernels::AdamWTensor> tensors;
  std::vector<int64_t> lengths;
  packCopies.clear();
  unpackCopies.clear();
  gathers.clear();
  for (const RankPiece &p : rankPieces(layout, res.rank)) {
    const ShardedBucketRefs &r = t.shardRefs[p.bucket];
    __nv_bfloat16 *param =
        at<__nv_bfloat16>(r.params[p.tensor]) + p.tensorOffset;
    tensors.push_back({param, at<float>(r.master) + p.shardOffset,
                       grads(p.bucket) + p.gradOffset,
                       at<float>(r.moment1) + p.shardOffset,
                       at<float>(r.moment2) + p.shardOffset, p.length});
    lengths.push_back(p.length);
    packCopies.push_back(
        {staging(p.bucket) + p.stagingOffset, param, size_t(p.length) * 2});
  }
  for (size_t k = 0; k < layout.buckets.size(); ++k) {
    const ShardedBucket &bucket = layout.buckets[k];
    for (size_t i = 0; i < bucket.tensors.size(); ++i)
      unpackCopies.push_back({at<__nv_bfloat16>(t.shardRefs[k].params[i]),
                              staging(k) + bucket.tensors[i].offset,
                              size_t(bucket.tensors[i].numel) * 2});
    gathers.push_back({grads(k), size_t(bucket.shardElements) * 2});
  }
  chunks = kernels::buildAdamWChunks(lengths);
  DFLASH_RETURN_IF_ERROR(uploadTables(tensors, {}));
  squareSum = adamwTables.normAndClip + 2;
  return Status::success();
}

Status CompiledStep::enqueue(cudaStream_t stream) {
  scheduleError.clear();
  profiler.beginStep(stream);
  schedule(stream);
  if (scheduleError.empty())
    return Status::success();
  return Status::error(scheduleError);
}

void CompiledStep::note(cudaError_t status, const char *what) {
  if (status != cudaSuccess && scheduleError.empty())
    scheduleError = cudaStatus(status, what).message();
}

void CompiledStep::copy(void *to, const void *from, size_t bytes,
                        cudaStream_t stream, const char *what) {
  note(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream),
       what);
}

void CompiledStep::copyColumns(void *to, size_t toPitch, const void *from,
                               size_t widthBytes, size_t rows,
                               cudaStream_t stream) {
  note(cudaMemcpy2DAsync(to, toPitch, from, widthBytes, widthBytes, rows,
                         cudaMemcpyDeviceToDevice, stream),
       "copy a column band");
}

void CompiledStep::copyBand(void *to, const void *from, size_t fromPitch,
                            size_t widthBytes, size_t rows,
                            cudaStream_t stream) {
  note(cudaMemcpy2DAsync(to, widthBytes, from, fromPitch, widthBytes, rows,
                         cudaMemcpyDeviceToDevice, stream),
       "copy a column band out");
}

void CompiledStep::allReduce(float *data, size_t count, cudaStream_t stream) {
  if (res.allReduceSum)
    res.allReduceSum(res.collectives, data, count, stream);
}

bool CompiledStep::reducesGradients() const {
  // ZeRO-1's shards exist even on one GPU.
  return t.sharded || res.allReduceSum;
}

void CompiledStep::reduceBucket(int64_t k, float *data, size_t count,
                                cudaStream_t stream) {
  auto hook = t.sharded ? res.reduceScatterSum : res.allReduceSum;
  if (!hook)
    return;
  note(cudaEventRecord(bucketReady[size_t(k)], stream), "bucket event");
  note(cudaStreamWaitEvent(commStream, bucketReady[size_t(k)], 0),
       "bucket wait");
  hook(res.collectives, data, count, commStream);
  note(cudaEventRecord(bucketDone[size_t(k)], commStream), "bucket event");
}

void CompiledStep::optimizerStep(const int32_t *step, const int32_t *total,
                                 float *lr, float *gradNorm,
                                 cudaStream_t stream) {
  kernels::lr_schedule(step, total, hyper.lr, hyper.warmupRatio, adamwState, lr,
                       stream);
  const bool collective =
      t.sharded ? bool(res.reduceScatterSum) : bool(res.allReduceSum);
  if (collective)
    for (cudaEvent_t done : bucketDone)
      note(cudaStreamWaitEvent(stream, done, 0), "bucket join");
  if (t.sharded) {
    // Each rank's sum of squares, summed over the ranks, gives the global
    // norm; each rank updates its pieces, then every rank gathers the
    // others' parameters.
    kernels::adamw_grad_square_sum<float>(adamwTables, squareSum, stream);
    allReduce(squareSum, 1, stream);
    kernels::adamw_clip_from_square_sum(adamwTables, squareSum, adamwHyper,
                                        stream);
    kernels::adamw_update<float>(adamwTables, adamwState, adamwHyper, stream);
    gatherParameters(stream);
  } else if (collective) {
    kernels::adamw_multi_tensor_step<float>(adamwTablesF32, adamwState,
                                            adamwHyper, stream);
  } else {
    kernels::adamw_multi_tensor_step<__nv_bfloat16>(adamwTables, adamwState,
                                                    adamwHyper, stream);
  }
  copy(gradNorm, adamwTables.normAndClip, 4, stream, "copy grad norm");
}

void CompiledStep::gatherParameters(cudaStream_t stream) {
  if (!res.allGather)
    return; // one GPU: its pieces are all the parameters
  for (const ShardCopy &c : packCopies)
    copy(c.to, c.from, c.bytes, stream, "pack a parameter shard");
  for (const ShardGather &g : gathers)
    res.allGather(res.collectives, g.data, g.shardBytes, stream);
  for (const ShardCopy &c : unpackCopies)
    copy(c.to, c.from, c.bytes, stream, "unpack gathered parameters");
}
