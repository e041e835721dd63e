import json
import os
import unittest
from unittest import mock

from helpers import TempDir

from dflash_prepare import progress, shards
from dflash_prepare.errors import UserError


class ManifestTest(TempDir):
    def out(self):
        return self.path("out")

    def shard(self, name, data=b"x" * 10):
        with open(os.path.join(self.out(), name), "wb") as f:
            f.write(data)
        return {"rows": 1, "bytes": len(data)}

    def test_resume_keeps_complete_shards(self):
        m = progress.Manifest(self.out(), "tokens", "fp1", overwrite=False)
        m.record("shard-00000.safetensors", self.shard("shard-00000.safetensors"))
        # Interrupted: shard 1 was written but never recorded, and a temp file
        # of shard 2 was left behind.
        self.shard("shard-00001.safetensors")
        with open(shards.temp_path_for(os.path.join(self.out(), "shard-00002.safetensors")), "wb"):
            pass
        again = progress.Manifest(self.out(), "tokens", "fp1", overwrite=False)
        self.assertTrue(again.done("shard-00000.safetensors"))
        self.assertFalse(again.done("shard-00001.safetensors"))
        self.assertFalse(again.complete)
        self.assertEqual(sorted(os.listdir(self.out())), ["manifest.json", "shard-00000.safetensors"])
        again.save(complete=True, report={"rows": 1})
        with open(os.path.join(self.out(), "manifest.json")) as f:
            saved = json.load(f)
        self.assertEqual(saved["fingerprint"], "fp1")
        self.assertTrue(progress.Manifest(self.out(), "tokens", "fp1", False).complete)

    def test_a_changed_shard_is_redone(self):
        m = progress.Manifest(self.out(), "tokens", "fp1", overwrite=False)
        m.record("shard-00000.safetensors", self.shard("shard-00000.safetensors"))
        self.shard("shard-00000.safetensors", b"short")
        self.assertFalse(progress.Manifest(self.out(), "tokens", "fp1", False)
                         .done("shard-00000.safetensors"))

    def test_another_run_is_refused_unless_overwritten(self):
        m = progress.Manifest(self.out(), "tokens", "fp1", overwrite=False)
        m.record("shard-00000.safetensors", self.shard("shard-00000.safetensors"))
        with self.assertRaises(UserError) as caught:
            progress.Manifest(self.out(), "tokens", "fp2", overwrite=False)
        self.assertIn("holds the shards of a different run", str(caught.exception))
        with self.assertRaises(UserError):
            progress.Manifest(self.out(), "features", "fp1", overwrite=False)
        fresh = progress.Manifest(self.out(), "tokens", "fp2", overwrite=True)
        self.assertEqual(fresh.shards, {})
        self.assertEqual(os.listdir(self.out()), [])

    def test_foreign_shards_are_refused(self):
        os.makedirs(self.out())
        self.shard("mine.safetensors")
        with self.assertRaises(UserError) as caught:
            progress.Manifest(self.out(), "tokens", "fp1", overwrite=False)
        self.assertIn("already holds *.safetensors files but no manifest.json",
                      str(caught.exception))

    def test_an_unused_directory_it_made_is_removed(self):
        made = progress.Manifest(self.path("a", "b", "out"), "tokens", "fp1", overwrite=False)
        self.assertTrue(os.path.isdir(self.path("a", "b", "out")))
        made.discard_if_unused()
        self.assertFalse(os.path.exists(self.path("a")))
        # One that was there already stays, and so does one that holds a shard.
        os.makedirs(self.out())
        progress.Manifest(self.out(), "tokens", "fp1", overwrite=False).discard_if_unused()
        self.assertTrue(os.path.isdir(self.out()))
        used = progress.Manifest(self.path("used"), "tokens", "fp1", overwrite=False)
        with open(self.path("used", "shard-00000.safetensors"), "wb"):
            pass
        used.discard_if_unused()
        self.assertTrue(os.path.isdir(self.path("used")))

    def test_output_that_cannot_be_written(self):
        """Refused when opened, before anything in it is removed (an
        --overwrite into a read-only directory deleted shards, then failed
        with a traceback). chmod does not stop root: the write is refused
        by a stand-in open instead."""
        m = progress.Manifest(self.out(), "tokens", "fp1", overwrite=False)
        m.record("shard-00000.safetensors", self.shard("shard-00000.safetensors"))
        with mock.patch.object(shards, "open", create=True,
                               side_effect=PermissionError(13, "Permission denied")):
            with self.assertRaises(UserError) as caught:
                progress.Manifest(self.out(), "tokens", "fp2", overwrite=True)
        self.assertEqual(str(caught.exception), f"{self.out()}: cannot write into the output "
                         "directory: Permission denied")
        self.assertEqual(sorted(os.listdir(self.out())),
                         ["manifest.json", "shard-00000.safetensors"])
        with open(self.path("file"), "w"):
            pass
        for directory, message in ((self.path("file"), "not a directory (the output is a "
                                    "directory of shards)"),
                                   (self.path("file", "out"), "cannot create the output "
                                    "directory: Not a directory")):
            with self.assertRaises(UserError) as caught:
                progress.Manifest(directory, "tokens", "fp1", overwrite=False)
            self.assertEqual(str(caught.exception), f"{directory}: {message}")

    def test_what_a_stopped_run_keeps(self):
        m = progress.Manifest(self.out(), "tokens", "fp1", overwrite=False)
        m.planned = 3
        self.assertEqual(m.kept(), f"no shard finished in {self.out()}")
        m.record("shard-00000.safetensors", self.shard("shard-00000.safetensors"))
        # Renamed into place, its manifest not yet written: not kept.
        self.shard("shard-00001.safetensors")
        self.assertEqual(m.kept(), f"{self.out()} keeps 1 of 3 finished shard(s), listed "
                         "in its manifest.json")

    def test_fingerprint_is_order_free(self):
        self.assertEqual(progress.fingerprint({"a": 1, "b": [1, 2]}),
                         progress.fingerprint({"b": [1, 2], "a": 1}))
        self.assertNotEqual(progress.fingerprint({"a": 1}), progress.fingerprint({"a": 2}))


if __name__ == "__main__":
    unittest.main()
