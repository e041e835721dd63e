"""`tokens` end to end without transformers (helpers.FakeChatTokenizer in
place of the tokenizer): what a file, a disk or a signal does to a run."""
import io
import json
import os
import signal
import subprocess
import sys
import time
import unittest
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

from helpers import HERE, FakeChatTokenizer, FullDisk, TempDir

from dflash_prepare import check, progress, shards, template
from dflash_prepare.cli import main

GOOD = {"messages": [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": "a b c"}]}

# Runs the command line with the stand-in tokenizer, in a process of its own
# (signals); SLOW_ENCODE and SLOW_WRITE (seconds) leave time to send one.
DRIVER = """\
import multiprocessing, os, sys, time
sys.path.insert(0, {tests!r})
import helpers
from dflash_prepare import shards, template
from dflash_prepare.cli import main

class Tokenizer(helpers.FakeChatTokenizer):
    def __call__(self, text, **options):
        if "EXIT" in text and multiprocessing.parent_process() is not None:
            os._exit(9)  # a worker killed (the OOM killer)
        time.sleep(float(os.environ.get("SLOW_ENCODE", "0")))
        return super().__call__(text, **options)

template.load_tokenizer = lambda directory: Tokenizer()
write_shard = shards.write_shard

def slow_write_shard(*args, **kwargs):
    time.sleep(float(os.environ.get("SLOW_WRITE", "0")))
    return write_shard(*args, **kwargs)

shards.write_shard = slow_write_shard
sys.exit(main(sys.argv[1:]))
"""


def conversation(index):
    return {"messages": [{"role": "user", "content": f"question {index}"},
                         {"role": "assistant", "content": f"answer {index} is {index % 7}"}]}


class TokensTest(TempDir):
    seq_len = 64

    def data(self, count=40, name="chat.jsonl", extra=""):
        lines = "".join(json.dumps(conversation(i)) + "\n" for i in range(count))
        return self.write_file(name, extra + lines)

    def argv(self, *inputs, out="out", workers=1):
        os.makedirs(self.path("tok"), exist_ok=True)
        return ["tokens", *inputs, "--spec", self.spec_path, "--tokenizer", self.path("tok"),
                "--out", self.path(out), "--rows-per-shard", "8", "--workers", str(workers),
                "--end-of-turn", "<|im_end|>"]

    def tokens(self, argv, tokenizer=None):
        """(status, stdout, stderr) of the command in this process."""
        out, err = io.StringIO(), io.StringIO()
        with mock.patch.object(template, "load_tokenizer",
                               return_value=tokenizer or FakeChatTokenizer()), \
                redirect_stdout(out), redirect_stderr(err):
            status = main(argv)
        return status, out.getvalue(), err.getvalue()

    def run_driver(self, argv, env=None):
        driver = self.write_file("driver.py", DRIVER.format(tests=HERE))
        with open(self.path("stderr"), "w") as stderr:
            process = subprocess.Popen([sys.executable, driver, *argv],
                                       stdout=subprocess.PIPE, stderr=stderr, text=True,
                                       env=dict(os.environ, **(env or {})),
                                       start_new_session=True,
                                       preexec_fn=self.default_sigint)
        self.addCleanup(self.end_group, process)
        return process

    @staticmethod
    def default_sigint():
        # A runner that started these tests with SIGINT ignored (lit, a
        # background job) would pass that on, and python then keeps Ctrl-C
        # ignored: the tool under test must get it as a terminal sends it.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    @staticmethod
    def end_group(process):
        """Ends what a failed test left running: the driver's process group."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        process.stdout.close()

    def assertValidShards(self, directory, count):
        paths = shards.list_shards(directory)
        self.assertEqual(len(paths), count)
        self.assertEqual(check.check_paths(paths, self.spec).problems, [])

    def test_every_bad_line_is_that_lines_failure(self):
        """Lines python's json reader or the tokenizer could not take ended
        the run with a traceback: each is named, counted and left out."""
        bad = ("[" * 100000 + "]" * 100000 + "\n"                  # RecursionError
               '{"messages": ' + "1" * 5000 + "}\n"               # int digit limit
               '{"messages": [{"role": "user", "content": "\\ud800 q"}, '
               '{"role": "assistant", "content": "a b"}]}\n'      # lone surrogate
               '[1, 2]\n{"text": "x"}\n')
        data = self.data(extra=bad)
        with open(data, "ab") as f:
            f.write(b'{"messages": "\xff"}\n')                    # not utf-8
        status, out, err = self.tokens(self.argv(data))
        self.assertEqual(status, 0, err)
        self.assertNotIn("Traceback", err)
        for line, why in ((1, "nests deeper than python's json reader follows"),
                          (2, "malformed json: exceeds the limit (4300 digits) for integer "
                              "string conversion"),
                          (3, "a string escapes a lone surrogate"),
                          (4, "the line is a json list, not an object"),
                          (5, "the object has neither 'messages' nor 'conversations'"),
                          (46, "not utf-8 text (byte 15 of the line)")):
            self.assertIn(f"dropped {data}:{line}: {why}", err)
        self.assertIn("malformed json line: 4 dropped", err)
        self.assertIn("not a conversation: 2 dropped", err)
        self.assertIn("40 conversations, 6 dropped", out)
        self.assertValidShards(self.path("out"), 5)

    def test_no_usable_conversation_stops_before_the_tokenizer(self):
        for text in ("", "\n\n", "{\n"):
            data = self.write_file("chat.jsonl", text)
            with mock.patch.object(template, "load_tokenizer",
                                   side_effect=AssertionError("loaded")):
                err = io.StringIO()
                with redirect_stderr(err):
                    status = main(self.argv(data))
            self.assertEqual(status, 2)
            self.assertIn(f"dflash-prepare: error: no usable conversation in {data} (",
                          err.getvalue())
            self.assertFalse(os.path.exists(self.path("out")))

    def test_inputs_and_outputs_that_are_not_what_they_should_be(self):
        data = self.data(4)
        os.makedirs(self.path("folder"))
        for argv, message in (
                (self.argv(self.path("folder")),
                 f"{self.path('folder')}: a directory, not a chat JSONL file"),
                (self.argv(data, out="chat.jsonl"),
                 f"{data}: not a directory (the output is a directory of shards)"),
                (self.argv(data, out="chat.jsonl/out"),
                 f"{data}/out: cannot create the output directory: Not a directory")):
            status, _, err = self.tokens(argv)
            self.assertEqual(status, 2, err)
            self.assertEqual(err.splitlines()[-1], f"dflash-prepare: error: {message}")
            self.assertNotIn("Traceback", err)

    def test_tokenizer_that_is_not_a_readable_directory(self):
        data = self.data(4)
        argv = self.argv(data)
        self.assertEqual(argv[4], "--tokenizer")
        status, _, err = self.tokens(argv[:5] + [data] + argv[6:])
        self.assertEqual(status, 2)
        self.assertEqual(err.splitlines()[-1], f"dflash-prepare: error: {data}: not a directory "
                         "(--tokenizer is a Hugging Face tokenizer directory)")
        # An unreadable file of it (chmod does not stop root: a stand-in open).
        unreadable = self.write_file("tok/tokenizer.json", "{}")
        real_open = open

        def open_but_the_tokenizer(path, *args, **kwargs):
            if path == unreadable:
                raise PermissionError(13, "Permission denied")
            return real_open(path, *args, **kwargs)

        with mock.patch.object(progress, "open", open_but_the_tokenizer, create=True):
            status, _, err = self.tokens(argv)
        self.assertEqual(status, 2)
        self.assertNotIn("Traceback", err)
        self.assertEqual(err.splitlines()[-1], f"dflash-prepare: error: {unreadable}: cannot "
                         "read: Permission denied")

    @unittest.skipIf(os.geteuid() == 0, "root writes into a read-only directory "
                     "(the path under a file is the case that runs as root)")
    def test_read_only_output_is_refused_before_the_tokenizer(self):
        os.makedirs(self.path("out"))
        os.chmod(self.path("out"), 0o555)
        self.addCleanup(os.chmod, self.path("out"), 0o755)
        with mock.patch.object(template, "load_tokenizer",
                               side_effect=AssertionError("loaded")):
            err = io.StringIO()
            with redirect_stderr(err):
                status = main(self.argv(self.data(4)))
        self.assertEqual(status, 2)
        self.assertEqual(err.getvalue().splitlines()[-1],
                         f"dflash-prepare: error: {self.path('out')}: cannot write into the "
                         "output directory: Permission denied")

    def test_full_disk_keeps_the_finished_shards(self):
        """ENOSPC part way through the third shard: one line naming it, the two
        finished shards kept and valid, no half shard, and the next run
        writes the rest."""
        data = self.data()
        real_open = open

        def open_on_a_filling_disk(path, mode="r", *args, **kwargs):
            file = real_open(path, mode, *args, **kwargs)
            if "w" in mode and os.path.basename(path).startswith(".shard-00002"):
                return FullDisk(file, 100)
            return file

        with mock.patch.object(shards, "open", open_on_a_filling_disk, create=True):
            status, _, err = self.tokens(self.argv(data))
        self.assertEqual(status, 2)
        self.assertNotIn("Traceback", err)
        shard = self.path("out", "shard-00002.safetensors")
        self.assertEqual(err.splitlines()[-1],
                         f"dflash-prepare: error: {shard}: cannot write: No space left on "
                         f"device; {self.path('out')} keeps 2 of 5 finished shard(s), listed in "
                         "its manifest.json; run the same command again to continue")
        self.assertEqual(sorted(os.listdir(self.path("out"))),
                         ["manifest.json", "shard-00000.safetensors", "shard-00001.safetensors"])
        self.assertValidShards(self.path("out"), 2)
        status, _, err = self.tokens(self.argv(data))
        self.assertEqual(status, 0, err)
        self.assertIn("wrote 3 shard(s), kept 2 complete from an earlier run", err)
        self.assertValidShards(self.path("out"), 5)

    def test_any_number_of_workers_writes_the_same_shards(self):
        data = self.data(100)
        for workers in (1, 3):
            status, _, err = self.tokens(self.argv(data, out=f"out{workers}", workers=workers))
            self.assertEqual(status, 0, err)
        for name in os.listdir(self.path("out1")):
            if name.endswith(".safetensors"):
                with open(self.path("out1", name), "rb") as one, \
                        open(self.path("out3", name), "rb") as three:
                    self.assertEqual(one.read(), three.read(), name)

    def test_a_worker_that_dies_ends_the_run_in_one_line(self):
        """A multiprocessing.Pool lost the dead worker's chunk and waited
        for it forever."""
        data = self.data(60, extra=json.dumps(
            {"messages": [{"role": "user", "content": "EXIT"},
                          {"role": "assistant", "content": "a b"}]}) + "\n")
        process = self.run_driver(self.argv(data, workers=3))
        process.communicate(timeout=30)
        with open(self.path("stderr")) as f:
            err = f.read()
        self.assertEqual(process.returncode, 2, err)
        self.assertNotIn("Traceback", err)
        self.assertEqual(err.splitlines()[-1],
                         "dflash-prepare: error: a worker process that tokenizes ended (exit "
                         "status 9; killed for memory?); try fewer --workers")
        self.assertFalse(os.path.exists(self.path("out")))

    def interrupt(self, argv, env, ready, sig, group):
        """Starts the driver, waits for `ready()`, sends `sig` (to the whole
        process group, as Ctrl-C and `timeout` do, or to the main process
        alone) and returns (status, stderr, seconds to stop)."""
        process = self.run_driver(argv, env)
        deadline = time.time() + 60
        while not ready():
            self.assertIsNone(process.poll(), "finished before the signal")
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)
        sent = time.time()
        (os.killpg if group else os.kill)(process.pid, sig)
        process.communicate(timeout=30)
        stopped = time.time() - sent
        with self.assertRaises(ProcessLookupError):  # no worker left behind
            os.killpg(process.pid, 0)
        with open(self.path("stderr")) as f:
            return process.returncode, f.read(), stopped

    def stderr_has(self, text):
        with open(self.path("stderr")) as f:
            return text in f.read()

    def manifest_lists_a_shard(self, out):
        try:
            with open(self.path(out, "manifest.json")) as f:
                return bool(json.load(f)["shards"])
        except (OSError, ValueError):
            return False

    def test_interrupt_while_encoding_in_workers(self):
        """Ctrl-C (SIGINT to the process group) and SIGTERM to the group
        while workers tokenize: no KeyboardInterrupt trace from any worker,
        no hang, nothing left behind."""
        data = self.data(60)
        for sig in (signal.SIGINT, signal.SIGTERM):
            status, err, stopped = self.interrupt(
                self.argv(data, workers=3), {"SLOW_ENCODE": "0.05"},
                lambda: self.stderr_has("loss masks from"), sig, group=True)
            self.assertEqual(status, 130, err)
            self.assertLess(stopped, 10)
            self.assertNotIn("Traceback", err)
            self.assertEqual(err.splitlines()[-1],
                             f"dflash-prepare: interrupted; no shard finished in "
                             f"{self.path('out')}; run the same command again to continue")
            self.assertFalse(os.path.exists(self.path("out")))

    def test_interrupt_between_shards_keeps_the_finished_ones(self):
        data = self.data()
        for sig, group in ((signal.SIGTERM, False), (signal.SIGINT, True)):
            out = f"out-{sig.name}"
            status, err, stopped = self.interrupt(
                self.argv(data, out=out), {"SLOW_WRITE": "0.5"},
                lambda: self.manifest_lists_a_shard(out), sig, group)
            self.assertEqual(status, 130, err)
            self.assertLess(stopped, 10)
            self.assertNotIn("Traceback", err)
            self.assertRegex(err.splitlines()[-1],
                             rf"^dflash-prepare: interrupted; {self.path(out)} keeps [1-4] of 5 "
                             r"finished shard\(s\), listed in its manifest.json; run the same "
                             r"command again to continue$")
            kept = int(err.splitlines()[-1].split(" keeps ")[1].split()[0])
            self.assertValidShards(self.path(out), kept)
            self.assertEqual([n for n in os.listdir(self.path(out)) if ".tmp-" in n], [])
            status, _, err = self.tokens(self.argv(data, out=out))
            self.assertEqual(status, 0, err)
            self.assertIn(f"kept {kept} complete from an earlier run", err)
            self.assertValidShards(self.path(out), 5)


if __name__ == "__main__":
    unittest.main()
