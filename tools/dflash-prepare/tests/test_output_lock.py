"""One writer per output (dflash_prepare/output_lock.py), and tokens and
features refusing a directory another run holds before they touch it."""
import errno
import io
import json
import os
import socket
import subprocess
import sys
import unittest
from collections import namedtuple
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

from helpers import TempDir, conversation, token_tensors

from dflash_prepare import output_lock, packing, shards
from dflash_prepare.cli import main
from dflash_prepare.errors import UserError


def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


class OutputLockTest(TempDir):
    def record(self, path, **fields):
        holder = {"command": "tokens", "pid": dead_pid(), "host": socket.gethostname(),
                  "started": "2001-01-01 00:00:00 UTC"}
        holder.update(fields)
        with open(path, "w") as f:
            json.dump(holder, f)
        return holder

    def test_a_held_lock_is_refused_naming_its_holder_and_removed_on_release(self):
        path = self.path("out.lock")
        with output_lock.OutputLock(path, "regenerate"):
            with open(path) as f:
                holder = json.load(f)
            self.assertEqual((holder["pid"], holder["host"]),
                             (os.getpid(), socket.gethostname()))
            with self.assertRaises(UserError) as caught:
                output_lock.OutputLock(path, "regenerate").acquire()
            self.assertIn(f"in use by dflash-prepare regenerate, process {os.getpid()} on "
                          f"{socket.gethostname()}, started {holder['started']}",
                          str(caught.exception))
        self.assertFalse(os.path.exists(path))
        with output_lock.OutputLock(path, "regenerate"):  # free again
            pass

    def test_stale_records_are_taken_over_only_where_this_host_can_tell(self):
        path = self.path("out.lock")
        holder = self.record(path)
        err = io.StringIO()
        with redirect_stderr(err), output_lock.OutputLock(path, "tokens"):
            pass
        self.assertIn(f"took over the lock of dflash-prepare tokens, process {holder['pid']}",
                      err.getvalue())
        self.record(path, host="elsewhere")
        with self.assertRaises(UserError) as caught:
            output_lock.OutputLock(path, "tokens").acquire()
        self.assertIn("another host", str(caught.exception))
        # Without flock (some network file systems) the record decides: a
        # live process holds it, a gone one does not.
        os.remove(path)
        no_flock = OSError(errno.ENOLCK, "no locks")
        with mock.patch.object(output_lock.fcntl, "flock", side_effect=no_flock):
            self.record(path, pid=os.getppid())
            with self.assertRaises(UserError):
                output_lock.OutputLock(path, "tokens").acquire()
            self.record(path)
            with redirect_stderr(io.StringIO()), output_lock.OutputLock(path, "tokens"):
                pass

    def test_a_directory_lock_makes_and_removes_its_empty_directory(self):
        out = self.path("a", "b")
        with output_lock.DirectoryLock(out, "features"):
            self.assertTrue(os.path.exists(os.path.join(out, output_lock.DIRECTORY_LOCK)))
        self.assertFalse(os.path.exists(self.path("a")))
        with output_lock.DirectoryLock(out, "features"):
            with open(os.path.join(out, "kept"), "w"):
                pass
        self.assertEqual(os.listdir(out), ["kept"])


class CommandsHoldTheirOutputTest(TempDir):
    def held_run(self, argv, out):
        with output_lock.DirectoryLock(out, "tokens"):
            err = io.StringIO()
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                status = main(argv)
        return status, err.getvalue()

    def test_tokens_refuses_a_directory_another_run_holds(self):
        spec = self.spec_path
        chat = self.write_file("chat.jsonl", json.dumps(
            {"messages": [{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "a"}]}) + "\n")
        os.makedirs(self.path("tokenizer"))
        out = self.path("tokens")
        status, err = self.held_run(["tokens", chat, "--spec", spec, "--tokenizer",
                                     self.path("tokenizer"), "--out", out], out)
        self.assertEqual(status, 2)
        self.assertIn(f"the output is in use by dflash-prepare tokens, process {os.getpid()}",
                      err)
        self.assertFalse(os.path.exists(os.path.join(out, "manifest.json")))

    def test_features_refuses_a_directory_another_run_holds(self):
        spec_path, spec = self.spec_path, self.spec
        rows = packing.build_rows([conversation(9, 2)], 16, 0, True)
        os.makedirs(self.path("tokens"))
        shards.write_shard(self.path("tokens", "shard-00000.safetensors"),
                           token_tensors(rows, True), spec.shard_metadata())
        os.makedirs(self.path("target"))
        with open(self.path("target", "config.json"), "w") as f:
            json.dump({"hidden_size": 8, "vocab_size": 64, "num_hidden_layers": 4}, f)
        out = self.path("features")
        argv = ["features", "--spec", spec_path, "--target", self.path("target"),
                "--tokens", self.path("tokens"), "--out", out]
        status, err = self.held_run(argv, out)
        self.assertEqual(status, 2)
        self.assertIn("the output is in use by dflash-prepare tokens", err)
        # Free, it goes on to the disk check, and leaves no empty directory.
        usage = namedtuple("usage", "total used free")
        with mock.patch("shutil.disk_usage", return_value=usage(100, 0, 100)):
            err = io.StringIO()
            with redirect_stderr(err):
                self.assertEqual(main(argv), 2)
        self.assertIn("the feature shards need about", err.getvalue())
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
