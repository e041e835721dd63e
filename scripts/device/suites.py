"""The device-check suites as data: scripts/device/suites/NAME.toml.

A suite file declares, once, what the GPU machine runs and how its outcome
is judged (scripts/device/README.md has the schema with an example):
  prepare      the products of scripts/device-prepare.sh it needs in .device/
               (scripts/device/products.toml says which files each leaves)
  [vars]       strings the commands share
  [[gpu_test]] GoogleTest binaries of .device/bin
  [[run]]      commands, in order, each with a timeout and its expected exit
  [[benchmark]] the numbers a run's output yields, with their units
  [[check]]    the thresholds that make the suite PASS or FAIL
This module reads and validates them (every error names the file, the line
of the table and the field) and expands their placeholders; harness.py runs
them.
"""

import fnmatch
import os
import re
import tomllib

import measurements

HERE = os.path.dirname(os.path.abspath(__file__))
SUITES_DIR = os.path.join(HERE, "suites")
PRODUCTS_FILE = os.path.join(HERE, "products.toml")

# Placeholders every template may use; a run's own also {name} and {each},
# a benchmark's file template {run}.
BUILTINS = ("D", "W", "O", "py", "repo")
_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")

STATISTICS = ("median", "mean", "first", "last", "min", "max")
SOURCES = ("log", "memory", "json", "kernels", "text", "largest_passing")


class SuiteError(Exception):
    """A suite or products file that does not follow the schema."""


def _is_str_list(value):
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_table_of(kind):
    return lambda v: isinstance(v, dict) and all(kind(x) for x in v.values())


# Field name -> (check, what it must be). Required fields are listed apart.
_TYPES = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (_is_int, "an integer"),
    "number": (_is_number, "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "strs": (_is_str_list, "a list of strings"),
    "pairs": (lambda v: isinstance(v, list) and all(_is_str_list(p) and len(p) == 2 for p in v),
              "a list of [a, b] string pairs"),
    "ints": (lambda v: isinstance(v, list) and all(_is_int(x) for x in v), "a list of integers"),
    "numbers_list": (lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
                     "a list of numbers"),
    "numbers": (_is_table_of(_is_number), "a table of numbers"),
    "values": (_is_table_of(lambda x: _is_number(x) or isinstance(x, str)),
               "a table of numbers or strings"),
    "tolerances": (_is_table_of(lambda x: isinstance(x, dict) and set(x) <= {"rel", "abs"}
                                and x and all(_is_number(y) for y in x.values())),
                   "a table of {rel = N} or {abs = N}"),
    "expect_rc": (lambda v: _is_int(v) or v in ("nonzero", "any"),
                  "an exit status, \"nonzero\" or \"any\""),
    "stat": (lambda v: v in STATISTICS, "one of " + ", ".join(STATISTICS)),
    "source": (lambda v: v in SOURCES, "one of " + ", ".join(SOURCES)),
    "lines": (lambda v: v in ("steps", "evals"), "\"steps\" or \"evals\""),
    "side": (lambda v: v in ("dflashc", "baseline"), "\"dflashc\" or \"baseline\""),
}

SUITE_FIELDS = {"summary": "str", "replaces": "strs", "prepare": "strs", "min_gpus": "int",
                "vars": None, "gpu_test": None, "run": None, "benchmark": None, "check": None}
GPU_TEST_FIELDS = {"binary": "str", "timeout_s": "int", "filter": "str", "min_gpus": "int"}
RUN_FIELDS = {"name": "str", "command": "str", "timeout_s": "int", "expect_rc": "expect_rc",
              "min_gpus": "int", "each": "strs", "cleanup": "strs"}
BENCHMARK_FIELDS = {"id": "str", "benchmark": "str", "unit": "str", "side": "side",
                    "label": "str", "vs": "str", "note": "str", "history": "str", "run": "str",
                    "runs": "strs", "from": "source", "file": "str", "field": "str",
                    "minus": "str", "divide_by": "number", "stat": "stat", "skip": "int",
                    "lines": "lines", "where": "values", "name": "str", "name_regex": "str",
                    "pattern": "str", "optional": "bool", "values": "numbers_list"}
