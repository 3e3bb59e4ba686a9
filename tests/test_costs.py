"""Cost estimates: robust to outliers and load, clamped to the plausible, this run's own."""

import json

import pytest

from edgespec.backends.toy import SimClock, ToyBackend
from edgespec.core.cache import CachedModel
from edgespec.planner.calibration import calibrate, load_calibration, prior_for, save_calibration
from edgespec.core.config import DEFAULT_CONFIG
from edgespec.planner.costs import CostModel

TRUSTED_SAMPLES = DEFAULT_CONFIG.trusted_samples


def feed(cost: CostModel, seconds_by_size: dict[int, float], times: int = 5) -> None:
    for _ in range(times):
        for n, seconds in seconds_by_size.items():
            cost.observe_target(n, seconds)


def test_v_is_a_ratio_of_medians_and_ignores_a_slow_outlier():
    cost = CostModel()
    cost.observe_target(3, 0.9)  # a slow first pass (warm-up), as a ratio 9x
    feed(cost, {1: 0.1, 3: 0.2})
    assert cost.v(3) == pytest.approx(2.0)
    assert cost.v(2) == pytest.approx(1.5)  # between measured sizes: linear


def test_one_or_two_samples_are_read_by_the_smaller():
    cost = CostModel()
    cost.observe_target(1, 0.5)   # busy moment
    cost.observe_target(1, 0.1)
    cost.observe_target(2, 0.15)
    assert cost.step_seconds == pytest.approx(0.1)
    assert cost.v(2) == pytest.approx(1.5)


def test_ratios_survive_a_machine_that_gets_slower_for_both_passes():
    cost = CostModel()
    feed(cost, {1: 0.1, 5: 0.3})
    calm = cost.v(5)
    feed(cost, {1: 0.3, 5: 0.9}, times=9)  # three times slower, both sizes alike
    assert cost.v(5) == pytest.approx(calm)


def test_a_dear_size_in_the_prior_gives_way_to_what_this_run_timed_surely():
    """A cached v(16) far dearer than the 8-token passes this run keeps timing (a busy
    moment when it was cached): drafts of 15 would look unprofitable, never be made, and
    so never be timed again. A 16-token pass costs at most two 8-token ones."""
    prior = {"v": {"8": 5.6, "16": 15.0, "32": 17.9, "64": 21.9}}
    cost = CostModel(prior)
    feed(cost, {1: 0.1}, times=3)
    cost.observe_target(8, 0.55)  # one 8-token pass: not yet sure
    assert cost.v(16) > 13.0  # (the prior, at this run's level)
    feed(cost, {8: 0.55}, times=TRUSTED_SAMPLES - 1)
    assert cost.v(16) == pytest.approx(11.0)  # two passes of 8 at 5.5 steps each
    assert cost.v(12) <= 11.0 and cost.v(9) <= 11.0
    assert cost.v(8) == pytest.approx(5.5)
    feed(cost, {16: 0.7}, times=TRUSTED_SAMPLES)  # 16 timed surely: its own measure
    assert cost.v(16) == pytest.approx(7.0)
    feed(cost, {64: 1.9}, times=TRUSTED_SAMPLES)  # and a longer pass bounds the ones a tile shorter
    assert cost.v(32) <= 19.0 and cost.v(60) <= 19.0


def test_implausible_values_are_clamped():
    cost = CostModel({"v": {"2": 6.0, "5": 0.5}, "c": {"draft": 6.0}})
    assert cost.v(2) == 2.0            # v(n) <= n
    assert 1.0 <= cost.v(5) <= 5.0     # v(n) >= 1 ...
    assert cost.v(5) >= cost.v(2)      # ... and never below a pass of half as many tokens
    assert cost.c("draft") == 1.0      # a draft step costs at most a target step
    assert cost.catch_up("draft", 4) <= 4.0
    feed(cost, {1: 0.1, 2: 0.5})       # measured v(2) = 5: still at most 2
    assert cost.v(2) == 2.0


def test_a_pass_cheaper_than_a_shorter_one_stands_as_timed():
    # llama.cpp's repacked CPU kernels multiply rows four at a time: on two Xeon cores a
    # 4-token pass of the Qwen 1.5B took 1.53 steps and a 3-token one 1.8.
    cost = CostModel()
    feed(cost, {1: 0.10, 2: 0.145, 3: 0.18, 4: 0.153, 5: 0.21})
    assert cost.v(4) == pytest.approx(1.53)
    assert cost.v(3) == pytest.approx(1.8)


