//===- OutOfMemory.cpp - One line when an allocation fails ----------------===//

#include "compiler/Support/OutOfMemory.h"

#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/Signals.h"

#include <cstring>
#include <new>
#include <unistd.h>

namespace {

const char *toolName = "dflash";
const char *toolHint = "";

void writeAll(const char *s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t written = ::write(STDERR_FILENO, s, n);
    if (written <= 0)
      return;
    s += written;
    n -= size_t(written);
  }
}

/// Allocates nothing: the heap is what just ran out.
[[noreturn]] void outOfMemory() {
  writeAll(toolName);
  writeAll(": error: out of memory: ");
  writeAll(toolHint);
  writeAll("\n");
  llvm::sys::RunInterruptHandlers();
  ::_exit(1);
}

void badAlloc(void *, const char *, bool) { outOfMemory(); }

} // namespace

void dflash::installOutOfMemoryHandler(const char *tool, const char *hint) {
  toolName = tool;
  toolHint = hint;
  std::set_new_handler(outOfMemory);
  llvm::install_bad_alloc_error_handler(badAlloc);
}
