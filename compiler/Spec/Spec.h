//===- Spec.h - DFlash drafter spec: parsed, validated, resolved -*- C++ -*-===//
//
// A drafter spec is a TOML file (specs/*.toml) that fixes every shape of one
// DFlash drafter and its training step at compile time. This header is the
// in-memory form after parsing, validation and default resolution; the rules
// follow docs/spec.md and shared SEMANTICS.md. No MLIR here: the runtime tools
// and the compiler both read specs through this library.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_SPEC_SPEC_H
#define DFLASH_COMPILER_SPEC_SPEC_H

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dflash {

/// A position in a spec file (1-based; 0 means "no position").
struct SourceLoc {
  uint32_t line = 0;
  uint32_t column = 0;
};

/// One error found while reading a spec. `key` is the dotted path of the
/// offending entry ("drafter.num_heads"), empty for syntax errors.
struct SpecError {
  std::string file;
  SourceLoc loc;
  std::string message;

  /// "file:line:col: error: message", the form every tool prints.
  std::string str() const;
};

enum class AttentionKind { Full, Sliding };

struct LayerSpec {
  AttentionKind kind = AttentionKind::Full;
  /// Sliding window W (keys at positions p - W + 1 .. p are visible);
  /// 0 for a full layer.
  int64_t window = 0;
};

struct DrafterSpec {
  std::string file; ///< the spec's path as given
  std::string name;

  // [target]
  std::string targetModel;
  int64_t targetNumLayers = 0;
  int64_t targetHiddenSize = 0;
  int64_t vocabSize = 0;
  std::vector<int64_t> targetLayerIds; ///< tapped layers, ascending
  bool targetLayerIdsDefaulted = false;
  bool tieWordEmbeddings = false;

  // [drafter]
  int64_t numLayers = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  double rmsNormEps = 1e-6;
  double ropeTheta = 1e6;
  int64_t blockSize = 0;
  int64_t maskTokenId = 0;
  int64_t maxPositionEmbeddings = 40960;

  // [attention]
  int64_t slidingWindow = 0; ///< 0 when no layer slides
  std::vector<LayerSpec> layers;

  // [training]
  int64_t seqLen = 3072;
  int64_t anchorsPerRow = 512;
  int64_t rowsPerGpu = 4;
  double gamma = 0; ///< loss decay; 0 disables
  bool gammaDefaulted = false;
  int64_t seed = 0;
  double initStd = 0.02;

  // [optimizer]
  double lr = 6e-4;
  double warmupRatio = 0.04;
  double maxGradNorm = 1.0;
  double weightDecay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double adamEps = 1e-8;
  int64_t totalSteps = 10000;

  // [parallel]
  int64_t gpusPerNode = 1;
  int64_t nodes = 1;
  int64_t bucketMiB = 64;
  bool shardOptimizerState = false;

  // [memory]
  double gpuMemoryGiB = 0; ///< 0: no budget given

  /// Where each key was written, by dotted path ("attention.layers.2").
  std::map<std::string, SourceLoc> locations;

  // Derived quantities.
  int64_t numTaps() const { return int64_t(targetLayerIds.size()); }
  int64_t draftLength() const { return anchorsPerRow * blockSize; } ///< Q
  int64_t qDim() const { return numHeads * headDim; }
  int64_t kvDim() const { return numKvHeads * headDim; }

  /// The location of `key`, or of the nearest enclosing table that has one.
  SourceLoc locationOf(const std::string &key) const;
  /// Number of trainable parameters (elements).
  int64_t numParameters() const;
};

/// The default taps of SEMANTICS.md section 7: for `numDraft` drafter layers
/// over a target of `numTarget` layers,
/// ids[i] = round_half_even(1 + i * (numTarget - 4) / (numDraft - 1)).
std::vector<int64_t> defaultTargetLayerIds(int64_t numTarget, int64_t numDraft);

/// The default loss decay gamma for a block size (7 for 16, 5 for 10, 4 for
/// 8; 0, meaning no decay, otherwise).
double defaultGamma(int64_t blockSize);

/// Parses, validates and resolves a spec from TOML text. On failure returns
/// nothing and sets `error` to the first problem found.
std::optional<DrafterSpec> parseSpec(const std::string &text,
                                     const std::string &file, SpecError &error);

/// Reads `path` and parses it.
std::optional<DrafterSpec> loadSpec(const std::string &path, SpecError &error);

/// The spec with every default resolved, as canonical TOML that parses back
/// to the same spec.
std::string printCanonicalSpec(const DrafterSpec &spec);

} // namespace dflash

#endif // DFLASH_COMPILER_SPEC_SPEC_H
