#!/usr/bin/env python3
# Stands in for KernelBench in run-rounds.test: round r (counted in a file
# beside the output) reports one kernel at 1 + r * r / 10 ms (1.1, 1.4,
# 1.9: median and mean differ) and 4270 / ms GB/s.
import json, os, sys

counter = os.path.join(os.path.dirname(sys.argv[1]), "fake-round")
r = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(r))
ms = 1 + r * r / 10
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"name": "copy d2d 2 GiB (read+write)", "ms": ms,
                        "metric": "GB/s", "value": 4270 / ms, "note": ""}) + "\n")
print(f"fake KernelBench round {r}")
