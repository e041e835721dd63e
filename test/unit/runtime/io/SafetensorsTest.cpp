//===- SafetensorsTest.cpp - safetensors reading and writing --------------===//

#include "runtime/io/Safetensors.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
namespace fs = std::filesystem;

namespace {

void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

/// A raw file: length prefix, `header`, `dataBytes` zero bytes.
std::string rawFile(const std::string &header, size_t dataBytes) {
  std::string bytes(8, '\0');
  uint64_t size = header.size();
  for (int i = 0; i < 8; ++i)
    bytes[size_t(i)] = char(size >> (8 * i));
  return bytes + header + std::string(dataBytes, '\0');
}

/// The error message of opening a file with these bytes.
std::string openError(const TempDir &dir, const std::string &bytes) {
  std::string path = dir / "bad.safetensors";
  writeBytes(path, bytes);
  SafetensorsFile file;
  Status status = file.open(path);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(file.tensors().empty());
  return status.message();
}

TEST(RuntimeSafetensors, DTypeNames) {
  DType dtype;
  for (const char *name : {"BF16", "F32", "F64", "I32", "I64", "U8", "BOOL"}) {
    ASSERT_TRUE(parseDType(name, dtype)) << name;
    EXPECT_STREQ(dtypeName(dtype), name);
  }
  EXPECT_FALSE(parseDType("F16", dtype));
  EXPECT_FALSE(parseDType("bf16", dtype));
  EXPECT_EQ(dtypeSize(DType::BF16), 2u);
  EXPECT_EQ(dtypeSize(DType::I64), 8u);
  EXPECT_EQ(shapeString({4, 128, 512}), "[4, 128, 512]");
  EXPECT_EQ(shapeString({}), "[]");
}

TEST(RuntimeSafetensors, RoundTrip) {
  TempDir dir;
  std::vector<uint16_t> bf16 = {0x3f80, 0x4000, 0xc000};
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 4.0f};
  std::vector<double> f64 = {0.125};
  std::vector<int32_t> i32 = {1, -2, 3, -4, 5, -6};
  std::vector<int64_t> i64 = {int64_t(1) << 40, -7};
  std::vector<uint8_t> u8 = {0, 1, 255};
  std::vector<uint8_t> flags = {1, 0};
  std::vector<TensorData> tensors = {
      {"bf16", DType::BF16, {3}, bf16.data()},
      {"f32", DType::F32, {2, 2}, f32.data()},
      {"f64", DType::F64, {}, f64.data()},
      {"i32", DType::I32, {2, 3}, i32.data()},
      {"i64", DType::I64, {2}, i64.data()},
      {"u8", DType::U8, {3}, u8.data()},
      {"bool", DType::BOOL, {2}, flags.data()},
      {"empty", DType::F32, {0, 5}, nullptr},
  };
  std::string path = dir / "round.safetensors";
  ASSERT_TRUE(
      writeSafetensors(path, tensors, {{"k", "v"}, {"x", "[1, 2]"}}).ok());
  // Nothing temporary is left next to it.
  int entries = 0;
  for (auto &entry : fs::directory_iterator(dir.path)) {
    (void)entry;
    ++entries;
  }
  EXPECT_EQ(entries, 1);

