//===- Collectives.h - NCCL sums over GPUs, MPI over nodes ------*- C++ -*-===//
//
// Data-parallel training sums the loss sums and the gradients of every GPU
// of a run (docs/semantics.md sections 4 and 5). Each GPU is one rank: global
// rank = node * gpusPerNode + the GPU's position in --gpus. Every rank owns
// one NCCL communicator (Collectives); the communicators of one process are
// created together from its main thread, then each is used only by the
// worker thread of its GPU, through the DeviceResources hooks that the
// generated step calls (allReduceSum; reduceScatterSum and allGather with a
// sharded optimizer state), also while its stream is being captured as a
// CUDA graph.
//
// Several nodes run one process each, started by `mpirun`; the processes
// find each other through MPI (ProcessGroup): rank 0 makes the NCCL unique
// id and MPI broadcasts it, and the main threads exchange small per-step
// reports (step times, anchor Rng states, stop requests) on the host. MPI
// and NCCL are optional at build time (DFLASH_HAVE_MPI, DFLASH_HAVE_NCCL);
// without them this file still compiles, and asking for what is missing is
// an error that says how to get it.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_COLLECTIVES_H
#define DFLASH_RUNTIME_COLLECTIVES_H

#include "schema/Status.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

struct ncclComm; // nccl.h: ncclComm_t is `struct ncclComm *`

namespace dflash::rt {

/// The number of processes the launcher started for this run, from its
/// environment (OMPI_COMM_WORLD_SIZE of Open MPI's mpirun, PMI_SIZE of
/// MPICH's and Slurm's); 1 when there is none. `getenv` is replaceable for
/// tests.
int64_t launcherProcessCount(
    const std::function<const char *(const char *)> &getenv = nullptr);

/// Sets NCCL_NVLS_ENABLE=0 unless the user set it: the machines this runs on
/// forbid NVLink multicast, and NCCL would otherwise try it on NVSwitch
/// systems. Called before the first communicator is created.
void disableNvlinkMulticastByDefault();

/// The id that the communicators of one run share (an ncclUniqueId).
struct CollectiveId {
  std::array<char, 128> bytes{};
};

/// Makes a fresh id (on one process; the others receive it).
Status createCollectiveId(CollectiveId &id);

/// Where this process's GPUs sit in a run: devices[i] is rank firstRank + i
/// of worldSize.
struct CollectivePlacement {
  std::vector<int> devices;
  int64_t firstRank = 0;
  int64_t worldSize = 1;
};

/// One rank's NCCL communicator.
class Collectives {
public:
  /// Creates the communicators of this process's GPUs, one a device of
  /// `placement`. Called from one thread; blocks until every rank of the
  /// run has joined (the other processes make the same call with the same
  /// id).
  static Status create(const CollectivePlacement &placement,
                       const CollectiveId &id,
                       std::vector<std::unique_ptr<Collectives>> &created);

  Collectives(const Collectives &) = delete;
  Collectives &operator=(const Collectives &) = delete;
  /// Destroys the communicator, or aborts it when an error was seen (a
  /// clean destroy would wait for peers that may never come).
  ~Collectives();

  int64_t rank() const { return rankIndex; }
  int64_t worldSize() const { return worldCount; }
  int device() const { return deviceIndex; }

  /// Sums `count` floats at `data` in place over every rank, ordered on
  /// `stream`; capturable. Every rank must make the same calls in the same
  /// order. A failure is kept for check() (the hook returns nothing).
  void allReduceSum(float *data, size_t count, cudaStream_t stream);

  /// ZeRO-1: `data` holds worldSize() * shardCount floats; sums them over
  /// every rank into this rank's shard, [rank() * shardCount, (rank() + 1) *
  /// shardCount), in place (the rest is left unspecified). Capturable; a
  /// failure is kept for check().
  void reduceScatterSum(float *data, size_t shardCount, cudaStream_t stream);
  /// ZeRO-1: `data` holds worldSize() * shardBytes bytes; sends this rank's
  /// part, [rank() * shardBytes, (rank() + 1) * shardBytes), to every rank
  /// and receives theirs, in place. Capturable; a failure is kept for
  /// check().
  void allGather(void *data, size_t shardBytes, cudaStream_t stream);

  /// The DeviceResources hooks; `self` is a Collectives.
  static void allReduceSumHook(void *self, float *data, size_t count,
                               cudaStream_t stream);
  static void reduceScatterSumHook(void *self, float *data, size_t shardCount,
                                   cudaStream_t stream);
  static void allGatherHook(void *self, void *data, size_t shardBytes,
                            cudaStream_t stream);

  /// The first failure of this communicator: a failed collective call, an
  /// asynchronous NCCL error (a peer or the network lost) or an abort;
  /// success when there was none. Once failed, it stays failed.
  Status check();

  /// Stops this rank's operations on the device, e.g. a collective waiting
  /// for a rank that failed, and frees the communicator; later calls fail.
  void abort();
  bool aborted() const { return wasAborted; }

private:
  Collectives() = default;
  std::string where() const;
  /// Whether a collective may be issued; records the error when not.
  bool usable(const char *what);

  ncclComm *comm = nullptr;
  int64_t rankIndex = 0, worldCount = 1;
  int deviceIndex = -1;
  Status firstError;
  bool wasAborted = false;
};

//===----------------------------------------------------------------------===//
// The processes of a multi-node run
//===----------------------------------------------------------------------===//

/// The processes (one per node) of a run, on the host. Used from one thread
/// of each process, the main one; every call is collective: each process
/// makes it, in the same order.
class ProcessGroup {
public:
  virtual ~ProcessGroup() = default;
  /// This process's index (its node) and the number of processes.
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  /// Copies `bytes` bytes at `data` of process `root` to every process.
  virtual Status broadcast(void *data, size_t bytes, int64_t root) = 0;
  /// Every process gives `bytes` bytes; `all` receives size() * bytes, in
  /// process order.
  virtual Status allGather(const void *mine, size_t bytes, void *all) = 0;
  /// Ends every process of the run with `exitCode`: after an error on this
  /// one, since the others would wait for it forever.
  [[noreturn]] virtual void abortAll(int exitCode) = 0;
};

/// Joins the processes of a multi-node run when the launcher started more
/// than one (MPI_Init); leaves `group` null for a single process. Fails when
/// the launcher started several but this build has no MPI.
Status joinProcessGroup(std::unique_ptr<ProcessGroup> &group);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_COLLECTIVES_H
