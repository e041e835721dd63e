#!/usr/bin/env bash
# Prepares, on a machine without a GPU, what the device scripts
# (scripts/device-*.sh) run on the GPU machine, under .device/ (git-ignored;
# carry it with the device tool's `carry`):
#   .device/bin/   GPU test binaries and trainers (no MPI: the GPU machine
#                  has none), train-<name> for each spec below
#   .device/specs/ the derived specs the multi-GPU checks compile
#   .device/tiny/  a synthetic tiny problem as files (target, data, init;
#                  packed: the same rows packed, test/oracle/pack_rows.py)
#   .device/ref/   dflash-reference losses and parameters on those files
#                  (bf16 storage and fp64), and the trainers' manifests
#   .device/tcfg/  the online checks' target configs (scripts/target-configs)
# Usage: scripts/device-prepare.sh [--no-qwen]   (qwen3-8b trainers take a
# few minutes of nvcc each)
#        scripts/device-prepare.sh --online [SUFFIX]
#   only the online target's binaries: target-features-{tq,tl} (tiny with
#   the small random Qwen3 / Llama-3 of tcfg/{qwen3,llama}),
#   target-features-q8 and train-q8o (qwen3-8b-b16 with the Qwen3-8B-shaped
#   target of tcfg/q8), each named with SUFFIX (e.g. -b), KernelBench, and
#   the GPU tests the online checks run; DFLASHC=path/to/dflashc emits them with another compiler
#   (an A/B pair from two trees), ONLINE_TARGETS="q8" builds only those
#   targets' binaries (nothing else), FUSE_TARGET_MLP=1 compiles them with
#   `[memory] fuse_target_mlp = true`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
D=.device
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
qwen=1
online=0
binSuffix=
[[ ${1:-} == --no-qwen ]] && qwen=0
[[ ${1:-} == --online ]] && online=1 && binSuffix=${2:-}
mkdir -p "$D/bin" "$D/specs" "$D/ref" "$D/gen" "$D/tcfg"
cp -r scripts/target-configs/. "$D/tcfg/"

step() { echo "device-prepare: $*"; }

# The compiler and the GPU tests, built without MPI.
if [[ ! -f build-dev/build.ninja ]]; then
  step "configuring build-dev"
  cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir -DMLIR_LINK_MLIR_DYLIB=ON \
    -DDFLASH_ENABLE_MPI=OFF -DCMAKE_CUDA_COMPILER="$nvcc" > /dev/null
fi
step "building build-dev"
ninja -C build-dev > "$D/build-dev.log" || { tail -20 "$D/build-dev.log"; exit 1; }
# The online mode carries only the tests its checks run: with every test
# beside the online binaries, .device outgrows what the device tool carries.
if [[ $online == 1 ]]; then
  tests="DenseGpuTest CausalAttentionGpuTest"
else
  tests="AttentionGpuTest DenseGpuTest LmHeadGpuTest AdamWGpuTest
         RuntimeTrainerTest GeneratedStepThreadsTest"
  cp build-dev/bin/dflash-synth "$D/bin/" # scripts/device-run-checks.sh makes data there
fi
[[ -n ${ONLINE_TARGETS:-} ]] && tests=
for t in $tests; do
  cp "build-dev/test/gpu/$t" "$D/bin/"
done
dflashc=${DFLASHC:-build-dev/bin/dflashc}

# Derived specs: tiny with small buckets (several per step), its ZeRO-1
# forms for two GPUs and for one, qwen3-8b's ZeRO-1 form for two GPUs.
sed 's/^name = .*/name = "tiny-b1"/' specs/tiny.toml > "$D/specs/tiny-b1.toml"
printf '\n[parallel]\nbucket_mib = 1\n' >> "$D/specs/tiny-b1.toml"
sed 's/^name = .*/name = "tiny-zero1"/' specs/tiny.toml > "$D/specs/tiny-zero1.toml"
printf '\n[parallel]\ngpus_per_node = 2\nbucket_mib = 1\nshard_optimizer_state = true\n' \
  >> "$D/specs/tiny-zero1.toml"
sed 's/^name = .*/name = "tiny-zero1-one"/' specs/tiny.toml > "$D/specs/tiny-zero1-one.toml"
printf '\n[parallel]\nbucket_mib = 1\nshard_optimizer_state = true\n' \
  >> "$D/specs/tiny-zero1-one.toml"
sed 's/^name = .*/name = "qwen3-8b-zero1"/' specs/qwen3-8b-b16.toml > "$D/specs/qwen3-8b-zero1.toml"
printf '\n[parallel]\ngpus_per_node = 2\nshard_optimizer_state = true\n' \
  >> "$D/specs/qwen3-8b-zero1.toml"

