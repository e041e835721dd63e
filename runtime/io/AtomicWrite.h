//===- AtomicWrite.h - Files and directories that appear whole --*- C++ -*-===//
//
// Checkpoints and data are written so that a crash or a full disk never
// leaves a half-written file or directory under the final name, and an
// existing good one is only replaced once its successor is complete: files go
// to `<path>.tmp-<pid>`, are fsynced and renamed; directories are built under
// `<dir>.tmp-<pid>` and swapped in with one rename.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_ATOMICWRITE_H
#define DFLASH_RUNTIME_ATOMICWRITE_H

#include "schema/Status.h"

#include <cstddef>
#include <string>

namespace dflash::rt {

/// Writes one file through a temporary sibling. Without commit() the
/// temporary is removed and `path` is untouched.
class AtomicFileWriter {
public:
  AtomicFileWriter() = default;
  AtomicFileWriter(const AtomicFileWriter &) = delete;
  AtomicFileWriter &operator=(const AtomicFileWriter &) = delete;
  ~AtomicFileWriter();

  Status begin(const std::string &path);
  Status write(const void *data, size_t size);
  /// fsync, rename over `path`, fsync the parent directory.
  Status commit();

private:
  void discard();
  std::string finalPath, tempPath;
  int fd = -1;
};

/// Writes `contents` to `path` atomically.
Status writeFileAtomically(const std::string &path,
                           const std::string &contents);

/// Reads a whole (small) file.
Status readTextFile(const std::string &path, std::string &contents);

/// strerror(code) in the lower case the runtime's messages use.
std::string systemError(int code);

/// A directory built under a temporary name and moved to its final name by
/// commit(). An existing directory of that name stays intact until the new
/// one is complete; it is then swapped out atomically (renameat2 exchange,
/// or two renames where the file system lacks it) and deleted. Without
/// commit() the temporary directory is deleted.
class StagedDirectory {
public:
  StagedDirectory() = default;
  StagedDirectory(const StagedDirectory &) = delete;
  StagedDirectory &operator=(const StagedDirectory &) = delete;
  ~StagedDirectory();

  /// Creates `<finalDir>.tmp-<pid>` (and the parents of finalDir).
  Status begin(const std::string &finalDir);
  /// Where to write the files.
  const std::string &path() const { return tempDir; }
  Status commit();

private:
  std::string finalDir, tempDir;
  bool active = false;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_ATOMICWRITE_H
