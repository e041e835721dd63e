//===- TrainerGroup.cpp - Data-parallel training on a node's GPUs ---------===//

#include "runtime/train/TrainerGroup.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;

struct TrainerGroup::Worker {
  int local = 0;
  int gpu = 0;
  std::unique_ptr<Collectives> collectives;
  std::unique_ptr<StepProgram> program, evalProgram;
  std::unique_ptr<DeviceContext> device;
  std::unique_ptr<Trainer> trainer;
  StepMetrics metrics; ///< the last step's, written by its job
  EvalMetrics eval;    ///< the last evaluation's
  std::thread thread;
  // Guarded by TrainerGroup::mutex.
  Job job;
  bool posted = false, done = false, quit = false;
  Status result;
};

TrainerGroup::TrainerGroup(StepProgramFactory factory, TrainerOptions options,
                           GroupLayout layout, StepProgramFactory evalFactory)
    : factory(std::move(factory)), evalFactory(std::move(evalFactory)),
      options(std::move(options)), layout(std::move(layout)) {}

TrainerGroup::~TrainerGroup() {
  servers.clear(); // waits for their copies into the ranks' buffers
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (std::unique_ptr<Worker> &w : workers)
      w->quit = true;
  }
  changed.notify_all();
  for (std::unique_ptr<Worker> &w : workers)
    if (w->thread.joinable())
      w->thread.join();
}

void TrainerGroup::serve(Worker &w) {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return w.posted || w.quit; });
      if (!w.posted)
        break;
      job = std::move(w.job);
      w.posted = false;
    }
    Status result;
    try {
      result = job(w);
    } catch (const std::exception &error) {
      // Host allocations of a huge step, mostly; the thread must report,
      // not end the process.
      result = Status::error("device " + std::to_string(w.gpu) + ": " +
                             error.what());
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      w.result = std::move(result);
      w.done = true;
    }
    changed.notify_all();
  }
  // Freed on the thread that used them, with its device current: the
  // trainer first (graph, prefetch thread), the step program, the context,
  // and last the communicator, which every rank destroys at the same time.
  w.trainer.reset();
  w.program.reset();
  w.device.reset();
  if (w.collectives && abortRequested.load())
    w.collectives->abort(); // peers may be gone: do not wait for them
  w.collectives.reset();
}

Status TrainerGroup::runOnWorkers(const Job &job, int only) {
  std::unique_lock<std::mutex> lock(mutex);
  auto selected = [&](const Worker &w) { return only < 0 || w.local == only; };
  for (std::unique_ptr<Worker> &w : workers)
    if (selected(*w)) {
      w->job = job;
      w->posted = true;
      w->done = false;
      w->result = Status::success();
    }
  changed.notify_all();
  while (true) {
    bool allDone = true, anyFailed = false;
    for (std::unique_ptr<Worker> &w : workers)
      if (selected(*w)) {
        allDone &= w->done;
        anyFailed |= w->done && !w->result.ok();
      }
    // The ranks still waiting in a collective for the failed one give up.
    if (anyFailed)
      abortRequested.store(true);
    if (allDone)
      break;
    changed.wait(lock);
  }
  const Status *first = nullptr, *firstOwn = nullptr;
  for (std::unique_ptr<Worker> &w : workers) {
    if (!selected(*w) || w->result.ok())
      continue;
    if (!first)
      first = &w->result;
    if (!firstOwn && !(w->trainer && w->trainer->stoppedByPeer()))
      firstOwn = &w->result;
  }
  return firstOwn ? *firstOwn : first ? *first : Status::success();
}

const DeviceContext &TrainerGroup::device(int local) const {
  return *workers[size_t(local)]->device;
}

const Trainer &TrainerGroup::trainer(int local) const {
  return *workers[size_t(local)]->trainer;
}

