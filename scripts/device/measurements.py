"""Numbers from the device checks' runs, and the result lines they become.

scripts/device/device-check runs a suite's commands on the GPU machine and
reads what they wrote through this module: the trainer's metrics logs
(`train --log`), GoogleTest summaries, the memory line of `train`'s output,
the JSON lines of KernelBench, torch_reference.py, torch_step.py and
`target-features --bench`, exported checkpoints. It computes the medians,
relative differences and run-against-run comparisons that the device scripts
did inline, and it owns the schema of the result lines (one JSON object per
number) that bench/results.py turns into the Current table of
bench/RESULTS.md. Needs only numpy (and numpy only for checkpoints).

Every error is a MeasurementError whose message names the file (and line or
field) it is about.
"""

import json
import math
import re
import statistics
import struct


class MeasurementError(Exception):
    """A log, checkpoint or result line that cannot be read as expected."""


# -- JSON lines -------------------------------------------------------------

def read_json_lines(path):
    """[(line number, object)] for every line of `path` that starts with
    '{' (the trainers and benchmarks print other text around them)."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as error:
        raise MeasurementError(f"{path}: cannot read: {error.strerror}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise MeasurementError(f"{path}:{number}: not a JSON object: {error.msg}") from None
        if not isinstance(value, dict):
            raise MeasurementError(f"{path}:{number}: not a JSON object")
        rows.append((number, value))
    return rows


def read_json_file(path):
    """A file holding one JSON object (best/eval.json, manifest.json)."""
    try:
        with open(path) as f:
            value = json.load(f)
    except OSError as error:
        raise MeasurementError(f"{path}: cannot read: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise MeasurementError(f"{path}:{error.lineno}: not JSON: {error.msg}") from None
    if not isinstance(value, dict):
        raise MeasurementError(f"{path}: not a JSON object")
    return value


def flops_per_step(manifest_path):
    """The compiler's FLOPs per training step, from a trainer's manifest.json."""
    manifest = read_json_file(manifest_path)
    try:
        return float(manifest["flops_per_step"]["total"])
    except (KeyError, TypeError, ValueError):
        raise MeasurementError(f"{manifest_path}: no number at flops_per_step.total") from None


def metrics_lines(path, kind="steps"):
    """The lines of a `train --log` file: kind "steps" gives the training
    steps (they carry "loss"), "evals" the evaluations ("eval_loss")."""
    key = {"steps": "loss", "evals": "eval_loss"}.get(kind)
    if key is None:
        raise MeasurementError(f"{path}: unknown kind of metrics line '{kind}' (steps, evals)")
    return [row for _, row in read_json_lines(path) if "step" in row and key in row]


def matching_lines(path, where):
    """The JSON lines of `path` whose fields equal every item of `where`."""
    return [row for _, row in read_json_lines(path)
            if all(row.get(key) == value for key, value in where.items())]


def named_lines(path):
    """KernelBench's and torch_reference.py's lines ({"name", "ms", "value",
    "metric", "note"}) by name; a later line of a name replaces an earlier."""
    rows = {}
    for number, row in read_json_lines(path):
        if "name" not in row:
            raise MeasurementError(f"{path}:{number}: a benchmark line without 'name'")
        rows[row["name"]] = row
    return rows


def field(row, name, where):
    """row[name] as a float; `where` says whose row it is for the error."""
    if name not in row:
        raise MeasurementError(f"{where}: no field '{name}' (fields: {', '.join(sorted(row))})")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MeasurementError(f"{where}: field '{name}' is {value!r}, not a number")
    return float(value)


# -- statistics -------------------------------------------------------------

STATISTICS = ("median", "mean", "first", "last", "min", "max")


def statistic(values, how, where):
    """One number from `values` (a list of floats) by `how` (STATISTICS)."""
    values = list(values)
    if not values:
        raise MeasurementError(f"{where}: no values to take the {how} of")
    if how == "median":
        return statistics.median(values)
    if how == "mean":
        return statistics.fmean(values)
    if how == "first":
        return values[0]
    if how == "last":
        return values[-1]
    if how == "min":
        return min(values)
    if how == "max":
        return max(values)
    raise MeasurementError(f"{where}: unknown statistic '{how}' ({', '.join(STATISTICS)})")


def relative_difference(a, b):
    """|a - b| / |b|: 0 when both are 0, infinite when only b is."""
    if a == b:
        return 0.0
    if b == 0:
        return math.inf
    return abs(a - b) / abs(b)


def worst_relative_difference(a_rows, b_rows, fields, steps, where):
    """The largest relative_difference(a[i][f], b[i][f]) over the first
    `steps` rows (all of the shorter when steps is None) and `fields`, as
    (worst, "step S field F"). Fewer rows than `steps` is an error."""
    count = min(len(a_rows), len(b_rows)) if steps is None else steps
    if len(a_rows) < count or len(b_rows) < count or count == 0:
        raise MeasurementError(f"{where}: {len(a_rows)} and {len(b_rows)} lines, "
                               f"{count or 'at least 1'} wanted")
    worst, at = 0.0, ""
    for i in range(count):
        for name in fields:
            x = field(a_rows[i], name, f"{where} (first, line {i + 1})")
            y = field(b_rows[i], name, f"{where} (second, line {i + 1})")
            diff = relative_difference(x, y)
            if diff > worst or not at:
                worst, at = diff, f"step {a_rows[i].get('step', i)} {name}"
    return worst, at


def first_difference(a_rows, b_rows, fields):
    """None when the rows hold equal values of `fields` (exactly, as the
    trainer printed them), else a text naming the first that differs."""
    if len(a_rows) != len(b_rows):
        return f"{len(a_rows)} lines against {len(b_rows)}"
    for x, y in zip(a_rows, b_rows):
        for name in fields:
            if x.get(name) != y.get(name):
                return f"step {x.get('step')} {name}: {x.get(name)!r} against {y.get(name)!r}"
    return None


# -- text outputs -----------------------------------------------------------

_GTEST_SUMMARY = re.compile(r"^\[  (PASSED|FAILED|SKIPPED) +\] (\d+) tests?", re.M)


def gtest_summary(text):
    """{"passed", "failed", "skipped"} test counts from a GoogleTest binary's
    output ("[  PASSED  ] 19 tests." and the like; 0 where absent)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for kind, count in _GTEST_SUMMARY.findall(text):
        counts[kind.lower()] = int(count)
    return counts


