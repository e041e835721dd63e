# The GPU side of the runtime: device context, trainer, prefetch thread,
# metrics and the `train` command line around a generated StepProgram.
# Included from runtime/CMakeLists.txt when DFLASH_ENABLE_CUDA is on.

# CLI11 is header-only: its CMake package where installed (Debian's
# libcli11-dev), else the header on the default path (the GPU machine).
find_package(CLI11 CONFIG QUIET)
find_path(DFLASH_CLI11_INCLUDE_DIR CLI/CLI.hpp)
if(NOT CLI11_FOUND AND NOT DFLASH_CLI11_INCLUDE_DIR)
  message(FATAL_ERROR "CLI11 not found: install libcli11-dev (the trainer's "
                      "command line needs CLI/CLI.hpp)")
endif()

# NCCL is optional: without it the trainer runs on one GPU only (several
# GPUs and --nccl report that it is missing).
find_path(DFLASH_NCCL_INCLUDE_DIR nccl.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
find_library(DFLASH_NCCL_LIBRARY nccl
  HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)

# MPI is optional too: it only joins the processes of a multi-node run
# (`mpirun -np NODES train ...`); one node needs none. Off: never look.
option(DFLASH_ENABLE_MPI "Build the trainer with MPI when it is found" ON)
if(DFLASH_ENABLE_MPI)
  # The C API only (libmpi; the top level enables C): the runtime never
  # uses the C++ bindings.
  find_package(MPI COMPONENTS C QUIET)
endif()

find_package(Threads REQUIRED)

add_library(DFlashRuntime STATIC
  Collectives.cpp
  CompiledStep.cu
  DeviceContext.cu
  Prefetch.cpp
  Progress.cpp
  TrainMain.cpp
  Trainer.cpp
  )
# The top level's host warning flags are not nvcc options: set the flags per
# language instead.
set_property(TARGET DFlashRuntime PROPERTY COMPILE_OPTIONS "")
target_compile_options(DFlashRuntime PRIVATE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:CUDA>:${DFLASH_CUDA_FLAGS} -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
target_include_directories(DFlashRuntime PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(DFlashRuntime PUBLIC
  DFlashRuntimeHost DFlashKernels CUDA::cudart CUDA::cublasLt Threads::Threads)
if(CLI11_FOUND)
  target_link_libraries(DFlashRuntime PRIVATE CLI11::CLI11)
else()
  target_include_directories(DFlashRuntime PRIVATE ${DFLASH_CLI11_INCLUDE_DIR})
endif()
if(DFLASH_NCCL_INCLUDE_DIR AND DFLASH_NCCL_LIBRARY)
  target_include_directories(DFlashRuntime PUBLIC ${DFLASH_NCCL_INCLUDE_DIR})
  target_link_libraries(DFlashRuntime PUBLIC ${DFLASH_NCCL_LIBRARY})
  target_compile_definitions(DFlashRuntime PUBLIC DFLASH_HAVE_NCCL=1)
  message(STATUS "NCCL: ${DFLASH_NCCL_LIBRARY}")
else()
  message(STATUS "NCCL not found: the trainer is built for one GPU")
endif()
if(MPI_C_FOUND)
  # Headers and libraries only: MPI::MPI_C's compile options (-pthread)
  # would reach nvcc through the .cu files. Only Collectives.cpp includes
  # mpi.h.
  target_include_directories(DFlashRuntime PRIVATE ${MPI_C_INCLUDE_DIRS})
  target_link_libraries(DFlashRuntime PUBLIC ${MPI_C_LIBRARIES})
  target_compile_definitions(DFlashRuntime PRIVATE DFLASH_HAVE_MPI=1)
  message(STATUS "MPI: ${MPI_C_LIBRARIES} (multi-node runs)")
else()
  message(STATUS "MPI not found: the trainer runs on one node")
endif()
# One CUDA runtime in the process, the shared one that cuBLASLt uses:
# executables linking DFlashRuntime set CUDA_RUNTIME_LIBRARY Shared too.
set_target_properties(DFlashRuntime PROPERTIES
  CUDA_RUNTIME_LIBRARY Shared)
