"""llama-server's sampling fields give what llama-server gives: the reference
llama-server, built from the llama.cpp that llama-cpp-python vendors
(``scripts/llamacpp_reference.py`` builds it, cached), and ``edgespec serve``, on the
same SmolLM2 GGUF and the same prompt token ids, greedy.

The two may split only at a near-tie: llama-server decodes one token a pass, edgespec
verifies drafts in batched passes, and llama.cpp's CPU kernels round the two
differently (tests/greedy.py). Where they split, the penalised logits' two best must be
within that margin.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgespec
from greedy import NEAR_TIE, first_difference
from test_server import RunningServer

httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent.parent / "scripts"
PROMPT = "The history of the city of Rome begins with"


@pytest.fixture(scope="module")
def servers(smollm2_path):
    """(edgespec's URL, llama-server's URL, the engine)."""
    sys.path.insert(0, str(SCRIPTS))
    from llamacpp_reference import build_llama_server
    binary = build_llama_server(log=lambda message: None)
    from edgespec.serve.server import bind
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    reference = subprocess.Popen([str(binary), "-m", str(smollm2_path), "--port", str(port), "-c", "2048",
                                  "-t", "2", "--no-webui"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    engine = edgespec.load(str(smollm2_path), draft="lookup", num_draft=4, n_ctx=2048)
    running = RunningServer(engine)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):  # its /health says 503 while it loads, then 200
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert reference.poll() is None, "llama-server exited"
            subprocess.run(["sleep", "0.2"])  # (a poll of a process we do not control)
        yield running.url, url, engine
    finally:
        reference.kill()
        reference.wait()
        running.stop()
        engine.close()


def complete(url: str, prompt: list[int], **fields) -> dict:
    reply = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": 48, "temperature": 0,
                                                  "return_tokens": True, **fields}, timeout=600)
    assert reply.status_code == 200, reply.text
    return reply.json()


def penalised_gap(engine, context: list[int], penalty: float, last_n: int) -> float:
    """The gap between the two best logits after ``context``, with llama.cpp's
    repetition penalty over its last ``last_n`` tokens."""
    cache = engine.target_cache
    cache.rewind(0)
    logits = np.array(cache.forward(context, last_only=True)[-1], dtype=np.float64)
    cache.rewind(0)
    window = sorted(set(context[-last_n:])) if last_n else []
    logits[window] = np.where(logits[window] <= 0, logits[window] * penalty, logits[window] / penalty)
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


@pytest.mark.parametrize("fields", [
    dict(repeat_penalty=1.5, repeat_last_n=64),
    dict(repeat_penalty=1.3, repeat_last_n=16, top_k=40, min_p=0.1),
    dict(top_k=5, min_p=0.05),
], ids=["repeat_penalty", "repeat-top_k-min_p", "top_k-min_p"])
def test_greedy_tokens_equal_llama_servers_up_to_a_near_tie(servers, fields):
    ours, theirs, engine = servers
    prompt = engine.target.tokenize(PROMPT, add_bos=False, special=False)
    mine, reference = complete(ours, prompt, **fields)["tokens"], complete(theirs, prompt, **fields)["tokens"]
    if reference and reference[-1] in engine.target.vocab.eos_token_ids:
        reference = reference[:-1]  # (llama-server lists the end token among the reply's, edgespec does not)
    assert len(reference) >= 30, reference
    first = first_difference(mine, reference)
    if first is not None:
        gap = penalised_gap(engine, prompt + reference[:first], fields.get("repeat_penalty", 1.0),
                            fields.get("repeat_last_n", 64))
        assert gap < NEAR_TIE, f"split at {first} where the top-2 gap is {gap:.3f}: {mine} vs {reference}"
    if "repeat_penalty" in fields:  # the penalty changed llama-server's reply, and ours alike
        assert complete(theirs, prompt)["tokens"] != reference


def test_a_gbnf_grammar_gives_text_it_accepts_as_llama_servers_does(servers):
    ours, theirs, engine = servers
    grammar = 'root ::= "The colours are " colour ", " colour " and " colour "."\n' \
              'colour ::= "red" | "green" | "blue" | "a" [a-z]{1,8}'
    accepted = re.compile(r"The colours are ((red|green|blue|a[a-z]{1,8})(, | and |\.)){3}")
    prompt = engine.target.tokenize("Name three colours.", add_bos=False, special=False)
    mine = complete(ours, prompt, grammar=grammar, n_predict=64)["content"]
    reference = complete(theirs, prompt, grammar=grammar, n_predict=64)["content"]
    assert accepted.fullmatch(mine), mine
    assert accepted.fullmatch(reference), reference
