//===- Collectives.cpp - NCCL sums over GPUs, MPI over nodes --------------===//

#include "runtime/device/Collectives.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#ifdef DFLASH_HAVE_NCCL
#include <nccl.h>
#endif
#ifdef DFLASH_HAVE_MPI
// The C API only: the deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

using namespace dflash;
using namespace dflash::rt;

[[maybe_unused]] static const char *kNoNccl =
    "this trainer was built without NCCL; training on several GPUs (or "
    "--nccl) needs it (install NCCL, e.g. libnccl-dev, and rebuild)";

int64_t dflash::rt::launcherProcessCount(
    const std::function<const char *(const char *)> &getenv) {
  for (const char *name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char *value = getenv ? getenv(name) : std::getenv(name);
    if (!value || !*value)
      continue;
    char *end = nullptr;
    errno = 0;
    long long count = std::strtoll(value, &end, 10);
    // A value that is not a count is not ours to judge: the launcher's own
    // variables are only read here, never set by users.
    if (*end == '\0' && errno == 0 && count >= 1)
      return int64_t(count);
  }
  return 1;
}

void dflash::rt::disableNvlinkMulticastByDefault() {
  // overwrite = 0: a user's explicit setting wins.
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
}

//===----------------------------------------------------------------------===//
// NCCL
//===----------------------------------------------------------------------===//

#ifdef DFLASH_HAVE_NCCL
static_assert(sizeof(ncclUniqueId) == sizeof(CollectiveId::bytes),
              "CollectiveId must hold an ncclUniqueId");

/// "<what>: <NCCL's name for the code>[: <its last message>]".
static Status ncclStatus(ncclResult_t result, const std::string &what,
                         ncclComm_t comm = nullptr) {
  if (result == ncclSuccess)
    return Status::success();
  std::string text = what + ": " + ncclGetErrorString(result);
  const char *detail = ncclGetLastError(comm);
  if (detail && *detail)
    text += ": " + std::string(detail);
  return Status::error(text + " (NCCL_DEBUG=WARN shows more)");
}
#endif

Status dflash::rt::createCollectiveId(CollectiveId &id) {
#ifdef DFLASH_HAVE_NCCL
  ncclUniqueId made;
  DFLASH_RETURN_IF_ERROR(ncclStatus(ncclGetUniqueId(&made), "ncclGetUniqueId"));
  std::memcpy(id.bytes.data(), &made, sizeof(made));
  return Status::success();
#else
  (void)id;
  return Status::error(kNoNccl);
#endif
}

Status Collectives::create(const CollectivePlacement &placement,
                           const CollectiveId &id,
                           std::vector<std::unique_ptr<Collectives>> &created) {
  const std::vector<int> &devices = placement.devices;
  const int64_t firstRank = placement.firstRank;
  const int64_t worldSize = placement.worldSize;
  created.clear();
  if (devices.empty() || firstRank < 0 || worldSize > INT_MAX ||
      firstRank + int64_t(devices.size()) > worldSize)
    return Status::error(
        "ranks " + std::to_string(firstRank) + ".." +
        std::to_string(firstRank + int64_t(devices.size()) - 1) +
        " do not fit a world of " + std::to_string(worldSize));
#ifdef DFLASH_HAVE_NCCL
  std::string what = "creating the NCCL communicators of ranks " +
                     std::to_string(firstRank) + ".." +
                     std::to_string(firstRank + int64_t(devices.size()) - 1) +
                     " of " + std::to_string(worldSize);
  ncclUniqueId uid;
  std::memcpy(&uid, id.bytes.data(), sizeof(uid));
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  // One thread creates every local rank: inside a group, so that NCCL does
  // not wait in the first ncclCommInitRank for the ranks created after it.
  DFLASH_RETURN_IF_ERROR(
      ncclStatus(ncclGroupStart(), what + ": ncclGroupStart"));
  Status status;
  for (size_t i = 0; i < devices.size() && status.ok(); ++i) {
    cudaError_t set = cudaSetDevice(devices[i]);
    if (set != cudaSuccess) {
      (void)cudaGetLastError();
      status =
          Status::error(what + ": cudaSetDevice(" + std::to_string(devices[i]) +
                        "): " + cudaGetErrorString(set));
      break;
    }
    status = ncclStatus(ncclCommInitRank(&comms[i], int(worldSize), uid,
                                         int(firstRank + int64_t(i))),
                        what + ": ncclCommInitRank on device " +
                            std::to_string(devices[i]));
  }
  // The group must be closed whatever happened inside it.
  Status ended = ncclStatus(ncclGroupEnd(), what);
  if (status.ok())
    status = ended;
  if (!status.ok()) {
    for (ncclComm_t comm : comms)
      if (comm)
        (void)ncclCommAbort(comm);
    return status;
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    std::unique_ptr<Collectives> made(new Collectives());
    made->comm = comms[i];
    made->rankIndex = firstRank + int64_t(i);
    made->worldCount = worldSize;
    made->deviceIndex = devices[i];
    created.push_back(std::move(made));
  }
  return Status::success();
#else
  (void)id;
  return Status::error(kNoNccl);
#endif
}

