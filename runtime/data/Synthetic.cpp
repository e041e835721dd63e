//===- Synthetic.cpp - A learnable synthetic problem ----------------------===//

#include "runtime/data/Synthetic.h"
#include "runtime/data/InitialParameters.h"

#include "kernels/Bf16.h"
#include "runtime/data/AnchorSampler.h"
#include "runtime/data/ParallelFor.h"
#include "runtime/data/Rng.h"

#include <algorithm>
#include <numeric>

using namespace dflash;
using namespace dflash::rt;

namespace {
// Stream ids of Rng::forStream, one per purpose, far from the 0x1000 + t
// streams of initialParameters.
constexpr uint64_t kEmbedStream = 0x100;
constexpr uint64_t kLmHeadStream = 0x101;
constexpr uint64_t kChainStream = 0x200;
constexpr uint64_t kProjectionStream = 0x300;
constexpr uint64_t kRowStreamBase = uint64_t(1) << 40;
constexpr uint64_t kAnchorStreamBase = uint64_t(2) << 40;

constexpr double kSuccessorProbability = 0.8;
constexpr double kEmbedStd = 0.05;
constexpr float kOffsetWeights[] = {1.0f, 0.75f, 0.5f};
constexpr float kNoise = 0.05f;
} // namespace

/// A uniform token other than the mask token.
static int32_t ordinaryToken(Rng &rng, const ModelConfig &config) {
  int64_t token = int64_t(rng.uniform(uint64_t(config.vocabSize - 1)));
  if (token >= config.maskTokenId)
    ++token;
  return int32_t(token);
}

/// N(0, stddev) values in bf16. Chunks of 2^20 draw from their own Rng
/// stream, so the values do not depend on how many threads made them.
static std::vector<uint16_t> normalBf16(uint64_t seed, uint64_t stream,
                                        size_t count, double stddev) {
  constexpr size_t kChunk = size_t(1) << 20;
  std::vector<uint16_t> values(count);
  parallelFor(int64_t((count + kChunk - 1) / kChunk), [&](int64_t c) {
    Rng rng = Rng::forStream(seed, stream + (uint64_t(c) << 32));
    size_t end = std::min(count, size_t(c + 1) * kChunk);
    for (size_t i = size_t(c) * kChunk; i < end; ++i)
      values[i] = floatToBf16(float(rng.normal() * stddev));
  });
  return values;
}

Status SyntheticProblem::init(const ModelConfig &config, uint64_t seed) {
  Status status = validateModelConfig(config);
  if (!status.ok())
    return status;
  if (config.vocabSize < 3)
    return Status::error(config.name + ": a synthetic problem needs a "
                                       "vocabulary of at least 3 tokens");
  cfg = config;
  problemSeed = seed;

  int64_t V = cfg.vocabSize, H = cfg.hiddenSize, L = cfg.numTaps();
  size_t tableSize = size_t(V) * size_t(H);
  weights = TargetWeights();
  weights.vocabSize = V;
  weights.hiddenSize = H;
  weights.tied = cfg.tieWordEmbeddings;
  weights.embed = normalBf16(seed, kEmbedStream, tableSize, kEmbedStd);
  if (!weights.tied)
    weights.lmHead = weights.embed;

  Rng chain = Rng::forStream(seed, kChainStream);
  successors.resize(size_t(V));
  for (int32_t &next : successors)
    next = ordinaryToken(chain, cfg);

  Rng projection = Rng::forStream(seed, kProjectionStream);
  permutation.resize(size_t(L * kOffsets * H));
  coefficient.resize(permutation.size());
  for (int64_t block = 0; block < L * kOffsets; ++block) {
    int32_t *perm = permutation.data() + block * H;
    std::iota(perm, perm + H, 0);
    for (int64_t i = H - 1; i > 0; --i) // Fisher-Yates
      std::swap(perm[i], perm[projection.uniform(uint64_t(i + 1))]);
    float weight = kOffsetWeights[block % kOffsets] / float(kEmbedStd);
    for (int64_t h = 0; h < H; ++h)
      coefficient[size_t(block * H + h)] =
          (projection.next() >> 63) ? -weight : weight;
  }
  return Status::success();
}

