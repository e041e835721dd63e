//===- DirectoryLock.h - One run per output directory -----------*- C++ -*-===//
//
// `train` holds an exclusive lock on its output directory for the whole run:
// flock(2) on `<dir>/.train.lock`, which records who holds it. The kernel
// drops the lock when the process ends, however it ends, so a crashed run
// never leaves a stale lock behind; a second run into the same directory,
// or a resume of a directory that a live run holds, is refused at once with
// a message that names the other process.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_IO_DIRECTORYLOCK_H
#define DFLASH_RUNTIME_IO_DIRECTORYLOCK_H

#include "schema/Status.h"

#include <string>

namespace dflash::rt {

/// The lock file inside an output directory.
constexpr const char *kDirectoryLockFile = ".train.lock";

class DirectoryLock {
public:
  DirectoryLock() = default;
  DirectoryLock(DirectoryLock &&other) noexcept;
  DirectoryLock &operator=(DirectoryLock &&other) noexcept;
  DirectoryLock(const DirectoryLock &) = delete;
  DirectoryLock &operator=(const DirectoryLock &) = delete;
  /// Releases the lock (the file stays, unlocked).
  ~DirectoryLock();

  /// Takes the lock of `dir` (an existing directory), recording this
  /// process (pid, host, start time) in its lock file. Fails without
  /// waiting when another process holds it, naming that process, or when
  /// the file cannot be created or locked.
  static Status acquire(const std::string &dir, DirectoryLock &lock);
  /// Succeeds when no live process holds `dir`'s lock (a directory without
  /// a lock file is free); does not keep the lock.
  static Status checkFree(const std::string &dir);

  bool held() const { return fd >= 0; }

private:
  void release();
  int fd = -1;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_IO_DIRECTORYLOCK_H
