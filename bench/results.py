#!/usr/bin/env python3
"""The Current table of bench/RESULTS.md, rendered from bench/results.jsonl.

  bench/results.py                 print the table
  bench/results.py --check         exit 1 (with a diff) when RESULTS.md's table differs
  bench/results.py --write         put the rendering into RESULTS.md
  bench/results.py --append FILE   add a device-check run's results.jsonl to the history

bench/results.jsonl holds one JSON line per number (the schema is
scripts/device/measurements.py's: benchmark, value, unit, date, commit,
gpu, command; side, label, vs, note, history where they apply), oldest
first. Each row of the table is one benchmark on one GPU, as its newest
call measured it: every line of that benchmark with the newest line's date,
commit, command and GPU. The baseline cell holds only numbers of that same
call, and every ratio is computed from the two cells: a time's as
baseline / dflashc (the speed), a rate's, a memory's and an error's as
dflashc / baseline. Lines that carry a check's verdict are left out (they
are a run's judgement, in its report).
"""

import argparse
import difflib
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "device"))

import measurements  # noqa: E402

HISTORY = os.path.join(HERE, "results.jsonl")
RESULTS = os.path.join(HERE, "RESULTS.md")
BEGIN = "<!-- current table: begin (rendered by bench/results.py from bench/results.jsonl; do not edit) -->"
END = "<!-- current table: end -->"
# The GPU of the table's heading; a row measured on another names its GPU.
DEFAULT_GPU = "NVIDIA H200"
# Units whose numbers read alone (a loss, a relative error): no unit word.
UNWRITTEN_UNITS = ("relative error", "loss", "tau", "accuracy", "count")
RATIO_WORDS = {"time": "speed", "rate": "speed", "memory": "memory", "error": "error"}


def significant_digits(text):
    """How many significant digits a number's repr writes ("0.0424": 3)."""
    digits = text.lower().split("e")[0].lstrip("-").replace(".", "").lstrip("0")
    return max(len(digits), 1)


def format_value(value, unit):
    """A number as the table writes it: as transcribed where it was
    written with few digits, else to a precision that suits its size."""
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) >= 1000:
        return str(int(value))
    if unit == "relative error" or abs(value) < 0.01:
        digits = min(max(significant_digits(repr(value)), 1), 3)
        mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    shown = repr(value)
    if "e" not in shown and significant_digits(shown) <= 6:
        return shown
    size = abs(value)
    decimals = 0 if size >= 1000 else 1 if size >= 100 else 2 if size >= 10 else 3
    return f"{value:.{decimals}f}"


def same_decimals(texts):
    """Runs of one number written alike: 1.468 / 1.47 becomes 1.468 / 1.470
    (a JSON number keeps no trailing zeros)."""
    if any("e" in t or "." not in t for t in texts):
        return texts
    decimals = max(len(t.split(".")[1]) for t in texts)
    return [t + "0" * (decimals - len(t.split(".")[1])) for t in texts]


def with_unit(values, unit, note):
    text = " / ".join(same_decimals([format_value(v, unit) for v in values]))
    if unit == "%":
        text += "%"
    elif unit not in UNWRITTEN_UNITS:
        text += " " + unit
    return text + (" " + note if note else "")


class Group:
    """The numbers of one side, label and unit of a row's call."""

    def __init__(self, line):
        self.label, self.unit = line.get("label", ""), line["unit"]
        self.note, self.vs = line.get("note", ""), line.get("vs")
        self.values = []

    def median(self):
        return statistics.median(self.values)


def groups_of(lines):
    groups = {}
    for line in lines:
        key = (line.get("label", ""), line["unit"])
        groups.setdefault(key, Group(line)).values.append(line["value"])
    return list(groups.values())


def cell(groups):
    """'a / b unit, c unit2; label: d unit' in the order the lines came."""
    labels = []
    for group in groups:
        if group.label not in labels:
            labels.append(group.label)
    parts = []
    for label in sorted(labels, key=lambda l: l != ""):
        numbers = ", ".join(with_unit(g.values, g.unit, g.note) for g in groups if g.label == label)
        parts.append(f"{label}: {numbers}" if label else numbers)
    return "; ".join(parts)


