"""`features` with a real (tiny, random) Qwen3 target made here with
save_pretrained. Skipped without transformers/tokenizers/torch >= 2."""
import json
import os
import shutil
import tempfile
import unittest

import numpy as np

from helpers import HAS_HF, PREPARE, run_tool

from dflash_prepare import features, packing, shards, toy
from dflash_prepare.cli import main
from dflash_prepare.spec import load_spec

SPEC = """\
name = "hf-features"
[target]
model = "test/toy-qwen3"
num_layers = 4
hidden_size = 64
vocab_size = 1024
layer_ids = [0, 2]
[drafter]
num_layers = 2
intermediate_size = 128
num_heads = 2
num_kv_heads = 1
head_dim = 32
block_size = 4
mask_token_id = 1023
[training]
seq_len = 192
gamma = 0.0
anchors_per_row = 8
"""


@unittest.skipUnless(HAS_HF, "needs transformers, tokenizers and torch >= 2")
class FeaturesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import torch
        cls.torch = torch
        cls.tmp = tempfile.mkdtemp(prefix="dflash-prepare-features-")
        cls.spec_path = os.path.join(cls.tmp, "spec.toml")
        with open(cls.spec_path, "w") as f:
            f.write(SPEC)
        cls.spec = load_spec(cls.spec_path)
        records = toy.make_corpus(40, seed=2)
        cls.data = os.path.join(cls.tmp, "chat.jsonl")
        toy.write_jsonl(cls.data, records)
        cls.tokenizer_dir = os.path.join(cls.tmp, "tokenizer")
        toy.build_tokenizer(cls.tokenizer_dir, toy.corpus_texts(records), vocab_size=1000)
        cls.target = os.path.join(cls.tmp, "target")
        toy.build_target(cls.target, cls.spec, seed=1)
        # Loaded as `features` loads it, so that both run the same kernels.
        import transformers
        cls.model = transformers.AutoModelForCausalLM.from_pretrained(
            cls.target, dtype=torch.bfloat16).eval()
        cls.tokens = os.path.join(cls.tmp, "tokens")
        status, _, err = run_tool(PREPARE, "tokens", cls.data, "--spec", cls.spec_path,
                                  "--tokenizer", cls.tokenizer_dir, "--out", cls.tokens,
                                  "--pack", "--rows-per-shard", "4")
        assert status == 0, err

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_features(self, out, *extra):
        return run_tool(PREPARE, "features", "--spec", self.spec_path, "--target", self.target,
                        "--tokens", self.tokens, "--out", out, "--device", "cpu", *extra)

    def alone(self, ids):
        """The taps of one conversation run alone, read with forward hooks on
        the decoder layers (not through hidden_states)."""
        torch = self.torch
        captured = {}
        hooks = []
        for l in self.spec.layer_ids:
            def hook(module, inputs, output, l=l):
                captured[l] = output[0] if isinstance(output, tuple) else output
            hooks.append(self.model.model.layers[l].register_forward_hook(hook))
        try:
            with torch.inference_mode():
                self.model.model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        taps = torch.cat([captured[l].reshape(len(ids), -1) for l in self.spec.layer_ids], dim=-1)
        return taps.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

    def features_of(self, out):
        rows = []
        for path in shards.list_shards(out):
            shard = shards.SafetensorsFile(path)
            for r in range(shard.tensors["input_ids"].shape[0]):
                rows.append({name: shard.load(name)[r] for name in shard.tensors})
            self.assertEqual(shard.metadata["target"], "test/toy-qwen3")
            self.assertEqual(shard.metadata["target_layer_ids"], "[0, 2]")
            self.assertEqual(shard.metadata["hidden_size"], "64")
            self.assertEqual(shard.metadata["seq_len"], "192")
            self.assertEqual(shard.metadata["format"], "dflash-feature-shard")
            self.assertEqual(shard.metadata["packed"], "true")
            self.assertIn("chat_template_sha256", shard.metadata)
        return rows

    def packed_rows(self):
        token_rows = features.TokenRows(shards.list_shards(self.tokens))
        chosen = [i for i in range(len(token_rows))
                  if len(packing.conversation_bounds(token_rows.row(i)[2], token_rows.row(i)[3])) > 1]
        self.assertGreater(len(chosen), 0, "no row holds two conversations")
        return token_rows, chosen[:4]

    def test_each_conversation_exactly_as_alone(self):
        # One conversation per forward pass: bit for bit what it gives alone
        # (in the same process), read at hidden_states[layer + 1].
        token_rows, chosen = self.packed_rows()
        extractor = features.FeatureExtractor(self.target, self.spec, "cpu", batch_tokens=1)
        out = np.zeros((len(chosen), self.spec.seq_len, self.spec.context_width), np.uint16)
        extractor.run(token_rows, chosen, out, set())
        for local, index in enumerate(chosen):
            ids, _, positions, n = token_rows.row(index)
            bounds = packing.conversation_bounds(positions, n)
            for s, e in bounds:
                np.testing.assert_array_equal(out[local, s:e], self.alone(list(ids[s:e])))
            self.assertFalse(out[local, n:].any())
            # Control: the second conversation run after the first (no
            # restart) differs far beyond rounding, so the comparisons below
            # would see a conversation that saw another.
            (s0, _), (s1, e1) = bounds[0], bounds[1]
            joined = self.alone(list(ids[s0:e1]))[s1 - s0:]
            self.assertFalse(np.allclose(shards.bf16_bits_to_float32(joined),
                                         shards.bf16_bits_to_float32(out[local, s1:e1]),
                                         rtol=2e-2, atol=2e-2))

    def test_command_output_and_zero_padding(self):
        # The command, batched (right-padded, attention-masked) or one pass
        # per conversation: each conversation's features as alone, up to bf16
        # rounding (another process may round differently on the CPU).
        for name, extra in (("features-batched", ()), ("features-single", ("--batch-tokens", "1"))):
            out = os.path.join(self.tmp, name)
            status, stdout, stderr = self.run_features(out, *extra)
            self.assertEqual(status, 0, stderr)
            multi = 0
            for row in self.features_of(out):
                n = int(row["num_tokens"])
                bounds = packing.conversation_bounds(row["position_ids"], n)
                multi += len(bounds) > 1
                for s, e in bounds:
                    np.testing.assert_allclose(
                        shards.bf16_bits_to_float32(row["hidden_states"][s:e]),
                        shards.bf16_bits_to_float32(self.alone(list(row["input_ids"][s:e]))),
                        rtol=2e-2, atol=2e-2)
                self.assertFalse(row["hidden_states"][n:].any())
            self.assertGreater(multi, 0, "no row holds two conversations")
            status, stdout, _ = run_tool(PREPARE, "check", out, "--spec", self.spec_path)
            self.assertEqual(status, 0, stdout)

    def test_tap_index_is_layer_plus_one(self):
        torch = self.torch
        ids = torch.tensor([[5, 17, 42, 99, 3]])
        with torch.inference_mode():
            out = self.model.model(input_ids=ids, output_hidden_states=True, use_cache=False)
        self.assertEqual(len(out.hidden_states), 5)
        expected = self.alone([5, 17, 42, 99, 3])
        width = self.spec.hidden_size
        for k, l in enumerate(self.spec.layer_ids):
            got = out.hidden_states[l + 1][0].to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            np.testing.assert_array_equal(got, expected[:, k * width:(k + 1) * width])

    def test_non_finite_rows_are_skipped_and_counted(self):
        original = features.FeatureExtractor.run

        def poisoned(extractor, token_rows, ids, out, bad):
            original(extractor, token_rows, ids, out, bad)
            if ids[0] == 0:
                out[1, 0, 0] = 0x7FC0
                bad.add(1)

        out = os.path.join(self.tmp, "features-nan")
        features.FeatureExtractor.run = poisoned
        try:
            status = main(["features", "--spec", self.spec_path, "--target", self.target,
                           "--tokens", self.tokens, "--out", out, "--device", "cpu",
                           "--rows-per-shard", "3"])
        finally:
            features.FeatureExtractor.run = original
        self.assertEqual(status, 0)
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["report"]["skipped_non_finite"], 1)
        first = shards.SafetensorsFile(os.path.join(out, "shard-00000.safetensors"))
        self.assertEqual(first.tensors["hidden_states"].shape[0], 2)
        self.assertEqual(first.metadata["skipped_rows"], "[1]")
        # Resumed: complete, nothing to do.
        status, _, stderr = run_tool(PREPARE, "features", "--spec", self.spec_path, "--target",
                                     self.target, "--tokens", self.tokens, "--out", out,
                                     "--device", "cpu", "--rows-per-shard", "3")
        self.assertEqual(status, 0, stderr)
        self.assertIn("already complete", stderr)

    def test_disagreeing_target_is_refused(self):
        other = os.path.join(self.tmp, "other-target")
        shutil.copytree(self.target, other)
        with open(os.path.join(other, "config.json")) as f:
            config = json.load(f)
        config["num_hidden_layers"] = 3
        with open(os.path.join(other, "config.json"), "w") as f:
            json.dump(config, f)
        status, _, stderr = run_tool(PREPARE, "features", "--spec", self.spec_path, "--target",
                                     other, "--tokens", self.tokens, "--out",
                                     os.path.join(self.tmp, "f-other"), "--device", "cpu")
        self.assertEqual(status, 2)
        self.assertIn(f"{other}/config.json: 'num_hidden_layers' is 3 but {self.spec_path} "
                      "[target] num_layers is 4", stderr)


if __name__ == "__main__":
    unittest.main()