# Every check has a name, a kind and may list the runs it reads (skipped
# with them); each kind's own fields follow, the first ones required.
CHECK_COMMON = {"name": "str", "kind": "str", "runs": "strs"}
CHECK_KINDS = {
    "losses": ({"a": "str", "b": "str", "limit": "number"},
               {"fields": "strs", "steps": "int", "lines": "lines"}),
    "params": ({"a": "str", "b": "str", "limit": "number"},
               {"noise_a": "str", "noise_b": "str", "factor": "number"}),
    "identical_files": ({"pairs": "pairs"}, {}),
    "identical_fields": ({"a": "str", "b": "str", "fields": "strs"},
                         {"lines": "lines", "min_lines": "int"}),
    "within_noise": ({"a": "str", "b": "str", "noise_a": "str", "noise_b": "str"},
                     {"fields": "strs", "factor": "number", "floor": "number"}),
    "log": ({"file": "str"},
            {"lines": "lines", "count": "int", "steps_are": "ints", "finite": "strs",
             "last": "values", "last_at_least": "numbers", "rising": "strs",
             "list_length": "numbers"}),
    "fields_close": ({"a": "str", "b": "str", "tolerances": "tolerances"},
                     {"lines": "lines", "count": "int", "equal": "values"}),
    "text": ({"file": "str"},
             {"lines_with": "str", "contains": "strs", "lacks": "strs", "names_from": "str",
              "suffix": "str", "at_least": "int", "none_named": "bool"}),
    "files_exist": ({"files": "strs"}, {}),
    "best_matches": ({"json": "str", "log": "str", "field": "str"},
                     {"lines": "lines", "tolerance": "number"}),
    "curve": ({"a": "str", "b": "str", "field": "str"},
              {"count": "int", "first": "number", "tail": "int", "tail_at_least": "number",
               "tail_rel": "number"}),
    "at_most": ({"value": "str", "limit": "number"}, {}),
    "at_least": ({"value": "str", "limit": "number"}, {}),
    "ratio_at_most": ({"value": "str", "of": "str", "limit": "number"}, {}),
}


class Located:
    """Where a table of a suite file is, for messages: 'FILE:LINE: run 'x''."""

    def __init__(self, path, line, what):
        self.path, self.line, self.what = path, line, what

    def __str__(self):
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.what}" if self.what else where

    def error(self, message):
        return SuiteError(f"{self}: {message}")


def _header_lines(text, header):
    """Line numbers of each `[[header]]` of a TOML text, in order."""
    pattern = re.compile(r"^[ \t]*\[\[[ \t]*" + re.escape(header) + r"[ \t]*\]\]", re.M)
    return [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]


