//===- RunLayout.cpp - Run settings and the output directory --------------===//

#include "runtime/train/RunLayout.h"

#include "runtime/io/AtomicWrite.h"
#include "runtime/io/Checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;

static const char *kRunFormat = "dflash-trainer-run";

Status dflash::rt::writeRunSettings(const std::string &path,
                                    const RunSettings &run) {
  nlohmann::ordered_json json;
  json["format"] = kRunFormat;
  json["version"] = 1;
  json["total_steps"] = run.totalSteps;
  json["seed"] = run.seed;
  json["lr"] = run.lr;
  json["warmup_ratio"] = run.warmupRatio;
  json["data"] = run.data;
  json["synthetic_rows"] = run.syntheticRows;
  json["world_size"] = run.worldSize;
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec)
    return Status::error(fs::path(path).parent_path().string() +
                         ": cannot create directory: " + ec.message());
  return writeFileAtomically(path, json.dump(2) + "\n");
}

Status dflash::rt::readRunSettings(const std::string &checkpointDir,
                                   RunSettings &run, bool &found) {
  std::string path = checkpointDir + "/" + kRunSettingsFile;
  std::error_code ec;
  found = fs::exists(path, ec);
  if (!found)
    return Status::success();
  std::string text;
  DFLASH_RETURN_IF_ERROR(readTextFile(path, text));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object())
    return Status::error(path + ": not a json object");
  auto format = json.find("format");
  if (format == json.end() || *format != kRunFormat)
    return Status::error(path + ": 'format' is not '" +
                         std::string(kRunFormat) + "'");
  RunSettings read;
  auto field = [&](const char *key, auto &value,
                   bool (nlohmann::json::*is)() const) -> Status {
    auto it = json.find(key);
    if (it == json.end() || !((*it).*is)())
      return Status::error(path + ": '" + key + "' is missing or has the " +
                           "wrong type");
    value = it->get<std::remove_reference_t<decltype(value)>>();
    return Status::success();
  };
  Status status =
      field("total_steps", read.totalSteps, &nlohmann::json::is_number_integer);
  if (status.ok())
    status = field("seed", read.seed, &nlohmann::json::is_number_integer);
  if (status.ok())
    status = field("lr", read.lr, &nlohmann::json::is_number);
  if (status.ok())
    status =
        field("warmup_ratio", read.warmupRatio, &nlohmann::json::is_number);
  if (status.ok())
    status = field("data", read.data, &nlohmann::json::is_string);
  if (status.ok())
    status = field("synthetic_rows", read.syntheticRows,
                   &nlohmann::json::is_number_integer);
  if (status.ok())
    status =
        field("world_size", read.worldSize, &nlohmann::json::is_number_integer);
  if (!status.ok())
    return status;
  if (read.totalSteps < 1)
    return Status::error(path + ": 'total_steps' must be positive");
  run = read;
  return Status::success();
}

std::string dflash::rt::checkpointDirectory(const std::string &outDir,
                                            int64_t steps) {
  return outDir + "/checkpoint-" + std::to_string(steps);
}

Status dflash::rt::readBestEvalTau(const std::string &outDir, double &tau,
                                   bool &found) {
  found = false;
  const std::string path =
      outDir + "/" + kBestDir + "/" + std::string(kBestEvalFile);
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::success();
  std::string text;
  DFLASH_RETURN_IF_ERROR(readTextFile(path, text));
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  auto it = value.is_object() ? value.find("eval_tau") : value.end();
  if (it == value.end() || !it->is_number())
    return Status::error(path + ": has no number 'eval_tau'; remove " + outDir +
                         "/" + kBestDir + " or fix it");
  tau = it->get<double>();
  found = true;
  return Status::success();
}

bool dflash::rt::checkpointDue(int64_t stepsDone, int64_t finalStep,
                               int64_t saveEvery) {
  if (stepsDone <= 0)
    return false;
  if (stepsDone == finalStep)
    return true;
  return saveEvery > 0 && stepsDone % saveEvery == 0;
}

Status dflash::rt::resolveCheckpoint(const std::string &path,
                                     std::string &checkpointDir) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::error(path + ": no such directory");
  if (!fs::is_directory(path, ec))
    return Status::error(path + ": not a directory");
  if (fs::exists(path + "/" + kTrainingStateFile, ec)) {
    checkpointDir = path;
    return Status::success();
  }
  std::string latestPath = path + "/" + kLatestFile;
  if (!fs::exists(latestPath, ec))
    return Status::error(
        path + ": neither a training checkpoint (no " + kTrainingStateFile +
        ") nor an output directory with a '" + kLatestFile + "' file");
  std::string name;
  DFLASH_RETURN_IF_ERROR(readTextFile(latestPath, name));
  while (!name.empty() && std::isspace((unsigned char)name.back()))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos)
    return Status::error(latestPath + ": does not name a checkpoint directory");
  std::string candidate = path + "/" + name;
  if (!fs::exists(candidate + "/" + kTrainingStateFile, ec))
    return Status::error(latestPath + ": names '" + name + "' but " +
                         candidate + " has no " + kTrainingStateFile);
  checkpointDir = candidate;
  return Status::success();
}
