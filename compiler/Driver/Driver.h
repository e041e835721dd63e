//===- Driver.h - The dflashc compiler driver -------------------*- C++ -*-===//

#ifndef DFLASH_COMPILER_DRIVER_DRIVER_H
#define DFLASH_COMPILER_DRIVER_DRIVER_H

namespace dflash {

/// Runs dflashc: parses its command line, compiles the spec to the stage
/// that --emit names and writes it. Returns the process exit status.
int runCompilerDriver(int argc, char **argv);

} // namespace dflash

#endif // DFLASH_COMPILER_DRIVER_DRIVER_H
