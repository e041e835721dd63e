"""dflash-plot: loss, accuracy and acceptance length (tau) against the step,
train and eval, from one or more metrics.jsonl files into a PNG.

A metrics line is a JSON object with an integer "step" and any of "loss",
"acc", "tau" (training) and "eval_loss", "eval_acc", "eval_tau" (held-out
evaluation; on the same lines or on lines of their own). Missing keys and
nulls (the trainer writes a non-finite value as null) are left out of the
curves; a panel with no data says so. The tau panel also draws
"eval_serving_tau" where the evaluation lines carry it (the serving-order
acceptance, docs/runtime.md "Serving tau": the figure to watch, as a server
would measure it). Where the lines carry "tau_by_bucket"
or "eval_tau_by_bucket" (tau per anchor-position bucket, docs/semantics.md
section 14), a fourth panel draws one curve per bucket, named after the
edges of the run's "position_buckets".
"""
import argparse
import json
import math
import os
import shlex
import sys
import sysconfig

PROG = "dflash-plot"

# (panel title, y label, [(metrics key, series label)])
PANELS = [
    ("loss", "loss", [("loss", "train"), ("eval_loss", "eval")]),
    ("accuracy", "acc", [("acc", "train"), ("eval_acc", "eval")]),
    ("acceptance length", "tau", [("tau", "train"), ("eval_tau", "eval"),
                                  ("eval_serving_tau", "eval serving")]),
]
KEYS = [key for _, _, series in PANELS for key, _ in series]
# Per-bucket lists: (metrics key, series label).
BUCKET_KEYS = [("tau_by_bucket", "train"), ("eval_tau_by_bucket", "eval")]


class PlotError(Exception):
    pass


