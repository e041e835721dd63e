//===- OutOfMemory.h - One line when an allocation fails --------*- C++ -*-===//
//
// LLVM's tools answer a failed allocation with "LLVM ERROR: out of memory",
// an abort and a stack dump that points at the allocator, not at the run
// that was too large. The compiler's tools say it in one line instead.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_SUPPORT_OUTOFMEMORY_H
#define DFLASH_COMPILER_SUPPORT_OUTOFMEMORY_H

namespace dflash {

/// From now on a failed allocation (operator new, or LLVM's own allocators)
/// prints "<tool>: error: out of memory: <hint>" to stderr, removes the
/// output files registered for removal on a crash (half-written ones) and
/// exits with status 1. Both strings must outlive the process (literals).
/// Call it after llvm::InitLLVM, which installs a new-handler of its own.
void installOutOfMemoryHandler(const char *tool, const char *hint);

} // namespace dflash

#endif // DFLASH_COMPILER_SUPPORT_OUTOFMEMORY_H
