"""Tests of the suite files and device-check's plan: every shipped suite loads,
needs only what device-prepare builds, and names real headings of
bench/RESULTS.md; malformed suites are refused naming file, line and field;
--list and --dry-run print the plan without running anything.

  /usr/bin/python3 -m unittest discover -s scripts/device/tests
"""

import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(DEVICE))
sys.path.insert(0, DEVICE)

import suites  # noqa: E402

CHECK = os.path.join(DEVICE, "device-check")


def device_check(*args, env=None):
    return subprocess.run([sys.executable, CHECK, *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)


class ShippedSuitesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.products = suites.Products()
        cls.suites = [suites.load_suite(name) for name in suites.suite_names()]
        with open(os.path.join(REPO, "bench", "RESULTS.md")) as f:
            cls.headings = {l.lstrip("#").strip() for l in f if l.startswith("#")}

    def test_there_are_suites(self):
        self.assertGreaterEqual(len(self.suites), 10)

    def test_every_file_a_suite_reads_is_prepared(self):
        """Each .device path a command or check names is a file an item of
        the suite's `prepare` leaves, or lies in a folder of one."""
        for suite in self.suites:
            files = [f for item in suite.prepare for f in self.products.files(item)]
            values = suite.values("W", "D", "O", "py", ".")
            texts = [command for _, _, _, command in suite.expanded_runs(values)]
            for _, check in suite.checks:
                texts += [suites.expand(v, values, None) for k, v in check.items()
                          if isinstance(v, str) and k not in ("name", "kind")]
                texts += [suites.expand(x, values, None) for pair in check.get("pairs", [])
                          for x in pair]
            for _, test in suite.gpu_tests:
                texts.append("D/bin/" + test["binary"])
            for text in texts:
                for path in re.findall(r"\bD/([\w./-]+)", text):
                    path = path.rstrip("/.")
                    self.assertTrue(
                        any(f == path or f.startswith(path + "/") or path.startswith(f + "/")
                            for f in files) or path in ("tcfg", "target") or
                        path.startswith("tcfg/"),
                        f"suite {suite.name}: .device/{path} is not left by any of {suite.prepare}")

    def test_checks_list_the_runs_they_read(self):
        """A check of a run's output names the run, so that it is skipped with
        it (too few GPUs, past the deadline) instead of failing on no file."""
        for suite in self.suites:
            runs = {name for _, _, name, _ in suite.expanded_runs(suite.values("W", "D", "O", "py", "."))}
            for _, check in suite.checks:
                text = " ".join(str(v) for v in check.values())
                for token in re.findall(r"\{W\}/([\w-]+)", text):
                    read = re.sub(r"\.(jsonl|err|out)$", "", token)
                    if read in runs:
                        self.assertIn(read, check.get("runs", []),
                                      f"suite {suite.name}, check '{check['name']}'")

    def test_histories_name_headings_of_results_md(self):
        for suite in self.suites:
            for _, bench in suite.benchmarks:
                if "history" in bench:
                    self.assertIn(bench["history"], self.headings, f"suite {suite.name}")

    def test_vs_names_a_dflashc_label_of_its_benchmark(self):
        for suite in self.suites:
            labels = {(b["benchmark"], b.get("label", "")) for _, b in suite.benchmarks
                      if b.get("side", "dflashc") == "dflashc"}
            for _, bench in suite.benchmarks:
                if "vs" in bench:
                    self.assertIn((bench["benchmark"], bench["vs"]), labels, f"suite {suite.name}")

    def test_every_old_script_is_accounted_for(self):
        """The device scripts this harness replaced, each named by a suite
        or moved to bench/ab (scripts/device/README.md has the table)."""
        replaced = " ".join(" ".join(s.replaces) for s in self.suites)
        for old in ("device-validate", "device-run-checks", "device-packing-check",
                    "device-data-parallel", "device-step-bench", "device-eval-check",
                    "device-tau-check", "device-online-target-check", "device-online-target-kernels",
                    "device-online-target-8b", "device-online-train-check", "device-online-split",
                    "device-target-check", "device-max-rows", "device-recompute-check",
                    "device-gemm-timing-check", "device-lmhead-skip-check"):
            self.assertIn(f"scripts/{old}.sh", replaced)


class MalformedSuiteTest(unittest.TestCase):
    GOOD = """\
        summary = "a suite"
        prepare = ["trainer:tiny"]

        [[run]]
        name = "graph"
        command = "{D}/bin/train-tiny --out {W}/{name}"
        timeout_s = 10

        [[benchmark]]
        benchmark = "tiny step"
        unit = "ms"
        run = "graph"
        from = "log"
        field = "step_ms"

        [[check]]
        name = "losses"
        kind = "losses"
        a = "{W}/graph.jsonl"
        b = "{D}/ref/tiny-losses.jsonl"
        limit = 2e-2
        """

    def load(self, text):
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "x.toml"), "w") as f:
            f.write(textwrap.dedent(text))
        return suites.load_suite("x", folder)

    def refused(self, old, new, message):
        text = textwrap.dedent(self.GOOD)
        self.assertIn(old, text)
        with self.assertRaises(suites.SuiteError) as caught:
            self.load(text.replace(old, new, 1))
        self.assertRegex(str(caught.exception), message)

    def test_the_good_one_loads(self):
        suite = self.load(self.GOOD)
        self.assertEqual([name for _, _, name, _ in suite.expanded_runs(
            suite.values("W", "D", "O", "py", "."))], ["graph"])

    def test_errors_name_file_line_and_field(self):
        self.refused("timeout_s = 10", "timeout = 10", r"x\.toml:4: \[\[run\]\] 'graph': unknown field 'timeout'")
        self.refused("timeout_s = 10", "timeout_s = \"10\"", r"x\.toml:4: .*field 'timeout_s' must be an integer")
        self.refused('field = "step_ms"\n', "", r"x\.toml:9: \[\[benchmark\]\] 'tiny step': a benchmark from 'log' names its 'field'")
        self.refused('unit = "ms"', 'unit = "msec"', r"x\.toml:9: .*unknown unit 'msec'")
        self.refused('run = "graph"', 'run = "eager"', r"x\.toml:9: .*run 'eager' is not a run of this suite")
        self.refused('kind = "losses"', 'kind = "loss"', r"x\.toml:16: \[\[check\]\] 'losses': field 'kind' must be one of")
        self.refused("limit = 2e-2\n", "", r"x\.toml:16: .*field 'limit' is missing")
        self.refused("{W}/{name}\"", "{W}/{nmae}\"", r"x\.toml:4: .*unknown placeholder \{nmae\}")
        self.refused('summary = "a suite"\n', "", r"x\.toml: field 'summary' is missing")
        self.refused("timeout_s = 10", 'timeout_s = 10\ncleanup = ["/tmp/x"]',
                     r"cleanup path '/tmp/x' must be under \{W\}")
        self.refused('prepare = ["trainer:tiny"]', 'prepare = ["trainer:tiny"]\ncolour = 1',
                     r"x\.toml: unknown field 'colour'")

    def test_two_runs_of_one_name(self):
        text = textwrap.dedent(self.GOOD).replace(
            "[[benchmark]]", '[[run]]\nname = "graph"\ncommand = "true"\ntimeout_s = 1\n\n[[benchmark]]')
        with self.assertRaisesRegex(suites.SuiteError, "two runs are named 'graph'"):
            self.load(text)

    def test_each_expands_runs(self):
        text = textwrap.dedent(self.GOOD).replace(
            'name = "graph"', 'name = "graph-{each}"\neach = ["1", "2"]').replace(
            'run = "graph"', 'runs = ["graph-1", "graph-2"]')
        suite = self.load(text)
        runs = suite.expanded_runs(suite.values("W", "D", "O", "py", "."))
        self.assertEqual([(n, c) for _, _, n, c in runs],
                         [("graph-1", "D/bin/train-tiny --out W/graph-1"),
                          ("graph-2", "D/bin/train-tiny --out W/graph-2")])

    def test_shell_braces_are_left_alone(self):
        suite = self.load(textwrap.dedent(self.GOOD).replace(
            "--out {W}/{name}", "--out ${HOME} {W}"))
        self.assertEqual(suite.expanded_runs(suite.values("W", "D", "O", "py", "."))[0][3],
                         "D/bin/train-tiny --out ${HOME} W")

    def test_unknown_product(self):
        with self.assertRaisesRegex(suites.SuiteError, "'tiny-huge' is not a trainer device-prepare builds"):
            suites.Products().files("trainer:tiny-huge")
        with self.assertRaisesRegex(suites.SuiteError, "no item 'widget'"):
            suites.Products().files("widget")
        self.assertEqual(suites.Products().files("trainer:qwen3-8b-rows-20"),
                         ["bin/train-qwen3-8b-rows-20", "ref/qwen3-8b-rows-20-manifest.json"])