def test_sizes_not_timed_in_this_run_follow_the_priors_shape():
    # The prior (a calibration) saw the saw-tooth; this run has timed sizes 2 and 5 only,
    # 10% dearer than the prior: v(3) and v(4) keep the prior's shape at this run's level.
    cost = CostModel({"v": {"2": 1.5, "3": 1.8, "4": 1.5, "5": 2.0}})
    feed(cost, {1: 0.1, 2: 0.165, 5: 0.22})
    assert cost.v(4) < cost.v(3)
    assert cost.v(2) == pytest.approx(1.65) and cost.v(5) == pytest.approx(2.2)
    assert cost.v(4) == pytest.approx(1.5 * 1.1)


def test_one_short_pass_timed_does_not_inflate_the_long_ones():
    # A calibration, then this run's only batched pass so far: a 2-token one, on a busy
    # moment (1.8 steps where the calibration has 1.54). Longer passes keep the calibration's
    # shape at that level (5 tokens: 2.57 * 1.8 / 1.54 = 3.0), not the line through
    # (1, 1) and (2, 1.8) (5 tokens: 4.2), which made auto mode stop drafting for good.
    cost = CostModel({"v": {"2": 1.54, "3": 2.14, "4": 2.35, "5": 2.57, "8": 3.31, "9": 3.56}})
    feed(cost, {1: 0.1, 2: 0.18})
    assert cost.v(5) == pytest.approx(2.57 * 1.8 / 1.54)
    assert cost.v(9) == pytest.approx(3.56 * 1.8 / 1.54)


def test_what_a_run_saves_is_what_it_timed_not_what_it_derived():
    # Each auto run saves its costs as the next run's prior. A run that timed only up to
    # 5-token passes, on a slow moment (3.0 where the prior has 2.5), scales the prior's
    # v(9) up for its own decisions; written back and scaled again run after run, v(9)
    # would walk off (ten runs of one prompt took it from 3.3 to 4.4-5.5).
    prior = {"v": {"2": 1.5, "3": 2.0, "5": 2.5, "9": 3.5}, "c": {"draft": 0.4}}
    for run in range(10):
        cost = CostModel(prior)
        feed(cost, {1: 0.1, 2: 0.15, 5: 0.3})
        # This run's decisions: v(9) along the prior's shape, at the level timed at 5 tokens.
        assert cost.v(9) == pytest.approx(3.5 * 3.0 / float(prior["v"]["5"]))
        prior = cost.as_prior()
        assert prior["v"]["9"] == 3.5 and prior["v"]["3"] == 2.0  # kept, not re-derived
        assert prior["v"]["5"] == pytest.approx(3.0) and prior["v"]["2"] == pytest.approx(1.5)
        assert prior["c"] == {"draft": 0.4} and prior["step_seconds"] == pytest.approx(0.1)
    # Sizes neither timed nor in the prior are not written: the next run interpolates them.
    assert set(CostModel({"v": {"2": 1.5, "6": 2.4}}).as_prior()["v"]) == {"1", "2", "6"}


def test_a_few_busy_samples_do_not_become_the_next_runs_prior_but_a_run_of_them_does():
    prior = {"v": {"2": 1.5, "4": 1.6, "9": 3.3}, "c": {"draft": 0.45}}
    cost = CostModel(prior)
    feed(cost, {1: 0.1})
    cost.observe_target(4, 0.28)        # one 4-token pass on a busy moment
    cost.observe_draft("draft", 1, 0.085)  # and one slow draft step
    assert cost.v(4) == pytest.approx(2.8)  # in this run, one sample replaces the prior ...
    saved = cost.as_prior()
    assert saved["v"]["4"] == pytest.approx(1.6)  # ... but the next run starts from the prior
    assert saved["c"]["draft"] == pytest.approx(0.45)
    # A run that times a size again and again outweighs the prior: a stale or poisoned
    # entry is corrected by the first run that measures it.
    cost = CostModel({"v": {"2": 6.0, "4": 1.6}, "c": {"draft": 6.0}})
    feed(cost, {1: 0.1, 2: 0.15, 4: 0.2})
    for _ in range(5):
        cost.observe_draft("draft", 1, 0.045)
    saved = cost.as_prior()
    assert saved["v"]["2"] == pytest.approx(1.5) and saved["v"]["4"] == pytest.approx(2.0)
    assert saved["c"]["draft"] == pytest.approx(0.45)