# Emits the trainer project of `dflashc ARGS...` into $D/gen/NAME and builds
# it without MPI: project NAME ARGS...
project() {
  local dir=$D/gen/$1
  shift
  rm -rf "$dir"
  "$dflashc" "$@" --emit=cuda -o "$dir" > /dev/null
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDFLASH_ENABLE_MPI=OFF -DCMAKE_CUDA_COMPILER="$nvcc" > "$dir.cmake.log"
  ninja -C "$dir/build" > "$dir.build.log" || { tail -20 "$dir.build.log"; exit 1; }
}
# One trainer: keep the binary and the manifest (FLOPs per step).
trainer() {
  local name=$1 spec=$2 dir=$D/gen/$1
  step "trainer $name ($spec)"
  project "$name" "$spec"
  cp "$dir/build/train" "$D/bin/train-$name"
  cp "$dir/manifest.json" "$D/ref/$name-manifest.json"
}
# An online-target project: its train and target-features binaries.
online() {
  local name=$1 spec=$2 target=$3 dir=$D/gen/$1
  if [[ ${FUSE_TARGET_MLP:-0} == 1 ]]; then
    cp "$spec" "$D/specs/$name-fused.toml"
    printf '\n[memory]\nfuse_target_mlp = true\n' >> "$D/specs/$name-fused.toml"
    spec=$D/specs/$name-fused.toml
  fi
  step "online target $name ($spec --target $target)"
  project "$name" "$spec" --target "$target"
  cp "$dir/build/target-features" "$D/bin/target-features-$name$binSuffix"
  [[ $name == q8 ]] && cp "$dir/build/train" "$D/bin/train-q8o$binSuffix"
  return 0
}
if [[ $online == 1 ]]; then
  if [[ -z ${ONLINE_TARGETS:-} ]]; then
    step "KernelBench"
    "$nvcc" -std=c++17 -O3 -I"$root" -gencode=arch=compute_90a,code=sm_90a \
      --expt-relaxed-constexpr -lineinfo bench/kernels/KernelBench.cu \
      -o "$D/bin/KernelBench" -lcublasLt
  fi
  for t in ${ONLINE_TARGETS:-tq tl q8}; do
    case $t in
      tq) online tq specs/tiny.toml "$D/tcfg/qwen3" ;;
      tl) online tl specs/tiny.toml "$D/tcfg/llama" ;;
      q8) online q8 specs/qwen3-8b-b16.toml "$D/tcfg/q8" ;;
      *) echo "device-prepare: unknown online target '$t' (tq, tl, q8)" >&2; exit 2 ;;
    esac
  done
  rm -rf "$D/gen"
  du -sh "$D"
  step "done; carry [\".device\"] (the device tool takes 64 MiB at most)"
  exit 0
fi

trainer tiny specs/tiny.toml
for n in tiny-b1 tiny-zero1 tiny-zero1-one; do trainer "$n" "$D/specs/$n.toml"; done
if [[ $qwen == 1 ]]; then
  trainer qwen3-8b specs/qwen3-8b-b16.toml
  trainer qwen3-8b-zero1 "$D/specs/qwen3-8b-zero1.toml"
fi

# The tiny problem as files, and the CPU reference's 10 steps on them.
step "synthetic tiny problem and the CPU reference"
build-dev/bin/dflash-synth specs/tiny.toml "$D/tiny" > /dev/null
for p in storage exact; do
  suffix=$([[ $p == exact ]] && echo -exact || true)
  build-dev/bin/dflash-reference specs/tiny.toml --target "$D/tiny/target" \
    --data "$D/tiny/data" --init "$D/tiny/init" --steps 10 --precision "$p" \
    --save "$D/ref/tiny-params$suffix" > "$D/ref/tiny-losses$suffix.jsonl"
done
# The same rows packed (conversations restarting at columns 40 and 90) and
# the reference on them, for scripts/device-packing-check.sh (a python3
# with numpy: Debian's, or $PYTHON).
"${PYTHON:-/usr/bin/python3}" test/oracle/pack_rows.py "$D/tiny/data" "$D/tiny/packed" 40 90
build-dev/bin/dflash-reference specs/tiny.toml --target "$D/tiny/target" \
  --data "$D/tiny/packed" --init "$D/tiny/init" --steps 10 --precision storage \
  --save "$D/ref/tiny-packed-params" > "$D/ref/tiny-packed-losses.jsonl"
rm -rf "$D/gen"
du -sh "$D"
step "done; carry [\".device\"] (the device tool takes 64 MiB at most)"
