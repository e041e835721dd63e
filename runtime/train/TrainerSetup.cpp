//===- TrainerSetup.cpp - What this trainer was built with ----------------===//

#include "runtime/train/TrainerSetup.h"

bool dflash::rt::collectivesAvailable() {
#ifdef DFLASH_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

bool dflash::rt::multiNodeAvailable() {
#ifdef DFLASH_HAVE_MPI
  return true;
#else
  return false;
#endif
}