def test_one_busy_pass_does_not_make_its_size_dear_where_the_others_say_the_prior_holds():
    prior = {"v": {"2": 1.5, "3": 1.9, "4": 1.7, "9": 3.4}}
    cost = CostModel(prior)
    feed(cost, {1: 0.1, 2: 0.15})      # 2-token passes: as the prior says
    cost.observe_target(3, 0.28)       # one 3-token pass on a busy moment
    assert cost.v(3) == pytest.approx(1.9) and cost.v(4) == pytest.approx(1.7)
    # Until a size is timed TRUSTED_SAMPLES times it follows the level of all timed passes.
    cost = CostModel(prior)
    feed(cost, {1: 0.1, 2: 0.18})      # this run is 20% dearer than the prior ...
    cost.observe_target(3, 0.30)
    assert cost.v(3) == pytest.approx(1.9 * 1.2)  # ... and so is one size timed once
    for _ in range(TRUSTED_SAMPLES - 1):
        cost.observe_target(3, 0.30)
    assert cost.v(3) == pytest.approx(3.0)  # timed again and again: its own median


def test_one_run_of_evidence_replaces_the_prior():
    cost = CostModel({"v": {"2": 1.0, "3": 1.0, "5": 1.0, "9": 1.0}, "c": {"draft": 0.0}})
    assert cost.v(9) == 1.0 and cost.c("draft") == 0.0
    feed(cost, {1: 0.1, 3: 0.25})
    assert cost.v(3) == pytest.approx(2.5)
    # Past the largest size measured: at least the line through (1, 1) and (3, 2.5).
    assert cost.v(9) >= 1 + 0.75 * 8 - 1e-9
    cost.observe_draft("draft", 2, 0.1)
    assert cost.c("draft") == pytest.approx(0.5)  # far above a prior of 0: believed at once


def test_one_cold_first_step_does_not_make_a_drafter_dearer_than_its_prior():
    cost = CostModel({"c": {"draft": 0.4}})
    feed(cost, {1: 0.1})
    cost.observe_draft("draft", 1, 0.055)  # a cold first step: 0.55 of a plain step
    assert cost.c("draft") == pytest.approx(0.4)
    cost.observe_draft("draft", 1, 0.03)  # a step below the prior counts at once
    assert cost.c("draft") == pytest.approx(0.3)
    cost = CostModel({"c": {"draft": 0.4}})
    feed(cost, {1: 0.1})
    for _ in range(TRUSTED_SAMPLES - 1):
        cost.observe_draft("draft", 1, 0.055)
        assert cost.c("draft") == pytest.approx(0.4)
    cost.observe_draft("draft", 1, 0.055)
    assert cost.c("draft") == pytest.approx(0.55)  # steadily dearer: believed
    cost = CostModel({"c": {"draft": 0.4}})
    feed(cost, {1: 0.1})
    cost.observe_draft("draft", 1, 0.09)  # far above the prior: no cold start, a wrong prior
    assert cost.c("draft") == pytest.approx(0.9)


def test_staleness_is_counted_in_target_passes():
    cost = CostModel()
    assert cost.rounds_since_measured("draft") == float("inf")
    feed(cost, {1: 0.1, 3: 0.2}, times=1)
    cost.observe_draft("draft", 1, 0.02)
    assert cost.rounds_since_measured("draft") == 0
    feed(cost, {1: 0.1}, times=10)
    assert cost.rounds_since_measured("draft") == 10
    assert cost.rounds_since_plain_step() == 0


def test_calibration_measures_what_passes_cost_and_leaves_the_caches_true():
    """On a simulated clock a pass over n tokens costs 1 + 0.4 (n - 1) steps and a
    draft step 0.25: calibration must find exactly that, through the caches a
    generation uses, and leave them empty and knowing it."""
    clock = SimClock()
    target = ToyBackend.random(8, seed=1, clock=clock, step_seconds=0.02, token_seconds=0.008)
    draft = target.perturbed(noise=0.1, seed=3, clock=clock, step_seconds=0.005)
    target_cache, draft_cache = CachedModel(target), CachedModel(draft)
    target_cache.forward([1, 2, 3])  # a conversation was cached before
    cost = calibrate(target_cache, [("toy-draft", draft_cache)], sizes=(1, 3, 5), repeats=2, clock=clock)
    assert cost.measured_sizes() == [1, 3, 5]
    assert cost.v(3) == pytest.approx(1.8) and cost.v(5) == pytest.approx(2.6)
    assert cost.c("toy-draft") == pytest.approx(0.25)
    assert target.n_past == draft.n_past == 0
    assert target_cache.tokens == [] and draft_cache.tokens == []


