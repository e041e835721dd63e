# The CMakeLists.txt of every trainer directory dflashc writes (dflashc
# copies this file there): `train` from the generated step and a copy of
# dflashc's schema/, kernels/ and runtime/ under dflash/. Needs CMake, the
# CUDA toolkit (sm_90a) and the nlohmann-json and CLI11 headers; NCCL and MPI
# where found (-DDFLASH_ENABLE_MPI=OFF skips MPI).
cmake_minimum_required(VERSION 3.20)
project(dflash_trainer LANGUAGES C CXX CUDA)
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Release)
endif()
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_ARCHITECTURES OFF)
find_package(CUDAToolkit REQUIRED)
set(DFLASH_ENABLE_CUDA ON)
# sm_90a: wgmma and setmaxnreg need the arch-specific target.
set(DFLASH_CUDA_FLAGS -gencode=arch=compute_90a,code=sm_90a
    --expt-relaxed-constexpr -lineinfo)

add_subdirectory(dflash/runtime)

# The programs once, for both binaries: `train`, and `target-features`
# (the online target alone: its features of a token shard, or its speed).
add_library(dflash_programs OBJECT step.cu eval.cu target.cu kernels.cu)
target_include_directories(dflash_programs PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(dflash_programs PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:${DFLASH_CUDA_FLAGS}>)
target_link_libraries(dflash_programs PRIVATE DFlashRuntime)
add_executable(train main.cpp $<TARGET_OBJECTS:dflash_programs>)
add_executable(target-features target_features_main.cpp
               $<TARGET_OBJECTS:dflash_programs>)
foreach(binary train target-features)
  target_include_directories(${binary} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${binary} PRIVATE DFlashRuntime)
  set_target_properties(${binary} PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
endforeach()