def _install_hint():
    """How to install matplotlib for this python (as dflash_prepare.errors
    install_hint says it of its packages)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    setup = os.path.join(root, "scripts", "setup.sh")
    ways = [f"{shlex.quote(setup)} --data (a virtual environment with every package of the "
            "data tools, which the launchers then use)"] if os.path.isfile(setup) else []
    managed = sys.prefix == sys.base_prefix and os.path.exists(
        os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
    ways.append("apt-get install python3-matplotlib" if managed else
                f"{shlex.quote(sys.executable)} -m pip install matplotlib")
    return "run " + ", or ".join(ways)


def _size(edge):
    """4096 -> "4K"; other edges as they are."""
    return f"{edge // 1024}K" if edge and edge % 1024 == 0 else str(edge)


def bucket_labels(edges, count):
    """Names of `count` buckets with these edges: "[0, 4K)", "[4K, 16K)",
    "16K+"; "bucket j" where the edges are unknown or do not fit."""
    if edges is None or len(edges) != count - 1:
        return [f"bucket {j}" for j in range(count)]
    bounds = [0] + list(edges)
    return [f"[{_size(bounds[j])}, {_size(bounds[j + 1])})" for j in range(count - 1)] \
        + [f"{_size(bounds[-1])}+"]


def read_metrics(path):
    """{key: [(step, value)]} of one metrics file, and for the per-bucket
    keys {key: [[(step, value)] of bucket j]} and "position_buckets" (the
    last edges the file names, or None); a line that is not a JSON object
    with an integer step is an error naming the line."""
    series = {key: [] for key in KEYS}
    series.update({key: [] for key, _ in BUCKET_KEYS})
    series["position_buckets"] = None
    try:
        f = open(path, encoding="utf-8-sig")  # a byte-order mark at the start is read over
    except OSError as error:
        raise PlotError(f"{path}: cannot open: {error.strerror}") from None
    with f:
        lines = f.readlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for index, line in enumerate(lines):
        number = index + 1
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if index == last and not line.endswith("\n"):
                # A run still writing leaves a half line at the end.
                print(f"{PROG}: warning: {path}:{number}: incomplete last line "
                      "skipped", file=sys.stderr)
                continue
            raise PlotError(f"{path}:{number}: malformed json: "
                            f"{error.msg[:1].lower() + error.msg[1:]}") from None
        if not isinstance(record, dict):
            raise PlotError(f"{path}:{number}: not a json object")
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise PlotError(f"{path}:{number}: has no integer 'step'")
        for key in KEYS:
            value = record.get(key)
            if _finite(value):
                series[key].append((step, float(value)))
        edges = record.get("position_buckets")
        if isinstance(edges, list) and all(isinstance(e, int) for e in edges):
            series["position_buckets"] = edges
        for key, _ in BUCKET_KEYS:
            values = record.get(key)
            if not isinstance(values, list):
                continue
            buckets = series[key]
            while len(buckets) < len(values):
                buckets.append([])
            for j, value in enumerate(values):
                if _finite(value):
                    buckets[j].append((step, float(value)))
    for key in KEYS:
        series[key].sort()
    for key, _ in BUCKET_KEYS:
        for points in series[key]:
            points.sort()
    return series


def _finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def has_buckets(series):
    return any(points for key, _ in BUCKET_KEYS for points in series[key])


def smooth(values, window):
    """Trailing mean over `window` points (1: unchanged)."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(runs, output, title=None, window=1):
    """Draws `runs` ([(label, series)]) into the PNG `output`."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(f"the python package 'matplotlib' is missing from {sys.executable}; "
                        f"drawing needs it: {_install_hint()}") from None
    buckets = any(has_buckets(series) for _, series in runs)
    panels = len(PANELS) + (1 if buckets else 0)
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if buckets:
        _plot_buckets(axes[-1], runs, colors, window)
    for axis, (panel, ylabel, keys) in zip(axes, PANELS):
        drawn = 0
        for r, (label, series) in enumerate(runs):
            color = colors[r % len(colors)]
            for key, kind in keys:
                points = series[key]
                if not points:
                    continue
                steps = [s for s, _ in points]
                values = [v for _, v in points]
                name = kind if len(runs) == 1 else f"{label} {kind}"
                # The few eval points go on top of the noisy per-step train
                # curve, which is drawn lighter so that they stay visible.
                if kind == "train":
                    axis.plot(steps, smooth(values, window), color=color,
                              linewidth=1.0, alpha=0.45, label=name, zorder=2)
                else:
                    # Serving tau solid with squares, beside eval tau's dashes.
                    serving = kind == "eval serving"
                    axis.plot(steps, values, color="black" if len(runs) == 1 else color,
                              linestyle="-" if serving else "--",
                              marker="s" if serving else "o", markersize=5,
                              linewidth=1.8, label=name, zorder=3)
                drawn += 1
        axis.set_title(panel)
        axis.set_xlabel("step")
        axis.set_ylabel(ylabel)
        axis.grid(True, alpha=0.3)
        if drawn:
            axis.legend(fontsize=8)
        else:
            axis.text(0.5, 0.5, f"no {ylabel} in the metrics", ha="center",
                      va="center", transform=axis.transAxes, color="gray")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    directory = os.path.dirname(os.path.abspath(output))
    temp = os.path.join(directory, f".{os.path.basename(output)}.tmp-{os.getpid()}.png")
    try:
        figure.savefig(temp, format="png")
        os.replace(temp, output)
    except OSError as error:
        raise PlotError(f"{output}: cannot write: {error.strerror}") from None
    finally:
        plt.close(figure)
        if os.path.exists(temp):
            os.remove(temp)


def _plot_buckets(axis, runs, colors, window):
    """Tau per anchor-position bucket: a color per bucket, a line style per
    run; eval points dashed with markers."""
    styles = ["-", ":", "-.", (0, (5, 1))]
    for r, (label, series) in enumerate(runs):
        for key, kind in BUCKET_KEYS:
            names = bucket_labels(series["position_buckets"], len(series[key]))
            for j, points in enumerate(series[key]):
                if not points:
                    continue
                steps = [s for s, _ in points]
                values = [v for _, v in points]
                name = f"{names[j]} {kind}" if len(runs) == 1 else f"{label} {names[j]} {kind}"
                color = colors[j % len(colors)]
                if kind == "train":
                    axis.plot(steps, smooth(values, window), color=color,
                              linestyle=styles[r % len(styles)], linewidth=1.0,
                              alpha=0.6, label=name, zorder=2)
                else:
                    axis.plot(steps, values, color=color, linestyle="--", marker="o",
                              markersize=4, linewidth=1.5, label=name, zorder=3)
    axis.set_title("tau by anchor position")
    axis.set_xlabel("step")
    axis.set_ylabel("tau")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=PROG, description="Draws loss, accuracy and acceptance length (tau), "
        "train and eval, against the step from metrics.jsonl files (a run's "
        "directory stands for its metrics.jsonl) into a PNG.")
    parser.add_argument("metrics", nargs="+", metavar="METRICS",
                        help="metrics.jsonl files or run directories")
    parser.add_argument("-o", "--out", default="metrics.png", metavar="PNG",
                        help="output image (default: metrics.png)")
    parser.add_argument("--title", help="figure title")
    parser.add_argument("--smooth", type=int, default=1, metavar="K",
                        help="trailing mean over K steps for the train curves (default: 1)")
    parser.add_argument("--labels", help="comma-separated run names (default: the paths)")
    args = parser.parse_args(argv)
    try:
        paths = [os.path.join(p, "metrics.jsonl") if os.path.isdir(p) else p
                 for p in args.metrics]
        labels = args.labels.split(",") if args.labels else paths
        if len(labels) != len(paths):
            raise PlotError(f"--labels names {len(labels)} runs but {len(paths)} are given")
        if args.smooth < 1:
            raise PlotError("--smooth must be at least 1")
        runs = [(label, read_metrics(path)) for label, path in zip(labels, paths)]
        if not any(series[k] for _, series in runs for k in KEYS):
            raise PlotError("no loss, acc or tau values in " + ", ".join(paths))
        plot(runs, args.out, args.title, args.smooth)
    except PlotError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{label}: {len(series['loss'])} train, {len(series['eval_loss'])} eval"
                       for label, series in runs)
    print(f"{PROG}: wrote {args.out} ({counts})")
    return 0
