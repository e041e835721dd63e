//===- CudaText.h - C++ text of IR values -----------------------*- C++ -*-===//
//
// The CUDA printer's small text helpers: literals, identifiers, types.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_TARGET_CUDA_CUDATEXT_H
#define DFLASH_COMPILER_TARGET_CUDA_CUDATEXT_H

#include "dialect/DFlashOps.h"
#include "schema/DType.h"
#include "schema/StepBuffers.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/Value.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::cuda_printer {

/// The C type of an element type ("__nv_bfloat16", "float", ...).
std::string cType(mlir::Type elementType);
mlir::RankedTensorType tensorOf(mlir::Value v);
/// Elements over the last dimension.
int64_t rowsOf(mlir::Value v);
/// A float as a C++ float literal ("0.5f").
std::string formatFloat(double v);
/// A double as a C++ literal that reads back exactly.
std::string doubleText(double v);
/// A C++ string literal.
std::string quoted(llvm::StringRef s);
/// "{1, 2, 3}".
std::string intList(llvm::ArrayRef<int64_t> values);
/// "specs/tiny.toml:27 layers.0.self_attn", for comments.
std::string describeLoc(mlir::Location loc);
/// A C++ identifier from a name: "layers.0.mlp" -> "layers_0_mlp".
std::string identifier(llvm::StringRef name);
/// A value as a C++ literal of its type.
std::string cppValue(const std::string &v);
std::string cppValue(int64_t v);
std::string cppValue(double v);
std::string cppValue(bool v);
std::string cppValue(const std::vector<int64_t> &v);
/// The schema's dtype of an element type.
DType dtypeOf(mlir::Type elementType);
/// The schema's role of a #dflash.arg role.
BufferRole bufferRole(mlir::dflash::ArgRole role);

} // namespace dflash::cuda_printer

#endif // DFLASH_COMPILER_TARGET_CUDA_CUDATEXT_H
