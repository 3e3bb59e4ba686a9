"""The Predicted Outputs drafter keeps its place in the prediction: through a reply
that follows it, a replacement, text around it, a rewind, and a prediction whose
lines differ only by a number (where the latest occurrence of a phrase, as prompt
lookup would take it, is the wrong one)."""

import numpy as np

from edgespec.drafters.prediction import PredictedOutput
from edgespec.core.sampling import SamplingParams

PROMPT = [900, 901, 902]


def drafted(drafter, reply, k=4):
    return drafter.propose(PROMPT + list(reply), k, SamplingParams(), np.random.default_rng(0)).token_ids


def fresh(prediction):
    drafter = PredictedOutput(prediction)
    drafter.prefill(PROMPT)
    return drafter


def test_a_reply_that_follows_the_prediction_is_drafted_its_next_tokens():
    drafter = fresh(list(range(10)))
    assert drafted(drafter, []) == [0, 1, 2, 3]
    assert drafted(drafter, [0, 1, 2]) == [3, 4, 5, 6]
    assert drafted(drafter, list(range(9))) == [9]
    assert drafted(drafter, list(range(10))) == []


def test_after_a_replaced_token_the_draft_skips_the_token_it_replaced():
    drafter = fresh(list(range(10)))
    assert drafted(drafter, [0, 1, 77]) == [3, 4, 5, 6]  # 2 -> 77
    assert drafted(drafter, [0, 1, 77, 3]) == [4, 5, 6, 7]


def test_text_around_the_prediction_is_skipped_and_the_place_found_again():
    drafter = fresh(list(range(10, 20)))
    fence = [500, 501, 502]  # ```python\n, say: not in the prediction
    assert drafted(drafter, fence + [10]) == [11, 12, 13, 14]
    assert drafted(drafter, fence + [10, 11, 12, 600, 601, 13, 14]) == [15, 16, 17, 18]  # an insertion


def test_the_nearest_occurrence_wins_over_the_latest():
    # def f0 ( x ) : return x * 0 ;  def f1 ... : lines that differ by their number only
    line = lambda i: [1, 100 + i, 2, 3, 4, 5, 3, 6, 200 + i, 7]
    prediction = [t for i in range(8) for t in line(i)]
    drafter = fresh(prediction)
    reply = line(0) + line(1) + [1, 999]  # line 2 renamed: its name token replaced
    assert drafted(drafter, reply, 8) == line(2)[2:]  # line 2's own number, not line 7's
    reply = line(0) + line(1) + [1, 999, 2, 3, 4, 5, 3, 6]
    assert drafted(drafter, reply, 2) == [202, 7]


def test_a_rewound_reply_is_followed_from_the_start_again():
    drafter = fresh(list(range(10)))
    assert drafted(drafter, [0, 1, 2, 3, 4]) == [5, 6, 7, 8]
    assert drafted(drafter, [0, 1]) == [2, 3, 4, 5]
