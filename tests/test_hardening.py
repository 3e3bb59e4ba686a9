"""Issue 15: misuse a desktop app or a downloaded file can throw at edgespec.

Every test here failed before its fix. Scenarios that used to kill the process
(a segfault in freed llama.cpp memory) run in a subprocess, so that a
regression fails the test instead of ending the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import edgespec
from edgespec import EdgespecError, SamplingParams
from edgespec.session import ChatSession

from ggufs import perturbed, tiny_llama_weights, write_tiny_llama_gguf

GREEDY = SamplingParams(temperature=0)
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def long_pair(tmp_path_factory):
    """A tiny target and drafter that rarely end a generation by themselves (a small
    end-of-text logit) and whose context holds long prompts."""
    folder = tmp_path_factory.mktemp("long")
    weights = tiny_llama_weights(seed=3, eos_logit_scale=0.05)
    return (write_tiny_llama_gguf(folder / "target.gguf", weights, context_length=4096),
            write_tiny_llama_gguf(folder / "draft.gguf", perturbed(weights, scale=0.3, seed=4),
                                  context_length=4096))


@pytest.fixture(scope="module")
def long_gguf(long_pair):
    return long_pair[0]


def run_scenario(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a crash is a failed test, not a dead suite)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, env=env, timeout=240)


# -- item 1: close() while generating, and every call after close() -------------------------

CLOSE_SCENARIO = """
    import sys, threading
    import edgespec
    from edgespec import EdgespecError, SamplingParams

    engine = edgespec.load(sys.argv[1], draft=sys.argv[2], num_draft=3, n_ctx=4096)
    greedy = SamplingParams(temperature=0)
    first, finals, errors = threading.Event(), [], []

    def consume():
        try:
            for chunk in engine.stream([1, 3, 4, 5], greedy, max_tokens=4000):
                first.set()
                if chunk.finish_reason:
                    finals.append(chunk)
        except BaseException as exc:  # anything but a clean end is a failure
            errors.append(repr(exc))
            first.set()

    thread = threading.Thread(target=consume)
    thread.start()
    first.wait()
    engine.close()  # from another thread, while the generation runs
    thread.join()
    assert not errors, errors
    assert finals[0].finish_reason == "cancelled", finals[0].finish_reason
    assert finals[0].stats.generated_tokens < 4000
    assert engine.closed
    calls = {
        "generate": lambda: engine.generate([1, 3], greedy, max_tokens=4),
        "stream": lambda: engine.stream([1, 3]),
        "chat": lambda: engine.chat([{"role": "user", "content": "a"}], stream=False),
        "tokenize": lambda: engine.tokenize("abc"),
        "configure": lambda: engine.configure(None, 2),
        "set_drafter": lambda: engine.set_drafter(None),
        "target.token_text": lambda: engine.target.token_text(3),
        "target.tokenize": lambda: engine.target.tokenize("abc"),
        "target.forward": lambda: engine.target.forward([3]),
    }
    for name, call in calls.items():
        try:
            call()
        except EdgespecError as exc:
            assert "closed" in str(exc), (name, str(exc))
        else:
            raise AssertionError(f"{name} after close() did not raise")
    engine.close()  # closing twice is fine
    engine.cancel()  # and so is cancelling nothing

    # close() from inside the consumer's own loop: the stream ends as cancelled.
    engine = edgespec.load(sys.argv[1], draft=sys.argv[2], num_draft=3, n_ctx=4096)
    chunks = []
    for chunk in engine.stream([1, 3, 4, 5], greedy, max_tokens=50):
        chunks.append(chunk)
        if len(chunks) == 2:
            engine.close()
    assert chunks[-1].finish_reason == "cancelled" and len(chunks) == 3, len(chunks)
    print("ok")
