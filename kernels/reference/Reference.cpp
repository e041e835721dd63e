//===- Reference.cpp - CPU reference of every op of the step ------------===//
#include "kernels/reference/Reference.h"