_BYTES = {"B": 1 / 2**30, "KiB": 1 / 2**20, "MiB": 1 / 2**10, "GiB": 1.0, "TiB": 2**10}
# train's last line: "train: done: 25 steps in 41 s; 41.0 GiB in use on the
# device after the first step; ..." (runtime/cli/TrainMain.cpp).
_IN_USE = re.compile(r"done: .*?; ([0-9.]+) (B|KiB|MiB|GiB|TiB) in use on the")


def memory_in_use_gib(text, where):
    """The device memory in use after the first step, from `train`'s "done:"
    line, in GiB."""
    found = _IN_USE.findall(text)
    if not found:
        raise MeasurementError(f"{where}: no 'done: ... in use on the device' line")
    value, unit = found[-1]
    return float(value) * _BYTES[unit]


def number_from_text(text, pattern, where):
    """The float of the regular expression's first group at its last match."""
    try:
        found = re.findall(pattern, text, re.M)
    except re.error as error:
        raise MeasurementError(f"{where}: bad pattern {pattern!r}: {error}") from None
    if not found:
        raise MeasurementError(f"{where}: nothing matches {pattern!r}")
    last = found[-1]
    return float(last[0] if isinstance(last, tuple) else last)


# -- checkpoints ------------------------------------------------------------

def read_safetensors(path):
    """{name: float64 array} of a safetensors file (BF16, F32, F64, I64)."""
    import numpy as np
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as error:
        raise MeasurementError(f"{path}: cannot read: {error.strerror}") from None
    if len(raw) < 8:
        raise MeasurementError(f"{path}: not a safetensors file (too short)")
    (length,) = struct.unpack("<Q", raw[:8])
    try:
        header = json.loads(raw[8:8 + length])
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise MeasurementError(f"{path}: not a safetensors file (bad header)") from None
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        data = raw[8 + length + begin:8 + length + end]
        if info["dtype"] == "BF16":
            array = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in dtypes:
            array = np.frombuffer(data, dtypes[info["dtype"]])
        else:
            raise MeasurementError(f"{path}: tensor '{name}': dtype {info['dtype']} not read")
        tensors[name] = array.astype(np.float64).reshape(info["shape"])
    return tensors


def parameter_differences(a_path, b_path):
    """{name: ||a - b|| / ||b||} over the tensors of two safetensors files,
    which must hold the same names and shapes."""
    import numpy as np
    a, b = read_safetensors(a_path), read_safetensors(b_path)
    if sorted(a) != sorted(b):
        only = sorted(set(a) ^ set(b))
        raise MeasurementError(f"{a_path} and {b_path}: tensor names differ ({', '.join(only[:4])})")
    out = {}
    for name in sorted(a):
        if a[name].shape != b[name].shape:
            raise MeasurementError(f"{a_path} and {b_path}: tensor '{name}' shapes differ")
        out[name] = float(np.linalg.norm(a[name] - b[name]) / max(np.linalg.norm(b[name]), 1e-30))
    return out


