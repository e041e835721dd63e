import io
import os
import unittest
from contextlib import redirect_stdout

import numpy as np

from helpers import SMALL_SPEC, TempDir, conversation, feature_tensors, token_tensors

from dflash_prepare import check, packing, shards


class CheckTest(TempDir):
    seq_len = 16

    def rows(self, pack=True):
        seqs = [conversation(7, 3, token=1), conversation(5, 2, token=2),
                conversation(4, 1, token=3), conversation(9, 5, token=4)]
        return packing.build_rows(seqs, self.seq_len, pad_id=0, pack=pack, seed=0)

    def write(self, tensors, name="shard-00000.safetensors", meta=None):
        directory = self.path("data")
        os.makedirs(directory, exist_ok=True)
        shards.write_shard(os.path.join(directory, name), tensors,
                           self.spec.shard_metadata() if meta is None else meta)
        return os.path.join(directory, name)

    def check(self):
        return check.check_paths(shards.list_shards(self.path("data")), self.spec)

    def problems(self):
        return [(os.path.basename(f), r, reason) for f, r, reason in self.check().problems]

    def assertOneProblem(self, row, text):
        problems = self.problems()
        self.assertEqual(len(problems), 1, problems)
        self.assertEqual(problems[0][1], row)
        self.assertIn(text, problems[0][2])

    def test_good_shards(self):
        for pack in (True, False):
            for features in (False, True):
                rows = self.rows(pack)
                tensors = feature_tensors(rows, self.spec, pack) if features \
                    else token_tensors(rows, pack)
                self.write(tensors)
                result = self.check()
                self.assertEqual(result.problems, [], (pack, features))
                self.assertEqual(result.rows, len(rows))

    def test_cli_exit_status_and_report(self):
        rows = self.rows()
        tensors = token_tensors(rows, True)
        tensors["input_ids"].array[1, 2] = 64
        self.write(tensors)
        args = type("Args", (), {"directory": self.path("data"), "spec": self.spec_path})
        out = io.StringIO()
        with redirect_stdout(out):
            status = check.run(args)
        self.assertEqual(status, 1)
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0], f"{self.path('data', 'shard-00000.safetensors')}: row 1: "
                         "input_ids has token 64 at column 2, outside the vocabulary of 64 tokens")
        self.assertTrue(lines[-1].endswith("1 bad row(s), 0 bad file(s): FAIL"), lines[-1])
        self.write(token_tensors(self.rows(), True))
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(check.run(args), 0)
        self.assertTrue(out.getvalue().strip().endswith(": OK"))

    def test_each_row_problem(self):
        def case(change, row, text, features=False, pack=True):
            rows = self.rows(pack)
            tensors = feature_tensors(rows, self.spec, pack) if features else token_tensors(rows, pack)
            change(tensors, rows)
            self.write(tensors)
            self.assertOneProblem(row, text)

        def set_(name, index, value):
            return lambda t, rows: t[name].array.__setitem__(index, value)

        case(set_("input_ids", (0, 3), -1), 0, "input_ids has token -1 at column 3, outside")
        case(set_("input_ids", (1, 1), 63), 1, "the mask token 63 at column 1")
        case(set_("loss_mask", (1, 4), 2), 1, "loss_mask has value 2 at column 4")
        rows = self.rows()
        padded = int(np.flatnonzero(rows.num_tokens < self.seq_len)[0])
        n = int(rows.num_tokens[padded])
        case(set_("loss_mask", (padded, n), 1), padded, f"loss_mask is 1 in the padding, at column {n}")
        case(set_("position_ids", (0, slice(0, 9)), np.arange(1, 10)), 0,
             "position_ids start at 1, not 0")
        case(set_("position_ids", (0, 2), 5), 0, "position_ids go from 1 to 5 at column 2")
        case(set_("num_tokens", 1, 17), 1, "num_tokens is 17, outside [0, 16]")

        def no_candidate(t, rows):
            t["loss_mask"].array[0] = 0
            t["loss_mask"].array[0, 1] = 1
            t["loss_mask"].array[0, 3] = 1
        case(no_candidate, 0, "no anchor candidate: fewer than 2 consecutive supervised "
                              "tokens within one conversation")
        case(no_candidate, 0, "no anchor candidate: fewer than 2 consecutive supervised tokens",
             pack=False)

        def across_conversations(t, rows):
            # Row 0 holds [9 | 7]: supervise only the last token of the first
            # and the first of the second: a pair, but not in one conversation.
            t["loss_mask"].array[0] = 0
            t["loss_mask"].array[0, 8:10] = 1
        self.assertEqual(list(self.rows().position_ids[0, 8:10]), [8, 0])
        case(across_conversations, 0, "within one conversation")

        def nan(t, rows):
            t["hidden_states"].array[1, 2, 5] = 0x7FC0
        case(nan, 1, "hidden_states is not finite at column 2, feature 5", features=True)

        def inf(t, rows):
            t["hidden_states"].array[1, 0, 0] = 0xFF80
        case(inf, 1, "hidden_states is not finite at column 0, feature 0", features=True)

        def nonzero_padding(t, rows):
            t["hidden_states"].array[padded, self.seq_len - 1, 3] = 0x3F80
        case(nonzero_padding, padded, f"hidden_states is not zero on the padding, at column "
             f"{self.seq_len - 1}", features=True)

    def test_pinned_anchors(self):
        rows = self.rows()
        R = len(rows)

        def with_anchors(anchors, keep):
            tensors = token_tensors(rows, True)
            tensors["anchors"] = shards.Tensor("I32", np.array([anchors] * R, dtype=np.int32))
            tensors["keep"] = shards.Tensor("U8", np.array([keep] * R, dtype=np.uint8))
            self.write(tensors)
            return [p for p in self.problems() if p[1] == 0]

        self.assertEqual(with_anchors([1, 3, 0], [1, 1, 0]), [])
        self.assertIn("strictly ascending", with_anchors([3, 1, 0], [1, 1, 0])[0][2])
        self.assertIn("outside [0, 14]", with_anchors([1, 15, 0], [1, 1, 0])[0][2])
        self.assertIn("keep has value 3", with_anchors([1, 2, 0], [1, 3, 0])[0][2])

    def test_file_problems(self):
        rows = self.rows()
        meta = dict(self.spec.shard_metadata(), target_layer_ids="[0, 3]", seq_len="32")
        del meta["target"]
        self.write(token_tensors(rows, True), meta=meta)
        problems = self.problems()
        self.assertEqual([p[1] for p in problems], [None, None, None])
        texts = [p[2] for p in problems]
        self.assertEqual(texts[0], "metadata has no 'target'")
        self.assertIn("metadata 'target_layer_ids' is '[0, 3]' but", texts[1])
        self.assertIn("needs '[0, 2]'", texts[1])
        self.assertIn("metadata 'seq_len' is '32'", texts[2])

        tensors = token_tensors(rows, True)
        tensors["loss_mask"] = shards.Tensor("I32", rows.loss_mask)
        self.write(tensors)
        self.assertEqual(self.problems(), [("shard-00000.safetensors", None,
                                            "tensor 'loss_mask' has dtype I32 but the spec needs U8")])
        tensors = feature_tensors(rows, self.spec, True)
        tensors["hidden_states"] = shards.Tensor("BF16", tensors["hidden_states"].array[:, :, :8])
        self.write(tensors)
        self.assertIn("tensor 'hidden_states' has shape [rows, 16, 8] but the spec needs "
                      "[rows, 16, 16]",
                      self.problems()[0][2])
        tensors = token_tensors(rows, True)
        del tensors["input_ids"]
        self.write(tensors)
        self.assertEqual(self.problems()[0][2], "has no tensor 'input_ids'")

        path = self.write(token_tensors(rows, True))
        with open(path, "r+b") as f:
            f.truncate(100)
        self.assertIn("truncated", self.problems()[0][2])

    def test_vocabulary_and_mask_token_of_another_spec(self):
        """`tokens` writes vocab_size and mask_token_id; a shard made for
        another vocabulary or mask token is named with both values (it was
        not compared). Shards without the fields (other writers) pass."""
        rows = self.rows()
        meta = dict(self.spec.shard_metadata(), vocab_size="64", mask_token_id="63")
        self.write(token_tensors(rows, True), meta=meta)
        self.assertEqual(self.problems(), [])
        self.write(token_tensors(rows, True),
                   meta=dict(meta, vocab_size="151936", mask_token_id="151669"))
        self.assertEqual(self.problems(), [
            ("shard-00000.safetensors", None,
             f"metadata 'vocab_size' is '151936' but {self.spec_path} needs '64'"),
            ("shard-00000.safetensors", None,
             f"metadata 'mask_token_id' is '151669' but {self.spec_path} needs '63'")])
        self.write(feature_tensors(rows, self.spec, True), meta=dict(meta, mask_token_id="62"))
        self.assertEqual(self.problems(), [
            ("shard-00000.safetensors", None,
             f"metadata 'mask_token_id' is '62' but {self.spec_path} needs '63'")])

    def test_metadata_that_nests_too_deep(self):
        deep = "[" * 100000 + "]" * 100000
        self.write(token_tensors(self.rows(), True),
                   meta=dict(self.spec.shard_metadata(), target_layer_ids=deep))
        self.assertEqual(self.problems(), [
            ("shard-00000.safetensors", None,
             f"metadata 'target_layer_ids' ('{deep[:60]}... (200000 characters)') is not a "
             "json list of integers")])

    def test_packed_row_of_no_tokens(self):
        """num_tokens 0 in a packed shard: a bad row, not a numpy broadcast error."""
        rows = self.rows()
        tensors = token_tensors(rows, True)
        tensors["num_tokens"].array[0] = 0
        self.write(tensors)
        problems = self.problems()
        self.assertEqual({p[1] for p in problems}, {0}, problems)
        self.assertRegex(problems[0][2], r"^loss_mask is 1 in the padding, at column \d+ "
                                         r"\(num_tokens 0\)$")

    def test_a_spec_that_is_not_theirs_is_named_once(self):
        """Each mismatch once, with the count of shards; it was once a shard."""
        rows = self.rows()
        one = packing.build_rows([conversation(7, 3)], self.seq_len, pad_id=0, pack=True, seed=0)
        for index, r in enumerate((rows, rows, one)):
            self.write(token_tensors(r, True), f"shard-{index:05d}.safetensors")
        other = self.write_spec(SMALL_SPEC.format(seq_len=32).replace("[0, 2]", "[1, 3]"),
                                "other.toml")
        out = io.StringIO()
        with redirect_stdout(out):
            status = check.run(type("Args", (), {"directory": self.path("data"),
                                                 "spec": other}))
        self.assertEqual(status, 1)
        first = self.path("data", "shard-00000.safetensors")
        self.assertEqual(out.getvalue().splitlines()[:-1], [
            f"{first} and 2 more: metadata 'target_layer_ids' is '[0, 2]' but {other} needs "
            "'[1, 3]' (3 of 3 shards)",
            f"{first} and 2 more: metadata 'seq_len' is '16' but {other} needs '32' "
            "(3 of 3 shards)",
        ] + [f"{first} and 2 more: tensor '{name}' has shape [rows, 16] but the spec needs "
             "[rows, 32] (3 of 3 shards)" for name in ("input_ids", "loss_mask", "position_ids")])
        self.assertTrue(out.getvalue().endswith("0 bad row(s), 3 bad file(s): FAIL\n"))

    def test_mixed_kinds(self):
        rows = self.rows()
        self.write(token_tensors(rows, True), "a.safetensors")
        self.write(feature_tensors(rows, self.spec, True), "b.safetensors")
        self.assertIn("holds both token shards and feature shards", self.problems()[-1][2])
        with self.assertRaises(Exception):
            check.run(type("Args", (), {"directory": self.path("none"), "spec": self.spec_path}))

    def test_every_bad_row_is_reported(self):
        rows = self.rows()
        tensors = token_tensors(rows, True)
        tensors["input_ids"].array[:, 0] = 99
        self.write(tensors, "a.safetensors")
        self.write(tensors, "b.safetensors")
        result = self.check()
        self.assertEqual(len(result.bad_rows), 2 * len(rows))


if __name__ == "__main__":
    unittest.main()