  SafetensorsFile file;
  Status status = file.open(path);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(file.tensors().size(), tensors.size());
  EXPECT_EQ(file.metadata().at("k"), "v");
  EXPECT_EQ(file.metadata().at("x"), "[1, 2]");
  for (const TensorData &tensor : tensors) {
    const TensorView *view = file.find(tensor.name);
    ASSERT_TRUE(view) << tensor.name;
    EXPECT_EQ(view->dtype, tensor.dtype);
    EXPECT_EQ(view->shape, tensor.shape);
    size_t bytes = size_t(shapeNumel(tensor.shape)) * dtypeSize(tensor.dtype);
    EXPECT_EQ(view->byteSize, bytes);
    if (bytes) {
      EXPECT_EQ(std::memcmp(view->data, tensor.data, bytes), 0) << tensor.name;
    }
    // The writer aligns every tensor to its element size.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(view->data) % dtypeSize(tensor.dtype),
              0u)
        << tensor.name;
  }
  EXPECT_EQ(file.find("missing"), nullptr);

  // Moving keeps the views valid.
  SafetensorsFile moved = std::move(file);
  EXPECT_EQ(moved.find("f32")->numel(), 4);
  EXPECT_EQ(moved.path(), path);

  // Rewriting replaces the file whole.
  ASSERT_TRUE(writeSafetensors(path, {tensors[0]}).ok());
  SafetensorsFile again;
  ASSERT_TRUE(again.open(path).ok());
  EXPECT_EQ(again.tensors().size(), 1u);
  EXPECT_TRUE(again.metadata().empty());
}

TEST(RuntimeSafetensors, RequireChecksDTypeAndShape) {
  TempDir dir;
  std::vector<float> values(8, 0.0f);
  std::string path = dir / "t.safetensors";
  ASSERT_TRUE(
      writeSafetensors(path, {{"w", DType::F32, {2, 4}, values.data()}}).ok());
  SafetensorsFile file;
  ASSERT_TRUE(file.open(path).ok());
  const TensorView *view = nullptr;
  EXPECT_TRUE(file.require("w", DType::F32, {2, 4}, view).ok());
  EXPECT_EQ(file.require("w", DType::F32, {2, 5}, view).message(),
            path + ": tensor 'w' has shape [2, 4] but the spec needs [2, 5]");
  EXPECT_EQ(file.require("w", DType::BF16, {2, 4}, view).message(),
            path + ": tensor 'w' has dtype F32 but the spec needs BF16");
  EXPECT_EQ(file.require("v", DType::F32, {2, 4}, view).message(),
            path + ": has no tensor 'v'");
}

TEST(RuntimeSafetensors, RejectsShortAndTruncatedFiles) {
  TempDir dir;
  std::string path = dir / "bad.safetensors";
  EXPECT_EQ(openError(dir, "abc"),
            path + ": file is 3 bytes, too short for a safetensors header "
                   "(truncated or not a safetensors file)");
  // The header claims more bytes than the file has.
  std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string whole = rawFile(header, 8);
  EXPECT_NE(openError(dir, whole.substr(0, 20))
                .find("runs past the end of "
                      "the file"),
            std::string::npos);
  // The data is cut short.
  EXPECT_EQ(openError(dir, whole.substr(0, whole.size() - 3)),
            path + ": tensor 'a' has data_offsets [0, 8] past the end of the "
                   "data (5 bytes): the file is truncated");
  // A corrupt length far beyond any header.
  std::string huge(8, '\xff');
  EXPECT_NE(openError(dir, huge + "{}").find("larger than the 100 MiB limit"),
            std::string::npos);
  // A missing file.
  SafetensorsFile file;
  Status status = file.open(dir / "none.safetensors");
  EXPECT_EQ(status.message(), dir / "none.safetensors" +
                                  ": cannot open: no such file or directory");
  // A directory.
  EXPECT_EQ(file.open(dir.path).message(), dir.path + ": not a regular file");
}