class PlanTest(unittest.TestCase):
    def test_list_names_every_suite(self):
        out = device_check("--list")
        self.assertEqual(out.returncode, 0, out.stderr)
        listed = re.findall(r"^([\w-]+)(?: \(\d GPUs\))?: ", out.stdout, re.M)
        self.assertEqual(listed, suites.suite_names())

    def test_dry_run_prints_builds_runs_and_checks(self):
        out = device_check("tiny", "--dry-run")
        self.assertEqual(out.returncode, 0, out.stderr)
        suite = suites.load_suite("tiny")
        self.assertIn("prepare (CPU machine): scripts/device-prepare.sh --items trainer:tiny data:tiny",
                      out.stdout)
        for _, _, name, _ in suite.expanded_runs(suite.values("W", "D", "O", "py", ".")):
            self.assertIn(f"run {name} (at most", out.stdout)
        for _, check in suite.checks:
            self.assertIn(f"check {check['name']}: ", out.stdout)
        self.assertIn(".device/bin/train-tiny --target .device/tiny/target", out.stdout)

    def test_dry_run_runs_nothing(self):
        with tempfile.TemporaryDirectory() as out_dir:
            env = dict(os.environ, OUT=out_dir)
            result = device_check("run-checks", "eval", "--dry-run", env=env)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("== all: at most", result.stdout)
            self.assertEqual(os.listdir(out_dir), [])
        self.assertFalse(os.path.exists("/tmp/device-check/run-checks/poison.out"))

    def test_prepare_dry_run_takes_the_union(self):
        out = device_check("tiny", "packing", "eval", "--prepare", "--dry-run")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(),
                         "scripts/device-prepare.sh --items trainer:tiny data:tiny ref:tiny-eval "
                         "ref:tiny-serving")

    def test_unknown_suite(self):
        out = device_check("tinny", "--dry-run")
        self.assertEqual(out.returncode, 2)
        self.assertIn("no suite 'tinny'", out.stderr)


if __name__ == "__main__":
    unittest.main()
