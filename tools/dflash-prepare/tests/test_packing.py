import unittest

import numpy as np

from helpers import conversation

from dflash_prepare import packing


class PackingTest(unittest.TestCase):
    def sequences(self, lengths):
        return [conversation(n, 1, token=i) for i, n in enumerate(lengths)]

    def test_first_fit_decreasing(self):
        lengths = [7, 3, 9, 2, 5, 4, 6, 1]
        rows = packing.pack_order(lengths, 10, seed=0)
        # Longest first; each into the first row with room.
        self.assertEqual([[lengths[i] for i in row] for row in rows],
                         [[9, 1], [7, 3], [6, 4], [5, 2]])
        for row in rows:
            self.assertLessEqual(sum(lengths[i] for i in row), 10)
        self.assertEqual(sorted(i for row in rows for i in row), list(range(len(lengths))))

    def test_long_rows_keep_long_conversations_whole(self):
        # Rows of 131072 tokens (docs/long-context.md): conversations of up
        # to a whole row stay whole, two longer than half a row never share
        # one, and the short ones fill what the long ones leave.
        S = 131072
        rng = np.random.default_rng(7)
        long = [S, 100000, 90000, 70000, 66000]
        short = [int(n) for n in rng.integers(500, 6000, size=40)]
        lengths = long + short
        sequences = self.sequences(lengths)
        rows = packing.build_rows(sequences, S, pad_id=0, pack=True, seed=1)
        self.assertEqual(int(rows.num_tokens.sum()), sum(lengths))
        seen = []
        for r in range(len(rows)):
            bounds = packing.conversation_bounds(rows.position_ids[r], rows.num_tokens[r])
            sizes = [e - s for s, e in bounds]
            self.assertLessEqual(sum(1 for n in sizes if n > S // 2), 1)
            seen.extend(sizes)
            # each conversation counts its own positions from 0
            for s, e in bounds:
                np.testing.assert_array_equal(rows.position_ids[r, s:e], np.arange(e - s))
        self.assertEqual(sorted(seen), sorted(lengths))
        # first-fit decreasing: the short ones went into the long ones' rows
        # before a new row was opened
        self.assertEqual(len(rows), len(long))
        self.assertGreater(rows.num_tokens.sum() / (len(rows) * S), 0.85)

    def test_every_row_gets_the_first_with_room(self):
        # Distinct lengths fix the order; a plain first-fit over them must
        # give the same rows as the segment tree.
        lengths = [int(n) for n in np.random.default_rng(1).permutation(np.arange(1, 61))]
        rows = packing.pack_order(lengths, 64, seed=3)
        naive_rows, naive_free = [], []
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            for r, free in enumerate(naive_free):
                if free >= lengths[i]:
                    naive_rows[r].append(i)
                    naive_free[r] -= lengths[i]
                    break
            else:
                naive_rows.append([i])
                naive_free.append(64 - lengths[i])
        self.assertEqual(rows, naive_rows)

    def test_deterministic_with_a_seed(self):
        lengths = [5] * 6 + [3] * 6
        a = packing.pack_order(lengths, 8, seed=7)
        self.assertEqual(a, packing.pack_order(lengths, 8, seed=7))
        self.assertNotEqual(a, packing.pack_order(lengths, 8, seed=8))  # ties differ

    def test_fill_on_chat_like_lengths(self):
        rng = np.random.default_rng(0)
        S = 3072
        lengths = np.clip(rng.lognormal(np.log(800), 0.8, size=2000), 16, S).astype(int)
        rows = packing.pack_order([int(n) for n in lengths], S, seed=0)
        fill = lengths.sum() / (len(rows) * S)
        self.assertGreater(fill, 0.95)

    def test_rows_positions_and_padding(self):
        seqs = self.sequences([4, 3, 5])
        rows = packing.build_rows(seqs, 8, pad_id=0, pack=True, seed=0)
        self.assertEqual(len(rows), 2)
        # [5 | 3] fills 8; [4] then padding that goes on counting.
        np.testing.assert_array_equal(rows.position_ids[0], [0, 1, 2, 3, 4, 0, 1, 2])
        np.testing.assert_array_equal(rows.position_ids[1], [0, 1, 2, 3, 4, 5, 6, 7])
        np.testing.assert_array_equal(rows.num_tokens, [8, 4])
        np.testing.assert_array_equal(rows.conversations, [2, 1])
        np.testing.assert_array_equal(rows.input_ids[0, :5], seqs[2][0])
        np.testing.assert_array_equal(rows.input_ids[0, 5:], seqs[1][0])
        np.testing.assert_array_equal(rows.input_ids[1, 4:], [0, 0, 0, 0])
        np.testing.assert_array_equal(rows.loss_mask[1, 4:], [0, 0, 0, 0])
        np.testing.assert_array_equal(rows.loss_mask[0], [0, 1, 1, 1, 1, 0, 1, 1])
        self.assertEqual(packing.conversation_bounds(rows.position_ids[0], 8), [(0, 5), (5, 8)])
        self.assertEqual(packing.conversation_bounds(rows.position_ids[1], 4), [(0, 4)])

    def test_unpacked_rows(self):
        seqs = self.sequences([4, 3])
        rows = packing.build_rows(seqs, 6, pad_id=9, pack=False)
        self.assertEqual(len(rows), 2)
        np.testing.assert_array_equal(rows.position_ids, np.tile(np.arange(6), (2, 1)))
        np.testing.assert_array_equal(rows.input_ids[1], list(seqs[1][0]) + [9, 9, 9])
        np.testing.assert_array_equal(rows.num_tokens, [4, 3])

    def test_lengths_outside_a_row_are_refused(self):
        with self.assertRaises(ValueError):
            packing.pack_order([3, 9], 8)
        with self.assertRaises(ValueError):
            packing.build_rows(self.sequences([9]), 8, 0, pack=False)

    def test_anchor_candidates_stay_in_one_conversation(self):
        mask = np.array([0, 1, 1, 0, 0, 1], dtype=np.uint8)
        self.assertTrue(packing.has_anchor_candidate(mask))
        self.assertFalse(packing.has_anchor_candidate(np.array([1, 0, 1, 0, 1], np.uint8)))
        # The only pair spans a conversation end: no candidate.
        mask = np.array([0, 0, 1, 1, 0, 0], dtype=np.uint8)
        positions = np.array([0, 1, 2, 0, 1, 2])
        self.assertFalse(packing.has_anchor_candidate(mask, positions))
        self.assertTrue(packing.has_anchor_candidate(mask, np.arange(6)))


if __name__ == "__main__":
    unittest.main()
