"""End-to-end tests of scripts/device/harness.py on a CPU machine: a suite of
stand-in binaries (a trainer that writes a metrics log, a checkpoint and its
"done:" line; GoogleTest binaries that pass and fail) runs through the
harness, and every verdict, number and result line is checked, the failing
ones included.

  /usr/bin/python3 -m unittest discover -s scripts/device/tests
"""

import json
import os
import stat
import sys
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import harness  # noqa: E402
import measurements  # noqa: E402
import suites  # noqa: E402

# A stand-in trainer: --losses L1,L2,... --out DIR --log FILE [--ms M].
FAKE_TRAIN = f"""#!{sys.executable}
import json, os, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
losses = [float(x) for x in args["--losses"].split(",")]
ms = float(args.get("--ms", "10"))
with open(args["--log"], "w") as f:
    for i, loss in enumerate(losses):
        f.write(json.dumps({{"step": i, "loss": loss, "grad_norm": 1.0, "step_ms": ms + i}}) + "\\n")
os.makedirs(os.path.join(args["--out"], "final"), exist_ok=True)
os.makedirs(os.path.join(args["--out"], "checkpoint-1"), exist_ok=True)
with open(os.path.join(args["--out"], "final", "model.safetensors"), "w") as f:
    f.write(args["--losses"])
print("train: done: %d steps in 1 s; 2.5 GiB in use on the device after the first step" % len(losses),
      file=sys.stderr)
"""
FAKE_GTEST = """#!/bin/sh
if [ "$(basename "$0")" = PassingGpuTest ]; then
  echo "[  PASSED  ] 3 tests."
else
  echo "[  PASSED  ] 2 tests."
  echo "[  FAILED  ] 1 test, listed below:"
  echo "[  FAILED  ] Dense.Rope"
  exit 1
fi
"""
PRODUCTS = """
[kind.test]
files = ["bin/{name}"]
names = ["PassingGpuTest", "FailingGpuTest"]

[item.fake]
files = ["bin/fake-train"]

[item.absent]
files = ["bin/never-built"]

[item.absent-prefix]
files = ["bin/never"]
"""
SUITE = """
summary = "stand-ins"
prepare = ["fake", "test:PassingGpuTest", "test:FailingGpuTest"]

[vars]
train = "{D}/bin/fake-train --out {W}/{name} --log {W}/{name}.jsonl"

[[gpu_test]]
binary = "PassingGpuTest"
timeout_s = 10

[[gpu_test]]
binary = "FailingGpuTest"
timeout_s = 10

[[run]]
name = "a"
command = "{train} --losses 2.0,1.5,1.0"
timeout_s = 30
cleanup = ["{W}/{name}/checkpoint-*"]

[[run]]
name = "b"
command = "{train} --losses 2.0,1.5,1.001 --ms 20"
timeout_s = 30

[[run]]
name = "a-again"
command = "{train} --losses 2.0,1.5,1.0"
timeout_s = 30

[[run]]
name = "two-gpus"
command = "{train} --losses 1.0"
timeout_s = 30
min_gpus = 2

[[run]]
name = "refused"
command = "echo 'train: error: no' >&2; exit 3"
timeout_s = 30
expect_rc = "nonzero"

[[run]]
name = "hangs"
command = "sleep 20"
timeout_s = 1

[[benchmark]]
id = "a_ms"
benchmark = "stand-in step"
unit = "ms"
run = "a"
from = "log"
field = "step_ms"
skip = 1

[[benchmark]]
id = "b_ms"
benchmark = "stand-in step"
side = "baseline"
label = "slower"
unit = "ms"
run = "b"
from = "log"
field = "step_ms"
stat = "max"

[[benchmark]]
benchmark = "stand-in step"
unit = "GiB"
note = "in use"
run = "a"
from = "memory"

[[check]]
name = "b within 1e-2"
kind = "losses"
runs = ["a", "b"]
a = "{W}/b.jsonl"
b = "{W}/a.jsonl"
steps = 3
limit = 1e-2

[[check]]
name = "b within 1e-4"
kind = "losses"
runs = ["a", "b"]
a = "{W}/b.jsonl"
b = "{W}/a.jsonl"
limit = 1e-4

[[check]]
name = "a again = a"
kind = "identical_files"
runs = ["a", "a-again"]
pairs = [["{W}/a/final/model.safetensors", "{W}/a-again/final/model.safetensors"]]

[[check]]
name = "b = a"
kind = "identical_files"
runs = ["a", "b"]
pairs = [["{W}/a/final/model.safetensors", "{W}/b/final/model.safetensors"]]

[[check]]
name = "two-gpu losses"
kind = "losses"
runs = ["two-gpus"]
a = "{W}/two-gpus.jsonl"
b = "{W}/a.jsonl"
limit = 0

[[check]]
name = "a faster than b"
kind = "ratio_at_most"
value = "a_ms"
of = "b_ms"
limit = 1.0

[[check]]
name = "three steps, falling"
kind = "log"
file = "{W}/a.jsonl"
count = 3
finite = ["loss"]
last_at_least = {loss = 1.0}

[[check]]
name = "the refusal says why"
kind = "text"
runs = ["refused"]
file = "{W}/refused.err"
contains = ["error: no"]
"""


def executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


class HarnessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp()
        os.makedirs(os.path.join(cls.root, ".device", "bin"))
        executable(os.path.join(cls.root, ".device", "bin", "fake-train"), FAKE_TRAIN)
        for name in ("PassingGpuTest", "FailingGpuTest"):
            executable(os.path.join(cls.root, ".device", "bin", name), FAKE_GTEST)
        with open(os.path.join(cls.root, "products.toml"), "w") as f:
            f.write(PRODUCTS)
        os.makedirs(os.path.join(cls.root, "suites"))
        with open(os.path.join(cls.root, "suites", "standins.toml"), "w") as f:
            f.write(textwrap.dedent(SUITE))
        cls.products = suites.Products(os.path.join(cls.root, "products.toml"))
        cls.suite = suites.load_suite("standins", os.path.join(cls.root, "suites"))
        cls.ctx = harness.Context(cls.root, ".device", os.path.join(cls.root, "work"),
                                  os.path.join(cls.root, "out"), gpus=1, gpu="Stand-in GPU",
                                  commit="abc1234", date="2026-12-04", python=sys.executable)
        cls.outcome = harness.run_suite(cls.suite, cls.ctx, cls.products, say=lambda text: None)
        cls.rows = {(what, name): (result, verdict)
                    for what, name, result, verdict in cls.outcome.rows}

    def verdict(self, what, name):
        return self.rows[(what, name)][1]

    def test_gpu_tests(self):
        self.assertEqual(self.verdict("gpu test", "PassingGpuTest"), "PASS")
        self.assertEqual(self.verdict("gpu test", "FailingGpuTest"), "FAIL")
        self.assertIn("2 passed, 1 failed", self.rows[("gpu test", "FailingGpuTest")][0])
        self.assertIn("Dense.Rope", self.rows[("gpu test", "FailingGpuTest")][0])

    def test_runs(self):
        self.assertEqual(self.verdict("run", "a"), "PASS")
        self.assertEqual(self.verdict("run", "two-gpus"), "SKIP")
        self.assertEqual(self.verdict("run", "refused"), "PASS")  # expected to fail
        self.assertEqual(self.verdict("run", "hangs"), "FAIL")
        self.assertIn("rc=124", self.rows[("run", "hangs")][0])
        self.assertIn("stopped after 1 s", self.rows[("run", "hangs")][0])

    def test_cleanup(self):
        work = os.path.join(self.root, "work", "standins")
        self.assertFalse(os.path.exists(os.path.join(work, "a", "checkpoint-1")))
        self.assertTrue(os.path.exists(os.path.join(work, "a", "final", "model.safetensors")))
        self.assertTrue(os.path.exists(os.path.join(work, "b", "checkpoint-1")))

    def test_checks(self):
        self.assertEqual(self.verdict("check", "b within 1e-2"), "PASS")
        self.assertEqual(self.verdict("check", "b within 1e-4"), "FAIL")
        self.assertIn("worst relative difference 1.00e-03 at step 2 loss",
                      self.rows[("check", "b within 1e-4")][0])
        self.assertEqual(self.verdict("check", "a again = a"), "PASS")
        self.assertEqual(self.verdict("check", "b = a"), "FAIL")
        self.assertEqual(self.verdict("check", "two-gpu losses"), "SKIP")
        self.assertEqual(self.verdict("check", "a faster than b"), "PASS")
        self.assertIn("11.5 / 22 = 0.523", self.rows[("check", "a faster than b")][0])
        self.assertEqual(self.verdict("check", "three steps, falling"), "PASS")
        self.assertEqual(self.verdict("check", "the refusal says why"), "PASS")
        self.assertEqual(self.outcome.verdict, "FAIL")

    def test_result_lines(self):
        for line in self.outcome.results:
            measurements.validate_result(line, "result")
            self.assertEqual((line["date"], line["commit"], line["gpu"], line["command"]),
                             ("2026-12-04", "abc1234", "Stand-in GPU",
                              "scripts/device/device-check standins"))
        numbers = {(l["benchmark"], l.get("side", "dflashc"), l["unit"]): l["value"]
                   for l in self.outcome.results if "verdict" not in l}
        self.assertEqual(numbers, {("stand-in step", "dflashc", "ms"): 11.5,  # steps 1, 2
                                   ("stand-in step", "baseline", "ms"): 22.0,
                                   ("stand-in step", "dflashc", "GiB"): 2.5})
        checks = {l["check"]: (l["value"], l["verdict"]) for l in self.outcome.results
                  if "verdict" in l and l["unit"] == "relative error"}
        self.assertEqual(checks["b within 1e-4"][1], "FAIL")
        self.assertAlmostEqual(checks["b within 1e-4"][0], 1e-3)
        json.dumps(self.outcome.results)  # what device-check writes

    def test_missing_products_stop_the_suite(self):
        text = textwrap.dedent(SUITE).replace('prepare = ["fake",', 'prepare = ["absent", "fake",')
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "missing.toml"), "w") as f:
            f.write(text)
        suite = suites.load_suite("missing", folder)
        outcome = harness.run_suite(suite, self.ctx, self.products, say=lambda text: None)
        self.assertEqual(len(outcome.rows), 1)
        what, _, result, verdict = outcome.rows[0]
        self.assertEqual((what, verdict), ("prepare", "FAIL"))
        self.assertIn(".device/bin/never-built (absent)", result)
        self.assertIn("device-check --prepare missing", result)

    def test_only_asks_for_the_products_of_the_selected_runs(self):
        # "absent" is only what run "never" needs: selecting the others runs
        # them; selecting "never" stops the suite at its prepare step.
        text = textwrap.dedent(SUITE).replace('prepare = ["fake",', 'prepare = ["absent", "fake",')
        text += '\n[[run]]\nname = "never"\ncommand = "{D}/bin/never-built"\ntimeout_s = 5\n'
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "partial.toml"), "w") as f:
            f.write(text)
        suite = suites.load_suite("partial", folder)
        for only, stops in ((["a", "b"], False), (["never"], True)):
            ctx = harness.Context(self.root, ".device", os.path.join(self.root, "work5"),
                                  os.path.join(self.root, "out"), gpus=1, gpu="none",
                                  commit="abc1234", date="2026-12-04", only=only)
            outcome = harness.run_suite(suite, ctx, self.products, say=lambda text: None)
            verdicts = {(r[0], r[1]): r[3] for r in outcome.rows}
            self.assertEqual(verdicts.get(("prepare", "partial")), "FAIL" if stops else None, only)
            if not stops:
                self.assertEqual(verdicts[("run", "a")], "PASS")

    def test_only_asks_for_whole_paths(self):
        # Run "never" names bin/never-built, not bin/never (absent-prefix's
        # file, a prefix of it): only the first is asked for.
        text = textwrap.dedent(SUITE).replace(
            'prepare = ["fake",', 'prepare = ["absent", "absent-prefix", "fake",')
        text += '\n[[run]]\nname = "never"\ncommand = "{D}/bin/never-built"\ntimeout_s = 5\n'
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "prefix.toml"), "w") as f:
            f.write(text)
        suite = suites.load_suite("prefix", folder)
        ctx = harness.Context(self.root, ".device", os.path.join(self.root, "work6"),
                              os.path.join(self.root, "out"), gpus=1, gpu="none",
                              commit="abc1234", date="2026-12-04", only=["never"])
        outcome = harness.run_suite(suite, ctx, self.products, say=lambda text: None)
        result = {(r[0], r[1]): r[2] for r in outcome.rows}[("prepare", "prefix")]
        self.assertIn(".device/bin/never-built (absent)", result)
        self.assertNotIn("(absent-prefix)", result)
        self.assertTrue(harness.names_path("x/.device/bin/a-b.json)", "bin/a-b.json"))
        self.assertFalse(harness.names_path(".device/bin/a-b-validated", "bin/a-b"))
        self.assertFalse(harness.names_path(".device/xbin/a", "bin/a"))

    def test_nothing_starts_past_the_deadline(self):
        import time
        ctx = harness.Context(self.root, ".device", os.path.join(self.root, "work3"),
                              os.path.join(self.root, "out"), gpus=1, gpu="none",
                              commit="abc1234", date="2026-12-04", deadline=time.monotonic())
        outcome = harness.run_suite(self.suite, ctx, self.products, say=lambda text: None)
        started = [r for r in outcome.rows if r[0] in ("run", "gpu test") and r[3] != "SKIP"]
        self.assertEqual(started, [])
        self.assertIn(("run", "a", "not started: past the deadline", "SKIP"), outcome.rows)

    def test_only_starts_the_named_runs_and_tests(self):
        ctx = harness.Context(self.root, ".device", os.path.join(self.root, "work4"),
                              os.path.join(self.root, "out"), gpus=1, gpu="none",
                              commit="abc1234", date="2026-12-04", only=["Passing*", "a", "b"])
        outcome = harness.run_suite(self.suite, ctx, self.products, say=lambda text: None)
        verdicts = {(r[0], r[1]): (r[2], r[3]) for r in outcome.rows}
        self.assertEqual(verdicts[("gpu test", "PassingGpuTest")][1], "PASS")
        self.assertEqual(verdicts[("gpu test", "FailingGpuTest")],
                         ("not selected (--only)", "SKIP"))
        self.assertEqual(verdicts[("run", "a-again")], ("not selected (--only)", "SKIP"))
        self.assertEqual(verdicts[("run", "b")][1], "PASS")
        # A check that reads an unselected run is skipped, not failed for a
        # missing log; one on the selected run still runs (and this one fails).
        self.assertEqual(verdicts[("check", "a again = a")][1], "SKIP")
        self.assertEqual(verdicts[("check", "b within 1e-4")][1], "FAIL")

    def test_too_few_gpus_skips_the_suite(self):
        ctx = harness.Context(self.root, ".device", os.path.join(self.root, "work2"),
                              os.path.join(self.root, "out"), gpus=0, gpu="none",
                              commit="abc1234", date="2026-12-04")
        outcome = harness.run_suite(self.suite, ctx, self.products, say=lambda text: None)
        self.assertEqual(outcome.verdict, "SKIP")


if __name__ == "__main__":
    unittest.main()