"""


def test_close_while_generating_and_every_call_after_close(long_pair):
    target, draft = long_pair
    out = run_scenario(CLOSE_SCENARIO, str(target), str(draft))
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# -- item 13: a cancel issued any time after the call returns ends that generation ----------


def test_cancel_before_the_first_chunk_ends_that_generation_only(tiny_gguf_pair):
    engine = edgespec.load(str(tiny_gguf_pair[0]), draft=str(tiny_gguf_pair[1]), num_draft=3)
    try:
        expected = engine.generate([1, 3, 4], GREEDY, max_tokens=20)
        stream = engine.stream([1, 3, 4], GREEDY, max_tokens=20)
        engine.cancel()  # before a single chunk was read
        chunks = list(stream)
        assert [c.finish_reason for c in chunks] == ["cancelled"]
        assert chunks[0].stats.generated_tokens == 0
        # A generation made after the cancel runs to the end, and is the same as before.
        again = engine.generate([1, 3, 4], GREEDY, max_tokens=20)
        assert again.finish_reason == "length" and again.token_ids == expected.token_ids
    finally:
        engine.close()


class CancelDuringPrefill:
    """A real llama.cpp backend whose first evaluation of a long batch cancels the
    engine, as a user pressing Stop while a long prompt is read would."""

    def __init__(self, backend, engine_ref):
        self._backend, self._engine_ref, self.batches = backend, engine_ref, []

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def forward(self, tokens, **options):
        self.batches.append(len(tokens))
        if len(tokens) > 1 and len(self.batches) == 1:
            self._engine_ref[0].cancel()
        return self._backend.forward(tokens, **options)


def test_cancel_is_seen_during_a_long_prefill(long_gguf):
    from edgespec.backends.llamacpp import LlamaCppBackend
    from edgespec.core.cache import PREFILL_CHUNK
    from edgespec.core.engine import Engine

    engine_ref = []
    backend = CancelDuringPrefill(LlamaCppBackend(long_gguf, n_ctx=4096), engine_ref)
    engine = Engine(backend, None, num_draft=1)
    engine_ref.append(engine)
    prompt = [3 + (i * 7) % 13 for i in range(3 * PREFILL_CHUNK + 10)]
    try:
        cancelled = engine.generate(prompt, GREEDY, max_tokens=10)
        assert cancelled.finish_reason == "cancelled" and cancelled.token_ids == []
        assert backend.batches == [PREFILL_CHUNK]  # it stopped after the first chunk
        # The engine is consistent: the same prompt now gives what a fresh engine gives.
        done = engine.generate(prompt, GREEDY, max_tokens=10)
        assert done.finish_reason == "length"
        fresh = Engine(LlamaCppBackend(long_gguf, n_ctx=4096), None, num_draft=1)
        assert done.token_ids == fresh.generate(prompt, GREEDY, max_tokens=10).token_ids
        fresh.close()
    finally:
        engine.close()


# -- item 2: token ids outside the vocabulary, on MLX -----------------------------------------

MLX_IDS_SCENARIO = """
    import sys
    from edgespec import EdgespecError, Engine, SamplingParams
    from edgespec.models.loading import BackendOptions, load_backend

    backend = load_backend(sys.argv[1], BackendOptions(backend="mlx", n_ctx=256))
    engine = Engine(backend)
    for bad in (10 ** 6, backend.vocab.size, -5):  # a segfault, garbage, std::bad_cast
        for call in (lambda: backend.forward([1, bad]),
                     lambda: engine.generate([1, bad], max_tokens=2)):
            try:
                call()
            except EdgespecError as exc:
                assert "outside the vocabulary" in str(exc), str(exc)
            else:
                raise AssertionError(f"id {bad} was read")
        assert backend.n_past == 0
    greedy = SamplingParams(temperature=0)
    print(len(engine.generate([1, 4], greedy, max_tokens=3).token_ids))  # still usable
