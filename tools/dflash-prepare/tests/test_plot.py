import json
import struct
import unittest
import zlib

from helpers import HAS_MATPLOTLIB, PLOT, TempDir, run_tool

import dflash_plot


def png_chunks(path):
    """The chunk types of a PNG file, each CRC checked; raises on a bad file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("no PNG signature")
    at, kinds = 8, []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind = data[at + 4:at + 8]
        body = data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"bad CRC in chunk {kind}")
        kinds.append((kind.decode(), body))
        at += 12 + length
    return kinds


def write_metrics(path, steps, eval_every=None, tau=True, extra=""):
    with open(path, "w") as f:
        for s in range(steps):
            line = {"step": s, "loss": 5.0 / (1 + s), "acc": s / steps, "grad_norm": 1.0,
                    "lr": 1e-3, "step_ms": 3.0}
            if tau:
                line["tau"] = 1 + s / steps
            if s == 3:
                line["grad_norm"] = None
                line["loss"] = None  # a non-finite value, written as null
            f.write(json.dumps(line) + "\n")
            if eval_every and s % eval_every == eval_every - 1:
                f.write(json.dumps({"step": s, "eval_loss": 6.0 / (1 + s), "eval_acc": 0.5,
                                    "eval_tau": 1.5, "eval_serving_tau": 2.0 + s / steps})
                        + "\n")
        f.write(extra)


class ReadMetricsTest(TempDir):
    def test_keys_absent_or_null(self):
        path = self.path("metrics.jsonl")
        write_metrics(path, 10, eval_every=5, tau=False)
        series = dflash_plot.read_metrics(path)
        self.assertEqual(len(series["loss"]), 9)  # the null is left out
        self.assertEqual(series["tau"], [])
        self.assertEqual(series["eval_loss"], [(4, 6.0 / 5), (9, 0.6)])
        self.assertEqual(len(series["eval_tau"]), 2)
        self.assertEqual(series["eval_serving_tau"], [(4, 2.4), (9, 2.9)])

    def test_malformed_lines(self):
        path = self.path("metrics.jsonl")
        write_metrics(path, 4, extra='{"step": 9, "loss": 1')  # a run still writing
        self.assertEqual(len(dflash_plot.read_metrics(path)["acc"]), 4)
        write_metrics(path, 4, extra='{"step": 9, "loss": 1\n{"step": 10}\n')
        with self.assertRaises(dflash_plot.PlotError) as caught:
            dflash_plot.read_metrics(path)
        self.assertIn(f"{path}:5: malformed json", str(caught.exception))
        write_metrics(path, 2, extra='{"loss": 1}\n')
        with self.assertRaises(dflash_plot.PlotError) as caught:
            dflash_plot.read_metrics(path)
        self.assertEqual(str(caught.exception), f"{path}:3: has no integer 'step'")

    def test_a_byte_order_mark_is_read_over(self):
        path = self.path("metrics.jsonl")
        with open(path, "w", encoding="utf-8-sig") as f:
            f.write('{"step": 0, "loss": 2.0}\n{"step": 1, "loss": 1.0}\n')
        self.assertEqual(dflash_plot.read_metrics(path)["loss"], [(0, 2.0), (1, 1.0)])

    def test_tau_by_anchor_position_bucket(self):
        path = self.path("metrics.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps({"step": 0, "position_buckets": [4096, 16384, 65536],
                                "tau": 3.0, "tau_by_bucket": [3.5, 3.0, None, 2.0]}) + "\n")
            f.write(json.dumps({"step": 1, "tau": 3.1,
                                "tau_by_bucket": [3.6, 3.1, 2.5, 2.1]}) + "\n")
            f.write(json.dumps({"step": 1, "eval_tau": 3.0,
                                "eval_tau_by_bucket": [3.4, 2.9, 2.4, 1.9]}) + "\n")
        series = dflash_plot.read_metrics(path)
        self.assertEqual(series["position_buckets"], [4096, 16384, 65536])
        self.assertEqual(len(series["tau_by_bucket"]), 4)
        self.assertEqual(series["tau_by_bucket"][0], [(0, 3.5), (1, 3.6)])
        self.assertEqual(series["tau_by_bucket"][2], [(1, 2.5)])  # the null is left out
        self.assertEqual(series["eval_tau_by_bucket"][3], [(1, 1.9)])
        self.assertTrue(dflash_plot.has_buckets(series))
        self.assertEqual(dflash_plot.bucket_labels([4096, 16384, 65536], 4),
                         ["[0, 4K)", "[4K, 16K)", "[16K, 64K)", "64K+"])
        self.assertEqual(dflash_plot.bucket_labels([100], 2), ["[0, 100)", "100+"])
        # Edges unknown (the first line is gone) or not matching: numbered.
        self.assertEqual(dflash_plot.bucket_labels(None, 2), ["bucket 0", "bucket 1"])
        self.assertEqual(dflash_plot.bucket_labels([4096], 3),
                         ["bucket 0", "bucket 1", "bucket 2"])
        plain = self.path("plain.jsonl")
        write_metrics(plain, 4)
        self.assertFalse(dflash_plot.has_buckets(dflash_plot.read_metrics(plain)))

    def test_smooth(self):
        self.assertEqual(dflash_plot.smooth([1, 2, 3, 4], 2), [1, 1.5, 2.5, 3.5])
        self.assertEqual(dflash_plot.smooth([1, 2], 1), [1, 2])


@unittest.skipUnless(HAS_MATPLOTLIB, "needs matplotlib")
class PlotTest(TempDir):
    def test_png_of_two_runs(self):
        a, b = self.path("a.jsonl"), self.path("run")
        write_metrics(a, 50, eval_every=10)
        import os
        os.makedirs(b)
        write_metrics(os.path.join(b, "metrics.jsonl"), 30, tau=False)
        out = self.path("plot.png")
        status, stdout, stderr = run_tool(PLOT, a, b, "-o", out, "--title", "t", "--smooth", "3")
        self.assertEqual(status, 0, stderr)
        self.assertIn("wrote", stdout)
        chunks = png_chunks(out)
        self.assertEqual(chunks[0][0], "IHDR")
        self.assertEqual(chunks[-1][0], "IEND")
        width, height = struct.unpack(">II", chunks[0][1][:8])
        self.assertEqual((width, height), (1500, 400))
        self.assertGreater(sum(len(body) for kind, body in chunks if kind == "IDAT"), 1000)

    def test_a_panel_of_tau_by_bucket(self):
        path = self.path("buckets.jsonl")
        write_metrics(path, 20, eval_every=10)
        with open(path, "a") as f:
            for s in range(20, 30):
                f.write(json.dumps({"step": s, "loss": 1.0, "tau": 2.0,
                                    "position_buckets": [4096] if s == 20 else None,
                                    "tau_by_bucket": [2.5, 1.5]}) + "\n")
        out = self.path("plot.png")
        status, stdout, stderr = run_tool(PLOT, path, "-o", out)
        self.assertEqual(status, 0, stderr)
        width, height = struct.unpack(">II", png_chunks(out)[0][1][:8])
        self.assertEqual((width, height), (2000, 400))  # four panels

    def test_errors(self):
        out = self.path("plot.png")
        status, _, stderr = run_tool(PLOT, self.path("none.jsonl"), "-o", out)
        self.assertEqual(status, 2)
        self.assertIn("dflash-plot: error: ", stderr)
        self.assertIn("none.jsonl: cannot open", stderr)
        empty = self.write_file("empty.jsonl", '{"step": 0, "lr": 1}\n')
        status, _, stderr = run_tool(PLOT, empty, "-o", out)
        self.assertEqual(status, 2)
        self.assertIn("no loss, acc or tau values", stderr)


if __name__ == "__main__":
    unittest.main()