Status TrainerGroup::init(const TrainerInputs &inputs) {
  if (initialised || !workers.empty())
    return Status::error("the trainer group is initialised twice");
  if (layout.gpus.empty())
    return Status::error("no GPU to train on");
  if (layout.nodes < 1 || layout.node < 0 || layout.node >= layout.nodes ||
      (layout.nodes > 1 && !layout.processes))
    return Status::error("node " + std::to_string(layout.node) + " of " +
                         std::to_string(layout.nodes) +
                         " has no process group");
  if (options.run.worldSize != layout.worldSize())
    return Status::error(
        "the run settings say " + std::to_string(options.run.worldSize) +
        " GPUs but the group has " + std::to_string(layout.worldSize()));
  badRows.clear();
  if (inputs.resume)
    badRows.insert(inputs.resume->badRows.begin(),
                   inputs.resume->badRows.end());

  for (size_t i = 0; i < layout.gpus.size(); ++i) {
    auto w = std::make_unique<Worker>();
    w->local = int(i);
    w->gpu = layout.gpus[i];
    workers.push_back(std::move(w));
  }
  for (std::unique_ptr<Worker> &w : workers)
    w->thread = std::thread([this, worker = w.get()] { serve(*worker); });

  // The step programs first (no GPU yet): what a program cannot run on is
  // refused before the communicators wait for every rank.
  Status status = runOnWorkers([&](Worker &w) -> Status {
    w.program = factory ? factory() : nullptr;
    if (!w.program)
      return Status::error("device " + std::to_string(w.gpu) +
                           ": no step program");
    if (inputs.evalRows && evalFactory)
      w.evalProgram = evalFactory();
    const OptimizerShardLayout *shards = w.program->optimizerShards();
    if (!shards)
      return Status::success();
    // Each process would hold only its own ranks' shards, and checkpoints
    // are assembled within one process.
    if (layout.nodes > 1)
      return Status::error(
          "this trainer shards the optimizer state (shard_optimizer_state), "
          "which runs on one node only: its checkpoints would need the "
          "shards of the other nodes' processes; train on one node, or "
          "recompile the spec without shard_optimizer_state");
    if (Status s = checkShardLayout(*shards); !s.ok())
      return Status::error("step program: " + s.message());
    return checkShardWorld(*shards, layout.worldSize());
  });
  if (!status.ok())
    return status;

  // Communicators next, from this thread: their creation waits for every
  // rank of the run, of every process.
  if (layout.usesCollectives()) {
    disableNvlinkMulticastByDefault();
    CollectiveId id;
    if (layout.node == 0)
      DFLASH_RETURN_IF_ERROR(createCollectiveId(id));
    if (layout.processes)
      if (Status s =
              layout.processes->broadcast(id.bytes.data(), id.bytes.size(), 0);
          !s.ok())
        return Status::error("sending the NCCL id to every node: " +
                             s.message());
    std::vector<std::unique_ptr<Collectives>> comms;
    const CollectivePlacement placement{layout.gpus, layout.firstRank(),
                                        layout.worldSize()};
    DFLASH_RETURN_IF_ERROR(Collectives::create(placement, id, comms));
    // The workers are idle: the next job's hand-over orders these writes
    // before their reads.
    for (size_t i = 0; i < workers.size(); ++i)
      workers[i]->collectives = std::move(comms[i]);
  }

  // The online target on its own GPUs: target GPU k computes the features
  // of the local ranks r with r % targets == k.
  const size_t targets = layout.targetGpus.size();
  if (targets > 0) {
    if (!inputs.targetProgram || !inputs.targetProgramWeights)
      return Status::error("target GPUs were given but the run has no online "
                           "target (token shards and a trainer compiled with "
                           "one)");
    for (size_t k = 0; k < targets; ++k) {
      std::vector<int> clients;
      for (size_t r = k; r < workers.size(); r += targets)
        clients.push_back(workers[r]->gpu);
      std::unique_ptr<TargetServer> server;
      DFLASH_RETURN_IF_ERROR(TargetServer::create(
          layout.targetGpus[k], inputs.targetProgram,
          *inputs.targetProgramWeights, clients,
          TargetServerOptions{options.useGraph, options.timeGemms}, server));
      servers.push_back(std::move(server));
    }
  }

  status = runOnWorkers([&](Worker &w) -> Status {
    DFLASH_RETURN_IF_ERROR(DeviceContext::create(
        w.gpu, w.program->gemmWorkspaceBytes(), w.device));
    w.device->setGemmTiming(options.timeGemms);
    w.device->attachCollectives(w.collectives.get());
    TrainerOptions mine = options;
    mine.rank = layout.firstRank() + w.local;
    w.trainer = std::make_unique<Trainer>(*w.program, *w.device, mine,
                                          w.evalProgram.get());
    w.trainer->watchForAbort(&abortRequested);
    if (targets > 0)
      w.trainer->serveFeaturesFrom(servers[size_t(w.local) % targets].get(),
                                   int(size_t(w.local) / targets));
    return w.trainer->init(inputs);
  });
  if (!status.ok())
    return status;
  completedSteps = workers.front()->trainer->stepsDone();
  flopsPerStep = workers.front()->program->flopsPerStep();
  evalRows = inputs.evalRows;
  partialState = workers.front()->trainer->holdsPartialState();
  rankRngStates.assign(size_t(layout.worldSize()), Rng::State{});
  initialised = true;
  return Status::success();
}

