"""A drafter added as docs/drafters.md adds one (a file of its own and a line in
edgespec/drafters/registry.py) works in `edgespec chat`, `edgespec serve` and
`edgespec bench`, by the name it was registered under: the example, ``lastline``."""

import json
import os
import signal
import sys

import pexpect
import pytest

import edgespec
from edgespec.drafters.last_line import RepeatLastLine
from edgespec.drafters.registry import BUILTIN, make_drafter
from edgespec.core.sampling import SamplingParams

from test_server import RunningServer

openai = pytest.importorskip("openai")

# SmolLM2 answers this at T = 0 with <li> lines that start alike (16 drafted, 8 accepted).
LIST = "Write an HTML unordered list of four colors."


def test_the_example_drafter_repeats_the_line_before():
    """It drafts the rest of the line before where this line starts as that one did."""
    drafter = make_drafter("lastline")
    assert isinstance(drafter, RepeatLastLine) and "lastline" in BUILTIN

    class Lines:  # ids are characters: "\n" ends a line
        def token_bytes(self, token):
            return chr(token).encode()

    drafter.attach(Lines())
    ids = [ord(c) for c in "x\n- one two\n- on"]
    assert drafter.propose(ids, 8, SamplingParams(), None).token_ids == [ord(c) for c in "e two\n"]
    assert drafter.propose(ids, 3, SamplingParams(), None).token_ids == [ord(c) for c in "e t"]
    other = [ord(c) for c in "x\n- one two\nand"]  # this line starts otherwise: nothing
    assert drafter.propose(other, 8, SamplingParams(), None).token_ids == []


def test_it_drafts_in_chat(smollm2_path):
    env = {**os.environ, "NO_COLOR": "1"}
    child = pexpect.spawn(sys.executable, ["-m", "edgespec", "chat", "-m", str(smollm2_path),
                                           "-d", "lastline", "--num-draft", "4", "--temp", "0",
                                           "-n", "48"],
                          env=env, encoding="utf-8", timeout=180, dimensions=(40, 200),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    child.expect_exact("> ")
    child.sendline(LIST)
    child.expect(r"\[(\d+) tokens, .*?drafter lastline.*?\]")
    child.expect_exact("> ")
    child.sendline("/quit")
    child.expect(pexpect.EOF)


def test_it_drafts_in_serve(smollm2_path):
    engine = edgespec.load(str(smollm2_path), draft="lookup", num_draft=4, n_ctx=1024)
    running = RunningServer(engine)
    try:
        reply = running.client().chat.completions.create(
            model=running.settings.model_names[0], messages=[{"role": "user", "content": LIST}],
            temperature=0, max_tokens=48, extra_body={"speculative": {"drafter": "lastline"}})
        timings = reply.model_extra["timings"]
        assert timings["drafter"] == "lastline" and timings["draft_n"] > 0
    finally:
        running.stop()
        engine.close()


def test_it_is_measured_by_bench(smollm2_path, tmp_path):
    out = tmp_path / "bench.json"
    result = pexpect.run(f"{sys.executable} -m edgespec bench --target {smollm2_path} --drafters lastline "
                         f"--num-draft 2 --temp 0 --prompts chat --prompts-per-set 1 --max-tokens 24 "
                         f"--no-auto --json {out}", timeout=300, withexitstatus=True,
                         env={**os.environ, "NO_COLOR": "1"})
    assert result[1] == 0, result[0]
    runs = json.loads(out.read_text())["runs"]
    assert ("fixed", "lastline", 2) in {(r["mode"], r["drafter"], r["num_draft"]) for r in runs}
