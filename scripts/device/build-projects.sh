#!/usr/bin/env bash
# Builds trainer projects emitted on the CPU machine (dflashc SPEC
# --emit=cuda -o GEN/NAME) on the GPU machine, all at once on its cores, and
# puts each trainer where device-check looks for it: .device/bin/train-NAME,
# or for a project with an online target (dflashc --target) the online
# items' names, .device/bin/train-NAMEo and .device/bin/target-features-NAME.
# The CPU machine has two cores: six long-context trainers take 45 minutes
# of nvcc there and two here. The flags are device-prepare.sh's (Release,
# no MPI). Usage: scripts/device/build-projects.sh GEN
set -euo pipefail
gen=${1:?usage: scripts/device/build-projects.sh GEN (a folder of emitted projects)}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p .device/bin
names=()
for dir in "$gen"/*/; do names+=("$(basename "$dir")"); done
((${#names[@]} > 0)) || { echo "build-projects: no project under $gen" >&2; exit 2; }
jobs=$(( $(nproc) / ${#names[@]} + 1 ))
pids=()
for name in "${names[@]}"; do
  (cmake -S "$gen/$name" -B "$gen/$name/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DDFLASH_ENABLE_MPI=OFF -DCMAKE_CUDA_COMPILER="$nvcc" > "$gen/$name.cmake.log" &&
   ninja -C "$gen/$name/build" -j "$jobs" > "$gen/$name.build.log" &&
   # dflashc writes a target.cu either way; without --target it says so.
   if ! grep -q "no online target was built in" "$gen/$name/target.cu"; then
     cp "$gen/$name/build/train" ".device/bin/train-${name}o" &&
     cp "$gen/$name/build/target-features" ".device/bin/target-features-$name"
   else
     cp "$gen/$name/build/train" ".device/bin/train-$name"
   fi) &
  pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "build-projects: ${names[$i]} failed:" >&2
    tail -20 "$gen/${names[$i]}.build.log" "$gen/${names[$i]}.cmake.log" >&2 2>/dev/null || true
    failed=1
  fi
done
((failed == 0)) && echo "build-projects: built ${names[*]}"
exit $failed
