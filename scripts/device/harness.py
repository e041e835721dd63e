"""Runs a device-check suite (suites.py) and judges it.

The GPU tests and runs execute in order under a work folder of the suite's
own (their output there, one file each), then every benchmark reads its
numbers from what the runs wrote and every check compares them with its
threshold (measurements.py does the arithmetic). The outcome is a list of
report rows (what, name, result, verdict) and the result lines, one per
number, that device-check writes to OUT/results.jsonl.
"""

import fnmatch
import glob
import math
import os
import re
import shutil
import signal
import subprocess
import time

import measurements as m
from suites import expand

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
NOT_SELECTED = "not selected (--only)"


class Context:
    """What a suite runs against: the repository, .device, the work and
    output folders, the machine's GPUs, and the fields every result line
    carries (date, commit, gpu, command)."""

    def __init__(self, repo, device, work_root, out, gpus, gpu, commit, date, python="python3",
                 deadline=None, only=None):
        self.repo, self.device, self.work_root, self.out = repo, device, work_root, out
        self.gpus, self.gpu, self.commit, self.date = gpus, gpu, commit, date
        self.python = python
        # time.monotonic() past which nothing more starts (device calls are
        # time-limited; what ran by then still comes back).
        self.deadline = deadline
        # Shell-style patterns of the runs and GPU tests to start (device-check
        # --only); None starts them all.
        self.only = only

    def selected(self, name):
        """Whether --only lets the run or GPU test `name` start."""
        return self.only is None or any(fnmatch.fnmatchcase(name, p) for p in self.only)

    def time_left(self, timeout_s):
        """The seconds a step may take: its timeout, cut at the deadline;
        None once the deadline has passed."""
        if self.deadline is None:
            return timeout_s
        left = self.deadline - time.monotonic()
        return min(timeout_s, left) if left > 1 else None


class Outcome:
    def __init__(self, suite):
        self.suite = suite
        self.rows = []      # (what, name, result, verdict)
        self.results = []   # result lines
        self.work = None

    def row(self, what, name, result, verdict):
        self.rows.append((what, name, result, verdict))

    @property
    def verdict(self):
        if any(r[3] == FAIL for r in self.rows):
            return FAIL
        return PASS if any(r[3] == PASS for r in self.rows) else SKIP


def _environment():
    env = dict(os.environ)
    # NVLink multicast stays off: a program that uses it can take the
    # host's shared GPUs out of service.
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1", PYTHONUNBUFFERED="1")
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/local/cuda/bin"
    return env


def names_path(text, path):
    """Whether `text` (a command) names the file `path` whole: bin/train-x is
    not named by a command that runs bin/train-x-validated."""
    return re.search(r"(?<![\w.-])" + re.escape(path) + r"(?![\w.-])", text) is not None


def execute(command, cwd, stdout_path, stderr_path, timeout_s):
    """Runs `command` with bash in its own process group; returns (exit
    status, seconds). Past its timeout the group is killed: status 124."""
    start = time.monotonic()
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        process = subprocess.Popen(["bash", "-c", command], cwd=cwd, stdout=out, stderr=err,
                                   stdin=subprocess.DEVNULL, env=_environment(),
                                   start_new_session=True)
        try:
            rc = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            rc = 124
    return rc, time.monotonic() - start


def _expected(rc, expect):
    if expect == "any":
        return True
    if expect == "nonzero":
        return rc != 0
    return rc == expect


def _tail(path, lines=3):
    try:
        with open(path, errors="replace") as f:
            text = [l.rstrip() for l in f.read().splitlines() if l.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-300:]


def _rel(value):
    return f"{value:.2e}"


