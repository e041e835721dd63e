# The trainer on a GPU (runtime/Trainer, DeviceContext) around a hand-written
# StepProgram: graph replay against eager runs, checkpoint and resume,
# non-finite stops, several trainers on threads, a sharded optimizer state
# (ZeRO-1) and the NCCL collectives. Exits with 77 (skipped) without a CUDA
# device.
add_executable(RuntimeTrainerTest RuntimeTrainerTest.cu)
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
