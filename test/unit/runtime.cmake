# Host runtime (runtime/, no CUDA): safetensors, bf16, random numbers, anchor
# sampling, LR schedule, checkpoints, feature shards, synthetic problem,
# optimizer-state shards.
add_executable(RuntimeTest
  RuntimeAnchorSamplerTest.cpp
  RuntimeCheckpointTest.cpp
  RuntimeFeatureShardTest.cpp
  RuntimeNumericsTest.cpp
  RuntimeBatchLoaderTest.cpp
  RuntimeOptimizerShardsTest.cpp
  RuntimeSafetensorsTest.cpp
  RuntimeSyntheticTest.cpp
  )
target_link_libraries(RuntimeTest PRIVATE DFlashRuntimeHost
  DFlashSpec GTest::gtest_main)
target_compile_definitions(RuntimeTest PRIVATE
  DFLASH_SPECS_DIR="${PROJECT_SOURCE_DIR}/specs")
gtest_discover_tests(RuntimeTest)

# dflash-synth end to end: write the tiny problem, then read every output
# back through the runtime; plus the command line's help and errors.
set(DFLASH_SYNTH_SMOKE_DIR ${CMAKE_CURRENT_BINARY_DIR}/synth-smoke)
add_test(NAME dflash-synth.tiny
  COMMAND dflash-synth ${PROJECT_SOURCE_DIR}/specs/tiny.toml
          ${DFLASH_SYNTH_SMOKE_DIR} --rows 10 --rows-per-shard 4 --pin-anchors)
set_tests_properties(dflash-synth.tiny PROPERTIES
  FIXTURES_SETUP dflash-synth-tiny
  PASS_REGULAR_EXPRESSION "wrote .*/data: 3 shards, 10 rows")

add_executable(RuntimeSynthOutputTest RuntimeSynthOutputTest.cpp)
target_link_libraries(RuntimeSynthOutputTest PRIVATE DFlashRuntimeHost
  DFlashSpec GTest::gtest)
add_test(NAME dflash-synth.tiny-reads-back
  COMMAND RuntimeSynthOutputTest ${PROJECT_SOURCE_DIR}/specs/tiny.toml
          ${DFLASH_SYNTH_SMOKE_DIR})
set_tests_properties(dflash-synth.tiny-reads-back PROPERTIES
  FIXTURES_REQUIRED dflash-synth-tiny)

add_test(NAME dflash-synth.help COMMAND dflash-synth --help)
set_tests_properties(dflash-synth.help PROPERTIES
  PASS_REGULAR_EXPRESSION "Rows per shard file")
add_test(NAME dflash-synth.missing-spec
  COMMAND dflash-synth ${CMAKE_CURRENT_BINARY_DIR}/no-such-spec.toml
          ${CMAKE_CURRENT_BINARY_DIR}/synth-unused)
set_tests_properties(dflash-synth.missing-spec PROPERTIES WILL_FAIL TRUE)
add_test(NAME dflash-synth.zero-rows
  COMMAND dflash-synth ${PROJECT_SOURCE_DIR}/specs/tiny.toml
          ${CMAKE_CURRENT_BINARY_DIR}/synth-unused --rows 0)
set_tests_properties(dflash-synth.zero-rows PROPERTIES WILL_FAIL TRUE)