def parameter_difference(a_path, b_path):
    """(worst, name): the largest ||a - b|| / ||b|| over the tensors of two
    safetensors files, which must hold the same names."""
    diffs = parameter_differences(a_path, b_path)
    name = max(sorted(diffs), key=lambda n: diffs[n])
    return diffs[name], name


def parameters_within(diffs, limit, noise=None, factor=4.0):
    """(name, difference, allowed) of the tensor furthest past what it is
    allowed: `limit`, or with `noise` ({name: difference} of two references,
    e.g. bf16 storage against fp64) max(limit, factor x its noise), so that
    a tensor the references themselves disagree on (a codebook that starts
    at 0 and gets sparse, near-zero gradients through Adam) is held to that
    disagreement and the others to the limit."""
    def allowed(name):
        return max(limit, factor * noise.get(name, 0.0)) if noise else limit
    name = max(sorted(diffs), key=lambda n: diffs[n] / allowed(n))
    return name, diffs[name], allowed(name)


# -- result lines -----------------------------------------------------------

# The unit of every number a result line may carry, and what a ratio of two
# of them means: "time" (lower is faster: baseline / dflashc), "rate" (higher
# is faster: dflashc / baseline), "memory" and "error" (dflashc / baseline),
# None (no ratio).
UNITS = {
    "ms": "time", "s": "time",
    "GiB": "memory", "MB": "memory",
    "TFLOP/s": "rate", "GB/s": "rate", "tokens/s": "rate", "conversations/s": "rate",
    "draft tokens/s": "rate",
    "relative error": "error",
    "%": None, "loss": None, "tau": None, "accuracy": None, "rows": None,
    "tests": None, "steps": None, "count": None,
    "MHz": None, "W": None,  # a clock and a power draw sampled beside a run
}
SIDES = ("dflashc", "baseline")
VERDICTS = ("PASS", "FAIL")
REQUIRED_FIELDS = ("benchmark", "value", "unit", "date", "commit", "gpu", "command")
# label: what the number is within its cell ("packed", "torch.compile with
# fp32 masters"); vs: on a baseline, the dflashc label its ratio is taken
# against (else the first dflashc number of its unit); note: words after it
# ("in use"); history: the section of
# bench/RESULTS.md that tells its story; check, verdict, limit: a threshold's
# outcome (bench/results.py leaves those out of the table).
OPTIONAL_FIELDS = ("side", "label", "vs", "note", "history", "check", "verdict", "limit")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def validate_result(line, where):
    """Raises MeasurementError, naming `where` and the field, unless `line`
    (a dict) is a result line of the schema above."""
    if not isinstance(line, dict):
        raise MeasurementError(f"{where}: a result line is a JSON object")
    for name in REQUIRED_FIELDS:
        if name not in line:
            raise MeasurementError(f"{where}: field '{name}' is missing")
    for name in line:
        if name not in REQUIRED_FIELDS and name not in OPTIONAL_FIELDS:
            raise MeasurementError(f"{where}: unknown field '{name}'")
    for name in ("benchmark", "unit", "date", "commit", "gpu", "command") + OPTIONAL_FIELDS:
        if name in line and name != "limit" and not isinstance(line[name], str):
            raise MeasurementError(f"{where}: field '{name}' must be a string")
    for name in ("benchmark", "commit", "gpu", "command"):
        if not line[name].strip():
            raise MeasurementError(f"{where}: field '{name}' is empty")
    value = line["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MeasurementError(f"{where}: field 'value' must be a finite number, not {value!r}")
    if line["unit"] not in UNITS:
        raise MeasurementError(f"{where}: field 'unit': unknown unit '{line['unit']}' "
                               f"(one of: {', '.join(UNITS)})")
    if not _DATE.match(line["date"]):
        raise MeasurementError(f"{where}: field 'date' must be YYYY-MM-DD, not '{line['date']}'")
    if line.get("side", "dflashc") not in SIDES:
        raise MeasurementError(f"{where}: field 'side' must be one of {', '.join(SIDES)}")
    if "vs" in line and line.get("side") != "baseline":
        raise MeasurementError(f"{where}: field 'vs' belongs to a baseline line")
    if "verdict" in line and line["verdict"] not in VERDICTS:
        raise MeasurementError(f"{where}: field 'verdict' must be PASS or FAIL")
    if "limit" in line and (isinstance(line["limit"], bool)
                            or not isinstance(line["limit"], (int, float))):
        raise MeasurementError(f"{where}: field 'limit' must be a number")


def result_line(benchmark, value, unit, context, **optional):
    """A validated result line; `context` holds date, commit, gpu, command;
    optional fields that are None are left out."""
    line = {"benchmark": benchmark, "value": value, "unit": unit,
            "date": context["date"], "commit": context["commit"],
            "gpu": context["gpu"], "command": context["command"]}
    line.update({k: v for k, v in optional.items() if v is not None})
    validate_result(line, f"result '{benchmark}'")
    return line


def read_results(path):
    """The validated result lines of a JSON-lines file, in file order, each
    as (line number, line)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as error:
        raise MeasurementError(f"{path}: cannot read: {error.strerror}") from None
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as error:
            raise MeasurementError(f"{path}:{number}: not JSON: {error.msg}") from None
        validate_result(line, f"{path}:{number}")
        lines.append((number, line))
    return lines


# -- command line (for the A/B scripts of bench/ab) ---------------------------

def _steps_summary(folder, name):
    rows = metrics_lines(f"{folder}/{name}.jsonl")
    if len(rows) < 6:
        raise MeasurementError(f"{folder}/{name}.jsonl: {len(rows)} steps, at least 6 wanted")
    median = statistic([field(r, "step_ms", name) for r in rows[5:]], "median", name)
    return rows, (f"{name:<14} median step {median:.1f} ms (steps 5..) loss@0 "
                  f"{rows[0]['loss']:.5f} loss@{len(rows) - 1} {rows[-1]['loss']:.5f}")


def main(argv):
    """measurements.py flops MANIFEST: the FLOPs per step of a trainer;
    measurements.py fields LOG FIELD...: each step's fields as written;
    measurements.py steps DIR NAME...: each run's median step and losses;
    measurements.py compare-steps DIR A A2 B B2: those, and the largest loss
    and grad-norm differences of B against A and of each against its second
    run (the noise a change that only rounds differently stays within);
    measurements.py eval-buckets LOG LABEL: the last evaluation's tau, acc
    and blocks per anchor-position bucket, a JSON line each (with LABEL),
    buckets without blocks left out."""
    if len(argv) >= 3 and argv[0] == "fields":
        for row in metrics_lines(argv[1]):
            print(" ".join(repr(row.get(name)) for name in argv[2:]))
        return 0
    if len(argv) == 2 and argv[0] == "flops":
        print(f"{flops_per_step(argv[1]):.0f}")
        return 0
    if len(argv) >= 3 and argv[0] == "steps":
        for name in argv[2:]:
            print(_steps_summary(argv[1], name)[1])
        return 0
    if len(argv) == 6 and argv[0] == "compare-steps":
        folder, names = argv[1], argv[2:]
        runs = {}
        for name in names:
            runs[name], text = _steps_summary(folder, name)
            print(text)
        a, a2, b, b2 = names
        for key in ("loss", "grad_norm"):
            pairs = [(b, a), (a, a2), (b, b2)]
            print(f"{key}: " + "; ".join(
                f"{x} vs {y} %.2e" % worst_relative_difference(
                    runs[x], runs[y], [key], None, f"{x} vs {y}")[0] for x, y in pairs))
        return 0
    if len(argv) == 3 and argv[0] == "eval-buckets":
        evals = metrics_lines(argv[1], "evals")
        if not evals:
            raise MeasurementError(f"{argv[1]}: no evaluation line")
        last = evals[-1]
        lists = []
        for name in ("eval_tau_by_bucket", "eval_acc_by_bucket", "eval_blocks_by_bucket"):
            if not isinstance(last.get(name), list):
                raise MeasurementError(f"{argv[1]}: the last evaluation has no list '{name}'")
            lists.append(last[name])
        taus, accs, blocks = lists
        for bucket, (tau, acc, count) in enumerate(zip(taus, accs, blocks)):
            if count:
                print(json.dumps({"label": argv[2], "bucket": bucket, "tau": tau,
                                  "acc": acc, "blocks": count}))
        return 0
    print(main.__doc__)
    return 2


if __name__ == "__main__":
    import sys
    try:
        sys.exit(main(sys.argv[1:]))
    except MeasurementError as error:
        sys.exit(f"measurements: error: {error}")