Status TrainerGroup::readState(int local,
                               std::vector<std::vector<uint16_t>> &params,
                               TrainingState &state) {
  if (!initialised || local < 0 || local >= localRanks())
    return Status::error("no trainer of local rank " + std::to_string(local));
  return runOnWorkers(
      [&](Worker &w) { return w.trainer->readState(params, state); }, local);
}

Status TrainerGroup::readFullState(std::vector<std::vector<uint16_t>> &params,
                                   TrainingState &state) {
  DFLASH_RETURN_IF_ERROR(readState(0, params, state));
  state.badRows = knownBadRows();
  if (!partialState)
    return Status::success();
  TrainingState assembled;
  DFLASH_RETURN_IF_ERROR(assembleOptimizerState(assembled));
  state.master = std::move(assembled.master);
  state.adamM = std::move(assembled.adamM);
  state.adamV = std::move(assembled.adamV);
  return Status::success();
}

Status TrainerGroup::assembleOptimizerState(TrainingState &state) {
  if (!initialised)
    return Status::error("the trainer group is not initialised");
  std::vector<ParamInfo> table =
      parameterTable(workers.front()->program->config());
  for (auto *group : {&state.master, &state.adamM, &state.adamV}) {
    group->assign(table.size(), {});
    for (size_t t = 0; t < table.size(); ++t)
      (*group)[t].assign(size_t(table[t].numel()), 0.0f);
  }
  // Each local rank writes the elements of its own shards, which no other
  // rank touches: all at once, into the same vectors.
  return runOnWorkers(
      [&](Worker &w) { return w.trainer->readOptimizerState(state); });
}

namespace {
/// The words one process contributes to the per-step exchange: its stop
/// signal, then per local rank its step and compute times, anchor Rng, the
/// FLOPs of the anchors its rows drew, and the source rows it skipped for
/// the first time in this step (at most one a batch row, the unused words
/// kNoRow).
constexpr size_t kFixedWordsPerRank = 7;
constexpr uint64_t kNoRow = ~uint64_t(0);

uint64_t doubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double bitsDouble(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}
} // namespace

