//===- DirectoryLock.cpp - One run per output directory -------------------===//

#include "runtime/io/DirectoryLock.h"

#include "runtime/io/AtomicWrite.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

using namespace dflash;
using namespace dflash::rt;

namespace {

std::string lockPath(const std::string &dir) {
  return dir + "/" + kDirectoryLockFile;
}

/// What the holder wrote into the lock file, on one line.
std::string holderOf(int fd) {
  char buffer[512];
  ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
  if (n <= 0)
    return "a process that has not written its name yet";
  std::string text(buffer, size_t(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  for (char &c : text)
    if (c == '\n')
      c = ',';
  return text;
}

/// Opens the lock file and tries to lock it: 1 when locked, 0 when another
/// process holds it (the file stays open in `fd`), -1 on an error.
int tryLock(const std::string &dir, int &fd, std::string &error) {
  const std::string path = lockPath(dir);
  fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = path + ": cannot create the lock file: " + systemError(errno);
    return -1;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0)
    return 1;
  if (errno == EWOULDBLOCK)
    return 0;
  error = path + ": cannot lock: " + systemError(errno);
  ::close(fd);
  fd = -1;
  return -1;
}

std::string heldMessage(const std::string &dir, int fd) {
  return "output directory '" + dir + "' is in use by another train run (" +
         holderOf(fd) +
         "): wait for it to end, or give another --out; a directory that "
         "a live run holds cannot be resumed either";
}

} // namespace

DirectoryLock::DirectoryLock(DirectoryLock &&other) noexcept : fd(other.fd) {
  other.fd = -1;
}

DirectoryLock &DirectoryLock::operator=(DirectoryLock &&other) noexcept {
  if (this != &other) {
    release();
    fd = other.fd;
    other.fd = -1;
  }
  return *this;
}

DirectoryLock::~DirectoryLock() { release(); }

void DirectoryLock::release() {
  if (fd >= 0)
    ::close(fd); // closing the descriptor drops the flock
  fd = -1;
}

Status DirectoryLock::acquire(const std::string &dir, DirectoryLock &lock) {
  int fd = -1;
  std::string error;
  int locked = tryLock(dir, fd, error);
  if (locked < 0)
    return Status::error(error);
  if (locked == 0) {
    std::string message = heldMessage(dir, fd);
    ::close(fd);
    return Status::error(message);
  }
  // Who holds it, for the message a second run gets.
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  std::time_t now = std::time(nullptr);
  char started[64] = "?";
  std::strftime(started, sizeof(started), "%Y-%m-%d %H:%M:%S UTC",
                std::gmtime(&now));
  std::string text = "process " + std::to_string(::getpid()) + " on " + host +
                     ", started " + started + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, text.data(), text.size(), 0) != ssize_t(text.size())) {
    int code = errno;
    ::close(fd);
    return Status::error(lockPath(dir) +
                         ": cannot write the lock file: " + systemError(code));
  }
  lock.release();
  lock.fd = fd;
  return Status::success();
}

Status DirectoryLock::checkFree(const std::string &dir) {
  if (::access(lockPath(dir).c_str(), F_OK) != 0)
    return Status::success();
  int fd = -1;
  std::string error;
  int locked = tryLock(dir, fd, error);
  if (locked < 0)
    return Status::error(error);
  Status status =
      locked == 1 ? Status::success() : Status::error(heldMessage(dir, fd));
  ::close(fd);
  return status;
}
