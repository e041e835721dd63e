import math
import unittest

import numpy as np

import helpers  # noqa: F401  (imports the checkout's dflash_prepare)

from dflash_prepare import acceptance


class AcceptanceTest(unittest.TestCase):
    # Three blocks of bs 4; slot 0 is the anchor (w = 0 there).
    labels = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    weight = np.array([[0, 1, 1, 1], [0, 1, 1, 1], [0, 1, 0, 1]], dtype=float)

    def test_runs_stop_at_the_first_miss_or_unsupervised_slot(self):
        predicted = np.array([[9, 2, 3, 4],    # all three right: run 3
                              [1, 2, 9, 4],    # miss at k = 2: run 1
                              [1, 2, 3, 4]])   # w = 0 at k = 2: run 1
        runs = acceptance.accepted_runs(predicted, self.labels, self.weight)
        self.assertEqual(list(runs), [3, 1, 1])
        self.assertEqual(acceptance.acceptance_length(predicted, self.labels, self.weight,
                                                      [1, 1, 1]), (4 + 2 + 2) / 3)
        self.assertEqual(acceptance.acceptance_length(predicted, self.labels, self.weight,
                                                      [1, 0, 0]), 4.0)
        self.assertTrue(math.isnan(acceptance.acceptance_length(
            predicted, self.labels, self.weight, [0, 0, 0])))

    def test_nothing_right_gives_one(self):
        predicted = np.zeros((3, 4), dtype=int)
        self.assertEqual(acceptance.acceptance_length(predicted, self.labels, self.weight,
                                                      [1, 1, 1]), 1.0)

    def test_accuracy_counts_what_tau_does_not(self):
        predicted = np.array([[9, 9, 3, 4], [1, 2, 9, 4], [1, 2, 3, 4]])
        # right among w > 0: block 0: 2 of 3; block 1: 2 of 3; block 2: 2 of 2
        self.assertAlmostEqual(acceptance.accuracy(predicted, self.labels, self.weight,
                                                   [1, 1, 1]), 6 / 8)
        self.assertEqual(acceptance.acceptance_length(predicted, self.labels, self.weight,
                                                      [1, 1, 1]), (1 + 2 + 2) / 3)
        per = acceptance.accuracy_per_position(predicted, self.labels, self.weight, [1, 1, 1])
        self.assertTrue(math.isnan(per[0]))
        np.testing.assert_allclose(per[1:], [2 / 3, 1 / 2, 1.0])


if __name__ == "__main__":
    unittest.main()
