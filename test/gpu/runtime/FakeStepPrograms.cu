//===- FakeStepPrograms.cu - The hand-written steps' kernels --------------===//
//
// The kernels of FakeGpuProgram and FakeTargetProgram and the methods that
// launch them. All reductions run in one block in a fixed order.
//
//===----------------------------------------------------------------------===//

#include "test/gpu/runtime/FakeStepPrograms.h"

#include "kernels/CudaCheck.cuh"

#include <csignal>

namespace dflash::runtimetest::gpu {

ModelConfig smallConfig() {
  ModelConfig c = oneLayerDrafterConfig();
  c.name = "trainer-test";
  c.seed = 5;
  c.lr = 1e-2;
  c.warmupRatio = 0.0;
  c.totalSteps = 20;
  return c;
}

namespace {

//===----------------------------------------------------------------------===//
// The hand-written step
//===----------------------------------------------------------------------===//
//
// A data-parallel regression: row b of the global batch (G rows over every
// rank) has a target t_b mixing all its inputs and the embedding, and every
// trainable tensor m of n elements is pulled towards the targets:
//   loss = sum_t sum_b sum_i (m_i - t_b)^2 / (n G)
//   grad_i = sum_b 2 (m_i - t_b) / (n G)
// Each rank sums over its own rows; allReduceSum adds the ranks' loss sums
// (with the kept-anchor count for acc, on the main stream) and their
// gradients (two buckets on a communication stream, joined before the
// update), as the generated step does. Without the hook (one GPU) those
// calls are skipped; with NCCL on one GPU they are sums of one term, so the
// results are the same bits.

constexpr int kThreads = 256;

/// Sum over the block in a fixed order; every thread gets the result.
__device__ float blockSum(float value, float *shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (int(threadIdx.x) < stride)
      shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  float sum = shared[0];
  __syncthreads();
  return sum;
}

/// targets[b] for this rank's B rows; kept[0] = kept anchor slots.
__global__ void rowTargetsKernel(const int32_t *ids, const uint8_t *mask,
                                 const uint16_t *hidden, const int32_t *anchors,
                                 const uint8_t *keep, const uint16_t *embed,
                                 int64_t rows, int64_t seq, int64_t width,
                                 int64_t slots, float *targets, float *kept) {
  __shared__ float shared[kThreads];
  float keptTotal = 0;
  for (int64_t b = 0; b < rows; ++b) {
    float idSum = 0, hiddenSum = 0, keptSum = 0, anchorSum = 0;
    for (int64_t i = threadIdx.x; i < seq; i += kThreads)
      idSum += float(ids[b * seq + i] * mask[b * seq + i]);
    for (int64_t i = threadIdx.x; i < seq * width; i += kThreads)
      hiddenSum += bf16ToFloat(hidden[b * seq * width + i]);
    for (int64_t i = threadIdx.x; i < slots; i += kThreads) {
      keptSum += float(keep[b * slots + i]);
      anchorSum += float(anchors[b * slots + i] * keep[b * slots + i]);
    }
    idSum = blockSum(idSum, shared);
    hiddenSum = blockSum(hiddenSum, shared);
    keptSum = blockSum(keptSum, shared);
    anchorSum = blockSum(anchorSum, shared);
    if (threadIdx.x == 0)
      targets[b] = fmodf(idSum, 97.f) / 97.f + hiddenSum / float(seq * width) +
                   anchorSum / 1000.f + bf16ToFloat(embed[0]);
    keptTotal += keptSum;
  }
  if (threadIdx.x == 0)
    kept[0] = keptTotal;
}

/// This rank's loss sum of one tensor and its gradient contribution.
__global__ void tensorLossKernel(const float *master, int64_t n,
                                 const float *targets, int64_t rows,
                                 float globalRows, float *lossSum,
                                 float *grad) {
  __shared__ float shared[kThreads];
  float scale = 1.f / (float(n) * globalRows), sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float g = 0;
    for (int64_t b = 0; b < rows; ++b) {
      float d = master[i] - targets[b];
      sum += d * d;
      g += 2.f * d;
    }
    grad[i] = g * scale;
  }
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0)
    lossSum[0] = sum * scale;
}

/// Squared norm of one tensor's (summed) gradient.
__global__ void gradNormKernel(const float *grad, int64_t n, float *part) {
  __shared__ float shared[kThreads];
  float sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    sum += grad[i] * grad[i];
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0)
    part[0] = sum;
}

