"""What `features` decides before it loads a model: no torch needed."""
import json
import os
import unittest
from collections import namedtuple
from unittest import mock

from helpers import SPECS, TempDir, conversation, token_tensors

from dflash_prepare import features, packing, shards
from dflash_prepare.cli import main
from dflash_prepare.errors import UserError
from dflash_prepare.spec import load_spec


class TargetConfigTest(TempDir):
    def target(self, **fields):
        config = {"hidden_size": 8, "vocab_size": 64, "num_hidden_layers": 4,
                  "model_type": "qwen3"}
        config.update(fields)
        os.makedirs(self.path("target"), exist_ok=True)
        with open(self.path("target", "config.json"), "w") as f:
            json.dump(config, f)
        return self.path("target")

    def test_agreeing_config(self):
        features.read_target_config(self.target(), self.spec)
        # A multimodal config keeps the language model's fields in text_config.
        features.read_target_config(self.target(hidden_size=1, text_config={
            "hidden_size": 8, "vocab_size": 64, "num_hidden_layers": 4}), self.spec)

    def test_disagreeing_field_names_both_files(self):
        for field, value, spec_key in (("hidden_size", 16, "hidden_size"),
                                       ("vocab_size", 65, "vocab_size"),
                                       ("num_hidden_layers", 3, "num_layers")):
            with self.assertRaises(UserError) as caught:
                features.read_target_config(self.target(**{field: value}), self.spec)
            self.assertEqual(str(caught.exception),
                             f"{self.path('target', 'config.json')}: '{field}' is {value} "
                             f"but {self.spec_path} [target] {spec_key} is "
                             f"{getattr(self.spec, {'num_layers': 'target_num_layers'}.get(spec_key, spec_key))}")

    def test_missing_target(self):
        with self.assertRaises(UserError) as caught:
            features.read_target_config(self.path("none"), self.spec)
        self.assertIn("target directory does not exist", str(caught.exception))
        os.makedirs(self.path("empty"))
        with self.assertRaises(UserError) as caught:
            features.read_target_config(self.path("empty"), self.spec)
        self.assertIn("config.json: no such file", str(caught.exception))


class DiskTest(TempDir):
    def test_row_size_of_an_8b_target(self):
        qwen = load_spec(os.path.join(SPECS, "qwen3-8b-b16.toml"))
        row = features.feature_row_bytes(qwen, packed=False)
        self.assertEqual(row, 3072 * 5 * 4096 * 2 + 3072 * 5 + 4)
        self.assertAlmostEqual(row / 1e6, 125.8, delta=0.1)  # "about 126 MB a row"

    def test_refuses_without_the_space(self):
        usage = namedtuple("usage", "total used free")
        with mock.patch("shutil.disk_usage", return_value=usage(10**9, 0, 5 * 10**8)):
            with self.assertRaises(UserError) as caught:
                features.check_disk(self.dir, 126 * 10**9)
            self.assertEqual(str(caught.exception),
                             f"{self.dir}: the feature shards need about 126.0 GB but its "
                             "filesystem has 500.0 MB free")
            self.assertEqual(features.check_disk(self.dir, 10**8), 5 * 10**8)

    def test_command_stops_before_loading_anything(self):
        # A token shard, a target whose config agrees, too little disk: the
        # refusal comes before torch or transformers are imported.
        rows = packing.build_rows([conversation(9, 2), conversation(6, 1)], 16, 0, True)
        os.makedirs(self.path("tokens"))
        shards.write_shard(self.path("tokens", "shard-00000.safetensors"),
                           token_tensors(rows, True), self.spec.shard_metadata())
        os.makedirs(self.path("target"))
        with open(self.path("target", "config.json"), "w") as f:
            json.dump({"hidden_size": 8, "vocab_size": 64, "num_hidden_layers": 4}, f)
        usage = namedtuple("usage", "total used free")
        argv = ["features", "--spec", self.spec_path, "--target", self.path("target"),
                "--tokens", self.path("tokens"), "--out", self.path("features")]
        with mock.patch("shutil.disk_usage", return_value=usage(100, 0, 100)), \
                mock.patch("dflash_prepare.features.FeatureExtractor",
                           side_effect=AssertionError("must not load the model")):
            with _quiet() as err:
                status = main(argv)
        self.assertEqual(status, 2)
        self.assertIn("the feature shards need about", err.getvalue())
        self.assertIn("but its filesystem has 100 bytes free", err.getvalue())

    def test_bad_token_shards_are_refused(self):
        rows = packing.build_rows([conversation(9, 2)], 16, 0, True)
        tensors = token_tensors(rows, True)
        tensors["input_ids"].array[0, 0] = 1000
        os.makedirs(self.path("tokens"))
        shards.write_shard(self.path("tokens", "shard-00000.safetensors"), tensors,
                           self.spec.shard_metadata())
        with _quiet() as err:
            status = main(["features", "--spec", self.spec_path, "--target", self.path("t"),
                           "--tokens", self.path("tokens"), "--out", self.path("f")])
        self.assertEqual(status, 2)
        self.assertIn("row 0: input_ids has token 1000", err.getvalue())
        self.assertIn("1 bad row(s) and 0 bad file(s) in the token shards", err.getvalue())


class _quiet:
    """Captures stderr."""

    def __enter__(self):
        import io
        import sys
        self.saved = sys.stderr
        self.buffer = io.StringIO()
        sys.stderr = self.buffer
        return self.buffer

    def __exit__(self, *exc):
        import sys
        sys.stderr = self.saved
        return False


if __name__ == "__main__":
    unittest.main()
