//===- Spec.h - The drafter spec: parsed, validated, resolved ---*- C++ -*-===//
//
// A drafter spec is a TOML file (specs/*.toml) that fixes every shape of one
// DFlash drafter and its training step at compile time. This header is the
// in-memory form after parsing, validation and default resolution; the rules
// follow docs/spec.md and docs/semantics.md. No MLIR here: the host tools
// and the compiler both read specs through this library.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_SPEC_SPEC_H
#define DFLASH_COMPILER_SPEC_SPEC_H

#include "schema/ModelConfig.h"

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

/// One error found while reading a spec, or a warning about a spec that is
/// valid but likely not what was meant.
struct SpecError {
  std::string file;
  SourceLoc loc;
  std::string message;
  bool warning = false;

  /// "file:line:col: error: message" (or "warning:"), the form every tool
  /// prints.
  std::string str() const;
};

/// The largest GPU memory budget a spec or `dflashc --gpu-memory` may give.
/// The largest GPUs sold today hold 288 GB; 1024 GiB leaves room for a few
/// generations and still catches a budget written in MiB or GB by mistake
/// (80000 for an 80 GB card), which would otherwise accept any step.
constexpr double kMaxGpuMemoryGiB = 1024;

/// A drafter spec: the model config it fixes (the schema both the compiler
/// and the runtime read), plus what only the compiler needs: where each key
/// was written, which values were defaulted, and how the step is run.
struct DrafterSpec : ModelConfig {
  std::string file; ///< the spec's path as given

  /// [target] path: the target's Hugging Face directory for an online
  /// target, as written (relative to the spec's folder); empty if absent.
  std::string targetPath;
  bool targetLayerIdsDefaulted = false;
  bool gammaDefaulted = false;
  /// [attention] sliding_window: the window of every sliding layer (each
  /// layer's own is in layerWindows); 0 when no layer slides.
  int64_t slidingWindow = 0;

  // [parallel]
  int64_t gpusPerNode = 1;
  int64_t nodes = 1;
  int64_t bucketMiB = 64;
  bool shardOptimizerState = false;

  // [memory]
  double gpuMemoryGiB = 0; ///< 0: no budget given
  /// Recompute the cheap row-wise activations (norms, q/k norm + RoPE,
  /// SwiGLU) in the backward pass instead of keeping them from the forward
  /// (dflash-recompute-activations).
  bool recomputeActivations = false;
  /// Also compute the MLP's gate and up products again (two GEMMs a layer)
  /// before the backward pass reads them (dflash-recompute-activations).
  bool recomputeMlpProducts = false;
  /// The online target's MLP as one GEMM with SwiGLU in its epilogue
  /// (dflash.linear_swiglu): its gate and up products are never stored.
  bool fuseTargetMlp = false;

  /// Where each key was written, by dotted path ("attention.layers.2").
  std::map<std::string, SourceLoc> locations;

  /// What the spec says that is valid but likely not meant (a sliding window
  /// longer than the sequence), for the tools to print beside their output.
  std::vector<SpecError> warnings;

  /// The location of `key`, or of the nearest enclosing table that has one.
  SourceLoc locationOf(const std::string &key) const;
};

/// The default taps of docs/semantics.md section 7: for `numDraft` drafter
/// layers over a target of `numTarget` layers,
/// ids[i] = round_half_even(1 + i * (numTarget - 4) / (numDraft - 1)).
std::vector<int64_t> defaultTargetLayerIds(int64_t numTarget, int64_t numDraft);

/// The default loss decay gamma for a block size (7 for 16, 5 for 10, 4 for
/// 8), or nothing: other block sizes must give `training.gamma`.
std::optional<double> defaultGamma(int64_t blockSize);

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
