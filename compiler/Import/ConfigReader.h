//===- ConfigReader.h - Fields of a config.json, checked ---------*- C++
//-*-===//
//
// What TargetConfig.cpp and TargetConfigHybrid.cpp share: a reader of one
// JSON object's fields that names the file and the field in every error,
// and the readers of the parts the model families share (the router and
// experts of a mixture-of-experts MLP).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_IMPORT_CONFIGREADER_H
#define DFLASH_COMPILER_IMPORT_CONFIGREADER_H

#include "compiler/Import/TargetConfig.h"

#include "llvm/Support/JSON.h"

#include <cmath>
#include <string>

namespace dflash::import {

namespace json = llvm::json;

/// Reads fields of one config object, keeping the first error.
class ConfigReader {
public:
  ConfigReader(const json::Object &object, std::string path, std::string prefix,
               std::string &error)
      : object(object), path(std::move(path)), prefix(std::move(prefix)),
        error(error) {}

  /// "DIR/config.json: 'field' message", the field under its prefix.
  bool fail(const std::string &field, const std::string &message) {
    error = path + ": '" + prefix + field + "' " + message;
    return false;
  }

  /// A positive integer; `fallback` when absent (0: required).
  bool positive(const char *field, int64_t &out, int64_t fallback = 0) {
    const json::Value *v = object.get(field);
    if (!v || v->kind() == json::Value::Null) {
      if (fallback > 0) {
        out = fallback;
        return true;
      }
      return fail(field, "is missing");
    }
    std::optional<int64_t> i = v->getAsInteger();
    if (!i)
      return fail(field, "must be an integer");
    if (*i <= 0)
      return fail(field, "must be positive, got " + std::to_string(*i));
    out = *i;
    return true;
  }

  /// A positive finite number; keeps `out` when absent.
  bool number(const json::Object &from, const std::string &where,
              const char *field, double &out) {
    const json::Value *v = from.get(field);
    if (!v || v->kind() == json::Value::Null)
      return true;
    std::optional<double> d = v->getAsNumber();
    if (!d)
      return fail(where + field, "must be a number");
    if (!std::isfinite(*d) || *d <= 0)
      return fail(where + field, "must be positive and finite");
    out = *d;
    return true;
  }

  /// A boolean; keeps `out` when absent.
  bool boolean(const char *field, bool &out) {
    const json::Value *v = object.get(field);
    if (!v || v->kind() == json::Value::Null)
      return true;
    std::optional<bool> b = v->getAsBoolean();
    if (!b)
      return fail(field, "must be true or false");
    out = *b;
    return true;
  }

  /// Refuses a field that is present and true (a bias the decoders here do
  /// not have).
  bool notTrue(const char *field, const std::string &why) {
    const json::Value *v = object.get(field);
    if (v && v->getAsBoolean().value_or(false))
      return fail(field, "is true: " + why);
    return true;
  }

  const json::Object &object;
  std::string path;
  std::string prefix; ///< "text_config." for a multimodal config
  std::string &error;
};

/// The routed experts of a Qwen3-MoE-style sparse MLP: how many, how many
/// a token, their width, which layers stay dense, and (`sharedExpert`: the
/// Qwen3.5/Qwen3-Next forms) the shared expert's width.
bool readExperts(ConfigReader &r, TargetModelConfig &config, bool sharedExpert);

/// The hybrid Qwen3.5 / Qwen3.6 / Qwen3-Next family (TargetConfigHybrid.cpp):
/// the layer kinds, the Gated DeltaNet's heads, the full-attention layers'
/// partial rotary, and the experts of the MoE forms.
bool readHybrid(ConfigReader &r, TargetModelConfig &config);

} // namespace dflash::import

#endif // DFLASH_COMPILER_IMPORT_CONFIGREADER_H