Status TrainerGroup::gatherStep(const TrainerHooks &hooks, bool stepOk,
                                StepMetrics &metrics, int &agreedStop) {
  const size_t world = size_t(layout.worldSize());
  const size_t first = size_t(layout.firstRank());
  // Unknown times (another process's, after a failed step) stay NaN and
  // show as null.
  std::vector<double> stepMs(world, std::nan("")),
      computeMs(world, std::nan("")), drawnFlops(world, std::nan(""));
  rankRngStates.resize(world);
  const size_t batchRows =
      size_t(workers.front()->program->config().rowsPerStep());
  const size_t wordsPerRank = kFixedWordsPerRank + batchRows;
  std::vector<std::vector<int64_t>> badRowsNow(world);
  for (std::unique_ptr<Worker> &w : workers) {
    size_t rank = first + size_t(w->local);
    stepMs[rank] = w->metrics.stepMs;
    computeMs[rank] = w->metrics.computeMs;
    drawnFlops[rank] = w->metrics.drawnFlops;
    badRowsNow[rank] = w->metrics.badRowsNow;
    rankRngStates[rank] = w->trainer->anchorRngState();
  }
  // Over several processes, only after a step that went well everywhere:
  // a process whose step failed ends the whole run instead.
  if (layout.processes && layout.nodes > 1 && stepOk) {
    const size_t local = workers.size();
    const size_t perProcess = 1 + wordsPerRank * local;
    std::vector<uint64_t> mine(perProcess),
        all(perProcess * size_t(layout.nodes));
    mine[0] = uint64_t(hooks.stopSignal ? hooks.stopSignal->load() : 0);
    for (size_t i = 0; i < local; ++i) {
      uint64_t *words = &mine[1 + wordsPerRank * i];
      words[0] = doubleBits(stepMs[first + i]);
      words[1] = doubleBits(computeMs[first + i]);
      for (size_t k = 0; k < 4; ++k)
        words[2 + k] = rankRngStates[first + i][k];
      words[6] = doubleBits(drawnFlops[first + i]);
      const std::vector<int64_t> &rows = badRowsNow[first + i];
      for (size_t b = 0; b < batchRows; ++b)
        words[kFixedWordsPerRank + b] =
            b < rows.size() ? uint64_t(rows[b]) : kNoRow;
    }
    if (Status s = layout.processes->allGather(
            mine.data(), mine.size() * sizeof(uint64_t), all.data());
        !s.ok())
      return Status::error("exchanging step " +
                           std::to_string(workers.front()->metrics.step) +
                           " with the other nodes: " + s.message());
    for (size_t node = 0; node < size_t(layout.nodes); ++node) {
      const uint64_t *words = &all[node * perProcess];
      if (words[0] != 0 && agreedStop == 0)
        agreedStop = int(words[0]);
      for (size_t i = 0; i < local; ++i) {
        const uint64_t *rankWords = words + 1 + wordsPerRank * i;
        size_t rank = node * local + i;
        stepMs[rank] = bitsDouble(rankWords[0]);
        computeMs[rank] = bitsDouble(rankWords[1]);
        for (size_t k = 0; k < 4; ++k)
          rankRngStates[rank][k] = rankWords[2 + k];
        drawnFlops[rank] = bitsDouble(rankWords[6]);
        badRowsNow[rank].clear();
        for (size_t b = 0; b < batchRows; ++b)
          if (rankWords[kFixedWordsPerRank + b] != kNoRow)
            badRowsNow[rank].push_back(
                int64_t(rankWords[kFixedWordsPerRank + b]));
      }
    }
  }
  // Loss, acc, grad_norm and lr are sums over every rank inside the step:
  // rank 0's (here the first local rank's) are the run's.
  metrics = workers.front()->metrics;
  auto slowest = [](const std::vector<double> &times) {
    double most = 0;
    for (double t : times)
      if (std::isfinite(t))
        most = std::max(most, t);
    return most;
  };
  metrics.stepMs = slowest(stepMs);
  metrics.computeMs = slowest(computeMs);
  // This process's GPUs only. A target GPU of its own computes the rows of
  // all its ranks: its time is theirs added up.
  metrics.targetMs = 0;
  metrics.featureWaitMs = 0;
  std::vector<double> targetGpuMs(servers.size(), 0.0);
  for (const std::unique_ptr<Worker> &w : workers) {
    metrics.featureWaitMs =
        std::max(metrics.featureWaitMs, w->metrics.featureWaitMs);
    if (servers.empty())
      metrics.targetMs = std::max(metrics.targetMs, w->metrics.targetMs);
    else
      targetGpuMs[size_t(w->local) % servers.size()] += w->metrics.targetMs;
  }
  for (double ms : targetGpuMs)
    metrics.targetMs = std::max(metrics.targetMs, ms);
  metrics.rankStepMs = stepMs;
  // A row counts once, whichever ranks met it and whenever.
  for (const std::vector<int64_t> &rows : badRowsNow)
    badRows.insert(rows.begin(), rows.end());
  metrics.skippedRows = int64_t(badRows.size());
  metrics.badRowsNow.clear();
  // The mean over the GPUs whose counts are known (every rank's after the
  // exchange): each counts the anchors its own rows drew.
  metrics.drawnFlops = 0;
  size_t counted = 0;
  for (double flops : drawnFlops)
    if (std::isfinite(flops)) {
      metrics.drawnFlops += flops;
      ++counted;
    }
  if (counted > 0)
    metrics.drawnFlops /= double(counted);
  setThroughput(metrics, workers.front()->program->config(), layout.worldSize(),
                flopsPerStep);
  return Status::success();
}

