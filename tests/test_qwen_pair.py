"""Auto mode on the real Qwen2.5-Coder pair (slow: 1.6 GB of weights, minutes on a CPU)."""

import json
from importlib import resources

import pytest

from edgespec import SamplingParams, load
from edgespec.core.prompting import chat_prompt_ids
from greedy import assert_equal_up_to_a_near_tie

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = load("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct",
                  n_ctx=2048, fetch=True)
    yield engine
    engine.close()


@pytest.mark.parametrize("prompt_set, index", [("edit", 1), ("code", 0)])
def test_auto_greedy_equals_plain_up_to_near_ties(engine, prompt_set, index):
    prompt = json.loads(resources.files("edgespec").joinpath(f"prompts/{prompt_set}.json").read_text())[index]
    ids = chat_prompt_ids(engine.target, [{"role": "user", "content": prompt}])
    plain = engine.generate(ids, GREEDY, max_tokens=96, speculative=False)
    auto = engine.generate(ids, GREEDY, max_tokens=96)
    assert auto.stats.rounds > 0 and auto.stats.accepted > 0  # it did speculate
    assert_equal_up_to_a_near_tie(engine, ids, plain.token_ids, auto.token_ids)
