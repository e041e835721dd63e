//===- RuntimeTestSupport.h - Configs, files, rows --------------*- C++ -*-===//
//
// What the runtime tests (test/unit/Runtime*, test/gpu/RuntimeTrainerTest)
// share: the small drafters they run, a temporary directory per test, whole
// files read back, and the row-by-row comparison of two row sources. Host
// code only, so that the runtime tests built without CUDA can include it.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_UNIT_RUNTIMETESTSUPPORT_H
#define DFLASH_TEST_UNIT_RUNTIMETESTSUPPORT_H

#include "runtime/data/RowSource.h"
#include "runtime/io/DirectoryLock.h"
#include "schema/ModelConfig.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/wait.h>
#include <system_error>
#include <unistd.h>
#include <vector>

namespace dflash::runtimetest {

/// One full-attention draft layer, 16 wide (2 query heads, 1 KV head of 8),
/// over a 4-layer target tapped at layers 1 and 2; rows of 32 tokens with 3
/// anchors of 4-token blocks, 2 rows per GPU. Named "unit"; seed, schedule
/// and optimizer keep ModelConfig's defaults: each test sets those it relies
/// on.
inline ModelConfig oneLayerDrafterConfig() {
  ModelConfig c;
  c.name = "unit";
  c.targetModel = "test/target";
  c.targetNumLayers = 4;
  c.targetHiddenSize = c.hiddenSize = 16;
  c.vocabSize = 64;
  c.targetLayerIds = {1, 2};
  c.numLayers = 1;
  c.intermediateSize = 32;
  c.numHeads = 2;
  c.numKvHeads = 1;
  c.headDim = 8;
  c.blockSize = 4;
  c.maskTokenId = 63;
  c.maxPositionEmbeddings = 128;
  c.layerWindows = {0};
  c.seqLen = 32;
  c.anchorsPerRow = 3;
  c.rowsPerGpu = 2;
  return c;
}

/// Two draft layers, a sliding one (window 8) then a full one, 32 wide (4
/// query heads, 2 KV heads of 8), over a 6-layer target tapped at layers 1
/// and 3; rows of 32 tokens with 6 anchors of 4-token blocks, 2 rows per GPU.
/// Named "unit"; everything else keeps ModelConfig's defaults.
inline ModelConfig twoLayerDrafterConfig() {
  ModelConfig c;
  c.name = "unit";
  c.targetModel = "test/target";
  c.targetNumLayers = 6;
  c.targetHiddenSize = 32;
  c.vocabSize = 64;
  c.targetLayerIds = {1, 3};
  c.numLayers = 2;
  c.hiddenSize = 32;
  c.intermediateSize = 48;
  c.numHeads = 4;
  c.numKvHeads = 2;
  c.headDim = 8;
  c.blockSize = 4;
  c.maskTokenId = 63;
  c.maxPositionEmbeddings = 256;
  c.layerWindows = {8, 0};
  c.seqLen = 32;
  c.anchorsPerRow = 6;
  c.rowsPerGpu = 2;
  return c;
}

/// A fresh directory under the system's temporary directory, removed with
/// everything in it when the test ends; `path` is empty if it could not be
/// made. The prefix may name the test binary, so that a directory left behind
/// by a crash says where it came from. Not copyable: a copy would remove the
/// directory under the original.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string &prefix = "dflash-rt") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX"))
            .string();
    path = ::mkdtemp(pattern.data()) ? pattern : std::string();
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string &name) const {
    return path + "/" + name;
  }
};

/// The bytes of the file at `path`; empty if it cannot be read.
inline std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Expects rows [0, rows) of `actual` to equal those of `expected` in every
/// input, pinned anchors and keep flags included; both are shaped by
/// `config`. A row either source cannot read ends the comparison as a fatal
/// failure.
inline void expectSameRows(const rt::RowSource &actual,
                           const rt::RowSource &expected, int64_t rows,
                           const ModelConfig &config) {
  const int64_t S = config.seqLen, N = config.anchorsPerRow,
                LH = config.contextWidth();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> ids(static_cast<size_t>(S)),
        ids2(static_cast<size_t>(S)), anchors(static_cast<size_t>(N)),
        anchors2(static_cast<size_t>(N));
    std::vector<uint8_t> mask(static_cast<size_t>(S)),
        mask2(static_cast<size_t>(S)), keep(static_cast<size_t>(N)),
        keep2(static_cast<size_t>(N));
    std::vector<uint16_t> hidden(size_t(S * LH)), hidden2(size_t(S * LH));
    ASSERT_TRUE(actual
                    .readRow(r, {ids.data(), mask.data(), hidden.data(),
                                 anchors.data(), keep.data()})
                    .ok());
    ASSERT_TRUE(expected
                    .readRow(r, {ids2.data(), mask2.data(), hidden2.data(),
                                 anchors2.data(), keep2.data()})
                    .ok());
    EXPECT_EQ(ids, ids2) << "row " << r;
    EXPECT_EQ(mask, mask2) << "row " << r;
    EXPECT_EQ(hidden, hidden2) << "row " << r;
    EXPECT_EQ(anchors, anchors2) << "row " << r;
    EXPECT_EQ(keep, keep2) << "row " << r;
  }
}

/// A child process holding `dir`'s output lock, as a live `train` would,
/// until killAndReap(); -1 when it could not take the lock.
inline pid_t holdDirectoryLockInChild(const std::string &dir) {
  int ready[2];
  if (::pipe(ready) != 0)
    return -1;
  pid_t child = ::fork();
  if (child == 0) {
    rt::DirectoryLock lock;
    char ok = rt::DirectoryLock::acquire(dir, lock).ok() ? 'y' : 'n';
    (void)!::write(ready[1], &ok, 1);
    while (true)
      ::pause();
  }
  char ok = 'n';
  (void)!::read(ready[0], &ok, 1);
  ::close(ready[0]);
  ::close(ready[1]);
  if (ok == 'y')
    return child;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return -1;
}

/// Ends a child at once, as a crash would (no destructor runs), and reaps it.
inline void killAndReap(pid_t child) {
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

} // namespace dflash::runtimetest

#endif // DFLASH_TEST_UNIT_RUNTIMETESTSUPPORT_H
