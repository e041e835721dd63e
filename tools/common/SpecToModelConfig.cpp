//===- SpecToModelConfig.cpp - A parsed spec as a runtime config ----------===//

#include "tools/common/SpecToModelConfig.h"

using namespace dflash;

rt::ModelConfig dflash::modelConfigFromSpec(const DrafterSpec &spec) {
  rt::ModelConfig config;
  config.name = spec.name;
  config.targetModel = spec.targetModel;
  config.targetNumLayers = spec.targetNumLayers;
  config.targetHiddenSize = spec.targetHiddenSize;
  config.vocabSize = spec.vocabSize;
  config.targetLayerIds = spec.targetLayerIds;
  config.tieWordEmbeddings = spec.tieWordEmbeddings;

  config.numLayers = spec.numLayers;
  config.hiddenSize = spec.hiddenSize;
  config.intermediateSize = spec.intermediateSize;
  config.numHeads = spec.numHeads;
  config.numKvHeads = spec.numKvHeads;
  config.headDim = spec.headDim;
  config.rmsNormEps = spec.rmsNormEps;
  config.ropeTheta = spec.ropeTheta;
  config.blockSize = spec.blockSize;
  config.maskTokenId = spec.maskTokenId;
  config.maxPositionEmbeddings = spec.maxPositionEmbeddings;
  for (const LayerSpec &layer : spec.layers)
    config.layerWindows.push_back(
        layer.kind == AttentionKind::Sliding ? layer.window : 0);

  config.seqLen = spec.seqLen;
  config.anchorsPerRow = spec.anchorsPerRow;
  config.rowsPerGpu = spec.rowsPerGpu;
  config.gamma = spec.gamma;
  config.seed = spec.seed;
  config.initStd = spec.initStd;

  config.lr = spec.lr;
  config.warmupRatio = spec.warmupRatio;
  config.maxGradNorm = spec.maxGradNorm;
  config.weightDecay = spec.weightDecay;
  config.beta1 = spec.beta1;
  config.beta2 = spec.beta2;
  config.adamEps = spec.adamEps;
  config.totalSteps = spec.totalSteps;
  return config;
}
