"""The command lines as a user runs them: help, exit status, messages."""
import os
import sys
import unittest

from helpers import PLOT, PREPARE, ROOT, TempDir, conversation, run_tool, token_tensors

from dflash_prepare import packing, shards


def hide(directory, *modules):
    """A PYTHONPATH entry where importing `modules` fails, as where they
    are not installed."""
    os.makedirs(directory, exist_ok=True)
    for module in modules:
        with open(os.path.join(directory, f"{module}.py"), "w") as f:
            f.write(f"raise ImportError(\"No module named '{module}'\")\n")
    return {"PYTHONPATH": directory}


class HelpTest(unittest.TestCase):
    def test_help_of_every_command(self):
        status, out, _ = run_tool(PREPARE, "--help")
        self.assertEqual(status, 0)
        for command in ("tokens", "features", "check"):
            self.assertIn(command, out)
        for command, options in (("tokens", ["--pack", "--last-turn-only", "--reasoning",
                                              "--max-length", "--over-long", "--seq-len",
                                              "--rows-per-shard", "--spec", "--tokenizer"]),
                                 ("features", ["--target", "--tokens", "--device",
                                               "--batch-tokens"]),
                                 ("check", ["--spec", "DIR"])):
            status, out, _ = run_tool(PREPARE, command, "--help")
            self.assertEqual(status, 0, command)
            for option in options:
                self.assertIn(option, out, (command, option))
        status, out, _ = run_tool(PLOT, "--help")
        self.assertEqual(status, 0)
        self.assertIn("--out", out)

    def test_usage_errors(self):
        status, _, err = run_tool(PREPARE)
        self.assertEqual(status, 2)
        status, _, err = run_tool(PREPARE, "tokens", "x.jsonl")
        self.assertEqual(status, 2)
        self.assertIn("dflash-prepare: error: the following arguments are required", err)
        status, _, err = run_tool(PREPARE, "check", "d", "--spec", "s.toml", "--bogus")
        self.assertEqual(status, 2)
        self.assertIn("unrecognized arguments: --bogus", err)
        self.assertNotIn("Traceback", err)


