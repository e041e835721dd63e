"""Unit tests of bench/results.py: which call a row shows, its cells and
ratios, number formatting, --check / --write / --append on copies, and the
shipped history against the shipped bench/RESULTS.md.

  /usr/bin/python3 -m unittest discover -s bench/tests
"""

import io
import json
import os
import shutil
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

import results  # noqa: E402


def line(benchmark="step", value=466.0, unit="ms", date="2026-12-02", commit="abc",
         command="scripts/device/device-check step", gpu="NVIDIA H200", **extra):
    out = {"benchmark": benchmark, "value": value, "unit": unit, "date": date,
           "commit": commit, "gpu": gpu, "command": command}
    out.update(extra)
    return out


def row_cells(table, benchmark):
    for text in table.splitlines():
        cells = [c.strip() for c in text.strip("|").split(" | ")]
        if cells[0] == benchmark:
            return cells
    raise AssertionError(f"no row '{benchmark}' in\n{table}")


class RenderTest(unittest.TestCase):
    def test_newest_call_and_same_call_baseline(self):
        lines = [line(value=513.1, date="2026-11-29", commit="old"),
                 line(value=529.0, date="2026-11-29", commit="old", side="baseline",
                      label="torch.compile"),
                 line(value=466.0), line(value=471.3),
                 line(value=41.0, unit="GiB", note="in use")]
        table = results.render(lines)
        cells = row_cells(table, "step")
        self.assertEqual(cells[1:4], ["466.0 / 471.3 ms, 41.0 GiB in use", "", ""])
        self.assertEqual(cells[4], "2026-12-02, abc, `scripts/device/device-check step`")
        self.assertEqual(len(table.splitlines()), 3)  # heading, rule, one row

    def test_one_date_later_line_wins(self):
        lines = [line(value=1.0, command="first call"), line(value=2.0, command="second call")]
        self.assertEqual(row_cells(results.render(lines), "step")[1], "2.0 ms")
        lines = [line(value=2.0, date="2026-12-03", command="newer"), line(value=1.0, command="older")]
        self.assertEqual(row_cells(results.render(lines), "step")[1], "2.0 ms")

    def test_ratios(self):
        lines = [line(value=466.0), line(value=471.3), line(value=41.0, unit="GiB"),
                 line(value=24000, unit="tokens/s"),
                 line(value=521.5, side="baseline", label="torch.compile"),
                 line(value=48.4, unit="GiB", side="baseline", label="torch.compile", note="peak"),
                 line(value=20000, unit="tokens/s", side="baseline", label="torch.compile")]
        cells = row_cells(results.render(lines), "step")
        self.assertEqual(cells[2], "torch.compile: 521.5 ms, 48.4 GiB peak, 20000 tokens/s")
        # speed = 521.5 / median(466.0, 471.3); memory = 41.0 / 48.4; the
        # tokens/s speed is the label's second speed, left out.
        self.assertEqual(cells[3], "torch.compile: speed %.2fx, memory %.2fx"
                         % (521.5 / 468.65, 41.0 / 48.4))

    def test_vs_picks_the_label(self):
        lines = [line(value=0.578, label="unpacked"), line(value=0.319, label="packed"),
                 line(value=0.576, side="baseline", label="varlen", vs="packed"),
                 line(value=0.540, side="baseline", label="SDPA")]
        cells = row_cells(results.render(lines), "step")
        self.assertEqual(cells[3], "varlen: speed %.2fx; SDPA: speed %.2fx"
                         % (0.576 / 0.319, 0.540 / 0.578))

    def test_rate_and_error_ratios(self):
        lines = [line(value=46223, unit="tokens/s"),
                 line(value=24180, unit="tokens/s", side="baseline", label="one GPU"),
                 line("features", value=1.32e-2, unit="relative error"),
                 line("features", value=1.65e-2, unit="relative error", side="baseline",
                      label="bf16")]
        table = results.render(lines)
        self.assertEqual(row_cells(table, "step")[3], "one GPU: speed %.2fx" % (46223 / 24180))
        self.assertEqual(row_cells(table, "features")[1:4],
                         ["1.32e-2", "bf16: 1.65e-2", "bf16: error 0.80x"])

    def test_checks_are_left_out_and_gpus_kept_apart(self):
        lines = [line(value=1.0), line("tiny: losses", value=1e-3, unit="relative error",
                                       check="losses", verdict="PASS", limit=0.02),
                 line(value=2.0, gpu="NVIDIA H100")]
        table = results.render(lines)
        self.assertNotIn("tiny: losses", table)
        rows = [t for t in table.splitlines() if t.startswith("| step ")]
        self.assertEqual(len(rows), 2)
        self.assertIn("2026-12-02, abc, NVIDIA H100, `", rows[1])

    def test_history_and_pipes(self):
        lines = [line("a | b", value=1.0, history="Kernels (bench/kernels)")]
        text = results.render(lines).splitlines()[2]
        self.assertTrue(text.startswith("| a \\| b | 1.0 ms |"))
        self.assertTrue(text.endswith('(history: "Kernels (bench/kernels)") |'))

    def test_format_value(self):
        cases = [(466.0, "ms", "466.0"), (824, "conversations/s", "824"), (24180.0, "tokens/s", "24180"),
                 (1.516, "ms", "1.516"), (4.24e-2, "relative error", "4.24e-2"),
                 (5.7e-05, "relative error", "5.7e-5"), (0.0123456, "relative error", "1.23e-2"),
                 (0.0, "relative error", "0"), (466.04999999, "ms", "466.0"),
                 (23946.351, "tokens/s", "23946"), (7.963440895, "loss", "7.963")]
        for value, unit, text in cases:
            self.assertEqual(results.format_value(value, unit), text, (value, unit))
        self.assertEqual(results.with_unit([1.468, 1.47], "ms", ""), "1.468 / 1.470 ms")
        self.assertEqual(results.with_unit([96], "%", "of copy"), "96% of copy")


class CommandLineTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.history = os.path.join(self.dir, "results.jsonl")
        self.md = os.path.join(self.dir, "RESULTS.md")
        with open(self.history, "w") as f:
            f.write(json.dumps(line(history="Old runs")) + "\n")
        with open(self.md, "w") as f:
            f.write(f"# Results\n\n## Current\n\n{results.BEGIN}\n| stale |\n{results.END}\n\n"
                    "## History\n\n### Old runs\n\ntext\n")

    def run_main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = results.main([*args, "--history", self.history, "--results", self.md])
        return rc, out.getvalue(), err.getvalue()

    def test_check_fails_then_write_then_check_passes(self):
        rc, out, err = self.run_main("--check")
        self.assertEqual(rc, 1)
        self.assertIn("-| stale |", out)
        self.assertIn("run bench/results.py --write", err)
        self.assertEqual(self.run_main("--write")[0], 0)
        self.assertEqual(self.run_main("--check")[0], 0)
        with open(self.md) as f:
            text = f.read()
        self.assertIn("### Old runs\n\ntext\n", text)  # the history stays as it was
        self.assertIn("| step | 466.0 ms |", text)

    def test_a_history_that_is_not_a_heading(self):
        with open(self.history, "w") as f:
            f.write(json.dumps(line(history="No such section")) + "\n")
        rc, _, err = self.run_main("--check")
        self.assertEqual(rc, 2)
        self.assertIn("field 'history': no heading 'No such section'", err)

    def test_missing_markers(self):
        with open(self.md, "w") as f:
            f.write("# Results\n")
        rc, _, err = self.run_main("--check")
        self.assertEqual(rc, 2)
        self.assertIn("RESULTS.md: no '<!-- current table: begin", err)

    def test_append_validates_and_drops_verdicts(self):
        run = os.path.join(self.dir, "run.jsonl")
        with open(run, "w") as f:
            f.write(json.dumps(line(value=460.0, date="2026-12-05")) + "\n")
            f.write(json.dumps(line("suite: check", value=0.0, unit="relative error",
                                    check="c", verdict="PASS")) + "\n")
        rc, out, _ = self.run_main("--append", run)
        self.assertEqual(rc, 0)
        self.assertIn("1 lines added", out)
        with open(self.history) as f:
            self.assertEqual(len(f.read().splitlines()), 2)
        with open(run, "w") as f:
            f.write(json.dumps(line(unit="furlongs")) + "\n")
        rc, _, err = self.run_main("--append", run)
        self.assertEqual(rc, 2)
        self.assertIn("run.jsonl:1: field 'unit': unknown unit 'furlongs'", err)


class ShippedTableTest(unittest.TestCase):
    def test_results_md_is_the_rendering_of_the_history(self):
        folder = tempfile.mkdtemp()
        md = os.path.join(folder, "RESULTS.md")
        shutil.copy(results.RESULTS, md)
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = results.main(["--check", "--results", md])
        self.assertEqual(rc, 0, out.getvalue() + err.getvalue())

    def test_one_row_per_benchmark_and_gpu(self):
        rows = results.current_rows([l for _, l in results.measurements.read_results(results.HISTORY)])
        keys = [(benchmark, gpu) for benchmark, gpu, _ in rows]
        self.assertEqual(len(keys), len(set(keys)))
        for benchmark, gpu, call in rows:
            self.assertEqual(len({(l["date"], l["commit"], l["command"]) for l in call}), 1, benchmark)


if __name__ == "__main__":
    unittest.main()