Collectives::~Collectives() {
#ifdef DFLASH_HAVE_NCCL
  if (!comm)
    return;
  // A communicator that saw an error may have operations that wait for a
  // lost peer: destroying it would wait too.
  if (!firstError.ok())
    (void)ncclCommAbort(comm);
  else
    (void)ncclCommDestroy(comm);
#endif
}

std::string Collectives::where() const {
  return " on rank " + std::to_string(rankIndex) + " (device " +
         std::to_string(deviceIndex) + ")";
}

bool Collectives::usable(const char *what) {
  if (comm)
    return true;
  if (firstError.ok())
    firstError = Status::error(std::string(what) + where() +
                               " after its communicator was aborted");
  return false;
}

void Collectives::allReduceSum(float *data, size_t count, cudaStream_t stream) {
  if (count == 0 || !usable("all-reduce"))
    return;
#ifdef DFLASH_HAVE_NCCL
  // In place: NCCL allows sendbuff == recvbuff and needs no extra buffer.
  ncclResult_t result =
      ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm, stream);
  if (result != ncclSuccess && firstError.ok())
    firstError = ncclStatus(result,
                            "ncclAllReduce of " + std::to_string(count) +
                                " floats" + where(),
                            comm);
#else
  (void)data;
  (void)stream;
#endif
}

void Collectives::reduceScatterSum(float *data, size_t shardCount,
                                   cudaStream_t stream) {
  if (shardCount == 0 || !usable("reduce-scatter"))
    return;
#ifdef DFLASH_HAVE_NCCL
  // In place: NCCL's reduce-scatter allows recvbuff == sendbuff + rank *
  // recvcount, so this rank's shard is summed where it already lies.
  ncclResult_t result =
      ncclReduceScatter(data, data + size_t(rankIndex) * shardCount, shardCount,
                        ncclFloat, ncclSum, comm, stream);
  if (result != ncclSuccess && firstError.ok())
    firstError =
        ncclStatus(result,
                   "ncclReduceScatter of " + std::to_string(shardCount) +
                       " floats per rank" + where(),
                   comm);
#else
  (void)data;
  (void)stream;
#endif
}

void Collectives::allGather(void *data, size_t shardBytes,
                            cudaStream_t stream) {
  if (shardBytes == 0 || !usable("all-gather"))
    return;
#ifdef DFLASH_HAVE_NCCL
  // In place: NCCL's all-gather allows sendbuff == recvbuff + rank *
  // sendcount. Bytes, whatever the shard holds (bf16 parameters).
  char *bytes = static_cast<char *>(data);
  ncclResult_t result =
      ncclAllGather(bytes + size_t(rankIndex) * shardBytes, bytes, shardBytes,
                    ncclUint8, comm, stream);
  if (result != ncclSuccess && firstError.ok())
    firstError = ncclStatus(result,
                            "ncclAllGather of " + std::to_string(shardBytes) +
                                " bytes per rank" + where(),
                            comm);
#else
  (void)data;
  (void)stream;
#endif
}

void Collectives::allReduceSumHook(void *self, float *data, size_t count,
                                   cudaStream_t stream) {
  static_cast<Collectives *>(self)->allReduceSum(data, count, stream);
}

