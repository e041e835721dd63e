//===- dflashc.cpp - The DFlash drafter compiler --------------------------===//

#include "compiler/Driver/Driver.h"

int main(int argc, char **argv) {
  return dflash::runCompilerDriver(argc, argv);
}
