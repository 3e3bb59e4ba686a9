"""`edgespec chat` in a pseudo-terminal, the chat session, and the embedding API."""

import json
import re
import signal
import sys
import threading

import pexpect
import pytest

import edgespec
from edgespec import ChatSession, EdgespecError, SamplingParams

STATS = re.compile(r"\[(\d+) tokens, [\d.]+ tok/s.*?prompt eval (\d+)/(\d+) tokens.*?\]")


def test_chat_in_a_terminal(smollm2_path, tmp_path):
    env = {**__import__("os").environ, "NO_COLOR": "1"}
    # A fixed k: auto mode would also time its long passes once on this machine, in a prompt.
    child = pexpect.spawn(sys.executable, ["-m", "edgespec", "chat", "-m", str(smollm2_path),
                                           "-d", "lookup", "--num-draft", "4", "--temp", "0", "-n", "64"],
                          env=env, encoding="utf-8", timeout=180, dimensions=(40, 200),
                          # started as a shell starts a background job: Ctrl-C must still work
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    child.expect("edgespec chat")
    child.expect_exact("> ")

    def turn(message):
        child.sendline(message)
        child.expect(STATS)
        generated, evaluated, prompt = map(int, child.match.groups())
        child.expect_exact("> ")
        return generated, evaluated, prompt

    generated, _, first_prompt = turn("What is the capital of France?")
    assert generated > 0
    generated, evaluated, prompt = turn("And what is the capital of Italy?")
    # Turn 2 evaluates the new message and its template tokens, not the history.
    assert prompt > first_prompt + generated
    assert evaluated < 30

    child.sendline("/stats")
    child.expect(r"session: (\d+) tokens generated")
    child.expect("acceptance per draft position")
    child.expect_exact("> ")

    # Ctrl-C in the middle of a long reply stops it at once.
    child.sendline("Write a very long story about a dragon who learns to bake bread.")
    child.expect_exact("dragon who learns to bake bread.\r\n")  # the terminal's echo
    child.expect(r"\w")  # the reply has started streaming
    child.sendintr()
    child.expect_exact("(interrupted)")
    child.expect(STATS)
    child.expect_exact("> ")

    generated, _, _ = turn("Say hello.")
    assert generated > 0

    transcript = tmp_path / "chat.json"
    child.sendline(f"/save {transcript}")
    child.expect_exact("(saved to")
    child.expect_exact("> ")
    saved = json.loads(transcript.read_text())
    roles = [m["role"] for m in saved["messages"]]
    assert roles == ["user", "assistant"] * 4
    assert saved["messages"][5]["content"]  # the interrupted reply was kept, partial

    child.sendline("/reset")
    child.expect_exact("(conversation cleared)")
    child.sendline(f"/load {transcript}")
    child.expect_exact("(loaded 8 messages)")
    child.expect_exact("> ")
    turn("Thanks!")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_path, smollm2_q2k_path):
    engine = edgespec.load(str(smollm2_path), draft=str(smollm2_q2k_path), n_ctx=2048, num_draft=4)
    yield engine
    engine.close()


def test_turn_two_only_evaluates_the_new_tokens(smollm2_engine):
    session = ChatSession(smollm2_engine, params=SamplingParams(temperature=0), max_tokens=48)
    list(session.send("Name three fruits."))
    first = session.last.stats
    message = "Now name three vegetables, please."
    list(session.send(message))
    second = session.last.stats
    new_tokens = len(smollm2_engine.target.tokenize(message, add_bos=False))
    # The message plus "<|im_end|>\n<|im_start|>user\n" ... "<|im_start|>assistant\n" and
    # the last reply token (still pending) -- on the target and on the draft model.
    assert second.prompt_eval_tokens <= new_tokens + 12
    assert second.draft_prompt_eval_tokens <= new_tokens + 12
    assert second.prompt_tokens > first.prompt_tokens + first.generated_tokens
    assert second.prompt_tokens > 3 * second.prompt_eval_tokens


def test_cancel_from_another_thread_stops_promptly(smollm2_engine):
    greedy = SamplingParams(temperature=0)
    messages = [{"role": "user", "content": "Write a long essay about the history of bread."}]
    request, cancelled = threading.Event(), threading.Event()

    def canceller():
        request.wait()
        smollm2_engine.cancel()
        cancelled.set()

    thread = threading.Thread(target=canceller)
    thread.start()
    after_cancel, final = 0, None
    for i, chunk in enumerate(smollm2_engine.chat(messages, params=greedy, max_tokens=1000)):
        if i == 10:
            request.set()
            cancelled.wait()
        elif cancelled.is_set() and chunk.token_ids:
            after_cancel += 1
        final = chunk
    thread.join()
    assert final.finish_reason == "cancelled"
    # At most the rest of the round in flight (k drafts + 1) after cancel() returned.
    assert after_cancel <= smollm2_engine.num_draft + 1
    # The engine is usable at once and gives the same greedy answer as before.
    fresh = smollm2_engine.chat(messages, stream=False, params=greedy, max_tokens=12)
    assert fresh.finish_reason == "length" and len(fresh.token_ids) == 12
    plain = smollm2_engine.chat(messages, stream=False, params=greedy, max_tokens=12,
                                speculative=False)
    assert plain.token_ids == fresh.token_ids


def test_api_chat_streams_chunks_then_stats(smollm2_engine):
    chunks = list(smollm2_engine.chat([{"role": "user", "content": "Hi!"}], temperature=0.7,
                                      seed=3, max_tokens=20))
    assert chunks[-1].finish_reason in ("stop", "length") and chunks[-1].stats is not None
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert sum(len(c.token_ids) for c in chunks) == chunks[-1].stats.generated_tokens


def test_long_conversation_drops_oldest_turns(smollm2_path):
    engine = edgespec.load(str(smollm2_path), draft="lookup", n_ctx=256)
    session = ChatSession(engine, params=SamplingParams(temperature=0), max_tokens=40)
    dropped = 0
    for i in range(8):
        list(session.send(f"Tell me one fact about the number {i}."))
        dropped += session.last.dropped_messages
    assert dropped > 0  # the history outgrew 256 tokens and was trimmed, never crashed
    with pytest.raises(EdgespecError, match="larger --ctx"):
        list(session.send("word " * 400))
    list(session.send("Still there?"))  # the session still works
    engine.close()