def ratios(ours, theirs):
    """'label: speed 1.11x, memory 0.85x; ...', one ratio per kind a label has."""
    parts, done = {}, set()
    for base in theirs:
        kind = measurements.UNITS[base.unit]
        if kind is None or (base.label, RATIO_WORDS[kind]) in done:
            continue
        same_unit = [g for g in ours if g.unit == base.unit]
        if base.vs is not None:
            same_unit = [g for g in same_unit if g.label == base.vs]
        if not same_unit or base.median() == 0 or same_unit[0].median() == 0:
            continue
        mine = same_unit[0].median()
        ratio = base.median() / mine if kind == "time" else mine / base.median()
        done.add((base.label, RATIO_WORDS[kind]))
        parts.setdefault(base.label, []).append(f"{RATIO_WORDS[kind]} {ratio:.2f}x")
    return "; ".join(f"{label}: {', '.join(words)}" if label else ", ".join(words)
                     for label, words in parts.items())


def current_rows(lines):
    """[(benchmark, gpu, the lines of its newest call)] in the order the
    benchmarks first appear in the history."""
    rows = {}
    for line in lines:
        if "verdict" in line:
            continue
        rows.setdefault((line["benchmark"], line["gpu"]), []).append(line)
    out = []
    for (benchmark, gpu), group in rows.items():
        # The newest call: the latest date, and of one date the later line.
        newest = max(enumerate(group), key=lambda item: (item[1]["date"], item[0]))[1]
        call = (newest["date"], newest["commit"], newest["command"])
        out.append((benchmark, gpu, [l for l in group
                                     if (l["date"], l["commit"], l["command"]) == call]))
    return out


def escape(text):
    return text.replace("|", "\\|")


def render(lines):
    table = ["| benchmark | dflashc | baseline (same call) | ratio | date, commit, command |",
             "|---|---|---|---|---|"]
    for benchmark, gpu, call in current_rows(lines):
        ours = groups_of([l for l in call if l.get("side", "dflashc") == "dflashc"])
        theirs = groups_of([l for l in call if l.get("side") == "baseline"])
        first = call[0]
        where = f"{first['date']}, {first['commit']}"
        if gpu != DEFAULT_GPU:
            where += f", {gpu}"
        where += f", `{first['command']}`"
        history = next((l["history"] for l in call if "history" in l), None)
        if history:
            where += f' (history: "{history}")'
        table.append("| " + " | ".join(escape(c) for c in (
            benchmark, cell(ours), cell(theirs), ratios(ours, theirs), where)) + " |")
    return "\n".join(table) + "\n"


def read_history(path):
    return [line for _, line in measurements.read_results(path)]


def check_history_names(lines, results_text, path):
    """Every history a line names is a heading of RESULTS.md."""
    headings = {l.lstrip("#").strip() for l in results_text.splitlines() if l.startswith("#")}
    for line in lines:
        if "history" in line and line["history"] not in headings:
            raise measurements.MeasurementError(
                f"{path}: benchmark '{line['benchmark']}': field 'history': no heading "
                f"'{line['history']}' in RESULTS.md")


def split_results_md(path):
    """(before, table, after) of RESULTS.md around the markers."""
    with open(path) as f:
        text = f.read()
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise measurements.MeasurementError(
            f"{path}: no '{BEGIN}' ... '{END}' block around the Current table")
    start = begin + len(BEGIN) + 1
    return text[:start], text[start:end], text[end:]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true")
    what.add_argument("--write", action="store_true")
    what.add_argument("--append", nargs="+", metavar="FILE")
    parser.add_argument("--history", default=HISTORY, help=argparse.SUPPRESS)
    parser.add_argument("--results", default=RESULTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.append:
            added = []
            for path in args.append:
                added += [l for l in read_history(path) if "verdict" not in l]
            history = read_history(args.history)  # validates what is there first
            with open(args.history, "a") as f:
                for line in added:
                    f.write(json.dumps(line) + "\n")
            print(f"results: {len(added)} lines added to {args.history} "
                  f"({len(history) + len(added)} in all); now bench/results.py --write")
            return 0
        history = read_history(args.history)
        table = render(history)
        if args.write or args.check:
            before, written, after = split_results_md(args.results)
            check_history_names(history, before + written + after, args.history)
            if args.check:
                if written == table:
                    return 0
                sys.stdout.writelines(difflib.unified_diff(
                    written.splitlines(True), table.splitlines(True),
                    f"{args.results} (Current table)", "bench/results.py's rendering"))
                print(f"results: {args.results}'s Current table is not the rendering of "
                      f"{args.history}: run bench/results.py --write", file=sys.stderr)
                return 1
            with open(args.results, "w") as f:
                f.write(before + table + after)
            return 0
        sys.stdout.write(table)
        return 0
    except measurements.MeasurementError as error:
        print(f"results: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
