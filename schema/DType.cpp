//===- DType.cpp - Element types and shapes -------------------------------===//

#include "schema/DType.h"

using namespace dflash;

namespace {
struct DTypeEntry {
  DType dtype;
  const char *name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::BF16, "BF16", 2}, {DType::F32, "F32", 4}, {DType::F64, "F64", 8},
    {DType::I32, "I32", 4},   {DType::I64, "I64", 8}, {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
};
} // namespace

const char *dflash::dtypeName(DType dtype) {
  for (const DTypeEntry &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry.name;
  return "?";
}

size_t dflash::dtypeSize(DType dtype) {
  for (const DTypeEntry &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry.size;
  return 0;
}

bool dflash::parseDType(const std::string &name, DType &dtype) {
  for (const DTypeEntry &entry : kDTypes)
    if (name == entry.name) {
      dtype = entry.dtype;
      return true;
    }
  return false;
}

std::string dflash::shapeString(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int64_t dflash::shapeNumel(const std::vector<int64_t> &shape) {
  int64_t count = 1;
  for (int64_t extent : shape)
    count *= extent;
  return count;
}
