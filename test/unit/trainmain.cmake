# The trainer's host side (runtime/TrainMain, Progress, Prefetch, checkpoint
# layout, Collectives): command line, validation, metrics formatting,
# checkpoint schedule, data-parallel layout, launch environment. Runs
# without a GPU; links DFlashRuntime, so it needs CUDA to build.
add_executable(RuntimeTrainMainTest RuntimeTrainMainTest.cpp
  RuntimeCollectivesTest.cpp)
target_link_libraries(RuntimeTrainMainTest PRIVATE DFlashRuntime
  GTest::gtest_main)
set_target_properties(RuntimeTrainMainTest PROPERTIES
  CUDA_RUNTIME_LIBRARY Shared)
gtest_discover_tests(RuntimeTrainMainTest)