class SuiteRun:
    def __init__(self, suite, ctx, products, say):
        self.suite, self.ctx, self.products, self.say = suite, ctx, products, say
        self.outcome = Outcome(suite.name)
        self.work = os.path.join(ctx.work_root, suite.name)
        self.values = suite.values(self.work, ctx.device, ctx.out, ctx.python, ctx.repo)
        self.run_status = {}  # run name -> PASS / FAIL / SKIP
        self.run_rc = {}      # run name -> exit status
        self.measured = {}    # benchmark id -> [values]

    def result(self, benchmark, value, unit, **optional):
        # A suite of several GPUs names them all: its numbers are another
        # machine's (bench/results.py keeps a row per benchmark and GPU).
        gpu = self.ctx.gpu if self.suite.min_gpus == 1 else f"{self.ctx.gpus} x {self.ctx.gpu}"
        context = {"date": self.ctx.date, "commit": self.ctx.commit, "gpu": gpu,
                   "command": f"scripts/device/device-check {self.suite.name}"}
        self.outcome.results.append(m.result_line(benchmark, value, unit, context, **optional))

    # -- the steps ------------------------------------------------------------

    def missing_products(self):
        """The files of the suite's prepare items that are not in .device;
        with --only, those that a selected run's command or GPU test names
        (what the others need is not asked for: a call may carry only the
        trainers of the runs it selects)."""
        named = None
        if self.ctx.only is not None:
            named = [command for _, _, name, command in self.suite.expanded_runs(self.values)
                     if self.ctx.selected(name)]
            named += [f"bin/{test['binary']}" for _, test in self.suite.gpu_tests
                      if self.ctx.selected(test["binary"])]
        missing = []
        for item in self.suite.prepare:
            for path in self.products.files(item):
                if named is not None and not any(names_path(text, path) for text in named):
                    continue
                if not os.path.exists(os.path.join(self.ctx.repo, self.ctx.device, path)):
                    missing.append(f"{self.ctx.device}/{path} ({item})")
        return missing

    def gpu_tests(self):
        for where, test in self.suite.gpu_tests:
            name = test["binary"]
            if test.get("min_gpus", 1) > self.ctx.gpus:
                self.outcome.row("gpu test", name, f"needs {test['min_gpus']} GPUs", SKIP)
                continue
            if not self.ctx.selected(name):
                self.outcome.row("gpu test", name, NOT_SELECTED, SKIP)
                continue
            seconds_left = self.ctx.time_left(test["timeout_s"])
            if seconds_left is None:
                self.outcome.row("gpu test", name, "not started: past the deadline", SKIP)
                continue
            command = f"{self.ctx.device}/bin/{name}"
            if "filter" in test:
                command += f" --gtest_filter='{test['filter']}'"
            log = os.path.join(self.work, name + ".txt")
            rc, seconds = execute(command, self.ctx.repo, log, log + ".err", seconds_left)
            with open(log, errors="replace") as f:
                text = f.read()
            counts = m.gtest_summary(text)
            verdict = PASS if rc == 0 and counts["failed"] == 0 and counts["passed"] > 0 else FAIL
            result = (f"rc={rc}, {counts['passed']} passed, {counts['failed']} failed, "
                      f"{counts['skipped']} skipped ({seconds:.0f} s)")
            if verdict == FAIL:
                failures = [l for l in text.splitlines() if "FAILED  ]" in l or "Failure" in l]
                result += ": " + (" | ".join(failures[:4]) or _tail(log + ".err"))
            self.outcome.row("gpu test", name, result, verdict)
            self.say(f"  gpu test {name}: {result} {verdict}")
            self.result(f"{name} ({self.suite.name})", counts["passed"], "tests",
                        check=f"gpu test {name}", verdict=verdict)

    def runs(self):
        for where, run, name, command in self.suite.expanded_runs(self.values):
            need = run.get("min_gpus", 1)
            if need > self.ctx.gpus:
                self.run_status[name] = SKIP
                self.outcome.row("run", name, f"needs {need} GPUs, {self.ctx.gpus} here", SKIP)
                continue
            if not self.ctx.selected(name):
                self.run_status[name] = SKIP
                self.outcome.row("run", name, NOT_SELECTED, SKIP)
                continue
            seconds_left = self.ctx.time_left(run["timeout_s"])
            if seconds_left is None:
                self.run_status[name] = SKIP
                self.outcome.row("run", name, "not started: past the deadline", SKIP)
                continue
            out = os.path.join(self.work, name + ".out")
            err = os.path.join(self.work, name + ".err")
            rc, seconds = execute(command, self.ctx.repo, out, err, seconds_left)
            expect = run.get("expect_rc", 0)
            verdict = PASS if _expected(rc, expect) else FAIL
            result = f"rc={rc} ({seconds:.0f} s)"
            if expect != 0:
                result += f", expected {expect}"
            if rc == 124:
                result += f", stopped after {seconds_left:.0f} s"
            if verdict == FAIL:
                result += ": " + _tail(err)
            self.run_status[name] = verdict
            self.run_rc[name] = rc
            self.outcome.row("run", name, result, verdict)
            self.say(f"  run {name}: {result} {verdict}")
            for path in run.get("cleanup", []):
                for found in glob.glob(expand(path, dict(self.values, name=name), where)):
                    shutil.rmtree(found, ignore_errors=True)

    def benchmarks(self):
        for where, bench in self.suite.benchmarks:
            if bench["from"] == "largest_passing":
                self.largest_passing(bench)
                continue
            for run in bench.get("runs", [bench.get("run")]):
                if self.run_status.get(run) != PASS:
                    continue  # the run's own row says why
                label = bench["benchmark"] + (f" [{bench['label']}]" if bench.get("label") else "")
                try:
                    value = self.extract(bench, run, where)
                except m.MeasurementError as error:
                    if not bench.get("optional"):
                        self.outcome.row("benchmark", label, f"run {run}: {error}", FAIL)
                    continue
                self.record(bench, value, f"run {run}")

    def record(self, bench, value, source):
        self.measured.setdefault(bench.get("id", ""), []).append(value)
        self.result(bench["benchmark"], value, bench["unit"], side=bench.get("side"),
                    label=bench.get("label"), vs=bench.get("vs"), note=bench.get("note"),
                    history=bench.get("history"))
        label = bench["benchmark"] + (f" [{bench['label']}]" if bench.get("label") else "")
        self.outcome.row("benchmark", label, f"{value:.6g} {bench['unit']} ({source})", "")

    def largest_passing(self, bench):
        """The largest of `values` whose run exited 0 (the most rows that
        fit, say); nothing when none did or a run was skipped."""
        runs = bench["runs"]
        if any(self.run_status.get(r) == SKIP for r in runs):
            return
        passed = [v for r, v in zip(runs, bench["values"]) if self.run_rc.get(r) == 0]
        if passed:
            self.record(bench, max(passed), "the largest whose run exited 0")

    def extract(self, bench, run, where):
        source = bench["from"]
        default = {"log": "{W}/{run}.jsonl", "memory": "{W}/{run}.err", "json": "{W}/{run}.out",
                   "text": "{W}/{run}.out"}.get(source)
        path = os.path.join(self.ctx.repo,
                            expand(bench.get("file", default), dict(self.values, run=run), where))
        where = os.path.relpath(path, self.ctx.repo)
        if source == "log":
            rows = m.metrics_lines(path, bench.get("lines", "steps"))[bench.get("skip", 0):]
            values = [m.field(r, bench["field"], where) -
                      (m.field(r, bench["minus"], where) if "minus" in bench else 0.0)
                      for r in rows]
            value = m.statistic(values, bench.get("stat", "median"), where)
        elif source == "memory":
            value = m.memory_in_use_gib(_read(path), where)
        elif source == "json":
            rows = m.matching_lines(path, bench.get("where", {}))
            value = m.statistic([m.field(r, bench["field"], where) for r in rows],
                                bench.get("stat", "last"), f"{where} {bench.get('where', {})}")
        elif source == "kernels":
            rows = m.named_lines(path)
            if "name" in bench:
                if bench["name"] not in rows:
                    raise m.MeasurementError(f"{where}: no line named '{bench['name']}'")
                row = rows[bench["name"]]
            else:
                found = [r for n, r in rows.items() if re.fullmatch(bench["name_regex"], n)]
                if not found:
                    raise m.MeasurementError(f"{where}: no line matches '{bench['name_regex']}'")
                row = found[-1]
            value = m.field(row, bench["field"], where)
        else:
            value = m.number_from_text(_read(path), bench["pattern"], where)
        return value / bench.get("divide_by", 1)

    # -- checks ---------------------------------------------------------------

    def checks(self):
        for where, check in self.suite.checks:
            skipped = [r for r in check.get("runs", []) if self.run_status.get(r) == SKIP]
            if skipped:
                self.outcome.row("check", check["name"], f"run {skipped[0]} skipped", SKIP)
                continue
            failed = [r for r in check.get("runs", []) if self.run_status.get(r) != PASS]
            try:
                ok, text, value, unit = self.judge(check, where)
            except m.MeasurementError as error:
                ok, text, value, unit = False, str(error), None, None
            if failed and not ok:
                text = f"run {failed[0]} failed; {text}"
            verdict = PASS if ok else FAIL
            self.outcome.row("check", check["name"], text, verdict)
            self.say(f"  check {check['name']}: {text} {verdict}")
            if value is not None and math.isfinite(value):
                limit = check.get("limit")
                self.result(f"{self.suite.name}: {check['name']}", value, unit,
                            check=check["name"], verdict=verdict, limit=limit)

    def path(self, template, where):
        return os.path.join(self.ctx.repo, expand(template, self.values, where))

    def lines(self, template, check, where):
        return m.metrics_lines(self.path(template, where), check.get("lines", "steps"))

    def judge(self, check, where):
        """(passed, text, number or None, its unit) for one check."""
        kind = check["kind"]
        if kind in ("losses", "within_noise", "identical_fields", "fields_close", "curve"):
            a, b = self.lines(check["a"], check, where), self.lines(check["b"], check, where)
        if kind == "losses":
            worst, at = m.worst_relative_difference(a, b, check.get("fields", ["loss"]),
                                                    check.get("steps"), check["name"])
            return (worst <= check["limit"], f"worst relative difference {_rel(worst)} at {at} "
                    f"(limit {check['limit']:.0e})", worst, "relative error")
        if kind == "params":
            noise = None
            if "noise_a" in check:
                noise = m.parameter_differences(self.path(check["noise_a"], where),
                                                self.path(check["noise_b"], where))
            diffs = m.parameter_differences(self.path(check["a"], where),
                                            self.path(check["b"], where))
            name, diff, allowed = m.parameters_within(diffs, check["limit"], noise,
                                                      check.get("factor", 4))
            held = f"limit {check['limit']:.0e}" if allowed == check["limit"] else (
                f"allowed {_rel(allowed)}: {check.get('factor', 4):g} x its references' "
                f"difference {_rel(noise[name])}")
            worst, worst_name = max((d, n) for n, d in diffs.items())
            return (diff <= allowed, f"furthest {_rel(diff)} ({name}; {held}); largest "
                    f"{_rel(worst)} ({worst_name})", worst, "relative error")
        if kind == "identical_files":
            for a_path, b_path in check["pairs"]:
                a_file, b_file = self.path(a_path, where), self.path(b_path, where)
                if _read_bytes(a_file) != _read_bytes(b_file):
                    return False, f"{os.path.relpath(a_file, self.ctx.repo)} differs", None, None
            return True, f"{len(check['pairs'])} pair(s) identical", None, None
        if kind == "identical_fields":
            if len(a) < check.get("min_lines", 1):
                return False, f"{len(a)} lines", None, None
            diff = m.first_difference(a, b, check["fields"])
            return (diff is None, diff or f"{len(a)} lines identical in "
                    f"{', '.join(check['fields'])}", None, None)
        if kind == "within_noise":
            fields = check.get("fields", ["loss", "grad_norm"])
            noise, _ = m.worst_relative_difference(
                self.lines(check["noise_a"], check, where),
                self.lines(check["noise_b"], check, where), fields, None, "noise")
            diff, at = m.worst_relative_difference(a, b, fields, None, check["name"])
            limit = max(check.get("factor", 4) * noise, check.get("floor", 1e-4))
            return (diff <= limit, f"{_rel(diff)} at {at}; run-to-run noise {_rel(noise)}, limit "
                    f"{_rel(limit)}", diff, "relative error")
        if kind == "log":
            return self.judge_log(check, where)
        if kind == "fields_close":
            return self.judge_fields_close(a, b, check)
        if kind == "text":
            return self.judge_text(check, where)
        if kind == "files_exist":
            missing = [f for f in check["files"] if not os.path.exists(self.path(f, where))]
            return (not missing, f"missing {', '.join(missing)}" if missing else
                    f"{len(check['files'])} present", None, None)
        if kind == "best_matches":
            best = m.read_json_file(self.path(check["json"], where))
            rows = self.lines(check["log"], dict(check, lines=check.get("lines", "evals")), where)
            if not rows:
                return False, "no evaluations", None, None
            kept = m.field(best, check["field"], check["json"])
            top = max(m.field(r, check["field"], check["log"]) for r in rows)
            ok = abs(kept - top) <= check.get("tolerance", 1e-6)
            return ok, f"kept {kept:.6g}, best of {len(rows)} {top:.6g}", None, None
        if kind == "curve":
            return self.judge_curve(a, b, check)
        # at_most, at_least, ratio_at_most over benchmark ids (medians)
        value = self.median(check["value"])
        if kind == "ratio_at_most":
            of = self.median(check["of"])
            ratio = value / of if of else math.inf
            return (ratio <= check["limit"], f"{value:.3g} / {of:.3g} = {ratio:.3f} (limit "
                    f"{check['limit']})", None, None)
        ok = value <= check["limit"] if kind == "at_most" else value >= check["limit"]
        sign = "<=" if kind == "at_most" else ">="
        return ok, f"{value:.6g} (limit {sign} {check['limit']})", None, None

    def median(self, id_):
        values = self.measured.get(id_)
        if not values:
            raise m.MeasurementError(f"benchmark '{id_}' was not measured")
        return m.statistic(values, "median", id_)

    def judge_log(self, check, where):
        rows = self.lines(check["file"], check, where)
        problems = []
        if "count" in check and len(rows) != check["count"]:
            problems.append(f"{len(rows)} lines, {check['count']} expected")
        if "steps_are" in check and [r.get("step") for r in rows] != check["steps_are"]:
            problems.append(f"steps {[r.get('step') for r in rows]}")
        for name in check.get("finite", []):
            bad = [r.get("step") for r in rows
                   if not isinstance(r.get(name), (int, float)) or not math.isfinite(r[name])]
            if bad:
                problems.append(f"{name} not finite at steps {bad[:5]}")
        last = rows[-1] if rows else {}
        for name, value in check.get("last", {}).items():
            if last.get(name) != value:
                problems.append(f"last {name} {last.get(name)!r}, {value!r} expected")
        for name, value in check.get("last_at_least", {}).items():
            if not rows or m.field(last, name, check["file"]) < value:
                problems.append(f"last {name} {last.get(name)!r} < {value}")
        for name in check.get("rising", []):
            if not rows or m.field(last, name, check["file"]) <= m.field(rows[0], name, check["file"]):
                problems.append(f"{name} not above its first value")
        for name, length in check.get("list_length", {}).items():
            bad = [r.get("step") for r in rows if len(r.get(name) or []) != length]
            if bad:
                problems.append(f"{name} not of length {length:g} at steps {bad[:5]}")
        shown = list(check.get("last", {})) + list(check.get("last_at_least", {}))
        text = f"{len(rows)} lines"
        if shown:
            text += ", last: " + ", ".join(f"{k} {last.get(k)}" for k in shown)
        return not problems, "; ".join(problems) or text, None, None

    def judge_fields_close(self, a, b, check):
        count = check.get("count")
        if count is not None and (len(a) != count or len(b) != count):
            return False, f"{len(a)} and {len(b)} lines, {count} expected", None, None
        if not a or not b:
            return False, "no lines to compare", None, None
        x, y = a[-1], b[-1]
        problems, parts = [], []
        for name, tolerance in check["tolerances"].items():
            gx, gy = m.field(x, name, "first"), m.field(y, name, "second")
            parts.append(f"{name} {gx:.6g} vs {gy:.6g}")
            if "rel" in tolerance and abs(gx - gy) > tolerance["rel"] * abs(gy):
                problems.append(f"{name} beyond {tolerance['rel']} relative")
            if "abs" in tolerance and abs(gx - gy) > tolerance["abs"]:
                problems.append(f"{name} beyond {tolerance['abs']}")
        for name, value in check.get("equal", {}).items():
            if x.get(name) != value:
                problems.append(f"{name} {x.get(name)!r}, {value!r} expected")
        worst = max(m.relative_difference(m.field(x, n, "first"), m.field(y, n, "second"))
                    for n in check["tolerances"])
        return not problems, "; ".join(parts + problems), worst, "relative error"

    def judge_text(self, check, where):
        text = _read(self.path(check["file"], where))
        problems = []
        if "lines_with" in check:
            # Only the lines that say this count (an error line, not the
            # progress lines before it).
            text = "\n".join(l for l in text.splitlines() if check["lines_with"] in l)
            if not text:
                problems.append(f"no line with '{check['lines_with']}'")
        problems += [f"no '{s}'" for s in check.get("contains", []) if s not in text]
        problems += [f"'{s}' is there" for s in check.get("lacks", []) if s in text]
        result = ""
        if "names_from" in check:
            names = [l.strip() for l in _read(self.path(check["names_from"], where)).splitlines()
                     if l.strip()]
            suffix = check.get("suffix", "")
            named = [n for n in names if n + suffix in text]
            result = f"{len(named)} of {len(names)} names found"
            if check.get("none_named"):
                if named or not names:
                    problems.append(f"{result}, none wanted")
            else:
                wanted = check.get("at_least", len(names))
                if len(named) < wanted or not names:
                    problems.append(f"{result}, {wanted} wanted")
        return (not problems, "; ".join(problems) or result or "found", None, None)

    def judge_curve(self, a, b, check):
        count = check.get("count", min(len(a), len(b)))
        if len(a) < count or len(b) < count or count == 0:
            return False, f"{len(a)} and {len(b)} lines, {count} wanted", None, None
        name, tail = check["field"], check.get("tail", 20)
        xs = [m.field(r, name, "first") for r in a[:count]]
        ys = [m.field(r, name, "second") for r in b[:count]]
        gx, gy = sum(xs[-tail:]) / tail, sum(ys[-tail:]) / tail
        problems = []
        if "first" in check and (xs[0] != check["first"] or ys[0] != check["first"]):
            problems.append(f"first {name} {xs[0]} / {ys[0]}, {check['first']} expected")
        if "tail_at_least" in check and min(gx, gy) <= check["tail_at_least"]:
            problems.append(f"tail mean not above {check['tail_at_least']}")
        if "tail_rel" in check and abs(gx - gy) >= check["tail_rel"] * abs(gy):
            problems.append(f"tail means more than {check['tail_rel']} apart")
        text = (f"mean {name} over the last {tail}: {gx:.4f} and {gy:.4f}; largest one-step "
                f"difference {max(abs(x - y) for x, y in zip(xs, ys)):.4f}")
        return not problems, "; ".join([text] + problems), m.relative_difference(gx, gy), \
            "relative error"


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError as error:
        raise m.MeasurementError(f"{path}: cannot read: {error.strerror}") from None


def _read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as error:
        raise m.MeasurementError(f"{path}: cannot read: {error.strerror}") from None


def run_suite(suite, ctx, products, say=print):
    """Runs one suite; returns its Outcome."""
    state = SuiteRun(suite, ctx, products, say)
    outcome = state.outcome
    outcome.work = state.work
    if ctx.gpus < suite.min_gpus:
        outcome.row("suite", suite.name, f"needs {suite.min_gpus} GPUs, {ctx.gpus} here", SKIP)
        return outcome
    missing = state.missing_products()
    if missing:
        outcome.row("prepare", suite.name, "missing " + ", ".join(missing[:6]) +
                    (f" and {len(missing) - 6} more" if len(missing) > 6 else "") +
                    " (scripts/device/device-check --prepare " + suite.name + ")", FAIL)
        return outcome
    shutil.rmtree(state.work, ignore_errors=True)
    os.makedirs(state.work)
    state.gpu_tests()
    state.runs()
    state.benchmarks()
    state.checks()
    return outcome