"""


def test_out_of_vocabulary_ids_on_mlx_are_refused_not_a_crash(tmp_path):
    from ggufs import write_tiny_mlx_model
    folder = write_tiny_mlx_model(tmp_path / "tiny-mlx", tiny_llama_weights(seed=3, eos_logit_scale=0.0))
    out = run_scenario(MLX_IDS_SCENARIO, str(folder))
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "3", out.stderr[-3000:]


# -- item 3: a SentencePiece vocabulary without byte tokens ---------------------------------

SPM_SCENARIO = """
    import sys
    import edgespec
    from edgespec import EdgespecError

    engine = edgespec.load(sys.argv[1], num_draft=1)
    assert engine.tokenize("ab ba") == engine.target.tokenize("ab ba")  # all in the vocabulary
    for text in ("ab!", "ab\\u00e9", "x"):
        try:
            engine.generate(text, max_tokens=2)
        except EdgespecError as exc:
            assert repr(text[-1]) in str(exc) and "byte tokens" in str(exc), str(exc)
        else:
            raise AssertionError(f"{text!r} was tokenized")
    print(engine.generate("ab", max_tokens=3, temperature=0).finish_reason)
"""


def test_text_an_spm_vocabulary_cannot_spell_is_refused_not_a_crash(tmp_path):
    words = ["\u2581", "a", "b", "\u2581a", "ab", "ba", "\u2581ab", "aa", "bb", "\u2581b",
             "\u2581ba", "aab", "bba"]
    path = write_tiny_llama_gguf(tmp_path / "spm.gguf", tiny_llama_weights(seed=4), words=words)
    out = run_scenario(SPM_SCENARIO, str(path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] in ("length", "stop")


# -- item 4: a GGUF header that declares more than the file holds ---------------------------


def hostile_gguf(path: Path) -> Path:
    """A 113-byte GGUF whose one metadata array declares 2**40 uint8 elements."""
    key = b"general.hostile"
    data = (b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
            + len(key).to_bytes(8, "little") + key + (9).to_bytes(4, "little")  # ARRAY
            + (0).to_bytes(4, "little") + (2 ** 40).to_bytes(8, "little"))    # of UINT8
    path.write_bytes(data.ljust(113, b"\0"))
    return path


BOUNDED_SCENARIO = """
    import resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a regression fails, not the machine
    import edgespec
    from edgespec import EdgespecError
    start = time.monotonic()
    try:
        edgespec.load(sys.argv[1], backend=sys.argv[2])
    except EdgespecError as exc:
        print("refused in %.1f s: %s" % (time.monotonic() - start, exc))
