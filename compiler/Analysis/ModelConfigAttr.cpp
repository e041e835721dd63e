//===- ModelConfigAttr.cpp - The drafter's config on the module -----------===//

#include "compiler/Analysis/ModelConfigAttr.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;

namespace {

Attribute toAttr(Builder &b, const std::string &v) {
  return b.getStringAttr(v);
}
Attribute toAttr(Builder &b, int64_t v) { return b.getI64IntegerAttr(v); }
Attribute toAttr(Builder &b, double v) { return b.getF64FloatAttr(v); }
Attribute toAttr(Builder &b, bool v) { return b.getBoolAttr(v); }
Attribute toAttr(Builder &b, const std::vector<int64_t> &v) {
  return b.getDenseI64ArrayAttr(v);
}

bool fromAttr(Attribute a, std::string &v) {
  auto s = dyn_cast_or_null<StringAttr>(a);
  if (s)
    v = s.getValue().str();
  return bool(s);
}
bool fromAttr(Attribute a, int64_t &v) {
  auto i = dyn_cast_or_null<IntegerAttr>(a);
  if (i && i.getType().isInteger(64))
    v = i.getInt();
  return i && i.getType().isInteger(64);
}
bool fromAttr(Attribute a, double &v) {
  auto f = dyn_cast_or_null<FloatAttr>(a);
  if (f)
    v = f.getValueAsDouble();
  return bool(f);
}
bool fromAttr(Attribute a, bool &v) {
  auto b = dyn_cast_or_null<BoolAttr>(a);
  if (b)
    v = b.getValue();
  return bool(b);
}
bool fromAttr(Attribute a, std::vector<int64_t> &v) {
  auto d = dyn_cast_or_null<DenseI64ArrayAttr>(a);
  if (d)
    v.assign(d.asArrayRef().begin(), d.asArrayRef().end());
  return bool(d);
}

} // namespace

DictionaryAttr dflash::modelConfigToAttr(MLIRContext *context,
                                         const ModelConfig &config) {
  Builder b(context);
  SmallVector<NamedAttribute> fields;
  forEachModelConfigField(
      config, [&](const char *key, const char *, const auto &value) {
        fields.push_back(b.getNamedAttr(key, toAttr(b, value)));
      });
  return b.getDictionaryAttr(fields);
}

FailureOr<dflash::ModelConfig> dflash::modelConfigOf(ModuleOp module) {
  auto dict = module->getAttrOfType<DictionaryAttr>(kModelConfigAttrName);
  if (!dict)
    return module.emitError() << "the module has no '" << kModelConfigAttrName
                              << "' attribute: it was not imported from a spec";
  ModelConfig config;
  std::string bad;
  forEachModelConfigField(config,
                          [&](const char *key, const char *, auto &value) {
                            if (bad.empty() && !fromAttr(dict.get(key), value))
                              bad = key;
                          });
  if (!bad.empty())
    return module.emitError()
           << "'" << kModelConfigAttrName << "' has no field '" << bad
           << "' of the schema's type";
  return config;
}

std::string dflash::specFileOf(ModuleOp module) {
  Location loc = module.getLoc();
  if (auto name = dyn_cast<NameLoc>(loc))
    loc = name.getChildLoc();
  if (auto file = dyn_cast<FileLineColLoc>(loc))
    return file.getFilename().str();
  return "";
}
