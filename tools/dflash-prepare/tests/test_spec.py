import os
import unittest

from helpers import SPECS, TempDir, SMALL_SPEC

from dflash_prepare.errors import UserError
from dflash_prepare.spec import default_layer_ids, load_spec


class SpecTest(TempDir):
    def test_shipped_specs(self):
        tiny = load_spec(os.path.join(SPECS, "tiny.toml"))
        self.assertEqual(tiny.layer_ids, [1, 5])  # spread rule, as dflashc prints
        self.assertTrue(tiny.layer_ids_defaulted)
        self.assertEqual((tiny.seq_len, tiny.vocab_size, tiny.mask_token_id), (128, 1024, 1023))
        self.assertEqual(tiny.context_width, 512)
        qwen = load_spec(os.path.join(SPECS, "qwen3-8b-b16.toml"))
        self.assertEqual(qwen.layer_ids, [1, 9, 17, 25, 33])
        self.assertEqual(qwen.shard_metadata(), {
            "target": "Qwen/Qwen3-8B", "target_layer_ids": "[1, 9, 17, 25, 33]",
            "hidden_size": "4096", "seq_len": "3072"})

    def test_spread_rule_rounds_half_to_even(self):
        self.assertEqual(default_layer_ids(36, 5), [1, 9, 17, 25, 33])
        self.assertEqual(default_layer_ids(8, 2), [1, 5])
        self.assertEqual(default_layer_ids(48, 8), [1, 7, 14, 20, 26, 32, 39, 45])
        self.assertEqual(default_layer_ids(9, 3), [1, 4, 6])  # 3.5 -> 4, 6
        self.assertEqual(default_layer_ids(7, 1), [3])

    def test_errors_name_the_file_and_key(self):
        cases = {
            "mask_token_id = 63": ("mask_token_id = 64", "'drafter.mask_token_id' is 64, outside"),
            "hidden_size = 8": ("hidden_size = \"8\"", "'target.hidden_size' is '8', not int"),
            "layer_ids = [0, 2]": ("layer_ids = [2, 2]", "'target.layer_ids' [2, 2] are not strictly"),
            "block_size = 4": ("", "'drafter.block_size' is missing"),
        }
        base = SMALL_SPEC.format(seq_len=16)
        for old, (new, message) in cases.items():
            path = self.write_spec(base.replace(old, new), "bad.toml")
            with self.assertRaises(UserError) as caught:
                load_spec(path)
            self.assertIn(path, str(caught.exception))
            self.assertIn(message, str(caught.exception))
        with self.assertRaises(UserError) as caught:
            load_spec(self.write_spec("name = [", "syntax.toml"))
        self.assertIn("invalid toml", str(caught.exception))
        with self.assertRaises(UserError) as caught:
            load_spec(self.path("none.toml"))
        self.assertIn("cannot open spec file", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
