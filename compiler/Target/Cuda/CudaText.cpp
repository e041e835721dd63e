//===- CudaText.cpp - C++ text of IR values -------------------------------===//

#include "compiler/Target/Cuda/CudaText.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <cctype>

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace dflash::cuda_printer {

std::string cType(Type elementType) {
  if (elementType.isBF16())
    return "__nv_bfloat16";
  if (elementType.isF32())
    return "float";
  if (elementType.isInteger(32))
    return "int32_t";
  if (elementType.isInteger(8))
    return "uint8_t";
  return "void";
}

RankedTensorType tensorOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}

int64_t rowsOf(Value v) {
  auto t = tensorOf(v);
  return t.getNumElements() / t.getShape().back();
}

std::string formatFloat(double v) {
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%.9g", v);
  if (s.find_first_of(".en") == std::string::npos)
    s += ".0";
  return s + "f";
}

/// A double as a C++ literal that reads back exactly.
std::string doubleText(double v) {
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%.17g", v);
  if (s.find_first_of(".en") == std::string::npos)
    s += ".0";
  return s;
}

std::string quoted(StringRef s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string intList(ArrayRef<int64_t> values) {
  std::string s = "{";
  for (size_t i = 0; i < values.size(); ++i)
    s += (i ? ", " : "") + std::to_string(values[i]);
  return s + "}";
}

/// "specs/tiny.toml:27 layers.0.self_attn", for comments.
std::string describeLoc(Location loc) {
  std::string s;
  llvm::raw_string_ostream os(s);
  if (auto name = dyn_cast<NameLoc>(loc)) {
    if (auto file = dyn_cast<FileLineColLoc>(name.getChildLoc()))
      os << file.getFilename().getValue() << ":" << file.getLine() << " ";
    os << name.getName().getValue();
  } else if (auto file = dyn_cast<FileLineColLoc>(loc)) {
    os << file.getFilename().getValue() << ":" << file.getLine();
  }
  return s;
}

/// A C++ identifier from a name: "layers.0.mlp" -> "layers_0_mlp".
std::string identifier(StringRef name) {
  std::string s;
  for (char c : name)
    s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])))
    s = "v_" + s;
  return s;
}

std::string cppValue(const std::string &v) { return quoted(v); }
std::string cppValue(int64_t v) { return std::to_string(v); }
std::string cppValue(double v) { return doubleText(v); }
std::string cppValue(bool v) { return v ? "true" : "false"; }
std::string cppValue(const std::vector<int64_t> &v) { return intList(v); }

/// The schema's dtype of an element type.
DType dtypeOf(Type elementType) {
  if (elementType.isBF16())
    return DType::BF16;
  if (elementType.isF32())
    return DType::F32;
  if (elementType.isInteger(32))
    return DType::I32;
  return DType::U8;
}

/// The schema's role of a #dflash.arg role.
BufferRole bufferRole(ArgRole role) {
  switch (role) {
  case ArgRole::Input:
    return BufferRole::Input;
  case ArgRole::Frozen:
    return BufferRole::Frozen;
  case ArgRole::Parameter:
    return BufferRole::Parameter;
  case ArgRole::Master:
    return BufferRole::Master;
  case ArgRole::Moment1:
    return BufferRole::Moment1;
  case ArgRole::Moment2:
    return BufferRole::Moment2;
  case ArgRole::Counter:
    return BufferRole::Counter;
  default:
    return BufferRole::Metric;
  }
}

} // namespace dflash::cuda_printer
