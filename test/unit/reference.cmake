# The CPU reference of every op (kernels/reference): one executable, one
# source file per group of ops.
add_executable(ReferenceTest
  ReferenceAcceptanceTest.cpp
  ReferenceAttentionTest.cpp
  ReferenceCrossEntropyTest.cpp
  ReferenceDeltaNetTest.cpp
  ReferenceDenseTest.cpp
  ReferenceDFlash2Test.cpp
  ReferenceDraftBlocksTest.cpp
  ReferenceOptimizerTest.cpp
  ReferenceStepTest.cpp
)
target_link_libraries(ReferenceTest PRIVATE DFlashReference GTest::gtest_main)
dflash_discover_tests(ReferenceTest)
