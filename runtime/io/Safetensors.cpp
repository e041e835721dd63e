//===- Safetensors.cpp - Reading and writing safetensors files ------------===//

#include "runtime/io/Safetensors.h"

#include "runtime/io/AtomicWrite.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace dflash;
using namespace dflash::rt;
using json = nlohmann::json;

namespace {
/// Headers larger than this are refused before parsing (the reference
/// implementation's limit), so a corrupt length cannot exhaust memory.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
} // namespace

/// A non-negative JSON integer that fits in int64.
static bool readCount(const json &value, uint64_t &out) {
  if (value.is_number_unsigned()) {
    out = value.get<uint64_t>();
    return out <= uint64_t(INT64_MAX);
  }
  if (value.is_number_integer()) {
    int64_t signedValue = value.get<int64_t>();
    if (signedValue < 0)
      return false;
    out = uint64_t(signedValue);
    return true;
  }
  return false;
}

//===----------------------------------------------------------------------===//
// SafetensorsFile
//===----------------------------------------------------------------------===//

SafetensorsFile::SafetensorsFile(SafetensorsFile &&other) noexcept {
  *this = std::move(other);
}

SafetensorsFile &SafetensorsFile::operator=(SafetensorsFile &&other) noexcept {
  if (this != &other) {
    close();
    filePath = std::move(other.filePath);
    mapping = other.mapping;
    mappingSize = other.mappingSize;
    views = std::move(other.views);
    meta = std::move(other.meta);
    other.mapping = nullptr;
    other.mappingSize = 0;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { close(); }

void SafetensorsFile::close() {
  if (mapping)
    ::munmap(const_cast<uint8_t *>(mapping), mappingSize);
  mapping = nullptr;
  mappingSize = 0;
  views.clear();
  meta.clear();
}

Status SafetensorsFile::open(const std::string &path) {
  close();
  filePath = path;
  auto fail = [&](const std::string &what) {
    close();
    return Status::error(path + ": " + what);
  };

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fail("cannot open: " + systemError(errno));
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    int code = errno;
    ::close(fd);
    return fail("cannot stat: " + systemError(code));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return fail("not a regular file");
  }
  size_t fileSize = size_t(info.st_size);
  if (fileSize < 8) {
    ::close(fd);
    return fail("file is " + std::to_string(fileSize) +
                " bytes, too short for a safetensors header (truncated or "
                "not a safetensors file)");
  }
  void *address = ::mmap(nullptr, fileSize, PROT_READ, MAP_PRIVATE, fd, 0);
  int mapError = errno;
  ::close(fd);
  if (address == MAP_FAILED)
    return fail("cannot map: " + systemError(mapError));
  mapping = static_cast<const uint8_t *>(address);
  mappingSize = fileSize;

  uint64_t headerSize = 0;
  for (int i = 7; i >= 0; --i)
    headerSize = (headerSize << 8) | mapping[i];
  if (headerSize > kMaxHeaderBytes)
    return fail("header length " + std::to_string(headerSize) +
                " is larger than the 100 MiB limit (corrupt or not a "
                "safetensors file)");
  if (headerSize > fileSize - 8)
    return fail("header length " + std::to_string(headerSize) +
                " runs past the end of the file (" + std::to_string(fileSize) +
                " bytes): the file is truncated");

  const char *headerBegin = reinterpret_cast<const char *>(mapping + 8);
  json header = json::parse(headerBegin, headerBegin + headerSize, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded())
    return fail("header is not valid json");
  if (!header.is_object())
    return fail("header is not a json object");

  const uint8_t *dataBegin = mapping + 8 + headerSize;
  uint64_t dataSize = fileSize - 8 - headerSize;
  struct Extent {
    uint64_t begin, end;
    size_t view;
  };
  std::vector<Extent> extents;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string &name = it.key();
    const json &entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object())
        return fail("'__metadata__' is not a json object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string())
          return fail("'__metadata__' entry '" + m.key() + "' is not a string");
        meta[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    std::string tensor = "tensor '" + name + "'";
    if (!entry.is_object())
      return fail(tensor + ": header entry is not a json object");

    auto dtypeIt = entry.find("dtype");
    if (dtypeIt == entry.end() || !dtypeIt->is_string())
      return fail(tensor + " has no 'dtype' string");
    TensorView view;
    view.name = name;
    std::string dtype = dtypeIt->get<std::string>();
    if (!parseDType(dtype, view.dtype))
      return fail(tensor + " has unsupported dtype '" + dtype +
                  "' (supported: BF16, F32, F64, I32, I64, U8, BOOL)");

    auto shapeIt = entry.find("shape");
    if (shapeIt == entry.end() || !shapeIt->is_array())
      return fail(tensor + " has no 'shape' list");
    uint64_t byteCount = dtypeSize(view.dtype);
    for (const json &extent : *shapeIt) {
      uint64_t value;
      if (!readCount(extent, value))
        return fail(tensor + " has a shape entry that is not a "
                             "non-negative integer");
      view.shape.push_back(int64_t(value));
      if (__builtin_mul_overflow(byteCount, value, &byteCount))
        return fail(tensor + " has shape " + shapeString(view.shape) +
                    " whose size overflows");
    }

    auto offsetsIt = entry.find("data_offsets");
    uint64_t begin = 0, end = 0;
    if (offsetsIt == entry.end() || !offsetsIt->is_array() ||
        offsetsIt->size() != 2 || !readCount((*offsetsIt)[0], begin) ||
        !readCount((*offsetsIt)[1], end))
      return fail(tensor + " has no 'data_offsets' pair of non-negative "
                           "integers");
    std::string offsets =
        "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (end < begin)
      return fail(tensor + " has data_offsets " + offsets +
                  " that end before they begin");
    if (end - begin != byteCount)
      return fail(tensor + " has shape " + shapeString(view.shape) + " of " +
                  dtype + " (" + std::to_string(byteCount) +
                  " bytes) but data_offsets " + offsets + " span " +
                  std::to_string(end - begin) + " bytes");
    if (end > dataSize)
      return fail(tensor + " has data_offsets " + offsets +
                  " past the end of the data (" + std::to_string(dataSize) +
                  " bytes): the file is truncated");
    view.data = dataBegin + begin;
    view.byteSize = size_t(byteCount);
    extents.push_back({begin, end, views.size()});
    views.push_back(std::move(view));
  }

  std::sort(extents.begin(), extents.end(),
            [](const Extent &a, const Extent &b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t reachedEnd = 0;
  size_t reachedBy = 0;
  for (const Extent &extent : extents) {
    if (extent.begin == extent.end)
      continue; // empty tensors occupy no bytes
    if (extent.begin < reachedEnd)
      return fail("tensors '" + views[reachedBy].name + "' and '" +
                  views[extent.view].name + "' overlap in the data");
    reachedEnd = extent.end;
    reachedBy = extent.view;
  }
  // The json object iterates in key order, so views are sorted by name.
  return Status::success();
}

const TensorView *SafetensorsFile::find(const std::string &name) const {
  auto it =
      std::lower_bound(views.begin(), views.end(), name,
                       [](const TensorView &view, const std::string &key) {
                         return view.name < key;
                       });
  if (it == views.end() || it->name != name)
    return nullptr;
  return &*it;
}

Status SafetensorsFile::require(const std::string &name, DType dtype,
                                const std::vector<int64_t> &shape,
                                const TensorView *&view) const {
  view = find(name);
  if (!view)
    return Status::error(filePath + ": has no tensor '" + name + "'");
  if (view->dtype != dtype)
    return Status::error(filePath + ": tensor '" + name + "' has dtype " +
                         dtypeName(view->dtype) + " but the spec needs " +
                         dtypeName(dtype));
  if (view->shape != shape)
    return Status::error(filePath + ": tensor '" + name + "' has shape " +
                         shapeString(view->shape) + " but the spec needs " +
                         shapeString(shape));
  return Status::success();
}

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

Status dflash::rt::writeSafetensors(
    const std::string &path, const std::vector<TensorData> &tensors,
    const std::map<std::string, std::string> &metadata) {
  std::vector<const TensorData *> order;
  for (const TensorData &tensor : tensors) {
    if (tensor.name.empty() || tensor.name == "__metadata__")
      return Status::error(path + ": invalid tensor name '" + tensor.name +
                           "'");
    for (int64_t extent : tensor.shape)
      if (extent < 0)
        return Status::error(path + ": tensor '" + tensor.name +
                             "' has negative shape " +
                             shapeString(tensor.shape));
    if (!tensor.data && shapeNumel(tensor.shape) > 0)
      return Status::error(path + ": tensor '" + tensor.name + "' has no data");
    order.push_back(&tensor);
  }
  std::sort(order.begin(), order.end(),
            [](const TensorData *a, const TensorData *b) {
              size_t sa = dtypeSize(a->dtype), sb = dtypeSize(b->dtype);
              return sa != sb ? sa > sb : a->name < b->name;
            });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->name == order[i - 1]->name)
      return Status::error(path + ": tensor '" + order[i]->name +
                           "' is given twice");

  json header = json::object();
  uint64_t offset = 0;
  for (const TensorData *tensor : order) {
    uint64_t bytes =
        uint64_t(shapeNumel(tensor->shape)) * dtypeSize(tensor->dtype);
    header[tensor->name] = {{"dtype", dtypeName(tensor->dtype)},
                            {"shape", tensor->shape},
                            {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  std::string text =
      header.dump(-1, ' ', false, json::error_handler_t::replace);
  // Pad with spaces so that the data, and each tensor in it, is aligned.
  text.append((8 - (text.size() + 8) % 8) % 8, ' ');

  uint8_t length[8];
  uint64_t headerSize = text.size();
  for (int i = 0; i < 8; ++i)
    length[i] = uint8_t(headerSize >> (8 * i));

  AtomicFileWriter writer;
  Status status = writer.begin(path);
  if (status.ok())
    status = writer.write(length, sizeof(length));
  if (status.ok())
    status = writer.write(text.data(), text.size());
  for (const TensorData *tensor : order) {
    if (!status.ok())
      break;
    size_t bytes = size_t(shapeNumel(tensor->shape)) * dtypeSize(tensor->dtype);
    status = writer.write(tensor->data, bytes);
  }
  if (status.ok())
    status = writer.commit();
  return status;
}

//===----------------------------------------------------------------------===//
// ShardedSafetensors
//===----------------------------------------------------------------------===//

Status ShardedSafetensors::open(const std::string &directory) {
  dir = directory;
  fileOfTensor.clear();
  openFiles.clear();
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::error(dir + ": not a directory");

  std::string indexPath = dir + "/model.safetensors.index.json";
  if (fs::exists(indexPath, ec)) {
    std::string text;
    Status read = readTextFile(indexPath, text);
    if (!read.ok())
      return read;
    json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object())
      return Status::error(indexPath + ": not a json object");
    auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object())
      return Status::error(indexPath + ": has no 'weight_map' object");
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it.value().is_string())
        return Status::error(indexPath + ": 'weight_map' entry '" + it.key() +
                             "' is not a file name");
      std::string file = it.value().get<std::string>();
      if (file.empty() || file[0] == '/' || file.find("..") != file.npos)
        return Status::error(indexPath + ": 'weight_map' entry '" + it.key() +
                             "' names '" + file +
                             "', not a file inside the directory");
      fileOfTensor[it.key()] = file;
    }
    return Status::success();
  }

  std::string single = dir + "/model.safetensors";
  if (!fs::exists(single, ec))
    return Status::error(dir + ": has neither model.safetensors.index.json "
                               "nor model.safetensors");
  auto file = std::make_unique<SafetensorsFile>();
  Status opened = file->open(single);
  if (!opened.ok())
    return opened;
  for (const TensorView &view : file->tensors())
    fileOfTensor[view.name] = "model.safetensors";
  openFiles["model.safetensors"] = std::move(file);
  return Status::success();
}

std::string ShardedSafetensors::fileOf(const std::string &name) const {
  auto it = fileOfTensor.find(name);
  return it == fileOfTensor.end() ? std::string() : it->second;
}

Status ShardedSafetensors::find(const std::string &name,
                                const TensorView *&view) {
  view = nullptr;
  auto it = fileOfTensor.find(name);
  if (it == fileOfTensor.end())
    return Status::success();
  std::unique_ptr<SafetensorsFile> &file = openFiles[it->second];
  if (!file) {
    auto opened = std::make_unique<SafetensorsFile>();
    Status status = opened->open(dir + "/" + it->second);
    if (!status.ok()) {
      openFiles.erase(it->second);
      return status;
    }
    file = std::move(opened);
  }
  view = file->find(name);
  if (!view)
    return Status::error(file->path() + ": has no tensor '" + name +
                         "' although model.safetensors.index.json maps it "
                         "to this file");
  return Status::success();
}