def test_calibration_discards_each_kinds_warm_up_pass():
    """The first pass of each size and each drafter step warms caches up; it is run
    but not counted, so `repeats` timings of each remain."""
    target = ToyBackend.random(8, seed=1)
    draft = target.perturbed(noise=0.1, seed=3)
    cost = calibrate(target, [("toy-draft", draft)], sizes=(1, 3), repeats=2)
    assert [len(cost._target[n].values) for n in (1, 3)] == [2, 2]
    assert len(cost._step["toy-draft"].values) == 2


def test_calibration_file_round_trip_and_bad_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    target = ToyBackend.random(8, seed=1)
    draft = target.perturbed(noise=0.1, seed=3)
    prior = prior_for(target, [("toy-draft", draft)])  # calibrates, then caches
    files = list((tmp_path / "calibration").glob("*.json"))
    assert len(files) == 1 and load_calibration(files[0]) == json.loads(files[0].read_text())
    assert "toy-draft" in prior["c"]
    files[0].write_text("{not json")
    assert load_calibration(files[0]) is None
    files[0].write_text(json.dumps({"v": {"2": "fast"}}))
    assert load_calibration(files[0]) is None
    capsys.readouterr()
    prior_for(target, [("toy-draft", draft)])  # a broken file: measured again, and rewritten
    assert "ignoring the cached costs" in capsys.readouterr().err
    assert load_calibration(files[0]) is not None
    save_calibration({"v": {"2": 1.5}, "c": {"toy-draft": 0.2}}, files[0])
    assert prior_for(target, [("toy-draft", draft)])["v"] == {"2": 1.5}  # read, not re-measured


@pytest.mark.parametrize("content", ["[]", "null", '{"draft": null, "num_draft": 2}',
                                     '{"draft": "lookup"}', '{"draft": "lookup", "num_draft": 0}',
                                     '{"draft": "", "num_draft": "auto"}', "{not json"])
def test_a_saved_profile_of_the_wrong_shape_is_ignored_with_a_warning(content, tmp_path,
                                                                      monkeypatch, capsys):
    from edgespec.measure.profiles import load_profile, profile_path, save_profile
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    path = profile_path("some-model")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    assert load_profile("some-model") is None
    assert "ignoring the saved profile" in capsys.readouterr().err
    save_profile("some-model", {"mode": "fixed", "drafter": "lookup", "num_draft": 4, "speedup": 1.2})
    assert load_profile("some-model")["num_draft"] == 4  # a good one is read back


def test_a_calibration_with_sizes_that_are_not_token_counts_is_ignored(tmp_path):
    path = tmp_path / "cal.json"
    for bad in ('{"v": {"a": 1.5}}', '{"v": {"0": 1.0}}', '{"v": {"2": null}}', '{"v": [], "c": {}}'):
        path.write_text(bad)
        assert load_calibration(path) is None
    path.write_text('{"v": {"2": 1.5}, "c": {"d": 0.3}}')
    assert load_calibration(path) == {"v": {"2": 1.5}, "c": {"d": 0.3}}


def test_profiles_are_keyed_by_the_model_not_its_file_name(tmp_path, monkeypatch):
    from edgespec.measure.profiles import load_profile, save_profile
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    ours, theirs = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf"
    for path, header in ((ours, b"GGUF one model"), (theirs, b"GGUF another model")):
        path.parent.mkdir()
        path.write_bytes(header)
    save_profile(str(ours), {"mode": "fixed", "drafter": "lookup", "num_draft": 3, "speedup": 1.2})
    assert load_profile(str(ours))["num_draft"] == 3
    assert load_profile(str(theirs)) is None  # same file name, another model
    ours.write_bytes(b"GGUF one model, re-quantized")  # the file changed: the profile is stale
    assert load_profile(str(ours)) is None


def test_the_priors_sizes_are_trusted_once_this_run_confirms_its_level():
    prior = {"v": {"2": 1.5, "3": 1.8, "5": 2.2, "9": 3.4, "16": 3.9, "32": 6.4, "64": 12.8}}
    agreeing = CostModel(prior)
    feed(agreeing, {1: 0.1, 2: 0.16, 5: 0.23})  # within a few percent of the prior
    assert agreeing.trusted_sizes() == [1, 2, 3, 5, 9, 16, 32, 64]
    # A prior claiming passes are far cheaper than they are: only what this run timed.
    poisoned = CostModel({"v": {n: 1.0 for n in prior["v"]}})
    feed(poisoned, {1: 0.1, 2: 0.16, 5: 0.23})
    assert poisoned.trusted_sizes() == [1, 2, 5]
    # Nothing but plain steps timed yet: no evidence either way.
    fresh = CostModel(prior)
    feed(fresh, {1: 0.1})
    assert fresh.trusted_sizes() == [1]