void SyntheticProblem::generateRow(int64_t index, int32_t *inputIds,
                                   uint8_t *lossMask,
                                   uint16_t *hiddenStates) const {
  int64_t S = cfg.seqLen, H = cfg.hiddenSize, L = cfg.numTaps();
  Rng rng = Rng::forStream(problemSeed, kRowStreamBase + uint64_t(index));

  int64_t prompt = S / 8 + int64_t(rng.uniform(uint64_t(S / 8 + 1)));
  int64_t length = S;
  if (rng.uniform(4) == 0) // padded row: at least two answer tokens
    length = prompt + 2 + int64_t(rng.uniform(uint64_t(S - prompt - 1)));
  length = std::min(length, S);

  int32_t token = ordinaryToken(rng, cfg);
  for (int64_t t = 0; t < S; ++t) {
    if (t >= length) {
      inputIds[t] = 0;
      lossMask[t] = 0;
      continue;
    }
    inputIds[t] = token;
    lossMask[t] = t >= prompt ? 1 : 0;
    token = rng.uniform01() < kSuccessorProbability ? successors[size_t(token)]
                                                    : ordinaryToken(rng, cfg);
  }

  int64_t width = L * H;
  for (int64_t t = 0; t < S; ++t) {
    uint16_t *row = hiddenStates + t * width;
    if (t >= length) {
      std::fill(row, row + width, uint16_t(0));
      continue;
    }
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t h = 0; h < H; ++h) {
        float value = 0;
        for (int64_t j = 0; j < kOffsets; ++j) {
          int64_t ahead = j == 0 ? 0 : cfg.blockSize + j - 1;
          if (t + ahead >= length)
            continue;
          size_t at = size_t((l * kOffsets + j) * H + h);
          const uint16_t *embedRow =
              weights.embed.data() + size_t(inputIds[t + ahead]) * size_t(H);
          value += coefficient[at] * bf16ToFloat(embedRow[permutation[at]]);
        }
        value += kNoise * float(2 * rng.uniform01() - 1);
        row[l * H + h] = floatToBf16(value);
      }
    }
  }
}

void SyntheticProblem::pinnedAnchors(int64_t index, const uint8_t *lossMask,
                                     int32_t *anchors, uint8_t *keep) const {
  Rng rng = Rng::forStream(problemSeed, kAnchorStreamBase + uint64_t(index));
  AnchorSampler sampler(1, cfg.seqLen, cfg.anchorsPerRow);
  sampler.sample(lossMask, nullptr, rng, anchors, keep);
}

std::vector<std::vector<uint16_t>> SyntheticProblem::initialParameters() const {
  return dflash::rt::initialParameters(cfg, problemSeed);
}

void SyntheticRowSource::materialize() {
  const ModelConfig &c = problem.config();
  const size_t S = size_t(c.seqLen), W = size_t(c.contextWidth());
  cachedIds.resize(size_t(rows) * S);
  cachedMask.resize(size_t(rows) * S);
  cachedHidden.resize(size_t(rows) * S * W);
  parallelFor(rows, [&](int64_t i) {
    problem.generateRow(firstRow + i, cachedIds.data() + size_t(i) * S,
                        cachedMask.data() + size_t(i) * S,
                        cachedHidden.data() + size_t(i) * S * W);
  });
  materialized = true;
}

Status SyntheticRowSource::readRow(int64_t index, const RowBuffers &out) const {
  if (index < 0 || index >= rows)
    return Status::error("synthetic data: row " + std::to_string(index) +
                         " is outside [0, " + std::to_string(rows) + ")");
  if (!out.inputIds || !out.lossMask || !out.hiddenStates)
    return Status::error("synthetic data: row " + std::to_string(index) +
                         " needs input_ids, loss_mask and hidden_states "
                         "buffers");
  if (materialized) {
    const ModelConfig &c = problem.config();
    const size_t S = size_t(c.seqLen), W = size_t(c.contextWidth());
    std::copy_n(cachedIds.data() + size_t(index) * S, S, out.inputIds);
    std::copy_n(cachedMask.data() + size_t(index) * S, S, out.lossMask);
    const uint16_t *from = cachedHidden.data() + size_t(index) * S * W;
    const size_t count = S * W;
    parallelFor(parallelChunks(count), [&](int64_t c) {
      size_t begin = size_t(c) * kParallelChunk;
      std::copy_n(from + begin, std::min(kParallelChunk, count - begin),
                  out.hiddenStates + begin);
    });
  } else {
    problem.generateRow(firstRow + index, out.inputIds, out.lossMask,
                        out.hiddenStates);
  }
  if (out.positionIds) // one conversation per row
    std::iota(out.positionIds, out.positionIds + problem.config().seqLen, 0);
  if (pinAnchors && out.anchors && out.keep)
    problem.pinnedAnchors(firstRow + index, out.lossMask, out.anchors,
                          out.keep);
  return Status::success();
}