def _key_line(text, key):
    m = re.search(r"^[ \t]*" + re.escape(key) + r"[ \t]*=", text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else 0


def _check_fields(table, allowed, required, where):
    for name in table:
        if name not in allowed:
            raise where.error(f"unknown field '{name}' (fields: {', '.join(allowed)})")
    for name in required:
        if name not in table:
            raise where.error(f"field '{name}' is missing")
    for name, kind in allowed.items():
        if kind is None or name not in table:
            continue
        test, wanted = _TYPES[kind]
        if not test(table[name]):
            raise where.error(f"field '{name}' must be {wanted}")


def placeholders(template):
    return _PLACEHOLDER.findall(template)


def expand(template, values, where):
    """`template` with every {key} of `values` replaced; an unknown one is an
    error naming it (a shell ${x} is left alone)."""
    def replace(m):
        key = m.group(1)
        if key not in values:
            raise where.error(f"unknown placeholder {{{key}}} (known: "
                              f"{', '.join(sorted(values))})")
        return str(values[key])
    # A variable's value may hold placeholders of its own ({name} of a run).
    for _ in range(8):
        expanded = _PLACEHOLDER.sub(replace, template)
        if expanded == template:
            break
        template = expanded
    return template


class Suite:
    """One validated suite file; runs expanded over their `each` lists."""

    def __init__(self, name, path, data, text):
        self.name, self.path = name, path
        where = Located(path, 0, "")
        _check_fields(data, SUITE_FIELDS, ("summary", "prepare"), where)
        self.summary = data["summary"]
        self.replaces = data.get("replaces", [])
        self.prepare = data["prepare"]
        self.min_gpus = data.get("min_gpus", 1)
        self.vars = data.get("vars", {})
        if not isinstance(self.vars, dict) or not all(isinstance(v, str) for v in self.vars.values()):
            raise Located(path, _key_line(text, "[vars]"), "[vars]").error(
                "every variable must be a string")
        for key in self.vars:
            if key in BUILTINS or key in ("name", "each", "run"):
                raise where.error(f"[vars] '{key}' shadows a built-in placeholder")
        self.gpu_tests = self._tables(data, text, "gpu_test", GPU_TEST_FIELDS,
                                      ("binary", "timeout_s"))
        self.runs = []
        for where, run in self._tables(data, text, "run", RUN_FIELDS,
                                       ("name", "command", "timeout_s")):
            for each in run.get("each", [None]):
                if "each" in run and "{each}" not in run["name"]:
                    raise where.error("a run with 'each' names each run with {each}")
                self.runs.append((where, run, each))
        self.benchmarks = self._tables(data, text, "benchmark", BENCHMARK_FIELDS,
                                       ("benchmark", "unit", "from"))
        self.checks = self._tables(data, text, "check", CHECK_COMMON, ("name", "kind"),
                                   partial=True)
        self._validate(text)

    def _tables(self, data, text, key, allowed, required, partial=False):
        tables = data.get(key, [])
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise Located(self.path, 0, "").error(f"'{key}' must be written [[{key}]]")
        lines = _header_lines(text, key)
        out = []
        for i, table in enumerate(tables):
            label = table.get("name") or table.get("binary") or table.get("benchmark") or ""
            where = Located(self.path, lines[i] if i < len(lines) else 0,
                            f"[[{key}]] '{label}'" if label else f"[[{key}]] #{i + 1}")
            if partial:
                kind = table.get("kind")
                if kind not in CHECK_KINDS:
                    raise where.error(f"field 'kind' must be one of {', '.join(CHECK_KINDS)}")
                own_required, own_optional = CHECK_KINDS[kind]
                fields = dict(allowed, **own_required, **own_optional)
                _check_fields(table, fields, tuple(required) + tuple(own_required), where)
            else:
                _check_fields(table, allowed, required, where)
            out.append((where, table))
        return out

    def values(self, work, device, out, python, repo):
        """The placeholder values of this suite's templates."""
        values = {"D": device, "W": work, "O": out, "py": python, "repo": repo}
        for _ in range(len(self.vars) + 1):  # variables may use one another
            for key, template in self.vars.items():
                values[key] = _PLACEHOLDER.sub(
                    lambda m: str(values.get(m.group(1), m.group(0))), template)
        return values

    def expanded_runs(self, values):
        """[(where, run table, name, command)] in order."""
        out = []
        for where, run, each in self.runs:
            own = dict(values, each=each if each is not None else "")
            name = expand(run["name"], own, where)
            own["name"] = name
            out.append((where, run, name, expand(run["command"], own, where)))
        return out

    def _validate(self, text):
        values = self.values("W", "D", "O", "py", "repo")
        runs = self.expanded_runs(values)
        names = [name for _, _, name, _ in runs]
        for where, run, name, _ in runs:
            if names.count(name) > 1:
                raise where.error(f"two runs are named '{name}'")
            for path in run.get("cleanup", []):
                if not expand(path, dict(values, name=name, each=""), where).startswith("W/"):
                    raise where.error(f"cleanup path '{path}' must be under {{W}}")
        ids = set()
        for where, bench in self.benchmarks:
            wanted = bench.get("runs", [bench["run"]] if "run" in bench else [])
            if not wanted:
                raise where.error("field 'run' or 'runs' is missing")
            for run in wanted:
                if run not in names:
                    raise where.error(f"run '{run}' is not a run of this suite")
            if bench["unit"] not in measurements.UNITS:
                raise where.error(f"field 'unit': unknown unit '{bench['unit']}'")
            source = bench["from"]
            if source in ("log", "json", "kernels") and "field" not in bench:
                raise where.error(f"a benchmark from '{source}' names its 'field'")
            if source == "kernels" and ("file" not in bench or
                                        ("name" in bench) == ("name_regex" in bench)):
                raise where.error("a benchmark from 'kernels' names its 'file' and one of "
                                  "'name', 'name_regex'")
            if source == "text" and "pattern" not in bench:
                raise where.error("a benchmark from 'text' names its 'pattern'")
            if (source == "largest_passing") != ("values" in bench) or \
                    ("values" in bench and len(bench["values"]) != len(wanted)):
                raise where.error("a benchmark from 'largest_passing' gives one of 'values' "
                                  "for each of its 'runs'")
            if "vs" in bench and bench.get("side") != "baseline":
                raise where.error("only a baseline names the dflashc label it is against ('vs')")
            if "file" in bench:
                expand(bench["file"], dict(values, run="run"), where)
            if "id" in bench:
                if bench["id"] in ids:
                    raise where.error(f"two benchmarks have the id '{bench['id']}'")
                ids.add(bench["id"])
        check_names = set()
        for where, check in self.checks:
            if check["name"] in check_names:
                raise where.error(f"two checks are named '{check['name']}'")
            check_names.add(check["name"])
            for run in check.get("runs", []):
                if run not in names:
                    raise where.error(f"run '{run}' is not a run of this suite")
            for key in ("value", "of"):
                if key in check and check[key] not in ids:
                    raise where.error(f"field '{key}': no benchmark has the id '{check[key]}'")
            for key, value in check.items():
                if key == "pairs":
                    templates = [x for pair in value for x in pair]
                elif isinstance(value, str):
                    templates = [value]
                else:
                    templates = value if _is_str_list(value) else []
                for template in templates:
                    expand(template, values, where)


def _shown(path):
    """A path as messages write it: from the working folder where inside it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def suite_names():
    return sorted(f[:-5] for f in os.listdir(SUITES_DIR) if f.endswith(".toml"))


def load_suite(name, directory=SUITES_DIR):
    path = os.path.join(directory, name + ".toml")
    shown = _shown(path)
    if not os.path.exists(path):
        known = ", ".join(suite_names()) if directory == SUITES_DIR else ""
        raise SuiteError(f"no suite '{name}' ({shown} does not exist; suites: {known})")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as error:
        raise SuiteError(f"{shown}: {error}") from None
    return Suite(name, shown, data, raw.decode())


class Products:
    """scripts/device/products.toml: the files under .device/ that each
    scripts/device-prepare.sh item leaves."""

    def __init__(self, path=PRODUCTS_FILE):
        self.path = _shown(path)
        with open(path, "rb") as f:
            try:
                data = tomllib.load(f)
            except tomllib.TOMLDecodeError as error:
                raise SuiteError(f"{self.path}: {error}") from None
        for key in data:
            if key not in ("kind", "item"):
                raise SuiteError(f"{self.path}: unknown table '{key}' (kind, item)")
        self.kinds = data.get("kind", {})
        self.items = data.get("item", {})
        for kind, table in self.kinds.items():
            _check_fields(table, {"files": "strs", "names": "strs"}, ("files", "names"),
                          Located(self.path, 0, f"[kind.{kind}]"))
        for item, table in self.items.items():
            _check_fields(table, {"files": "strs"}, ("files",),
                          Located(self.path, 0, f"[item.\"{item}\"]"))

    def files(self, item):
        """The files (relative to .device) that `item` leaves; an item that
        device-prepare does not build is an error."""
        if item in self.items:
            return self.items[item]["files"]
        kind, _, name = item.partition(":")
        table = self.kinds.get(kind)
        if table is None or not name:
            raise SuiteError(f"{self.path}: no item '{item}' (items: "
                             f"{', '.join(sorted(self.items))}; kinds: "
                             f"{', '.join(k + ':NAME' for k in sorted(self.kinds))})")
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in table["names"]):
            raise SuiteError(f"{self.path}: '{name}' is not a {kind} device-prepare builds "
                             f"({', '.join(table['names'])})")
        return [f.replace("{name}", name) for f in table["files"]]