TEST(RuntimeSafetensors, RejectsBadHeaders) {
  TempDir dir;
  std::string path = dir / "bad.safetensors";
  auto error = [&](const std::string &header, size_t data) {
    return openError(dir, rawFile(header, data));
  };
  EXPECT_EQ(error("{not json", 0), path + ": header is not valid json");
  EXPECT_EQ(error("[1, 2]", 0), path + ": header is not a json object");
  EXPECT_EQ(error(R"({"a": 3})", 0),
            path + ": tensor 'a': header entry is not a json object");
  EXPECT_EQ(error(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4),
            path + ": tensor 'a' has no 'dtype' string");
  EXPECT_EQ(
      error(R"({"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", 2),
      path + ": tensor 'a' has unsupported dtype 'F16' (supported: "
             "BF16, F32, F64, I32, I64, U8, BOOL)");
  EXPECT_EQ(error(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4),
            path + ": tensor 'a' has no 'shape' list");
  EXPECT_EQ(
      error(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
      path + ": tensor 'a' has a shape entry that is not a non-negative "
             "integer");
  EXPECT_EQ(
      error(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
      path + ": tensor 'a' has a shape entry that is not a non-negative "
             "integer");
  EXPECT_EQ(error(R"({"a":{"dtype":"F32","shape":[1]}})", 4),
            path + ": tensor 'a' has no 'data_offsets' pair of non-negative "
                   "integers");
  EXPECT_EQ(error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", 4),
            path + ": tensor 'a' has no 'data_offsets' pair of non-negative "
                   "integers");
  EXPECT_EQ(
      error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
      path + ": tensor 'a' has data_offsets [4, 0] that end before they "
             "begin");
  // The span disagrees with shape x dtype (a wrong dtype for the data).
  EXPECT_EQ(
      error(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", 8),
      path + ": tensor 'a' has shape [2] of F64 (16 bytes) but "
             "data_offsets [0, 8] span 8 bytes");
  // Offsets beyond the data.
  EXPECT_EQ(
      error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})", 10),
      path + ": tensor 'a' has data_offsets [8, 12] past the end of "
             "the data (10 bytes): the file is truncated");
  // Overlapping tensors.
  EXPECT_EQ(error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                  6),
            path + ": tensors 'a' and 'b' overlap in the data");
  // Overflowing shapes.
  EXPECT_NE(error(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],)"
                  R"("data_offsets":[0,8]}})",
                  8)
                .find("whose size overflows"),
            std::string::npos);
  // Metadata must map strings to strings.
  EXPECT_EQ(error(R"({"__metadata__":{"n":3}})", 0),
            path + ": '__metadata__' entry 'n' is not a string");
  EXPECT_EQ(error(R"({"__metadata__":[1]})", 0),
            path + ": '__metadata__' is not a json object");
}

TEST(RuntimeSafetensors, AcceptsForeignLayouts) {
  TempDir dir;
  // Unpadded header, tensors listed out of order, an empty tensor.
  std::string header =
      R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
      R"("a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
      R"("e":{"dtype":"F32","shape":[0],"data_offsets":[6,6]},)"
      R"("__metadata__":{"format":"pt"}})";
  std::string bytes = rawFile(header, 0) + std::string("\x07\0\0\0\x01\x02", 6);
  std::string path = dir / "foreign.safetensors";
  writeBytes(path, bytes);
  SafetensorsFile file;
  Status status = file.open(path);
  ASSERT_TRUE(status.ok()) << status.message();
  ASSERT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.tensors()[0].name, "a");
  int32_t a;
  std::memcpy(&a, file.find("a")->data, 4);
  EXPECT_EQ(a, 7);
  EXPECT_EQ(file.find("b")->data[1], 2);
  EXPECT_EQ(file.metadata().at("format"), "pt");
}

TEST(RuntimeSafetensors, WriterRejectsBadInput) {
  TempDir dir;
  std::string path = dir / "w.safetensors";
  float value = 1;
  EXPECT_EQ(writeSafetensors(path, {{"a", DType::F32, {1}, &value},
                                    {"a", DType::F32, {1}, &value}})
                .message(),
            path + ": tensor 'a' is given twice");
  EXPECT_EQ(writeSafetensors(path, {{"__metadata__", DType::F32, {1}, &value}})
                .message(),
            path + ": invalid tensor name '__metadata__'");
  EXPECT_EQ(writeSafetensors(path, {{"a", DType::F32, {-1}, &value}}).message(),
            path + ": tensor 'a' has negative shape [-1]");
  EXPECT_EQ(writeSafetensors(path, {{"a", DType::F32, {1}, nullptr}}).message(),
            path + ": tensor 'a' has no data");
  EXPECT_FALSE(fs::exists(path));
  std::string nowhere = dir / "missing/w.safetensors";
  Status status = writeSafetensors(nowhere, {{"a", DType::F32, {1}, &value}});
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.message().rfind(nowhere + ": cannot create", 0), 0u)
      << status.message();
}