void Collectives::reduceScatterSumHook(void *self, float *data,
                                       size_t shardCount, cudaStream_t stream) {
  static_cast<Collectives *>(self)->reduceScatterSum(data, shardCount, stream);
}

void Collectives::allGatherHook(void *self, void *data, size_t shardBytes,
                                cudaStream_t stream) {
  static_cast<Collectives *>(self)->allGather(data, shardBytes, stream);
}

Status Collectives::check() {
  if (!firstError.ok())
    return firstError;
  if (!comm)
    return wasAborted
               ? Status::error("the communicator" + where() + " was aborted")
               : Status::success();
#ifdef DFLASH_HAVE_NCCL
  ncclResult_t async = ncclSuccess;
  Status status = ncclStatus(ncclCommGetAsyncError(comm, &async),
                             "ncclCommGetAsyncError" + where(), comm);
  if (status.ok() && async != ncclSuccess && async != ncclInProgress)
    status = ncclStatus(async, "NCCL" + where(), comm);
  if (!status.ok())
    firstError = status;
  return status;
#else
  return Status::success();
#endif
}

void Collectives::abort() {
  if (!comm)
    return;
#ifdef DFLASH_HAVE_NCCL
  (void)ncclCommAbort(comm);
#endif
  comm = nullptr;
  wasAborted = true;
}

//===----------------------------------------------------------------------===//
// MPI
//===----------------------------------------------------------------------===//

#ifdef DFLASH_HAVE_MPI
namespace {
/// "<what>: <MPI's message>".
Status mpiStatus(int code, const std::string &what) {
  if (code == MPI_SUCCESS)
    return Status::success();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    length = 0;
  return Status::error(what + ": " +
                       (length > 0 ? std::string(text, size_t(length))
                                   : "MPI error " + std::to_string(code)));
}

class MpiProcessGroup : public ProcessGroup {
public:
  MpiProcessGroup(int64_t rank, int64_t size) : rankIndex(rank), count(size) {}
  ~MpiProcessGroup() override {
    int finalized = 0;
    if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized)
      MPI_Finalize();
  }
  int64_t rank() const override { return rankIndex; }
  int64_t size() const override { return count; }

  Status broadcast(void *data, size_t bytes, int64_t root) override {
    if (bytes > size_t(INT_MAX))
      return Status::error("MPI_Bcast of " + std::to_string(bytes) +
                           " bytes: too large");
    return mpiStatus(
        MPI_Bcast(data, int(bytes), MPI_BYTE, int(root), MPI_COMM_WORLD),
        "MPI_Bcast");
  }

  Status allGather(const void *mine, size_t bytes, void *all) override {
    if (bytes > size_t(INT_MAX))
      return Status::error("MPI_Allgather of " + std::to_string(bytes) +
                           " bytes: too large");
    return mpiStatus(MPI_Allgather(mine, int(bytes), MPI_BYTE, all, int(bytes),
                                   MPI_BYTE, MPI_COMM_WORLD),
                     "MPI_Allgather");
  }

  [[noreturn]] void abortAll(int exitCode) override {
    MPI_Abort(MPI_COMM_WORLD, exitCode);
    std::_Exit(exitCode); // MPI_Abort does not return; should it, still end
  }

private:
  int64_t rankIndex, count;
};
} // namespace
#endif

Status dflash::rt::joinProcessGroup(std::unique_ptr<ProcessGroup> &group) {
  group.reset();
  int64_t launched = launcherProcessCount();
  if (launched <= 1)
    return Status::success();
#ifdef DFLASH_HAVE_MPI
  int provided = 0;
  // Only the main thread of each process calls MPI.
  DFLASH_RETURN_IF_ERROR(mpiStatus(
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
      "MPI_Init_thread"));
  // Errors come back as codes, to be reported like every other failure.
  (void)MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  DFLASH_RETURN_IF_ERROR(
      mpiStatus(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank"));
  DFLASH_RETURN_IF_ERROR(
      mpiStatus(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size"));
  group = std::make_unique<MpiProcessGroup>(rank, size);
  return Status::success();
#else
  return Status::error("this trainer was built without MPI; multi-node runs "
                       "need it (install libopenmpi-dev and rebuild)");
#endif
}
