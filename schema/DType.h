//===- DType.h - Element types and shapes of step buffers -------*- C++ -*-===//
//
// The element types the step's buffers and the files around it use, named as
// safetensors names them. The compiler prints them into the generated step,
// the runtime checks buffers and files against them.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_SCHEMA_DTYPE_H
#define DFLASH_SCHEMA_DTYPE_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

enum class DType : uint8_t { BF16, F32, F64, I32, I64, U8, BOOL };

/// The safetensors name ("BF16"), which is also the enumerator's name.
const char *dtypeName(DType dtype);
/// Bytes per element.
size_t dtypeSize(DType dtype);
/// Parses a safetensors dtype name; false for any other name.
bool parseDType(const std::string &name, DType &dtype);
/// "[4, 128, 512]".
std::string shapeString(const std::vector<int64_t> &shape);
/// Product of the extents (1 for a scalar).
int64_t shapeNumel(const std::vector<int64_t> &shape);

} // namespace dflash

#endif // DFLASH_SCHEMA_DTYPE_H
