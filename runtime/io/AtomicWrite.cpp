//===- AtomicWrite.cpp - Files and directories that appear whole ----------===//

#include "runtime/io/AtomicWrite.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;

std::string dflash::rt::systemError(int code) {
  std::string text = std::strerror(code);
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z')
    text[0] = char(text[0] - 'A' + 'a');
  return text;
}

static std::string withoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  return path;
}

static std::string parentOf(const std::string &path) {
  std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

/// fsync a directory so that a rename inside it survives a crash.
static Status syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return Status::error(
        dir + ": cannot open directory to sync it: " + systemError(errno));
  int rc = ::fsync(fd);
  int code = errno;
  ::close(fd);
  // Some file systems cannot fsync directories; the data is already synced.
  if (rc != 0 && code != EINVAL && code != EROFS)
    return Status::error(dir + ": cannot sync directory: " + systemError(code));
  return Status::success();
}

AtomicFileWriter::~AtomicFileWriter() { discard(); }

void AtomicFileWriter::discard() {
  if (fd >= 0) {
    ::close(fd);
    fd = -1;
  }
  if (!tempPath.empty()) {
    ::unlink(tempPath.c_str());
    tempPath.clear();
  }
}

Status AtomicFileWriter::begin(const std::string &path) {
  discard();
  finalPath = path;
  tempPath = path + ".tmp-" + std::to_string(::getpid());
  fd = ::open(tempPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int code = errno;
    tempPath.clear();
    return Status::error(path + ": cannot create '" + path + ".tmp-" +
                         std::to_string(::getpid()) +
                         "': " + systemError(code));
  }
  return Status::success();
}

Status AtomicFileWriter::write(const void *data, size_t size) {
  if (fd < 0)
    return Status::error(finalPath + ": write without an open file");
  const char *bytes = static_cast<const char *>(data);
  while (size > 0) {
    size_t chunk = size < (size_t(1) << 30) ? size : (size_t(1) << 30);
    ssize_t written = ::write(fd, bytes, chunk);
    if (written < 0) {
      if (errno == EINTR)
        continue;
      int code = errno;
      discard();
      return Status::error(finalPath + ": write failed: " + systemError(code));
    }
    bytes += written;
    size -= size_t(written);
  }
  return Status::success();
}

Status AtomicFileWriter::commit() {
  if (fd < 0)
    return Status::error(finalPath + ": commit without an open file");
  if (::fsync(fd) != 0) {
    int code = errno;
    discard();
    return Status::error(finalPath + ": fsync failed: " + systemError(code));
  }
  if (::close(fd) != 0) {
    fd = -1;
    int code = errno;
    discard();
    return Status::error(finalPath + ": close failed: " + systemError(code));
  }
  fd = -1;
  if (::rename(tempPath.c_str(), finalPath.c_str()) != 0) {
    int code = errno;
    discard();
    return Status::error(finalPath +
                         ": cannot rename the temporary file "
                         "into place: " +
                         systemError(code));
  }
  tempPath.clear();
  return syncDirectory(parentOf(finalPath));
}

Status dflash::rt::writeFileAtomically(const std::string &path,
                                       const std::string &contents) {
  AtomicFileWriter writer;
  Status status = writer.begin(path);
  if (status.ok())
    status = writer.write(contents.data(), contents.size());
  if (status.ok())
    status = writer.commit();
  return status;
}

Status dflash::rt::readTextFile(const std::string &path,
                                std::string &contents) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error(path + ": cannot open: " + systemError(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad())
    return Status::error(path + ": read failed");
  contents = buffer.str();
  return Status::success();
}

StagedDirectory::~StagedDirectory() {
  if (active) {
    std::error_code ec;
    fs::remove_all(tempDir, ec);
  }
}

Status StagedDirectory::begin(const std::string &dir) {
  if (active)
    return Status::error(tempDir + ": staged directory begun twice");
  finalDir = withoutTrailingSlashes(dir);
  tempDir = finalDir + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  if (fs::exists(finalDir, ec) && !fs::is_directory(finalDir, ec))
    return Status::error(finalDir + ": exists and is not a directory");
  fs::create_directories(parentOf(finalDir), ec);
  if (ec)
    return Status::error(parentOf(finalDir) +
                         ": cannot create directory: " + ec.message());
  // A leftover of an earlier crashed run of a process with our pid.
  fs::remove_all(tempDir, ec);
  if (!fs::create_directory(tempDir, ec) || ec)
    return Status::error(tempDir + ": cannot create directory: " +
                         (ec ? ec.message() : std::string("already exists")));
  active = true;
  return Status::success();
}

Status StagedDirectory::commit() {
  if (!active)
    return Status::error(finalDir + ": commit without a staged directory");
  Status synced = syncDirectory(tempDir);
  if (!synced.ok())
    return synced;
  std::error_code ec;
  bool replacing = fs::exists(finalDir, ec);
  if (!replacing) {
    if (::rename(tempDir.c_str(), finalDir.c_str()) != 0)
      return Status::error(finalDir + ": cannot rename '" + tempDir +
                           "' into place: " + systemError(errno));
    active = false;
    return syncDirectory(parentOf(finalDir));
  }
  // Swap old and new in one step; the old contents end up under tempDir.
  if (::renameat2(AT_FDCWD, tempDir.c_str(), AT_FDCWD, finalDir.c_str(),
                  RENAME_EXCHANGE) == 0) {
    fs::remove_all(tempDir, ec);
    active = false;
    return syncDirectory(parentOf(finalDir));
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    return Status::error(finalDir + ": cannot swap in '" + tempDir +
                         "': " + systemError(errno));
  // No exchange on this file system: move the old one aside first. A crash
  // between the renames leaves both complete directories on disk.
  std::string oldDir = finalDir + ".old-" + std::to_string(::getpid());
  fs::remove_all(oldDir, ec);
  if (::rename(finalDir.c_str(), oldDir.c_str()) != 0)
    return Status::error(finalDir + ": cannot move the old directory aside: " +
                         systemError(errno));
  if (::rename(tempDir.c_str(), finalDir.c_str()) != 0) {
    int code = errno;
    if (::rename(oldDir.c_str(), finalDir.c_str()) != 0) {
      // Keep both complete directories; say where the old one is.
      return Status::error(finalDir + ": cannot rename '" + tempDir +
                           "' into place (" + systemError(code) +
                           "); the previous contents are in '" + oldDir + "'");
    }
    return Status::error(finalDir + ": cannot rename '" + tempDir +
                         "' into place: " + systemError(code));
  }
  active = false;
  fs::remove_all(oldDir, ec);
  return syncDirectory(parentOf(finalDir));
}
