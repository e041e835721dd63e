//===- TargetFeaturesMain.cpp - The `target-features` binary --------------===//

#include "runtime/cli/TargetFeaturesMain.h"

#include "runtime/data/FeatureShard.h"
#include "runtime/device/DeviceContext.h"
#include "runtime/device/StepBuffers.h"
#include "runtime/io/Safetensors.h"
#include "runtime/io/TargetWeights.h"
#include "runtime/train/TargetServer.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

using namespace dflash;
using namespace dflash::rt;

namespace {

struct Options {
  std::string target, rows, out;
  std::string experts; ///< where to write the sparse layers' expert ids
  int bench = 0;       ///< timed batches on random weights; 0: features
  bool packed = false;
  bool noGemmTiming = false;
  bool noGraph = false; ///< --bench: launch op by op, not as one CUDA graph
  int device = 0;
};

/// Random bf16 values of a decoder's scale (randomWeightPattern, norms 1),
/// uploaded straight into the frozen buffers.
Status fillRandomWeights(const std::vector<BufferSpec> &specs,
                         const std::vector<void *> &buffers,
                         const TargetBufferMap &map) {
  const std::vector<uint16_t> &pattern = randomWeightPattern();
  std::vector<uint16_t> ones(size_t(1) << 16, kBf16One);
  for (int index : map.frozen) {
    const BufferSpec &b = specs[size_t(index)];
    const bool norm = b.shape.size() == 1;
    const std::vector<uint16_t> &src = norm ? ones : pattern;
    const size_t total = b.bytes(), chunk = src.size() * 2;
    for (size_t at = 0; at < total; at += chunk)
      DFLASH_RETURN_IF_ERROR(cudaCallStatus(
          cudaMemcpy(static_cast<char *>(buffers[size_t(index)]) + at,
                     src.data(), std::min(chunk, total - at),
                     cudaMemcpyHostToDevice),
          "uploading random weights to '" + b.name + "'"));
  }
  return Status::success();
}

Status run(const Options &o, std::unique_ptr<StepProgram> (*factory)()) {
  std::unique_ptr<StepProgram> program = factory ? factory() : nullptr;
  if (!program)
    return Status::error("this trainer was compiled without an online target "
                         "(dflashc SPEC --target DIR builds one in)");
  const std::vector<BufferSpec> &specs = program->buffers();
  TargetBufferMap map;
  DFLASH_RETURN_IF_ERROR(mapTargetBuffers(specs, map));
  const BufferSpec &ids = specs[size_t(map.inputIds)];
  const BufferSpec &features = specs[size_t(map.features)];
  const int64_t B = ids.shape[0], S = ids.shape[1];

  // Host side first: every mistake in the inputs before the GPU is touched.
  std::vector<std::vector<uint16_t>> weights;
  SafetensorsFile rowsIn;
  TokenRows tokens;
  if (!o.bench) {
    std::vector<FrozenTensor> wanted;
    for (int index : map.frozen)
      wanted.push_back({specs[size_t(index)].name, specs[size_t(index)].shape});
    DFLASH_RETURN_IF_ERROR(
        loadFrozenTensors(o.target, wanted, "the target program", weights));
    DFLASH_RETURN_IF_ERROR(rowsIn.open(o.rows));
    const int64_t V = specs[size_t(map.frozen[0])].shape[0];
    DFLASH_RETURN_IF_ERROR(readTokenRows(rowsIn, S, V, tokens));
    if (!o.experts.empty() && map.expertIds.empty())
      return Status::error("--experts: the target program has no sparse "
                           "layers, so no expert ids to write");
  }

  std::unique_ptr<DeviceContext> device;
  DFLASH_RETURN_IF_ERROR(
      DeviceContext::create(o.device, program->gemmWorkspaceBytes(), device));
  device->setGemmTiming(!o.noGemmTiming);
  DFLASH_RETURN_IF_ERROR(device->allocate(specs, program->arenaBytes()));
  const std::vector<void *> &buffers = device->buffers();
  if (o.bench) {
    DFLASH_RETURN_IF_ERROR(fillRandomWeights(specs, buffers, map));
  } else {
    DFLASH_RETURN_IF_ERROR(uploadTargetWeights(specs, map, buffers, weights));
    weights.clear();
  }
  DFLASH_RETURN_IF_ERROR(program->bind(buffers, device->arena(),
                                       device->resources(), StepHyper{}));
  cudaStream_t stream = device->stream();
  const size_t tokenBytes = size_t(B * S) * 4;
  std::vector<int32_t> batchIds(size_t(B * S)), batchPositions(size_t(B * S));
  auto upload = [&]() -> Status {
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemcpyAsync(buffers[size_t(map.inputIds)], batchIds.data(),
                        tokenBytes, cudaMemcpyHostToDevice, stream),
        "copying input_ids"));
    return cudaCallStatus(cudaMemcpyAsync(buffers[size_t(map.positionIds)],
                                          batchPositions.data(), tokenBytes,
                                          cudaMemcpyHostToDevice, stream),
                          "copying position_ids");
  };
  auto enqueue = [&]() -> Status {
    DFLASH_RETURN_IF_ERROR(program->enqueue(stream));
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaGetLastError(), "launching the target program"));
    // The first launch planned the GEMMs: time them for the next ones.
    return device->timeNewGemmShapes();
  };

  if (o.bench) {
    // Unpacked rows, or conversations of 64..1536 tokens packed end to end.
    std::mt19937 rng(11);
    const int64_t V = specs[size_t(map.frozen[0])].shape[0];
    std::uniform_int_distribution<int32_t> token(0, int32_t(V - 1));
    std::uniform_int_distribution<int64_t> length(64, 1536);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0, start = 0, end = o.packed ? length(rng) : S; t < S;
           ++t) {
        if (t == end) {
          start = t;
          end = t + length(rng);
        }
        batchIds[size_t(b * S + t)] = token(rng);
        batchPositions[size_t(b * S + t)] = int32_t(t - start);
      }
    DFLASH_RETURN_IF_ERROR(upload());
    // As train replays it: one CUDA graph (its GEMMs timed at the capture),
    // unless --no-graph (each op launched). DFLASH_PROFILE times either.
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t graphExec = nullptr;
    if (!o.noGraph)
      DFLASH_RETURN_IF_ERROR(captureProgramGraph(
          *program, *device, "the online target", graph, graphExec));
    auto launch = [&]() -> Status {
      if (o.noGraph)
        return enqueue();
      return launchProgram(*program, graphExec, stream, "the online target");
    };
    cudaEvent_t start, stop;
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaEventCreate(&start), "cudaEventCreate"));
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaEventCreate(&stop), "cudaEventCreate"));
    std::vector<float> ms;
    for (int i = 0; i < o.bench + 3; ++i) {
      DFLASH_RETURN_IF_ERROR(
          cudaCallStatus(cudaEventRecord(start, stream), "event"));
      DFLASH_RETURN_IF_ERROR(launch());
      DFLASH_RETURN_IF_ERROR(
          cudaCallStatus(cudaEventRecord(stop, stream), "event"));
      DFLASH_RETURN_IF_ERROR(device->synchronize("the target program"));
      float t = 0;
      DFLASH_RETURN_IF_ERROR(cudaCallStatus(
          cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime"));
      if (i >= 3)
        ms.push_back(t);
    }
    if (graphExec)
      DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaGraphExecDestroy(graphExec),
                                            "cudaGraphExecDestroy"));
    if (graph)
      DFLASH_RETURN_IF_ERROR(
          cudaCallStatus(cudaGraphDestroy(graph), "cudaGraphDestroy"));
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    DeviceMemory memory;
    DFLASH_RETURN_IF_ERROR(device->memory(memory));
    const kernels::GemmTimingSummary &gemms = device->gemmTimingSummary();
    // Which algorithm each timed shape runs, for comparing machines.
    for (const kernels::GemmCandidateTimes &t : device->gemmTimings()) {
      const int c = t.chosen;
      std::fprintf(stderr,
                   "target-features: %s: candidate %d of %zu, %.3f ms, %.1f "
                   "TFLOP/s (first %.3f ms)\n",
                   t.shape.c_str(), c + 1, t.ms.size(), t.ms[size_t(c)],
                   t.flops / (double(t.ms[size_t(c)]) * 1e-3) / 1e12, t.ms[0]);
    }
    std::printf("{\"rows\": %lld, \"seq_len\": %lld, \"packed\": %s, "
                "\"graph\": %s, \"ms\": %.3f, \"tokens_per_s\": %.0f, "
                "\"tflops\": %.1f, "
                "\"gemm_shapes_timed\": %d, \"gemm_shapes_faster\": %d, "
                "\"gemm_shapes_untimed\": %d, "
                "\"arena_gib\": %.2f, \"buffers_gib\": %.2f, "
                "\"device_used_gib\": %.2f}\n",
                (long long)B, (long long)S, o.packed ? "true" : "false",
                o.noGraph ? "false" : "true", median,
                double(B * S) / (median * 1e-3),
                program->flopsPerStep() / (median * 1e-3) / 1e12,
                gemms.timed + gemms.agreed, gemms.faster, gemms.untimed,
                double(program->arenaBytes()) / double(1 << 30),
                double(device->bufferBytes()) / double(1 << 30),
                double(memory.usedBytes()) / double(1 << 30));
    return Status::success();
  }

  // Features of every row, B at a time; a last partial batch is padded
  // with copies of row 0 whose features are dropped.
  const int64_t R = tokens.rows, width = features.shape.back();
  std::vector<uint16_t> out(size_t(R * S * width));
  // --experts: each sparse layer's [B*S, k] ids, gathered to [R, S, k].
  std::vector<std::vector<int32_t>> experts;
  if (!o.experts.empty())
    for (int index : map.expertIds)
      experts.emplace_back(size_t(R * S * specs[size_t(index)].shape[1]));
  for (int64_t r0 = 0; r0 < R; r0 += B) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = r0 + b < R ? r0 + b : 0;
      std::memcpy(&batchIds[size_t(b * S)], &tokens.ids[size_t(r * S)], S * 4);
      std::memcpy(&batchPositions[size_t(b * S)],
                  &tokens.positions[size_t(r * S)], S * 4);
    }
    DFLASH_RETURN_IF_ERROR(upload());
    DFLASH_RETURN_IF_ERROR(enqueue());
    const int64_t n = std::min(B, R - r0);
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemcpyAsync(
            &out[size_t(r0 * S * width)], buffers[size_t(map.features)],
            size_t(n * S * width) * 2, cudaMemcpyDeviceToHost, stream),
        "copying the features back"));
    for (size_t e = 0; e < experts.size(); ++e) {
      const int64_t k = specs[size_t(map.expertIds[e])].shape[1];
      DFLASH_RETURN_IF_ERROR(cudaCallStatus(
          cudaMemcpyAsync(&experts[e][size_t(r0 * S * k)],
                          buffers[size_t(map.expertIds[e])],
                          size_t(n * S * k) * 4, cudaMemcpyDeviceToHost,
                          stream),
          "copying " + specs[size_t(map.expertIds[e])].name + " back"));
    }
    DFLASH_RETURN_IF_ERROR(device->synchronize("the target program"));
  }
  DFLASH_RETURN_IF_ERROR(
      writeFeatureShard(o.out, rowsIn, out, width, o.target));
  if (!o.experts.empty()) {
    std::vector<TensorData> tensors;
    for (size_t e = 0; e < experts.size(); ++e) {
      const BufferSpec &b = specs[size_t(map.expertIds[e])];
      tensors.push_back(
          {b.name, DType::I32, {R, S, b.shape[1]}, experts[e].data()});
    }
    DFLASH_RETURN_IF_ERROR(writeSafetensors(
        o.experts, tensors,
        {{"format", "dflash-expert-ids"}, {"target", o.target}}));
    std::fprintf(stderr,
                 "target-features: wrote %s: the expert ids of %zu sparse "
                 "layers [%lld, %lld, k]\n",
                 o.experts.c_str(), experts.size(), (long long)R, (long long)S);
  }
  std::fprintf(stderr,
               "target-features: wrote %s: hidden_states [%lld, %lld, "
               "%lld] on %s\n",
               o.out.c_str(), (long long)R, (long long)S, (long long)width,
               device->name().c_str());
  return Status::success();
}

} // namespace