class CommandTest(TempDir):
    def token_dir(self, broken=False):
        rows = packing.build_rows([conversation(9, 2), conversation(6, 1)], 16, 0, True)
        tensors = token_tensors(rows, True)
        if broken:
            tensors["loss_mask"].array[0] = 0
        os.makedirs(self.path("tokens"), exist_ok=True)
        shards.write_shard(self.path("tokens", "shard-00000.safetensors"), tensors,
                           self.spec.shard_metadata())
        return self.path("tokens")

    def test_check_exit_status(self):
        status, out, _ = run_tool(PREPARE, "check", self.token_dir(), "--spec", self.spec_path)
        self.assertEqual(status, 0, out)
        self.assertIn("1 token shard(s), 1 rows", out)
        status, out, _ = run_tool(PREPARE, "check", self.token_dir(broken=True), "--spec",
                                  self.spec_path)
        self.assertEqual(status, 1)
        self.assertIn("shard-00000.safetensors: row 0: no anchor candidate", out)
        status, _, err = run_tool(PREPARE, "check", self.path("none"), "--spec", self.spec_path)
        self.assertEqual(status, 2)
        self.assertIn("dflash-prepare: error: ", err)
        self.assertIn("none: not a directory", err)

    def test_tokens_reports_bad_lines_then_the_missing_package(self):
        data = self.write_file("chat.jsonl",
                               '{"messages": [{"role": "user", "content": "q"}, '
                               '{"role": "assistant", "content": "a"}]}\n'
                               '{"messages": [\n'
                               '{"messages": [{"role": "user", "content": "q"}]}\n')
        os.makedirs(self.path("tok"))
        status, _, err = run_tool(PREPARE, "tokens", data, "--spec", self.spec_path,
                                  "--tokenizer", self.path("tok"), "--out", self.path("out"),
                                  env=hide(self.path("hidden"), "transformers"))
        self.assertEqual(status, 2)
        self.assertIn("read 1 file(s): 3 conversation line(s), 1 usable so far", err)
        self.assertIn("the python package 'transformers' is missing", err)
        # The interpreter named, and the commands that install the package.
        self.assertIn(f"missing or broken in {sys.executable} (No module named "
                      "'transformers'); reading the tokenizer needs it: run "
                      f"{ROOT}/scripts/setup.sh --data", err)
        self.assertNotIn("Traceback", err)
        # The bad lines are named and counted before it stops, and the output
        # directory it made is not left behind empty.
        self.assertIn(f"dropped {data}:2: malformed json: ", err)
        self.assertIn(f"dropped {data}:3: 1 turns, none of them the assistant's", err)
        self.assertIn("malformed json line: 1 dropped\n", err)
        self.assertIn("no assistant turn: 1 dropped\n", err)
        self.assertLess(err.index("no assistant turn: 1 dropped"),
                        err.index("the python package 'transformers' is missing"))
        self.assertFalse(os.path.exists(self.path("out")))

    def test_tokens_names_the_first_five_bad_lines_of_each_reason(self):
        good = '{"messages": [{"role": "user", "content": "q"}, ' \
               '{"role": "assistant", "content": "a"}]}\n'
        data = self.write_file("chat.jsonl", "\ufeff" + good + "{\n" * 7 + good
                               + '{"messages": [{"role": "wizard", "content": "q"}]}\n')
        os.makedirs(self.path("tok"))
        os.makedirs(self.path("made-by-hand"))
        status, _, err = run_tool(PREPARE, "tokens", data, "--spec", self.spec_path,
                                  "--tokenizer", self.path("tok"), "--out",
                                  self.path("made-by-hand"),
                                  env=hide(self.path("hidden"), "transformers"))
        self.assertEqual(status, 2)
        self.assertIn("read 1 file(s): 10 conversation line(s), 2 usable so far", err)
        for number in range(2, 7):
            self.assertIn(f"dropped {data}:{number}: malformed json", err)
        self.assertNotIn(f"{data}:7:", err)
        self.assertIn("malformed json line: 7 dropped (the first 5 named above)\n", err)
        self.assertIn(f"dropped {data}:10: turn 0 has unknown role 'wizard'", err)
        self.assertIn("unknown role: 1 dropped\n", err)
        self.assertEqual(err.count("malformed json line: 7 dropped"), 1)
        # A directory the user made stays.
        self.assertTrue(os.path.isdir(self.path("made-by-hand")))

    def test_tokens_input_errors(self):
        os.makedirs(self.path("tok"))
        status, _, err = run_tool(PREPARE, "tokens", self.path("none.jsonl"), "--spec",
                                  self.spec_path, "--tokenizer", self.path("tok"),
                                  "--out", self.path("out"))
        self.assertEqual(status, 2)
        self.assertIn("none.jsonl: no such file", err)
        data = self.write_file("chat.jsonl", "")
        status, _, err = run_tool(PREPARE, "tokens", data, "--spec", self.spec_path,
                                  "--tokenizer", self.path("no-tok"), "--out", self.path("out"))
        self.assertEqual(status, 2)
        self.assertIn("no-tok: tokenizer directory does not exist", err)
        status, _, err = run_tool(PREPARE, "tokens", data, "--spec", self.spec_path,
                                  "--tokenizer", self.path("tok"), "--out", self.path("out"),
                                  "--max-length", "17")
        self.assertEqual(status, 2)
        self.assertIn("--max-length 17 must be in [2, 16]", err)

    def test_features_missing_torch(self):
        import json
        os.makedirs(self.path("target"))
        with open(self.path("target", "config.json"), "w") as f:
            json.dump({"hidden_size": 8, "vocab_size": 64, "num_hidden_layers": 4}, f)
        status, _, err = run_tool(PREPARE, "features", "--spec", self.spec_path, "--target",
                                  self.path("target"), "--tokens", self.token_dir(),
                                  "--out", self.path("features"),
                                  env=hide(self.path("hidden"), "torch"))
        self.assertEqual(status, 2)
        self.assertIn(f"the python package 'torch' is missing or broken in {sys.executable}",
                      err)
        self.assertIn(f"computing target features needs it: run {ROOT}/scripts/setup.sh --data",
                      err)

    def test_plot_missing_matplotlib(self):
        metrics = self.write_file("m.jsonl", '{"step": 0, "loss": 1.0}\n')
        status, _, err = run_tool(PLOT, metrics, "-o", self.path("p.png"),
                                  env=hide(self.path("hidden"), "matplotlib"))
        self.assertEqual(status, 2)
        self.assertIn("dflash-plot: error: the python package 'matplotlib' is missing from "
                      f"{sys.executable}; drawing needs it: run {ROOT}/scripts/setup.sh --data",
                      err)
        self.assertFalse(os.path.exists(self.path("p.png")))


if __name__ == "__main__":
    unittest.main()
