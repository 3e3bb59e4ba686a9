"""The ceiling: the copy runs, the cheapest schedule, and the engine measuring it."""

import json

import pytest
from run_script import run_script

from edgespec import Engine, PromptLookup, SamplingParams
from edgespec.backends.toy import SimClock, ToyBackend
from edgespec.measure.ceiling import best_schedule, ceiling, copy_lengths
from edgespec.drafters.scheduled import ScheduledDrafter

GREEDY = SamplingParams(temperature=0)


def linear(n: int) -> float:
    """A CPU-like pass cost: each token past the first costs 0.75 of a step."""
    return 0.25 + 0.75 * n


def test_copy_runs_follow_an_earlier_occurrence_of_the_token_before():
    # t=0: 3 has no successor yet; t=1: "1" was followed by 2, 3; t=2: "2" by 3 only;
    # t=3: "3" was followed by 1, not 7.
    assert copy_lengths([5, 1, 2, 3], [1, 2, 3, 7], max_draft=8) == [0, 2, 1, 0]
    assert copy_lengths([5, 1, 2, 3], [1, 2, 3, 7], max_draft=1) == [0, 1, 1, 0]
    # A reply that repeats itself can copy from its own earlier tokens.
    assert copy_lengths([9], [4, 5, 4, 5, 4], max_draft=8) == [0, 0, 0, 2, 1]


def test_the_cheapest_schedule_by_hand():
    schedule, cost = best_schedule([0, 2, 1, 0], linear)
    # t=0 plain (1), then 2 drafts at t=1 (v(3) = 2.5): 4 tokens for 3.5 steps.
    assert schedule == [0, 2]
    assert cost == pytest.approx(3.5)
    assert ceiling([0, 2, 1, 0], linear) == pytest.approx(4 / 3.5)


def test_no_gain_without_cheap_batches_and_all_of_it_with_free_ones():
    runs = [8] * 20
    assert ceiling(runs, lambda n: float(n)) == pytest.approx(1.0)
    # A pass costs one step whatever its size: 20 tokens in 3 passes of up to 8 drafts.
    schedule, cost = best_schedule(runs, lambda n: 1.0)
    assert cost == pytest.approx(3.0) and sum(d + 1 for d in schedule) == 20
    assert ceiling([0] * 20, linear) == pytest.approx(1.0)  # nothing to copy, no gain


def _timed_toy(step=0.04, token=0.03):
    clock = SimClock()
    target = ToyBackend.random(6, seed=3, scale=3.0, clock=clock, step_seconds=step,
                               token_seconds=token)
    return target, clock, (lambda n: 1.0 + (n - 1) * token / step)


def test_the_engine_measures_the_computed_ceiling_and_real_lookup_stays_below_it():
    target, clock, v = _timed_toy()
    engine = Engine(target, None, num_draft=1, clock=clock)
    prompt = [0, 1, 2, 3, 4, 5, 0, 1, 2]
    plain = engine.generate(prompt, GREEDY, max_tokens=60, speculative=False)
    runs = copy_lengths(prompt, plain.token_ids, max_draft=8)
    schedule, _ = best_schedule(runs, v)
    assert sum(schedule) > 10  # the toy's greedy text repeats: there is something to copy

    engine.configure(ScheduledDrafter(plain.token_ids, schedule), 8)
    oracle = engine.generate(prompt, GREEDY, max_tokens=60)
    assert oracle.token_ids == plain.token_ids
    assert oracle.stats.accepted == oracle.stats.drafted == sum(schedule)
    assert oracle.stats.rounds + oracle.stats.plain_steps == len(schedule)
    measured = oracle.stats.tokens_per_second / plain.stats.tokens_per_second
    assert measured == pytest.approx(ceiling(runs, v), rel=1e-9)

    for k in (1, 2, 4, 8):  # a real copying drafter, at any k, is no faster
        engine.configure(PromptLookup(min_ngram=1, max_ngram=4), k)
        lookup = engine.generate(prompt, GREEDY, max_tokens=60)
        assert lookup.token_ids == plain.token_ids
        assert lookup.stats.tokens_per_second <= oracle.stats.tokens_per_second * (1 + 1e-9)


def test_a_scheduled_drafter_stops_drafting_once_the_text_parts_from_its_reply():
    target, clock, v = _timed_toy()
    engine = Engine(target, None, num_draft=1, clock=clock)
    plain = engine.generate([0, 1], GREEDY, max_tokens=30, speculative=False)
    wrong = [(t + 1) % 6 for t in plain.token_ids]  # a reply the target never gives
    engine.configure(ScheduledDrafter(wrong, [4] * 6), 4)
    g = engine.generate([0, 1], GREEDY, max_tokens=30)
    assert g.token_ids == plain.token_ids
    assert g.stats.drafted == 4 and g.stats.accepted == 0  # one failed draft, then none


def test_the_script_on_a_real_model_drafts_the_reply_it_decoded(smollm2_path, tmp_path):
    """scripts/ceiling.py end to end on SmolLM2 (llama.cpp): its figures hang together."""
    out = tmp_path / "ceiling.json"
    run_script("ceiling.py", "--target", str(smollm2_path), "--prompts", "edit", "--prompts-per-set", "1",
               "--max-tokens", "24", "--max-draft", "3", "--measure", "--json", str(out))
    result = json.loads(out.read_text())
    assert sorted(int(n) for n in result["v"]) == [1, 2, 3, 4]
    [row] = result["prompts"]
    assert row["tokens"] == len(row["reply_ids"]) > 0
    v = {int(n): x for n, x in result["v"].items()}
    # Recomputed from what it saved, the copy ceiling is what it printed, and never above
    # the ceiling of a drafter that may draft everything.
    runs = copy_lengths(row["prompt_ids"], row["reply_ids"], max_draft=3)
    assert row["copy"] == pytest.approx(ceiling(runs, v.__getitem__))
    assert 1.0 <= row["copy"] <= row["any"] + 1e-9
    # Both perfect drafters were run by the engine; where it kept to the reply (only a
    # batched pass's rounding can part it), each ran at a measured speed.
    for name in ("copy", "any"):
        assert row[f"measured_{name}"] > 0 and isinstance(row[f"parted_{name}"], bool)
