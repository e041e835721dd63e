//===- Safetensors.h - Reading and writing safetensors files ----*- C++ -*-===//
//
// The safetensors format: an 8-byte little-endian header length n, n bytes of
// JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}), then the tensor bytes, offsets relative
// to the end of the header. Files are mapped read-only; a tensor view points
// into the mapping. Everything in a header is validated on open, so a view
// can be read without further checks.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_SAFETENSORS_H
#define DFLASH_RUNTIME_SAFETENSORS_H

#include "schema/DType.h"
#include "schema/Status.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dflash::rt {

/// One tensor of a mapped file. `data` may be unaligned when another writer
/// did not align the file; copy with memcpy rather than casting.
struct TensorView {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  const uint8_t *data = nullptr;
  size_t byteSize = 0;
  int64_t numel() const { return shapeNumel(shape); }
};

class SafetensorsFile {
public:
  SafetensorsFile() = default;
  SafetensorsFile(const SafetensorsFile &) = delete;
  SafetensorsFile &operator=(const SafetensorsFile &) = delete;
  SafetensorsFile(SafetensorsFile &&other) noexcept;
  SafetensorsFile &operator=(SafetensorsFile &&other) noexcept;
  ~SafetensorsFile();

  /// Maps and validates `path`: header length within the file, valid JSON,
  /// known dtypes, non-negative shapes, data_offsets whose span matches the
  /// shape and dtype, lie inside the data (else: truncated) and do not
  /// overlap, string-only metadata.
  Status open(const std::string &path);

  const std::string &path() const { return filePath; }
  /// Every tensor, sorted by name.
  const std::vector<TensorView> &tensors() const { return views; }
  /// The tensor called `name`, or null.
  const TensorView *find(const std::string &name) const;
  /// `__metadata__`, empty when absent.
  const std::map<std::string, std::string> &metadata() const { return meta; }

  /// Looks up `name` and checks its dtype and shape, with messages like
  /// "<path>: tensor 'x' has shape [2, 3] but the spec needs [2, 4]".
  Status require(const std::string &name, DType dtype,
                 const std::vector<int64_t> &shape,
                 const TensorView *&view) const;

private:
  void close();
  std::string filePath;
  const uint8_t *mapping = nullptr;
  size_t mappingSize = 0;
  std::vector<TensorView> views;
  std::map<std::string, std::string> meta;
};

/// A tensor to write; `data` holds numel * dtypeSize bytes.
struct TensorData {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  const void *data = nullptr;
};

/// Writes a safetensors file atomically (AtomicFileWriter). Tensors are laid
/// out by element size, largest first, then by name, with the header padded
/// to 8 bytes, so every tensor is aligned to its element size; the data has
/// no holes, as the reference Python implementation requires.
Status
writeSafetensors(const std::string &path,
                 const std::vector<TensorData> &tensors,
                 const std::map<std::string, std::string> &metadata = {});

/// The tensors of a Hugging Face model directory: sharded through
/// `model.safetensors.index.json` (its weight_map names the file of each
/// tensor) or a single `model.safetensors`. Shards are opened on first use.
class ShardedSafetensors {
public:
  Status open(const std::string &dir);

  const std::string &directory() const { return dir; }
  bool contains(const std::string &name) const {
    return fileOfTensor.count(name) != 0;
  }
  /// The file (relative to the directory) that holds `name`; empty if none.
  std::string fileOf(const std::string &name) const;
  /// Sets `view` to the tensor, or to null (with success) when the model has
  /// no tensor of that name. Fails when its shard is broken or lacks it.
  Status find(const std::string &name, const TensorView *&view);

private:
  std::string dir;
  std::map<std::string, std::string> fileOfTensor;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> openFiles;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_SAFETENSORS_H
