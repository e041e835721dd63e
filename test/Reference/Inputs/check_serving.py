"""Checks dflash-reference's serving-order acceptance (docs/runtime.md,
"Serving tau") independently of runtime/train/ServingWalk.cpp.

  check_serving.py walk DUMP LINE N > ANCHORS
      DUMP: --eval-serving-dump's lines (each walked row's loss_mask,
      position_ids, candidates and the run at each candidate); LINE: the
      run's output, whose last line is the evaluation's. Recomputes each
      row's candidates (docs/semantics.md sections 2 and 9) and walks the
      runs as a server drafts; the sums must be the line's
      eval_serving_tau and eval_serving_blocks. Writes the walked anchors,
      N at most a line, as --eval-anchors reads them.
  check_serving.py compare LINE PINNED
      PINNED: the output of a second run evaluated at exactly those
      anchors, whose eval_tau is mean(1 + run) over them, computed by the
      evaluation program's own draft_acceptance sums instead of the host
      walk's per-slot runs: it must equal LINE's eval_serving_tau.
"""

import json
import sys


def last_eval(path):
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.startswith("{")]
    evals = [line for line in lines if "eval_tau" in line]
    if not evals:
        sys.exit(f"{path}: no evaluation line")
    return evals[-1]


def candidates(mask, positions):
    return [
        a
        for a in range(len(mask) - 1)
        if mask[a] and mask[a + 1] and positions[a + 1] == positions[a] + 1
    ]


def walk(dump, line_path, n):
    line = last_eval(line_path)
    runs_total = blocks = rows = longest = skips = 0
    for text in open(dump):
        row = json.loads(text)
        rows += 1
        c = candidates(row["loss_mask"], row["position_ids"])
        if c != row["candidates"]:
            sys.exit(f"row {row['row']}: candidates {row['candidates']} != {c}")
        run = dict(zip(c, row["runs"]))
        if len(run) != len(c):
            sys.exit(f"row {row['row']}: {len(row['runs'])} runs")
        walked = []
        a = c[0] if c else None
        while a is not None:
            walked.append(a)
            runs_total += 1 + run[a]
            blocks += 1
            longest = max(longest, run[a])
            after = a + 1 + run[a]
            following = [x for x in c if x >= after]
            if following and following[0] != after:
                skips += 1
            a = following[0] if following else None
        for i in range(0, len(walked), n):
            print(row["row"], *walked[i : i + n])
    tau = runs_total / blocks
    if rows != line["eval_serving_rows"]:
        sys.exit(f"{rows} rows dumped, the line says {line['eval_serving_rows']}")
    if blocks != line["eval_serving_blocks"]:
        sys.exit(f"{blocks} blocks walked, the line says {line['eval_serving_blocks']}")
    if abs(tau - line["eval_serving_tau"]) > 1e-6 * tau:
        sys.exit(f"serving tau {tau} != the line's {line['eval_serving_tau']}")
    print(
        f"walk: {rows} rows, {blocks} blocks, serving tau {tau:.4f} = the line's, "
        f"longest run {longest}, {skips} jumps to a later candidate",
        file=sys.stderr,
    )


def compare(line_path, pinned_path):
    serving = last_eval(line_path)["eval_serving_tau"]
    pinned = last_eval(pinned_path)["eval_tau"]
    same = abs(serving - pinned) <= 1e-6 * serving
    print(
        f"pinned anchors: eval_tau {pinned:.6f} "
        f"{'=' if same else '!='} eval_serving_tau {serving:.6f}"
    )
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "walk":
        walk(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
