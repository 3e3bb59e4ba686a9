"""Auto mode decides from the text and the clock alone, on the real engine and model:
SmolLM2-135M with prompt lookup, run once on the real clock and again from the same
starting costs with that run's clock readings, makes the same decisions and the same text
(scripts/decisions.py does this on the default target, in fresh processes)."""

import edgespec
from edgespec.core.prompting import chat_prompt_ids
from edgespec.core.sampling import SamplingParams
from edgespec.measure.replay import RecordingClock, ReplayingClock, record_decisions

PRIOR = {"v": {"2": 1.6, "3": 2.2, "4": 2.7, "5": 3.3, "8": 5.5, "9": 6.0}, "c": {}}
LIST = "\n".join(f"{i}. item number {i} of the list" for i in range(1, 13))


def run(model_path, clock):
    engine = edgespec.load(model_path, n_ctx=2048, prior=PRIOR, clock=clock, cache_ram=0)
    try:
        rounds = record_decisions(engine.planner)
        ids = chat_prompt_ids(engine.target, [{"role": "user", "content": f"Repeat exactly:\n{LIST}"}])
        text = engine.generate(ids, SamplingParams(temperature=0), max_tokens=96).token_ids
        return rounds, text
    finally:
        engine.close()


def test_a_real_run_replayed_with_its_clock_decides_alike(smollm2_path):
    recorded = RecordingClock()
    rounds, text = run(smollm2_path, recorded)
    assert any(r["drafter"] for r in rounds)  # (it drafted: there were decisions to make)
    replay = ReplayingClock(recorded.readings)
    assert run(smollm2_path, replay) == (rounds, text)
    assert replay.read == len(recorded.readings)
