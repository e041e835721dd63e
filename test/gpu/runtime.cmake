# The runtime's GPU side (test/gpu/runtime/, by the unit each file tests)
# around StepPrograms written by hand (FakeStepPrograms): DeviceContext and
# its profiler, the NCCL collectives, the Trainer (graph replay against eager
# runs, checkpoint and resume, non-finite stops, trainers on threads), the
# TrainerGroup on one and two GPUs, a sharded optimizer state (ZeRO-1) and
# the TargetServer. One binary; exits with 77 (skipped) without a CUDA
# device.
add_executable(RuntimeTrainerTest
  runtime/FakeStepPrograms.cu
  runtime/TrainerRuns.cpp
  runtime/device/CollectivesGpuTest.cpp
  runtime/device/DeviceContextGpuTest.cu
  runtime/train/ShardedStateGpuTest.cpp
  runtime/train/TargetServerGpuTest.cu
  runtime/train/TrainerGpuTest.cpp
  runtime/train/TrainerGroupGpuTest.cpp
  )
target_compile_options(RuntimeTrainerTest PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:${DFLASH_CUDA_FLAGS}>)
target_link_libraries(RuntimeTrainerTest PRIVATE
  DFlashRuntime DFlashGpuTestMain GTest::gtest)
set_target_properties(RuntimeTrainerTest PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
add_test(NAME RuntimeTrainerTest COMMAND RuntimeTrainerTest)
set_tests_properties(RuntimeTrainerTest PROPERTIES
  SKIP_RETURN_CODE 77 LABELS gpu)
if(TARGET dflash-gpu-tests)
  add_dependencies(dflash-gpu-tests RuntimeTrainerTest)
endif()