"""


@pytest.mark.parametrize("backend", ["mlx", "llama.cpp"])
def test_a_gguf_header_declaring_2_to_the_40_elements_is_refused_in_bounded_memory(tmp_path, backend):
    path = hostile_gguf(tmp_path / "hostile.gguf")
    assert path.stat().st_size == 113
    out = run_scenario(BOUNDED_SCENARIO, str(path), backend)
    assert out.returncode == 0 and "refused in" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert "could not load" in out.stdout or "corrupt" in out.stdout


# -- item 10: a conversion that dies half-way leaves no folder that looks complete ----------

CRASHING_CONVERSION = """
    import os, pathlib, sys
    real = pathlib.Path.write_text

    def die_half_way(self, data, *args, **kwargs):
        if self.name == "config.json":  # the process dies while writing the config
            real(self, data[: len(data) // 2])
            os._exit(3)
        return real(self, data, *args, **kwargs)

    pathlib.Path.write_text = die_half_way
    from edgespec.backends.gguf_mlx import convert_gguf
    convert_gguf(sys.argv[1], quantize="none")
"""


def test_a_conversion_killed_half_way_is_redone_not_left_broken(tmp_path, tiny_gguf_pair, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    out = run_scenario(CRASHING_CONVERSION, str(tiny_gguf_pair[0]))
    assert out.returncode == 3, out.stderr[-2000:]
    from edgespec.backends.gguf_mlx import convert_gguf, converted_path
    assert not converted_path(Path(tiny_gguf_pair[0]), "none").exists()
    engine = edgespec.load(str(tiny_gguf_pair[0]), backend="mlx", mlx_quantize="none", num_draft=1)
    try:
        assert len(engine.generate([1, 3, 4], GREEDY, max_tokens=5).token_ids) > 0
    finally:
        engine.close()
    folder = convert_gguf(tiny_gguf_pair[0], quantize="none")
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no debris left


# -- item 5: a chat template or a prompt far larger than the context ------------------------


@pytest.fixture(scope="module")
def byte_gguf(tmp_path_factory):
    """A tiny model with byte tokens (any text tokenizes) and a hostile chat template."""
    folder = tmp_path_factory.mktemp("bytes")
    weights = tiny_llama_weights(vocab_size=3 + 256 + 16, seed=9, eos_logit_scale=0.3)
    hostile = write_tiny_llama_gguf(folder / "hostile-template.gguf", weights, byte_tokens=True,
                                    chat_template="{{ 'ab' * 25000000 }}")
    plain = write_tiny_llama_gguf(folder / "plain.gguf", weights, byte_tokens=True)
    return plain, hostile


def peak_python_memory(call) -> tuple[int, BaseException | None]:
    """Peak bytes Python allocated during ``call()``, and what it raised."""
    import tracemalloc
    tracemalloc.start()
    try:
        call()
        error = None
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        error = exc
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, error


def test_a_template_that_renders_50_mb_is_stopped_before_it_does(byte_gguf):
    engine = edgespec.load(str(byte_gguf[1]), num_draft=1, n_ctx=512)
    try:
        peak, error = peak_python_memory(
            lambda: engine.chat([{"role": "user", "content": "hi"}], stream=False, max_tokens=2))
        assert isinstance(error, EdgespecError) and "context" in str(error), error
        assert peak < 5 << 20  # not the 50 MB string, let alone its tokens
        assert engine.generate([4, 5], GREEDY, max_tokens=3).finish_reason == "length"
    finally:
        engine.close()


def test_a_prompt_far_longer_than_the_context_is_refused_before_tokenizing(byte_gguf):
    engine = edgespec.load(str(byte_gguf[0]), num_draft=1, n_ctx=512)
    huge = "abc " * 2_500_000  # 10 MB of text for a 512-token context
    try:
        for call in (lambda: engine.generate(huge, max_tokens=2),
                     lambda: engine.chat([{"role": "user", "content": huge}], stream=False)):
            peak, error = peak_python_memory(call)
            assert isinstance(error, EdgespecError) and "--ctx" in str(error), error
            assert peak < 5 << 20  # no 2.5-million-entry token list was built
    finally:
        engine.close()


# -- item 6: trimming a long history renders it a few times, not once per dropped pair ------


def test_trimming_a_long_history_renders_it_logarithmically_often(byte_gguf, monkeypatch):
    engine = edgespec.load(str(byte_gguf[0]), num_draft=1, n_ctx=512)
    renders = []
    render = engine.target.apply_chat_template

    def counted(messages, **options):
        renders.append(len(messages))
        return render(messages, **options)

    monkeypatch.setattr(engine.target, "apply_chat_template", counted)
    try:
        session = ChatSession(engine, params=GREEDY, max_tokens=16)
        for i in range(400):  # 800 messages, far more than 512 tokens
            session.messages += [{"role": "user", "content": f"q{i}"},
                                 {"role": "assistant", "content": f"a{i}"}]
        list(session.send("last"))
        assert session.last.dropped_messages > 700
        assert len(renders) <= 2 * 10 + 4  # log2(401) < 9: bisection, plus a final check
        # It dropped no more than it had to: one more exchange would not have fitted.
        kept = session.messages[:-1]  # (the reply is the last message now)
        assert kept[0]["role"] == "user"
        dropped = session.last.dropped_messages
        longer = [{"role": "user", "content": f"q{(dropped - 2) // 2}"},
                  {"role": "assistant", "content": f"a{(dropped - 2) // 2}"}] + kept
        from edgespec.core.prompting import chat_prompt_ids
        assert len(chat_prompt_ids(engine.target, longer)) + 16 > engine.n_ctx
    finally:
        engine.close()


# -- item 7: the chat survives every bad command ---------------------------------------------


def test_bad_transcripts_and_save_targets_are_one_line_errors_and_change_nothing(byte_gguf, tmp_path):
    engine = edgespec.load(str(byte_gguf[0]), num_draft=1, n_ctx=512)
    session = ChatSession(engine, params=GREEDY, max_tokens=4)
    list(session.send("ab"))
    before = [dict(m) for m in session.messages]
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000 + "]" * 100_000)
    null_content = tmp_path / "null.json"
    null_content.write_text(json.dumps({"messages": [{"role": "user", "content": None}]}))
    bad_role = tmp_path / "role.json"
    bad_role.write_text(json.dumps({"messages": [{"role": "wizard", "content": "x"}]}))
    try:
        for call, match in ((lambda: session.save(tmp_path), "is a folder"),
                            (lambda: session.load(tmp_path), "is a folder"),
                            (lambda: session.load(nested), "not an edgespec transcript"),
                            (lambda: session.load(null_content), "no text content"),
                            (lambda: session.load(bad_role), "role 'wizard'")):
            with pytest.raises(EdgespecError, match=match):
                call()
            assert session.messages == before
        list(session.send("ba"))  # and the conversation goes on
        assert len(session.messages) == len(before) + 2
    finally:
        engine.close()


def test_the_chat_command_line_survives_bad_commands(byte_gguf, tmp_path):
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000)
    script = "\n".join([f"/save {tmp_path}", f"/load {tmp_path}", f"/load {nested}", "/set temp x",
                        "ab", f"/save {tmp_path / 'kept.json'}", "/quit"]) + "\n"
    out = subprocess.run([sys.executable, "-m", "edgespec", "chat", "-m", str(byte_gguf[0]),
                          "-d", "lookup", "--ctx", "512", "-n", "4", "--temp", "0"],
                         input=script, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "EDGESPEC_HOME": str(tmp_path / "home")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr
    assert out.stdout.count("error: ") == 4
    saved = json.loads((tmp_path / "kept.json").read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"]


# -- item 14: a draft model whose vocabulary is smaller than the target's ------------------


def test_a_drafter_missing_some_target_ids_steps_aside_instead_of_failing(tmp_path):
    weights = tiny_llama_weights(vocab_size=20, seed=11, eos_logit_scale=0.1)
    weights["output.weight"][16:] *= 2.5  # the target often commits ids the drafter lacks
    small = {name: (w[:16] if name in ("token_embd.weight", "output.weight") else w)
             for name, w in weights.items()}
    target = write_tiny_llama_gguf(tmp_path / "target.gguf", weights)
    draft = write_tiny_llama_gguf(tmp_path / "draft.gguf", small)
    engine = edgespec.load(str(target), draft=str(draft), num_draft=3)
    try:
        plain = engine.generate([1, 3, 4], GREEDY, max_tokens=60, speculative=False)
        assert any(t >= 16 for t in plain.token_ids)  # the case this test is about
        first = next(i for i, t in enumerate(plain.token_ids) if t >= 16)
        spec = engine.generate([1, 3, 4], GREEDY, max_tokens=60)
        assert spec.token_ids == plain.token_ids and spec.finish_reason == plain.finish_reason
        assert spec.stats.drafted > 0 or first < 2  # it drafted until it could not
        # A prompt with such an id: no drafting at all, and no error.
        again = engine.generate([1, 3, 17, 4], GREEDY, max_tokens=10)
        assert again.token_ids == engine.generate([1, 3, 17, 4], GREEDY, max_tokens=10,
                                                  speculative=False).token_ids
    finally:
        engine.close()


# -- item 15: a llama.cpp target with an MLX drafter: the smaller context rules -------------


def test_a_mixed_pair_uses_the_smaller_context(long_pair):
    engine = edgespec.load(str(long_pair[0]), draft=str(long_pair[1]),
                           draft_backend="mlx", mlx_quantize="none", n_ctx=100, num_draft=3)
    try:
        assert engine.target.n_ctx > 100 and engine.drafter.n_ctx == 100  # llama.cpp rounds up
        assert engine.n_ctx == 100
        spec = engine.generate([1, 3, 4], GREEDY, max_tokens=500)
        plain = engine.generate([1, 3, 4], GREEDY, max_tokens=500, speculative=False)
        assert spec.finish_reason == plain.finish_reason == "length"
        assert len(spec.token_ids) == len(plain.token_ids) == 100 - 3
        with pytest.raises(EdgespecError, match="context holds 100"):
            engine.generate([3] * 120, max_tokens=2)
    finally:
        engine.close()