/// scalars = [kept anchors, loss sum of each tensor], summed over ranks.
__global__ void finalizeKernel(const float *scalars, const float *normParts,
                               int tensors, float anchorSlots,
                               const int32_t *step, const int32_t *total,
                               float lr0, int nanStep, float *loss, float *acc,
                               float *gradNorm, float *lr) {
  float l = 0, g = 0;
  for (int i = 0; i < tensors; ++i) {
    l += scalars[1 + i];
    g += normParts[i];
  }
  if (*step == nanStep)
    l = __int_as_float(0x7fc00000);
  *loss = l;
  *acc = scalars[0] / anchorSlots;
  *gradNorm = sqrtf(g);
  *lr = lr0 * float(*step + 1) / float(*total);
}

__global__ void updateKernel(uint16_t *param, float *master, float *m1,
                             float *m2, const float *grad, int64_t n,
                             const float *lr, const float *loss) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float g = grad[i];
  if (!isfinite(*loss)) // as a real step would: a NaN loss poisons all
    g = __int_as_float(0x7fc00000);
  float a = 0.9f * m1[i] + 0.1f * g;
  float b = 0.999f * m2[i] + 0.001f * g * g;
  float m = master[i] - *lr * a / (sqrtf(b) + 1e-8f);
  m1[i] = a;
  m2[i] = b;
  master[i] = m;
  param[i] = floatToBf16(m);
}

__global__ void emptyKernel() {}

__global__ void fakeTargetKernel(const int32_t *ids, const int32_t *positions,
                                 const uint16_t *embed, int64_t tokens,
                                 int64_t hidden, int64_t width,
                                 uint16_t *features) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * width)
    return;
  int64_t token = i / width, j = i % width;
  float e = bf16ToFloat(embed[int64_t(ids[token]) * hidden + j % hidden]);
  // No fused multiply-add: the host's expected() rounds twice too.
  features[i] =
      floatToBf16(__fadd_rn(__fmul_rn(e, 1.f + float(positions[token]) / 64.f),
                            float(j / hidden) / 8.f));
}

} // namespace

Status FakeGpuProgram::bind(const std::vector<void *> &pointers, void *arena,
                            const DeviceResources &resources,
                            const StepHyper &hyper) {
  if (Status s = mapStepBuffers(specs, cfg, optimizerShards(), map); !s.ok())
    return s;
  ptrs = pointers;
  scratch = static_cast<float *>(arena);
  lr0 = hyper.lr;
  res = resources;
  boundWithGemm = resources.gemm != nullptr;
  for (size_t i = 0; i < pointers.size(); ++i)
    alignedTo256 &= reinterpret_cast<uintptr_t>(pointers[i]) % 256 == 0;
  alignedTo256 &= reinterpret_cast<uintptr_t>(arena) % 256 == 0;
  // The buckets' gaps are summed too: keep them zero.
  DFLASH_CUDA_CHECK(cudaMemset(arena, 0, arenaBytes()));
  if (res.allReduceSum) {
    DFLASH_CUDA_CHECK(
        cudaStreamCreateWithFlags(&commStream, cudaStreamNonBlocking));
    DFLASH_CUDA_CHECK(
        cudaEventCreateWithFlags(&gradsReady, cudaEventDisableTiming));
    DFLASH_CUDA_CHECK(
        cudaEventCreateWithFlags(&gradsDone, cudaEventDisableTiming));
  }
  if (behaviour.onBind)
    behaviour.onBind(resources);
  return Status::success();
}

