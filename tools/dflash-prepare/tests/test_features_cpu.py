"""What `features` decides before it loads a model, and what a run that
stops early keeps (a stand-in for the model): no torch needed."""
import io
import json
import os
import signal
import unittest
from collections import namedtuple
from contextlib import redirect_stdout
from types import SimpleNamespace
from unittest import mock

from helpers import SMALL_SPEC, SPECS, FullDisk, TempDir, conversation, token_tensors

from dflash_prepare import check, features, packing, shards
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

    def test_tying_must_agree(self):
        config = self.path("target", "config.json")
        with self.assertRaises(UserError) as caught:
            features.read_target_config(self.target(tie_word_embeddings=True), self.spec)
        self.assertEqual(str(caught.exception),
                         f"{config}: 'tie_word_embeddings' is true but {self.spec_path} "
                         "[target] tie_word_embeddings is false")
        features.read_target_config(self.target(tie_word_embeddings=None), self.spec)
        # Absent is untied, as for dflashc: a tied spec refuses it.
        tied_path = self.write_spec(SMALL_SPEC.format(seq_len=self.seq_len).replace(
            "layer_ids = [0, 2]", "layer_ids = [0, 2]\ntie_word_embeddings = true"), "tied.toml")
        tied = load_spec(tied_path)
        features.read_target_config(self.target(tie_word_embeddings=True), tied)
        with self.assertRaises(UserError) as caught:
            features.read_target_config(self.target(), tied)
        self.assertEqual(str(caught.exception),
                         f"{config}: 'tie_word_embeddings' is false (absent) but {tied_path} "
                         "[target] tie_word_embeddings is true")

    def test_mistyped_and_missing_fields_are_named(self):
        config = self.path("target", "config.json")
        features.read_target_config(self.target(hidden_size=8.0), self.spec)  # json: 8.0 is 8
        for fields, message in (
                ({"hidden_size": "8"}, "'hidden_size' is \"8\", not an integer"),
                ({"vocab_size": True}, "'vocab_size' is true, not an integer"),
                ({"tie_word_embeddings": "yes"},
                 "'tie_word_embeddings' is \"yes\", not true or false"),
                ({"text_config": {"hidden_size": 8, "num_hidden_layers": 4}},
                 "has no 'text_config.vocab_size'")):
            with self.assertRaises(UserError) as caught:
                features.read_target_config(self.target(**fields), self.spec)
            self.assertEqual(str(caught.exception), f"{config}: {message}")

    def test_missing_target(self):
        with self.assertRaises(UserError) as caught:
            features.read_target_config(self.path("none"), self.spec)
        self.assertIn("target directory does not exist", str(caught.exception))
        with open(self.path("file"), "w"):
            pass
        with self.assertRaises(UserError) as caught:
            features.read_target_config(self.path("file"), self.spec)
        self.assertEqual(str(caught.exception), f"{self.path('file')}: not a directory "
                         "(--target is a Hugging Face model directory)")
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
        # The output directory it made is not left behind empty.
        self.assertFalse(os.path.exists(self.path("features")))

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


class FakeExtractor:
    """FeatureExtractor without torch or a model: zero features (finite, zero
    on padding). `before` runs with the call's number before each shard."""

    before = None
    calls = 0

    def __init__(self, directory, spec, device, batch_tokens):
        self.device = SimpleNamespace(type="cuda")

    def run(self, token_rows, ids, out, bad):
        FakeExtractor.calls += 1
        if FakeExtractor.before:
            FakeExtractor.before(FakeExtractor.calls)


