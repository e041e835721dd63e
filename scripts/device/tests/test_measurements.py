"""Unit tests of scripts/device/measurements.py: the device checks' statistics,
run comparisons, output parsers and the result-line schema.

  /usr/bin/python3 -m unittest discover -s scripts/device/tests
"""

import io
import json
import os
import struct
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import measurements as m  # noqa: E402


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def train_log(path, losses, step_ms=None, extra=None):
    """A `train --log` file: one metrics line per loss, a line of other text
    and an evaluation line between them, as the trainer writes."""
    lines = ["train: progress text the parser must skip"]
    for i, loss in enumerate(losses):
        row = {"step": i, "loss": loss, "grad_norm": 1.0 + i, "step_ms": (step_ms or [10.0] * len(losses))[i]}
        row.update((extra or {}).get(i, {}))
        lines.append(json.dumps(row))
        if i == 1:
            lines.append(json.dumps({"step": i, "eval_loss": 3.0, "eval_tau": 1.5}))
    return write(path, "\n".join(lines) + "\n")


def safetensors(path, tensors, dtype="F32"):
    """A safetensors file of float tensors (F32 or BF16, truncated)."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        array = np.asarray(array, dtype=np.float32)
        if dtype == "BF16":
            data = (array.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        else:
            data = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return path


GOOD_LINE = {"benchmark": "qwen3-8b-b16 step", "value": 466.0, "unit": "ms",
             "date": "2026-12-02", "commit": "abc1234", "gpu": "NVIDIA H200",
             "command": "scripts/device/device-check step"}


class StatisticsTest(unittest.TestCase):
    def test_each_statistic(self):
        values = [5.0, 1.0, 4.0, 2.0]
        self.assertEqual(m.statistic(values, "median", "w"), 3.0)
        self.assertEqual(m.statistic(values, "mean", "w"), 3.0)
        self.assertEqual(m.statistic(values, "first", "w"), 5.0)
        self.assertEqual(m.statistic(values, "last", "w"), 2.0)
        self.assertEqual(m.statistic(values, "min", "w"), 1.0)
        self.assertEqual(m.statistic(values, "max", "w"), 5.0)

    def test_no_values_names_where(self):
        with self.assertRaisesRegex(m.MeasurementError, "^run q8: no values"):
            m.statistic([], "median", "run q8")

    def test_unknown_statistic(self):
        with self.assertRaisesRegex(m.MeasurementError, "unknown statistic 'p90'"):
            m.statistic([1.0], "p90", "w")

    def test_relative_difference(self):
        self.assertAlmostEqual(m.relative_difference(1.1, 1.0), 0.1)
        self.assertAlmostEqual(m.relative_difference(-0.9, -1.0), 0.1)
        self.assertEqual(m.relative_difference(0.0, 0.0), 0.0)
        self.assertEqual(m.relative_difference(1.0, 0.0), float("inf"))


class LossComparisonTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def test_worst_difference_and_where(self):
        a = m.metrics_lines(train_log(os.path.join(self.dir, "a.jsonl"), [2.0, 4.0, 1.0]))
        b = m.metrics_lines(train_log(os.path.join(self.dir, "b.jsonl"), [2.0, 4.2, 1.01]))
        worst, at = m.worst_relative_difference(a, b, ["loss"], 3, "a vs b")
        self.assertAlmostEqual(worst, 0.2 / 4.2)
        self.assertEqual(at, "step 1 loss")
        # Only the first step: equal.
        self.assertEqual(m.worst_relative_difference(a, b, ["loss"], 1, "x")[0], 0.0)

    def test_grad_norm_too(self):
        a = [{"step": 0, "loss": 1.0, "grad_norm": 2.0}]
        b = [{"step": 0, "loss": 1.0, "grad_norm": 1.0}]
        self.assertEqual(m.worst_relative_difference(a, b, ["loss", "grad_norm"], None, "w"),
                         (1.0, "step 0 grad_norm"))

    def test_too_few_steps_is_an_error(self):
        a = [{"step": 0, "loss": 1.0}]
        with self.assertRaisesRegex(m.MeasurementError, "tiny vs ref: 1 and 1 lines, 10 wanted"):
            m.worst_relative_difference(a, a, ["loss"], 10, "tiny vs ref")

    def test_missing_field_is_named(self):
        a = [{"step": 0, "loss": 1.0}]
        with self.assertRaisesRegex(m.MeasurementError, "no field 'grad_norm'"):
            m.worst_relative_difference(a, a, ["grad_norm"], 1, "w")

    def test_metrics_lines_split_steps_and_evaluations(self):
        path = train_log(os.path.join(self.dir, "a.jsonl"), [3.0, 2.0, 1.0])
        self.assertEqual([r["loss"] for r in m.metrics_lines(path)], [3.0, 2.0, 1.0])
        self.assertEqual([r["eval_loss"] for r in m.metrics_lines(path, "evals")], [3.0])

    def test_first_difference(self):
        a = [{"step": 0, "loss": 1.0, "acc": 0.5}]
        self.assertIsNone(m.first_difference(a, [dict(a[0])], ["loss", "acc"]))
        self.assertEqual(m.first_difference(a, [{"step": 0, "loss": 1.0, "acc": 0.25}], ["loss", "acc"]),
                         "step 0 acc: 0.5 against 0.25")
        self.assertEqual(m.first_difference(a, [], ["loss"]), "1 lines against 0")

    def test_bad_json_names_file_and_line(self):
        path = write(os.path.join(self.dir, "bad.jsonl"), '{"step": 0, "loss": 1}\n{"step": \n')
        with self.assertRaisesRegex(m.MeasurementError, r"bad.jsonl:2: not a JSON object"):
            m.metrics_lines(path)

    def test_missing_file_is_named(self):
        with self.assertRaisesRegex(m.MeasurementError, "nowhere.jsonl: cannot read"):
            m.metrics_lines(os.path.join(self.dir, "nowhere.jsonl"))


class OutputParsersTest(unittest.TestCase):
    def test_gtest_summary(self):
        text = ("[==========] 22 tests from 5 test suites ran. (1234 ms total)\n"
                "[  PASSED  ] 18 tests.\n[  SKIPPED ] 3 tests, listed below:\n"
                "[  SKIPPED ] RuntimeTrainerGroup.TwoGpus\n[  FAILED  ] 1 test, listed below:\n"
                "[  FAILED  ] Dense.Rope\n")
        self.assertEqual(m.gtest_summary(text), {"passed": 18, "failed": 1, "skipped": 3})
        self.assertEqual(m.gtest_summary("no summary"), {"passed": 0, "failed": 0, "skipped": 0})

    def test_memory_in_use(self):
        text = ("train: device 0 (NVIDIA H200): step buffers 16.5 GiB; 40.9 GiB of 139.8 GiB in use\n"
                "train: done: 25 steps in 41 s; 41.0 GiB in use on the device after the first step; "
                "drafter in run/final\n")
        self.assertEqual(m.memory_in_use_gib(text, "w"), 41.0)
        mib = "train: done: 5 steps in 1 s; 512.0 MiB in use on the fullest device after the first step"
        self.assertEqual(m.memory_in_use_gib(mib, "w"), 0.5)
        with self.assertRaisesRegex(m.MeasurementError, "q8.err: no 'done: "):
            m.memory_in_use_gib("train: error: out of memory", "q8.err")

    def test_number_from_text(self):
        text = "lm_head+CE blockSize=16 chunk=2048  29.391 ms  workspace 554 MB\n"
        self.assertEqual(m.number_from_text(text, r"workspace (\d+) MB", "w"), 554.0)
        with self.assertRaisesRegex(m.MeasurementError, "nothing matches"):
            m.number_from_text(text, r"arena (\d+)", "w")

    def test_named_and_matching_lines(self):
        folder = tempfile.mkdtemp()
        path = write(os.path.join(folder, "k.jsonl"),
                     '{"name": "causal fwd unpacked B=4 [x]", "ms": 0.578, "value": 535.0}\n'
                     '{"mode": "torch-compile-masters", "step_ms": 521.5}\n')
        with self.assertRaisesRegex(m.MeasurementError, r"k.jsonl:2: a benchmark line without 'name'"):
            m.named_lines(path)
        self.assertEqual(m.matching_lines(path, {"mode": "torch-compile-masters"})[0]["step_ms"], 521.5)
        self.assertEqual(m.matching_lines(path, {"mode": "torch-compile"}), [])

    def test_flops_per_step(self):
        folder = tempfile.mkdtemp()
        path = write(os.path.join(folder, "manifest.json"),
                     json.dumps({"flops_per_step": {"total": 293103802730624}}, indent=2))
        self.assertEqual(m.flops_per_step(path), 293103802730624.0)
        bad = write(os.path.join(folder, "bad.json"), "{}")
        with self.assertRaisesRegex(m.MeasurementError, "bad.json: no number at flops_per_step.total"):
            m.flops_per_step(bad)


class CheckpointTest(unittest.TestCase):
    def test_parameter_difference(self):
        folder = tempfile.mkdtemp()
        x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
        a = safetensors(os.path.join(folder, "a.safetensors"), {"w": x, "b": [1.0, 2.0]})
        b = safetensors(os.path.join(folder, "b.safetensors"), {"w": x * 1.5, "b": [1.0, 2.0]})
        worst, name = m.parameter_difference(b, a)
        self.assertEqual(name, "w")
        self.assertAlmostEqual(worst, 0.5)
        self.assertEqual(m.parameter_difference(a, a), (0.0, "b"))

    def test_parameters_within_the_references_noise(self):
        folder = tempfile.mkdtemp()
        x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
        a = safetensors(os.path.join(folder, "a.safetensors"), {"w": x, "s": [1.0, 2.0]})
        # s differs by 30%, w by 3%: s's references differ by 10% themselves.
        b = safetensors(os.path.join(folder, "b.safetensors"), {"w": x * 1.03, "s": [1.3, 2.6]})
        diffs = m.parameter_differences(b, a)
        self.assertAlmostEqual(diffs["s"], 0.3, places=6)
        self.assertEqual(m.parameters_within(diffs, 0.05)[0], "s")  # 0.3 > 0.05: fails
        name, diff, allowed = m.parameters_within(diffs, 0.05, {"w": 0.0, "s": 0.1}, 4)
        self.assertEqual(name, "s")  # 0.3 of 0.4 allowed, w 0.03 of 0.05
        self.assertAlmostEqual(allowed, 0.4, places=6)
        self.assertLessEqual(diff, allowed)
        name, diff, allowed = m.parameters_within(diffs, 0.05, {"w": 0.0, "s": 0.1}, 2)
        self.assertEqual(name, "s")
        self.assertGreater(diff, allowed)  # 0.3 > 2 x 0.1
        self.assertAlmostEqual(allowed, 0.2, places=6)

    def test_bf16_reads_the_truncated_values(self):
        folder = tempfile.mkdtemp()
        path = safetensors(os.path.join(folder, "h.safetensors"), {"w": [1.0, -2.5, 3.0]}, "BF16")
        np.testing.assert_array_equal(m.read_safetensors(path)["w"], [1.0, -2.5, 3.0])

    def test_different_names_are_an_error(self):
        folder = tempfile.mkdtemp()
        a = safetensors(os.path.join(folder, "a.safetensors"), {"w": [1.0]})
        b = safetensors(os.path.join(folder, "b.safetensors"), {"v": [1.0]})
        with self.assertRaisesRegex(m.MeasurementError, "tensor names differ"):
            m.parameter_difference(a, b)

    def test_not_a_safetensors_file(self):
        folder = tempfile.mkdtemp()
        path = write(os.path.join(folder, "x.safetensors"), "hi")
        with self.assertRaisesRegex(m.MeasurementError, "x.safetensors: not a safetensors file"):
            m.read_safetensors(path)


class ResultSchemaTest(unittest.TestCase):
    def test_a_good_line_passes(self):
        m.validate_result(dict(GOOD_LINE), "w")
        m.validate_result(dict(GOOD_LINE, side="baseline", label="torch.compile", vs="", note="peak"), "w")

    def test_each_required_field(self):
        for name in m.REQUIRED_FIELDS:
            line = dict(GOOD_LINE)
            del line[name]
            with self.assertRaisesRegex(m.MeasurementError, f"^f:3: field '{name}' is missing"):
                m.validate_result(line, "f:3")

    def test_bad_fields_are_named(self):
        cases = [({"unit": "msec"}, "field 'unit': unknown unit 'msec'"),
                 ({"value": "466"}, "field 'value' must be a finite number"),
                 ({"value": float("nan")}, "field 'value' must be a finite number"),
                 ({"value": True}, "field 'value' must be a finite number"),
                 ({"date": "2026-12-2"}, "field 'date' must be YYYY-MM-DD"),
                 ({"side": "torch"}, "field 'side' must be one of"),
                 ({"vs": "graph"}, "field 'vs' belongs to a baseline line"),
                 ({"verdict": "OK"}, "field 'verdict' must be PASS or FAIL"),
                 ({"limit": "1e-2"}, "field 'limit' must be a number"),
                 ({"commit": " "}, "field 'commit' is empty"),
                 ({"speed": 1}, "unknown field 'speed'")]
        for change, message in cases:
            with self.assertRaisesRegex(m.MeasurementError, message, msg=str(change)):
                m.validate_result(dict(GOOD_LINE, **change), "w")

    def test_result_line_drops_none_and_validates(self):
        context = {k: GOOD_LINE[k] for k in ("date", "commit", "gpu", "command")}
        line = m.result_line("b", 1.5, "GiB", context, side="baseline", label=None)
        self.assertEqual(line["side"], "baseline")
        self.assertNotIn("label", line)
        with self.assertRaises(m.MeasurementError):
            m.result_line("b", 1.5, "gibibytes", context)

    def test_read_results_names_the_line(self):
        folder = tempfile.mkdtemp()
        path = write(os.path.join(folder, "r.jsonl"),
                     json.dumps(GOOD_LINE) + "\n\n" + json.dumps(dict(GOOD_LINE, unit="x")) + "\n")
        with self.assertRaisesRegex(m.MeasurementError, r"r.jsonl:3: field 'unit'"):
            m.read_results(path)
        write(path, json.dumps(GOOD_LINE) + "\n")
        self.assertEqual(m.read_results(path), [(1, GOOD_LINE)])


class CommandLineTest(unittest.TestCase):
    def test_compare_steps(self):
        folder = tempfile.mkdtemp()
        for name, scale in (("a", 1.0), ("a2", 1.001), ("b", 1.01), ("b2", 1.012)):
            train_log(os.path.join(folder, name + ".jsonl"), [4.0 * scale] * 8,
                      step_ms=[100.0] * 5 + [10.0, 12.0, 14.0])
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(m.main(["compare-steps", folder, "a", "a2", "b", "b2"]), 0)
        text = out.getvalue()
        self.assertIn("a              median step 12.0 ms (steps 5..) loss@0 4.00000", text)
        self.assertIn("loss: b vs a 1.00e-02; a vs a2 9.99e-04; b vs b2 1.98e-03", text)

    def test_fields_as_written(self):
        folder = tempfile.mkdtemp()
        path = train_log(os.path.join(folder, "t.jsonl"), [0.1, 0.30000000000000004])
        out = io.StringIO()
        with redirect_stdout(out):
            m.main(["fields", path, "step", "loss"])
        self.assertEqual(out.getvalue(), "0 0.1\n1 0.30000000000000004\n")


if __name__ == "__main__":
    unittest.main()