Status FakeGpuProgram::enqueue(cudaStream_t stream) {
  int call = enqueueCalls++;
  if (call == behaviour.signalAtEnqueue)
    std::raise(SIGINT);
  const bool broken =
      call == behaviour.failAtEnqueue && res.rank == behaviour.failRank;
  const bool collectives = res.allReduceSum && !broken;
  const int64_t B = cfg.rowsPerGpu, S = cfg.seqLen, N = cfg.anchorsPerRow;
  const float globalRows = float(B * res.worldSize);
  std::vector<ParamInfo> table = parameterTable(cfg);
  const int tensors = int(table.size());
  float *targets = scratch + targetsAt, *scalars = scratch + scalarsAt;
  float *norms = scratch + normsAt;
  if (shards && res.worldSize > 1) {
    // No rank holds whole tensors: only the metrics, from the zeroed
    // scalars, and the state stays as it is.
    finalizeKernel<<<1, 1, 0, stream>>>(
        scalars, norms, 0, globalRows * float(N),
        at<int32_t>(map.counter(StepCounter::Step)),
        at<int32_t>(map.counter(StepCounter::TotalSteps)), lr0,
        behaviour.nanStep, at<float>(map.metric(StepMetric::Loss)),
        at<float>(map.metric(StepMetric::Acc)),
        at<float>(map.metric(StepMetric::GradNorm)),
        at<float>(map.metric(StepMetric::Lr)));
    DFLASH_CUDA_CHECK_LAUNCH("finalizeKernel");
    return Status::success();
  }
  rowTargetsKernel<<<1, kThreads, 0, stream>>>(
      at<int32_t>(map.input(StepInput::InputIds)),
      at<uint8_t>(map.input(StepInput::LossMask)),
      at<uint16_t>(map.input(StepInput::TargetHidden)),
      at<int32_t>(map.input(StepInput::Anchors)),
      at<uint8_t>(map.input(StepInput::Keep)),
      at<uint16_t>(map.frozenWeight(FrozenWeight::Embed)), B, S,
      cfg.contextWidth(), N, targets, scalars);
  DFLASH_CUDA_CHECK_LAUNCH("rowTargetsKernel");
  for (int t = 0; t < tensors; ++t) {
    tensorLossKernel<<<1, kThreads, 0, stream>>>(
        master(t), table[size_t(t)].numel(), targets, B, globalRows,
        scalars + 1 + t, grad(t));
    DFLASH_CUDA_CHECK_LAUNCH("tensorLossKernel");
  }
  if (collectives) {
    // Gradients on the communication stream, in two buckets, while the
    // main stream sums the scalars.
    DFLASH_CUDA_CHECK(cudaEventRecord(gradsReady, stream));
    DFLASH_CUDA_CHECK(cudaStreamWaitEvent(commStream, gradsReady, 0));
    int half = tensors / 2;
    float *first = grad(0), *middle = grad(half);
    float *end = grad(tensors - 1) + table.back().numel();
    res.allReduceSum(res.collectives, first, size_t(middle - first),
                     commStream);
    res.allReduceSum(res.collectives, middle, size_t(end - middle), commStream);
    DFLASH_CUDA_CHECK(cudaEventRecord(gradsDone, commStream));
    res.allReduceSum(res.collectives, scalars, size_t(1 + tensors), stream);
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DFLASH_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusActive && behaviour.whileCapturing)
    behaviour.whileCapturing();
  if (collectives)
    DFLASH_CUDA_CHECK(cudaStreamWaitEvent(stream, gradsDone, 0));
  for (int t = 0; t < tensors; ++t) {
    gradNormKernel<<<1, kThreads, 0, stream>>>(
        grad(t), table[size_t(t)].numel(), norms + t);
    DFLASH_CUDA_CHECK_LAUNCH("gradNormKernel");
  }
  finalizeKernel<<<1, 1, 0, stream>>>(
      scalars, norms, tensors, globalRows * float(N),
      at<int32_t>(map.counter(StepCounter::Step)),
      at<int32_t>(map.counter(StepCounter::TotalSteps)), lr0, behaviour.nanStep,
      at<float>(map.metric(StepMetric::Loss)),
      at<float>(map.metric(StepMetric::Acc)),
      at<float>(map.metric(StepMetric::GradNorm)),
      at<float>(map.metric(StepMetric::Lr)));
  DFLASH_CUDA_CHECK_LAUNCH("finalizeKernel");
  for (int t = 0; t < tensors; ++t) {
    int64_t n = table[size_t(t)].numel();
    updateKernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0,
                   stream>>>(at<uint16_t>(map.param[size_t(t)]), master(t),
                             moment(1, t), moment(2, t), grad(t), n,
                             at<float>(map.metric(StepMetric::Lr)),
                             at<float>(map.metric(StepMetric::Loss)));
    DFLASH_CUDA_CHECK_LAUNCH("updateKernel");
  }
  // Last, unchecked: the runtime's launch check must see it.
  if (broken)
    emptyKernel<<<0, 1, 0, stream>>>(); // invalid: zero blocks
  return Status::success();
}

Status FakeTargetProgram::enqueue(cudaStream_t stream) {
  const int64_t tokens = cfg.rowsPerGpu * cfg.seqLen;
  const int64_t n = tokens * cfg.contextWidth();
  fakeTargetKernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0,
                     stream>>>(static_cast<const int32_t *>(ptrs[0]),
                               static_cast<const int32_t *>(ptrs[1]),
                               static_cast<const uint16_t *>(ptrs[2]), tokens,
                               cfg.hiddenSize, cfg.contextWidth(),
                               static_cast<uint16_t *>(ptrs[3]));
  DFLASH_CUDA_CHECK_LAUNCH("fakeTargetKernel");
  return Status::success();
}

} // namespace dflash::runtimetest::gpu
