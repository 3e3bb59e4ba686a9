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


def test_a_fenced_rename_is_followed_after_the_fence_and_after_the_new_name():
    # def add ( a , b ) : \n return a + b \n\n def sub ...; the reply: ```python \n def plus ( a ...
    DEF, ADD, NL, FENCE, PY, PLUS = 1, 2, 9, 500, 501, 502
    prediction = [DEF, ADD, 3, 4, 5, 6, 7, 8, 4, 10, 5, NL, DEF, 11, 3, 4, 5]
    drafter = fresh(prediction)
    # A newline far away in the prediction says nothing of the place: after the fence
    # (text the prediction lacks) nothing is drafted until the reply is back on it.
    assert drafted(drafter, [FENCE]) == [ADD, 3, 4, 5]  # (one token: a replacement, perhaps)
    assert drafted(drafter, [FENCE, PY, NL]) == []
    assert drafted(drafter, [FENCE, PY, NL, DEF]) == [ADD, 3, 4, 5]
    # The new name replaced one token: the draft picks up just past it, at once.
    assert drafted(drafter, [FENCE, PY, NL, DEF, PLUS]) == [3, 4, 5, 6]
    assert drafted(drafter, [FENCE, PY, NL, DEF, PLUS, 3]) == [4, 5, 6, 7]


def test_a_longer_new_name_and_dropped_tokens_are_found_again_a_token_or_two_later():
    drafter = fresh(list(range(20)))
    # 3 renamed to two tokens: after them, the prediction's 4 is its place again.
    assert drafted(drafter, [0, 1, 2, 700, 701, 4]) == [5, 6, 7, 8]
    # 9 and 10 dropped: 11 is found two past the place.
    assert drafted(drafter, [0, 1, 2, 700, 701, 4, 5, 6, 7, 8, 11]) == [12, 13, 14, 15]


def test_a_draft_holds_as_often_as_the_reply_went_on_in_step():
    hold = lambda reply: fresh(list(range(100))).propose(  # noqa: E731
        PROMPT + reply, 4, SamplingParams(), np.random.default_rng(0)).hold
    followed = hold(list(range(40)))
    assert len(followed) == 4 and followed[0] > 0.95
    # Runs in step broken by edits every few tokens: later tokens held less often.
    edited = [t if t % 4 else 900 + t for t in range(40)]
    assert hold(edited)[0] < followed[0] - 0.1
