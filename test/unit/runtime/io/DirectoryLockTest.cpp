//===- DirectoryLockTest.cpp - One run per output directory ---------------===//
//
// The lock of an output directory: a second holder is refused, naming the
// first; a holder that dies (SIGKILL, no clean-up) leaves no stale lock.
// The other holder is a forked child process, as a second `train` would be.
//
//===----------------------------------------------------------------------===//

#include "runtime/io/DirectoryLock.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;

TEST(RuntimeDirectoryLock, ASecondHolderIsRefusedNamingTheFirst) {
  TempDir dir;
  DirectoryLock first;
  Status s = DirectoryLock::acquire(dir.path, first);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(first.held());
  // flock belongs to the open file: even this process cannot take it twice.
  DirectoryLock second;
  s = DirectoryLock::acquire(dir.path, second);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(second.held());
  const std::string holder = "(process " + std::to_string(::getpid()) + " on ";
  EXPECT_NE(s.message().find("output directory '" + dir.path +
                             "' is in use by another train run " + holder),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(DirectoryLock::checkFree(dir.path).ok());
  first = DirectoryLock(); // released
  EXPECT_TRUE(DirectoryLock::checkFree(dir.path).ok());
  EXPECT_TRUE(DirectoryLock::acquire(dir.path, second).ok());
}

TEST(RuntimeDirectoryLock, AKilledHolderLeavesNoStaleLock) {
  TempDir dir;
  pid_t child = holdDirectoryLockInChild(dir.path);
  ASSERT_GT(child, 0);
  DirectoryLock lock;
  Status s = DirectoryLock::acquire(dir.path, lock);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("(process " + std::to_string(child) + " on "),
            std::string::npos)
      << s.message();
  s = DirectoryLock::checkFree(dir.path);
  EXPECT_FALSE(s.ok());
  killAndReap(child); // no destructor runs: the kernel drops the lock
  s = DirectoryLock::acquire(dir.path, lock);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(RuntimeDirectoryLock, ADirectoryWithoutLockFileIsFree) {
  TempDir dir;
  EXPECT_TRUE(DirectoryLock::checkFree(dir.path).ok());
  DirectoryLock lock;
  Status s = DirectoryLock::acquire(dir.path + "/missing", lock);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir.path +
                             "/missing/.train.lock: cannot create "
                             "the lock file: no such file or directory"),
            std::string::npos)
      << s.message();
}
