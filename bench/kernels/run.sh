#!/usr/bin/env bash
# Builds KernelBench when missing or older than its sources, runs it and the
# PyTorch baselines (torch_reference.py) on this GPU in one go, and prints one
# comparison table. Logs and JSON lines go to $OUT (or $1, or build-bench/).
#   [DFLASH_BENCH_ROUNDS=N] bench/kernels/run.sh [outdir] [only]
#     only: attention|lmhead|memory|gemm|gemm-algorithms|causal|hybrid|swiglu-gemm
# DFLASH_BENCH_ROUNDS=N runs KernelBench N times (the machine's speed drifts
# by several percent within minutes) and reports each kernel's median, with
# the rounds' range; the PyTorch baselines run once, after them.
# Both sides let the GPU idle DFLASH_BENCH_COOLDOWN_MS (default 1000) before
# each kernel, so every one is timed at the same (rested) clock, not at the
# power-capped clock the ones before it left; DFLASH_BENCH_COOLDOWN_MS=0
# DFLASH_BENCH_WARMUP_MS=1000 times each at its own sustained clock instead.
# The SM clock and power through the run are sampled into clocks.csv and
# summarised under the table.
# For profilers, DFLASH_BENCH_ONCE=1 runs each KernelBench variant once, e.g.
#   DFLASH_BENCH_ONCE=1 ncu --clock-control none --set full -k regex:fwd_wgmma \
#     -c 1 -o OUT/fwd build-bench/KernelBench OUT/k.jsonl attention-fwd
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-${OUT:-$root/build-bench}}
only=${2:-}
build=${DFLASH_BENCH_BUILD:-$root/build-bench}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$out" "$build"
bin=$build/KernelBench
rounds=${DFLASH_BENCH_ROUNDS:-1}
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
  echo "run.sh: DFLASH_BENCH_ROUNDS must be a positive integer, got '$rounds'" >&2
  exit 2
fi
# Refused here too (KernelBench and torch_reference.py check them as well),
# before anything is built or run.
for v in DFLASH_BENCH_COOLDOWN_MS DFLASH_BENCH_WARMUP_MS; do
  val=${!v:-}
  if [[ -n $val ]] && ! [[ $val =~ ^[0-9]{1,6}$ && $((10#$val)) -le 600000 ]]; then
    echo "run.sh: $v must be a whole number of milliseconds from 0 to 600000, got '$val'" >&2
    exit 2
  fi
done
if [[ ! -x $bin ]] || [[ -n $(find "$root/kernels" "$here" \( -name '*.cu*' -o -name '*.h' \) -newer "$bin") ]]; then
  echo "building $bin"
  "$nvcc" -std=c++17 -O3 -I"$root" -gencode=arch=compute_90a,code=sm_90a \
    --expt-relaxed-constexpr -lineinfo "$here/KernelBench.cu" "$here/TargetBench.cu" \
    -o "$bin" -lcublasLt
fi
# The SM clock and power through the run (nvidia-smi every 0.2 s, where it
# exists): the table's footer says at what clock the numbers were taken.
rm -f "$out/clocks.csv"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits \
    -lms 200 > "$out/clocks.csv" 2> /dev/null &
  smi=$!
  trap 'kill $smi 2> /dev/null || true' EXIT
fi
if ((rounds == 1)); then
  "$bin" "$out/kernels.jsonl" "$only" 2>&1 | tee "$out/kernels.log"
else
  for ((r = 1; r <= rounds; ++r)); do
    echo "KernelBench round $r of $rounds"
    "$bin" "$out/kernels-round$r.jsonl" "$only" 2>&1 | tee "$out/kernels-round$r.log"
  done
  # Each kernel's median over the rounds; its rate scaled to that time.
  python3 - "$out" "$rounds" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
for r in range(1, rounds + 1):
    for line in open(os.path.join(out, f"kernels-round{r}.jsonl")):
        if line.strip():
            row = json.loads(line)
            runs.setdefault(row["name"], []).append(row)
with open(os.path.join(out, "kernels.jsonl"), "w") as f:
    for name, rows in runs.items():
        times = [row["ms"] for row in rows]
        median = statistics.median(times)
        merged = dict(rows[0])
        merged["ms"] = median
        merged["value"] = rows[0]["value"] * rows[0]["ms"] / median
        merged["rounds"] = times
        f.write(json.dumps(merged) + "\n")
PY
fi
if [[ -z $only || $only == attention* || $only == lmhead || $only == causal || $only == hybrid ]]; then
  python3 "$here/torch_reference.py" --out "$out/torch.jsonl" \
    --anchors "$out/anchors_b4.bin" --only "$only" 2>&1 | tee "$out/torch.log"
fi
if [[ -n ${smi:-} ]]; then
  kill "$smi" 2> /dev/null || true
  wait "$smi" 2> /dev/null || true
fi
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return {}
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return {r["name"]: r for r in rows}
ours, torch = load("kernels.jsonl"), load("torch.jsonl")
print("\n| kernel | ours ms | ours | baseline | baseline ms | baseline | speedup |")
print("|---|---|---|---|---|---|---|")
for name, r in ours.items():
    base = None
    if name.startswith("attention"):
        # Variants carry a " [..]" suffix; flex runs once per shape.
        base = torch.get("flex_attention" + name[len("attention"):].split(" [")[0])
    spread = ""
    if len(r.get("rounds", [])) > 1:
        spread = f" ({min(r['rounds']):.3f}-{max(r['rounds']):.3f})"
    line = (f"| {name} | {r['ms']:.3f}{spread} | {r['value']:.1f} {r['metric']} "
            f"{r['note']} |")
    if base:
        line += (f" flex_attention | {base['ms']:.3f} | {base['value']:.1f} "
                 f"{base['metric']} | {base['ms'] / r['ms']:.2f}x |")
    else:
        line += " | | | |"
    print(line)
for name, r in torch.items():
    if name.startswith("torch"):
        print(f"| {name} | | | | {r['ms']:.3f} | {r['value']:.1f} "
              f"{r['metric']} {r['note']} | |")
samples = []
clocks = os.path.join(out, "clocks.csv")
if os.path.exists(clocks):
    for line in open(clocks):
        try:
            mhz, watts = (float(x) for x in line.split(","))
            samples.append((mhz, watts))
        except ValueError:
            pass  # a header or "[N/A]"
if samples:
    def pct(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, len(xs) * p // 100)]
    mhz = [m for m, _ in samples]
    watts = [w for _, w in samples]
    print(f"\nSM clock through the run ({len(samples)} samples): p10 / p50 / "
          f"p90 {pct(mhz, 10):.0f} / {pct(mhz, 50):.0f} / {pct(mhz, 90):.0f} "
          f"MHz; power p50 / p90 {pct(watts, 50):.0f} / {pct(watts, 90):.0f} W")
PY