class FeaturesRunTest(TempDir):
    """A run that stops early: what it keeps, what it says, what it leaves."""

    def setUp(self):
        super().setUp()
        rows = packing.build_rows([conversation(9, 2), conversation(6, 1),
                                   conversation(12, 3)], 16, 0, False)
        os.makedirs(self.path("tokens"))
        shards.write_shard(self.path("tokens", "shard-00000.safetensors"),
                           token_tensors(rows, False), self.spec.shard_metadata())
        os.makedirs(self.path("target"))
        with open(self.path("target", "config.json"), "w") as f:
            json.dump({"hidden_size": 8, "vocab_size": 64, "num_hidden_layers": 4}, f)
        FakeExtractor.before, FakeExtractor.calls = None, 0

    def features(self):
        """(status, stderr) of a run of 3 one-row shards with FakeExtractor."""
        argv = ["features", "--spec", self.spec_path, "--target", self.path("target"),
                "--tokens", self.path("tokens"), "--out", self.path("out"),
                "--rows-per-shard", "1"]
        with mock.patch("dflash_prepare.features.FeatureExtractor", FakeExtractor), \
                _quiet() as err, redirect_stdout(io.StringIO()):
            status = main(argv)
        return status, err.getvalue()

    def assertValidShards(self, count):
        paths = shards.list_shards(self.path("out"))
        self.assertEqual(len(paths), count)
        self.assertEqual(check.check_paths(paths, self.spec, expect="features").problems, [])
        self.assertEqual([n for n in os.listdir(self.path("out")) if ".tmp-" in n], [])

    def test_a_run_that_fails_before_a_shard_leaves_no_directory(self):
        def fail(*args):
            raise UserError("target: cannot load the target model: broken")
        with mock.patch.object(FakeExtractor, "__init__", fail):
            status, err = self.features()
        self.assertEqual(status, 2)
        self.assertTrue(err.endswith("error: target: cannot load the target model: broken\n"))
        self.assertFalse(os.path.exists(self.path("out")))

    def test_sigterm_keeps_the_finished_shards(self):
        """SIGTERM while the second shard is computed: stops with one line
        saying what was kept (SIGTERM ended the process without a word, and
        Ctrl-C said nothing of the shards), and the next run does the rest."""
        def terminate(call):
            if call == 2:
                os.kill(os.getpid(), signal.SIGTERM)
        # Where the run installs no handler of its own, this one gets it
        # (not the default, which would end the tests).
        unhandled = []

        def guard(number, frame):
            unhandled.append(number)
        self.addCleanup(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, guard))
        FakeExtractor.before = terminate
        status, err = self.features()
        self.assertEqual(unhandled, [])
        self.assertEqual(status, 130)
        self.assertIs(signal.getsignal(signal.SIGTERM), guard)  # given back
        self.assertNotIn("Traceback", err)
        self.assertEqual(err.splitlines()[-1],
                         f"dflash-prepare: interrupted; {self.path('out')} keeps 1 of 3 "
                         "finished shard(s), listed in its manifest.json; run the same "
                         "command again to continue")
        self.assertValidShards(1)
        FakeExtractor.before = None
        status, err = self.features()
        self.assertEqual(status, 0, err)
        self.assertIn("wrote 2 feature shard(s), 3 rows in all", err)
        self.assertValidShards(3)

    def test_full_disk_keeps_the_finished_shards(self):
        real_open = open

        def open_on_a_filling_disk(path, mode="r", *args, **kwargs):
            file = real_open(path, mode, *args, **kwargs)
            if "w" in mode and os.path.basename(path).startswith(".shard-00001"):
                return FullDisk(file, 200)
            return file

        with mock.patch.object(shards, "open", open_on_a_filling_disk, create=True):
            status, err = self.features()
        self.assertEqual(status, 2)
        self.assertNotIn("Traceback", err)
        self.assertEqual(err.splitlines()[-1],
                         f"dflash-prepare: error: {self.path('out', 'shard-00001.safetensors')}: "
                         f"cannot write: No space left on device; {self.path('out')} keeps 1 of "
                         "3 finished shard(s), listed in its manifest.json; run the same command "
                         "again to continue")
        self.assertValidShards(1)
        status, err = self.features()
        self.assertEqual(status, 0, err)
        self.assertValidShards(3)


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


HAS_TORCH = False
try:
    import torch  # noqa: E402
    HAS_TORCH = True
except Exception:
    pass


@unittest.skipUnless(HAS_TORCH, "needs torch")
class LastLayerTapTest(unittest.TestCase):
    """A decoder shaped like transformers' (`layers`, hidden_states whose last
    entry is after the final norm): a tap of the last layer must be that
    layer's output, the others hidden_states[l + 1]."""

    class Layer(torch.nn.Module if HAS_TORCH else object):
        """Returns the residual stream, as a decoder layer does."""
        def __init__(self):
            super().__init__()
            self.mix = torch.nn.Linear(4, 4)

        def forward(self, x):
            return x + self.mix(x)

    class Body(torch.nn.Module if HAS_TORCH else object):
        def __init__(self, n):
            super().__init__()
            self.layers = torch.nn.ModuleList(LastLayerTapTest.Layer() for _ in range(n))

        def forward(self, x):
            states = [x]
            for layer in self.layers:
                x = layer(x)
                states.append(x)
            states[-1] = states[-1] / states[-1].norm(dim=-1, keepdim=True)  # final norm
            return states

    def test_last_layer_from_its_output(self):
        torch.manual_seed(0)
        body = self.Body(3)
        held, handle = features.capture_last_layer(body)
        x = torch.randn(2, 4)
        with torch.no_grad():
            residual = [x]
            for layer in body.layers:
                residual.append(residual[-1] + layer.mix(residual[-1]))
            states = body(x)
        taps = features.tapped_states(states, [0, 2], 3, held.get("out"))
        self.assertTrue(torch.equal(taps[0], residual[1]))
        self.assertTrue(torch.equal(taps[1], residual[3]))  # not the normed entry
        self.assertFalse(torch.allclose(states[3], residual[3]))
        handle.remove()

    def test_uncaptured_last_layer_is_an_error(self):
        with self.assertRaises(UserError):
            features.tapped_states([None] * 4, [2], 3, None)
        with self.assertRaises(UserError):
            features.capture_last_layer(torch.nn.Module())
