#!/usr/bin/env python3
"""The GPU's ceilings the step-time estimates scale by: a large bf16 GEMM's
rate and the device-to-device copy's, through PyTorch (cuBLAS), as result
lines for bench/results.py --append.

  python3 bench/step/gpu_ceilings.py --commit C [--out results.jsonl]

The GEMM is 8192 x 8192 x 8192 on random data: rested (the median of 10
products after 3 warm-ups, as bench/RESULTS.md's H200 ceilings were taken)
and sustained (the median of 20 after 2 s of GEMMs, at the power-capped
clock a step runs at; on the H200 the two differ by about 10%). The copy
moves 4 GiB, counting bytes read and written.
`dflashc --summary` (compiler/Analysis/StepTime.h) scales the measured
qwen3-8b-b16 step rate by the ratio of these ceilings."""

import argparse
import datetime
import json
import statistics
import sys
import time

import torch

COMMAND = "python3 bench/step/gpu_ceilings.py"


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True)
    parser.add_argument("--out", default="-")
    args = parser.parse_args()

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    def gemm():
        torch.matmul(a, b, out=c)

    for _ in range(3):
        gemm()
    rested = 2 * n ** 3 / timed(gemm, 10) / 1e12
    deadline = time.time() + 2.0
    while time.time() < deadline:
        gemm()
        torch.cuda.synchronize()
    sustained = 2 * n ** 3 / timed(gemm, 20) / 1e12

    src = torch.empty(1 << 31, device="cuda", dtype=torch.int16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_s = timed(lambda: dst.copy_(src), 20)
    gbs = 2 * src.numel() * src.element_size() / copy_s / 1e9

    gpu = torch.cuda.get_device_name()
    context = {"date": datetime.date.today().isoformat(), "commit": args.commit,
               "gpu": gpu, "command": COMMAND,
               "history": "GPU ceilings for the step-time estimate (issue 56)"}
    gemm_name = "bf16 GEMM 8192 x 8192 x 8192, PyTorch (cuBLAS), random data"
    lines = [
        dict(benchmark=gemm_name, value=round(rested, 1), unit="TFLOP/s",
             label="rested", **context),
        dict(benchmark=gemm_name, value=round(sustained, 1), unit="TFLOP/s",
             label="after 2 s of GEMMs", **context),
        dict(benchmark="device-to-device copy, 4 GiB (bytes read and written)",
             value=round(gbs), unit="GB/s", **context),
    ]
    out = sys.stdout if args.out == "-" else open(args.out, "w")
    for line in lines:
        out.write(json.dumps(line) + "\n")
    print(f"{gpu}: GEMM rested {rested:.1f}, sustained {sustained:.1f} TFLOP/s; "
          f"copy {gbs:.0f} GB/s", file=sys.stderr)


if __name__ == "__main__":
    main()
