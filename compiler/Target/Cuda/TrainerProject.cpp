//===- TrainerProject.cpp - Write and build the trainer directory ---------===//
//
// The output directory builds on its own: the generated sources, a copy of
// schema/, runtime/ and kernels/ under dflash/ (runtime/TrainerProject.cmake
// as its CMakeLists.txt, which adds dflash/runtime/CMakeLists.txt), needing
// only CMake, the CUDA toolkit (nvcc, cuBLASLt) and the nlohmann-json and CLI11
// headers. So a drafter can be compiled on a CPU machine and built where the
// GPUs are.
//
//===----------------------------------------------------------------------===//

#include "compiler/Target/Cuda/TranslateToCuda.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FileUtilities.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
namespace fs = llvm::sys::fs;
namespace path = llvm::sys::path;

namespace {

bool writeFile(const std::string &file, const std::string &text,
               std::string &error) {
  std::error_code ec;
  llvm::raw_fd_ostream os(file, ec);
  if (ec) {
    error = "cannot write '" + file + "': " + ec.message();
    return false;
  }
  os << text;
  return true;
}

/// Copies the files of `from` whose names end in one of `suffixes` into
/// `to`, keeping subfolders, except the subfolders named in `skip`.
bool copySources(const std::string &from, const std::string &to,
                 std::initializer_list<const char *> suffixes,
                 std::initializer_list<const char *> skip, std::string &error) {
  std::error_code ec;
  int copied = 0;
  for (fs::recursive_directory_iterator it(from, ec), end; it != end && !ec;
       it.increment(ec)) {
    llvm::StringRef name = path::filename(it->path());
    if (it->type() == fs::file_type::directory_file) {
      for (const char *s : skip)
        if (name == s)
          it.no_push();
      continue;
    }
    bool wanted = false;
    for (const char *s : suffixes)
      wanted |= name.ends_with(s);
    if (!wanted)
      continue;
    llvm::StringRef relative =
        llvm::StringRef(it->path()).drop_front(from.size());
    std::string dest = to + relative.str();
    if (std::error_code c = fs::create_directories(path::parent_path(dest))) {
      error = "cannot create '" + path::parent_path(dest).str() +
              "': " + c.message();
      return false;
    }
    if (std::error_code c = fs::copy_file(it->path(), dest)) {
      error =
          "cannot copy '" + it->path() + "' to '" + dest + "': " + c.message();
      return false;
    }
    ++copied;
  }
  if (ec || copied == 0) {
    error = "no sources found in '" + from +
            "': point --source-dir at the dflashc source tree";
    return false;
  }
  return true;
}

} // namespace

namespace dflash {

LogicalResult writeCudaTrainer(const CudaTrainerSources &sources,
                               const CudaTrainerOptions &options,
                               std::string &error) {
  const std::string &dir = options.outputDir;
  if (std::error_code ec = fs::create_directories(dir)) {
    error = "cannot create output directory '" + dir + "': " + ec.message();
    return failure();
  }
  std::pair<const char *, const std::string *> files[] = {
      {"step.cu", &sources.stepCu},
      {"eval.cu", &sources.evalCu},
      {"target.cu", &sources.targetCu},
      {"kernels.cu", &sources.kernelsCu},
      {"kernels.h", &sources.kernelsH},
      {"main.cpp", &sources.mainCpp},
      {"target_features_main.cpp", &sources.targetMainCpp},
      {"manifest.json", &sources.manifestJson}};
  for (auto [name, text] : files)
    if (!writeFile(dir + "/" + name, *text, error))
      return failure();
  // The project's build is the runtime's own file, not a string here.
  const std::string project =
      options.sourceDir + "/runtime/TrainerProject.cmake";
  if (std::error_code ec = fs::copy_file(project, dir + "/CMakeLists.txt")) {
    error = "cannot copy '" + project + "': " + ec.message() +
            " (point --source-dir at the dflashc source tree)";
    return failure();
  }
  if (!copySources(options.sourceDir + "/schema", dir + "/dflash/schema",
                   {".h", ".cpp", "CMakeLists.txt"}, {}, error) ||
      !copySources(options.sourceDir + "/runtime", dir + "/dflash/runtime",
                   {".h", ".cpp", ".cu", "CMakeLists.txt"}, {}, error) ||
      !copySources(options.sourceDir + "/kernels", dir + "/dflash/kernels",
                   {".h", ".cuh"}, {"reference"}, error))
    return failure();
  return success();
}

LogicalResult buildCudaTrainer(const CudaTrainerOptions &options,
                               llvm::raw_ostream &log, std::string &error) {
  auto cmake = llvm::sys::findProgramByName("cmake");
  if (!cmake) {
    error = "cmake is not on PATH; write the sources only with --emit=cuda";
    return failure();
  }
  auto nvcc = llvm::sys::findProgramByName("nvcc", {"/usr/local/cuda/bin"});
  if (!nvcc) {
    error = "nvcc is not on PATH or in /usr/local/cuda/bin; write the sources "
            "only with --emit=cuda and build them where CUDA is installed";
    return failure();
  }
  std::string dir = options.outputDir, buildDir = dir + "/build";
  std::string generator =
      llvm::sys::findProgramByName("ninja") ? "Ninja" : "Unix Makefiles";
  std::vector<std::string> configure = {*cmake,
                                        "-S",
                                        dir,
                                        "-B",
                                        buildDir,
                                        "-G",
                                        generator,
                                        "-DCMAKE_BUILD_TYPE=Release",
                                        "-DCMAKE_CUDA_COMPILER=" + *nvcc};
  std::vector<std::string> build = {*cmake, "--build", buildDir, "-j"};
  for (const auto &command : {configure, build}) {
    std::vector<llvm::StringRef> args(command.begin(), command.end());
    std::string message;
    int rc = llvm::sys::ExecuteAndWait(command[0], args, std::nullopt, {}, 0, 0,
                                       &message);
    if (rc != 0) {
      error = "building the trainer in '" + buildDir + "' failed" +
              (message.empty() ? "" : ": " + message) +
              " (the build's output is above)";
      return failure();
    }
  }
  for (const char *name : {"train", "target-features"}) {
    std::string binary = dir + "/" + name;
    fs::remove(binary);
    if (std::error_code ec = fs::copy_file(buildDir + "/" + name, binary)) {
      error = "cannot copy '" + std::string(name) + "' to '" + binary +
              "': " + ec.message();
      return failure();
    }
    fs::setPermissions(binary, fs::perms::all_read | fs::perms::owner_write |
                                   fs::perms::all_exe);
    log << "dflashc: built " << binary << "\n";
  }
  return success();
}

} // namespace dflash