Status TrainerGroup::saveCheckpoint(std::string &dir) {
  std::vector<Rng::State> states = rankRngStates;
  const std::vector<int64_t> known = knownBadRows();
  std::string saved;
  // Sharded: the state of every rank, assembled, so that the checkpoint is
  // the one an unsharded run would write.
  TrainingState assembled;
  if (partialState)
    DFLASH_RETURN_IF_ERROR(assembleOptimizerState(assembled));
  DFLASH_RETURN_IF_ERROR(runOnWorkers(
      [&](Worker &w) {
        return w.trainer->saveCheckpoint(
            saved, states, partialState ? &assembled : nullptr, &known);
      },
      /*only=*/0));
  lastCheckpoint = dir = saved;
  return Status::success();
}

Status TrainerGroup::evaluate(const TrainerHooks &hooks, bool writesFiles,
                              double &bestTau) {
  DFLASH_RETURN_IF_ERROR(
      runOnWorkers([](Worker &w) { return w.trainer->evaluate(w.eval); }));
  // The figures are every GPU's (the program all-reduces its sums); the
  // rows are those of this process's GPUs, or with several processes the
  // held-out set's.
  EvalMetrics metrics = workers.front()->eval;
  metrics.rows = 0;
  ServingSums serving;
  for (std::unique_ptr<Worker> &w : workers) {
    metrics.rows += w->eval.rows;
    serving += w->trainer->servingSums();
  }
  if (layout.nodes > 1 && evalRows)
    metrics.rows = evalRows->numRows();
  // The serving walk's sums are each rank's own (the host walks them): add
  // up the other processes'.
  if (layout.processes && layout.nodes > 1) {
    const double mine[2] = {serving.runs, serving.blocks};
    std::vector<double> all(2 * size_t(layout.nodes));
    if (Status s = layout.processes->allGather(mine, sizeof(mine), all.data());
        !s.ok())
      return Status::error("exchanging the serving walk's sums with the "
                           "other nodes: " +
                           s.message());
    serving = ServingSums();
    for (size_t node = 0; node < size_t(layout.nodes); ++node)
      serving += ServingSums{all[2 * node], all[2 * node + 1]};
  }
  metrics.servingTau = serving.tau();
  metrics.servingBlocks = int64_t(serving.blocks);
  if (hooks.onEval)
    DFLASH_RETURN_IF_ERROR(hooks.onEval(metrics));
  if (!(metrics.tau > bestTau))
    return Status::success();
  bestTau = metrics.tau;
  if (!writesFiles)
    return Status::success();
  std::string dir;
  DFLASH_RETURN_IF_ERROR(runOnWorkers(
      [&](Worker &w) { return w.trainer->exportBest(metrics, dir); }, 0));
  if (hooks.onNote) {
    char tau[32];
    std::snprintf(tau, sizeof(tau), "%.3f", metrics.tau);
    hooks.onNote("eval tau " + std::string(tau) +
                 " is the best so far: exported the drafter to " + dir);
  }
  return Status::success();
}