int dflash::rt::targetFeaturesMain(int argc, char **argv,
                                   std::unique_ptr<StepProgram> (*target)()) {
  CLI::App app("The compiled online target on one GPU: the features of a "
               "token shard, or (--bench) its speed on random weights.",
               "target-features");
  Options o;
  app.add_option("--target", o.target,
                 "Hugging Face directory of the target (its safetensors "
                 "shards, read by tensor name)")
      ->type_name("DIR");
  app.add_option("--rows", o.rows,
                 "token shard: input_ids [R, seq_len] I32, and position_ids "
                 "where rows are packed")
      ->type_name("FILE");
  app.add_option("-o,--out", o.out,
                 "feature shard to write: the token shard's tensors and "
                 "hidden_states [R, seq_len, taps x hidden] bf16")
      ->type_name("FILE");
  app.add_option("--experts", o.experts,
                 "also write each sparse layer's chosen experts, "
                 "model.layers.<i>.mlp.expert_ids [R, seq_len, k] I32 in "
                 "the router's order, to this safetensors file")
      ->type_name("FILE");
  app.add_option("--bench", o.bench,
                 "time N batches on random weights and tokens instead "
                 "(median, tokens/s, TFLOP/s by the compiler's count)")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  app.add_flag("--packed", o.packed,
               "with --bench: rows packed with conversations of 64..1536 "
               "tokens (default: one conversation a row)");
  app.add_option("--device", o.device, "CUDA device (default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no-graph", o.noGraph,
               "with --bench: launch the program op by op instead of as one "
               "CUDA graph, as train replays it (DFLASH_PROFILE=1 times each "
               "op either way)");
  app.add_flag("--no-gemm-timing", o.noGemmTiming,
               "run every GEMM with cuBLASLt's first heuristic choice instead "
               "of timing its candidates at the first batch");
  try {
    app.parse(argc, argv);
    if (!o.bench && (o.target.empty() || o.rows.empty() || o.out.empty()))
      throw CLI::ValidationError("--target, --rows and -o are needed (or "
                                 "--bench N)");
    if (o.bench && !o.experts.empty())
      throw CLI::ValidationError("--experts writes the experts of a token "
                                 "shard's rows; --bench has none");
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  Status s = run(o, target);
  if (!s.ok()) {
    std::fprintf(stderr, "target-features: error: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}