TEST(RuntimeSafetensors, WrittenFileIsByteExact) {
  TempDir dir;
  uint8_t data[3] = {1, 2, 3};
  std::string path = dir / "exact.safetensors";
  ASSERT_TRUE(writeSafetensors(path, {{"x", DType::U8, {3}, data}}).ok());
  std::string bytes = readFile(path);
  std::string header =
      R"({"x":{"data_offsets":[0,3],"dtype":"U8","shape":[3]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(bytes, rawFile(header, 0) + "\x01\x02\x03");
}

TEST(RuntimeSafetensors, ShardedDirectory) {
  TempDir dir;
  float a[2] = {1, 2}, b[3] = {3, 4, 5};
  ASSERT_TRUE(writeSafetensors(dir / "model-00001-of-00002.safetensors",
                               {{"a", DType::F32, {2}, a}})
                  .ok());
  ASSERT_TRUE(writeSafetensors(dir / "model-00002-of-00002.safetensors",
                               {{"b", DType::F32, {3}, b}})
                  .ok());
  writeBytes(dir / "model.safetensors.index.json",
             R"({"metadata": {"total_size": 20}, "weight_map": {)"
             R"("a": "model-00001-of-00002.safetensors",)"
             R"("b": "model-00002-of-00002.safetensors",)"
             R"("c": "model-00001-of-00002.safetensors"}})");
  ShardedSafetensors model;
  Status status = model.open(dir.path);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_TRUE(model.contains("b"));
  EXPECT_FALSE(model.contains("z"));
  const TensorView *view = nullptr;
  ASSERT_TRUE(model.find("b", view).ok());
  ASSERT_TRUE(view);
  EXPECT_EQ(view->shape, (std::vector<int64_t>{3}));
  ASSERT_TRUE(model.find("z", view).ok());
  EXPECT_EQ(view, nullptr);
  // The index names a tensor its file lacks.
  EXPECT_EQ(model.find("c", view).message(),
            dir / "model-00001-of-00002.safetensors" +
                ": has no tensor 'c' although model.safetensors.index.json "
                "maps it to this file");

  writeBytes(dir / "model.safetensors.index.json", R"({"weight_map": 3})");
  EXPECT_EQ(model.open(dir.path).message(),
            dir / "model.safetensors.index.json" +
                ": has no 'weight_map' object");
  writeBytes(dir / "model.safetensors.index.json",
             R"({"weight_map": {"a": "/etc/passwd"}})");
  EXPECT_NE(model.open(dir.path).message().find("not a file inside the "
                                                "directory"),
            std::string::npos);
}

TEST(RuntimeSafetensors, SingleFileDirectory) {
  TempDir dir;
  EXPECT_EQ(ShardedSafetensors().open(dir.path).message(),
            dir.path + ": has neither model.safetensors.index.json nor "
                       "model.safetensors");
  EXPECT_EQ(ShardedSafetensors().open(dir / "nothing").message(),
            dir / "nothing" + ": not a directory");
  float a[2] = {1, 2};
  ASSERT_TRUE(
      writeSafetensors(dir / "model.safetensors", {{"a", DType::F32, {2}, a}})
          .ok());
  ShardedSafetensors model;
  ASSERT_TRUE(model.open(dir.path).ok());
  const TensorView *view = nullptr;
  ASSERT_TRUE(model.find("a", view).ok());
  ASSERT_TRUE(view);
  EXPECT_EQ(model.fileOf("a"), "model.safetensors");
}

} // namespace