Status TrainerGroup::run(const TrainerHooks &hooks, TrainerOutcome &outcome) {
  outcome = TrainerOutcome();
  if (!initialised)
    return Status::error("the trainer group is not initialised");
  // Rank 0 (the first GPU of node 0) writes every file of the run.
  const bool writesFiles = layout.node == 0 && !options.outDir.empty();
  const bool severalProcesses = layout.processes && layout.nodes > 1;
  const int64_t firstStep = completedSteps;
  int64_t lastSaved = -1;
  int agreedStop = 0;
  // The eval tau to beat: a resumed run's best/ holds the best before it.
  const bool evaluates = workers.front()->trainer->evaluates();
  double bestTau = -1;
  if (evaluates && !options.outDir.empty() && firstStep > 0) {
    bool found = false;
    DFLASH_RETURN_IF_ERROR(readBestEvalTau(options.outDir, bestTau, found));
    if (!found)
      bestTau = -1;
  }
  auto finish = [&](Status status) {
    outcome.stepsDone = completedSteps;
    outcome.stepsThisRun = completedSteps - firstStep;
    outcome.lastCheckpoint = lastCheckpoint;
    return status;
  };
  if (options.evalOnly) {
    if (!evaluates)
      return finish(Status::error("--eval-only: the run has no held-out rows"));
    // Nothing was trained, so nothing is "best": no export.
    double unbeatable = std::numeric_limits<double>::infinity();
    return finish(evaluate(hooks, /*writesFiles=*/false, unbeatable));
  }
  auto save = [&]() -> Status {
    lastSaved = completedSteps;
    if (!writesFiles)
      return Status::success();
    std::string dir;
    DFLASH_RETURN_IF_ERROR(saveCheckpoint(dir));
    if (hooks.onNote)
      hooks.onNote("saved checkpoint " + dir);
    return Status::success();
  };

  while (completedSteps < options.finalStep) {
    // Every process must run the same steps: over several, only a stop that
    // all of them agreed on after the last step counts.
    int signal = severalProcesses   ? agreedStop
                 : hooks.stopSignal ? hooks.stopSignal->load()
                                    : 0;
    if (signal) {
      outcome.stoppedBySignal = signal;
      break;
    }
    // Every rank has its batch before any starts the step: a rank that
    // cannot read its rows must fail before the others wait for it in a
    // collective (the first one also connects NCCL, on the host).
    Status status =
        runOnWorkers([](Worker &w) { return w.trainer->prepareStep(); });
    if (status.ok())
      status =
          runOnWorkers([](Worker &w) { return w.trainer->step(w.metrics); });
    // A non-finite step still reports its metrics, so that the log shows
    // it; other failures have none.
    bool reported = true;
    for (std::unique_ptr<Worker> &w : workers)
      reported &= w->result.ok() || w->trainer->nonFinite();
    if (reported) {
      StepMetrics metrics;
      Status gathered = gatherStep(hooks, status.ok(), metrics, agreedStop);
      if (gathered.ok() && hooks.onStep) {
        Status logged = hooks.onStep(metrics);
        if (status.ok())
          status = logged;
      }
      if (status.ok())
        status = gathered;
    }
    if (!status.ok())
      return finish(status);
    completedSteps = workers.front()->trainer->stepsDone();
    if (evaluates &&
        checkpointDue(completedSteps, options.finalStep, options.evalEvery))
      if (Status s = evaluate(hooks, writesFiles, bestTau); !s.ok())
        return finish(s);
    if (!options.outDir.empty() &&
        checkpointDue(completedSteps, options.finalStep, options.saveEvery))
      if (Status s = save(); !s.ok())
        return finish(s);
  }
  if (outcome.stoppedBySignal) {
    if (!options.outDir.empty() && completedSteps > firstStep &&
        lastSaved != completedSteps)
      if (Status s = save(); !s.ok())
        return finish(s);
    return finish(Status::success());
  }
  if (writesFiles && options.exportFinal) {
    std::string dir;
    if (Status s = runOnWorkers(
            [&](Worker &w) { return w.trainer->exportFinal(dir); }, 0);
        !s.ok())
      return finish(s);
    outcome.finalExport = dir;
    if (hooks.onNote)
      hooks.onNote("exported the drafter to " + dir);
  }
  return finish(Status::success());
}
