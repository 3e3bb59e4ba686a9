"""llama.cpp's spelling on the command line, on SmolLM2-135M: each flag does what it says,
``--draft N`` is refused naming both meanings, every option's help shows its default,
a command lists only what it uses, and the docs give one near-tie figure, the tests'."""

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pexpect
import pytest

from edgespec.cli.main import make_parser
from edgespec.measure.selfcheck import NEAR_TIE
from test_cli import assert_one_line_error, edgespec

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write one sentence about the sea. Then write another one."


def generate(model, *args) -> dict:
    """``edgespec generate --json`` (no saved prompts on disk): its JSON, after exit 0."""
    result = edgespec("generate", "-m", model, "--json", "--cache-disk", 0, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# -- each flag does what it says ---------------------------------------------------------


def test_llama_cpp_context_flags_run(smollm2_path):
    out = generate(smollm2_path, "-p", PROMPT, "-n", 8, "-c", 2048, "-t", 2, "-s", 1, "--temp", 0,
                   "-fa", "on", "-b", 512, "-ub", 512, "-ctk", "q8_0", "-ctv", "q8_0", "--no-mmap")
    assert out["stats"]["generated_tokens"] == 8 and out["text"].strip()


def test_a_model_drafts_for_itself_with_md_and_draft_max(smollm2_path):
    out = generate(smollm2_path, "-md", smollm2_path, "--draft-max", 4, "--draft-min", 1,
                   "-p", "Count from one to twenty.", "-n", 24, "--temp", 0)
    stats = out["stats"]
    assert stats["drafter"] == smollm2_path.stem  # the draft model, at a fixed k (not auto mode)
    assert 0 < len(stats["drafted_per_position"]) <= 4
    assert stats["accepted"] > 0 and out["text"].strip()


def test_draft_min_leaves_shorter_drafts_unverified(smollm2_path):
    # The model drafting for itself stops below a top probability of 0.8: some drafts are short.
    args = ("-md", smollm2_path, "--draft-max", 8, "--draft-p-min", 0.8, "-p",
            "Write a short poem about the sea.", "-n", 48, "--temp", 0)
    anything = generate(smollm2_path, *args)["stats"]["drafted_per_position"]
    long_only = generate(smollm2_path, *args, "--draft-min", 2)["stats"]["drafted_per_position"]
    assert anything[0] > anything[1]  # (without it, one-token drafts were verified)
    # With it, every verified draft had 2 tokens or more: positions 1 and 2 drafted as often.
    assert long_only and long_only[0] == long_only[1]


def test_penalties_typical_and_a_stop_string(smollm2_path):
    sampling = ("-p", PROMPT, "-n", 40, "-s", 3, "--repeat-penalty", 1.1, "--presence-penalty", 0.5,
                "--top-k", 40, "--min-p", 0.05, "--typical", 0.9)
    whole = generate(smollm2_path, *sampling)
    stopped = generate(smollm2_path, *sampling, "-r", ".")
    # A seed gives one text; the stop string cuts it before its first "." (when one comes).
    if "." in whole["text"]:
        assert stopped["text"] == whole["text"].split(".")[0] and stopped["finish_reason"] == "stop"
    else:
        assert stopped["text"] == whole["text"]


def test_a_gbnf_grammar_decides_the_reply(smollm2_path):
    out = generate(smollm2_path, "-p", "Is the sea salty? Answer yes or no.", "-n", 8,
                   "--grammar", 'root ::= "yes" | "no"')
    assert out["text"] in ("yes", "no")


def test_a_json_schema_decides_the_reply(smollm2_path):
    schema = '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'
    out = generate(smollm2_path, "-p", "Give a JSON object with a number a.", "-n", 48, "--temp", 0,
                   "--json-schema", schema)
    reply = json.loads(out["text"])
    assert isinstance(reply["a"], int) and set(reply) == {"a"}  # (closed, as llama.cpp's schemas)


def expected_prompt_tokens(model_path, template: str, messages) -> int:
    from edgespec.backends.llamacpp import LlamaCppBackend
    from edgespec.core.chat_template import chat_template_from
    from edgespec.core.prompting import chat_prompt_ids
    backend = LlamaCppBackend(model_path, n_ctx=256)
    try:
        backend.use_chat_template(chat_template_from(template))
        return len(chat_prompt_ids(backend, messages))
    finally:
        backend.close()


def test_a_named_chat_template_replaces_the_models_own(smollm2_path):
    messages = [{"role": "user", "content": PROMPT}]
    own = generate(smollm2_path, "-p", PROMPT, "-n", 1, "--temp", 0)["stats"]["prompt_tokens"]
    llama3 = generate(smollm2_path, "-p", PROMPT, "-n", 1, "--temp", 0, "--chat-template", "llama3")
    assert llama3["stats"]["prompt_tokens"] == expected_prompt_tokens(smollm2_path, "llama3", messages) != own


def test_chat_with_a_system_prompt_and_chatml_in_a_terminal(smollm2_path):
    env = {**__import__("os").environ, "NO_COLOR": "1"}
    child = pexpect.spawn(sys.executable, ["-m", "edgespec", "chat", "-m", str(smollm2_path),
                                           "-sys", "Answer briefly.", "--chat-template", "chatml",
                                           "-d", "lookup", "--draft-max", "4", "--temp", "0",
                                           "-n", "16", "--cache-disk", "0"],
                          env=env, encoding="utf-8", timeout=180, dimensions=(40, 200))
    child.expect_exact("> ")
    child.sendline("What is the capital of France?")
    child.expect(r"\[(\d+) tokens, .*?prompt eval \d+/(\d+) tokens")
    generated, prompt = map(int, child.match.groups())
    child.expect_exact("> ")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and generated > 0
    # The prompt was the system message and the question, in ChatML.
    assert prompt == expected_prompt_tokens(smollm2_path, "chatml", [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the capital of France?"}])


def test_serve_answers_to_its_alias(smollm2_path):
    server = subprocess.Popen([sys.executable, "-m", "edgespec", "serve", "-m", str(smollm2_path),
                               "--alias", "local", "--port", "0", "-c", "1024", "--cache-disk", "0"],
                              stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in server.stderr:
            if (match := re.search(r"serving local on (http://\S+)", line)):
                url = match.group(1)
                break
        assert url, "the server did not say where it serves"
        models = httpx.get(url + "/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["local"]
        reply = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "local", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert reply.status_code == 200 and reply.json()["model"] == "local"
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0


# -- what is refused ---------------------------------------------------------------------


def refused(capsys, *args) -> tuple[int, list[str]]:
    """``edgespec ARGS`` in this process (each of these is refused before a model
    loads): its exit status and the lines it wrote to stderr."""
    from edgespec.cli.main import main
    try:
        status = main([str(a) for a in args])
    except SystemExit as exit:  # (argparse's usage errors)
        status = exit.code
    return status, capsys.readouterr().err.strip().splitlines()


def test_draft_n_as_llama_cpp_means_it_is_refused_naming_both_meanings():
    result = edgespec("generate", "-m", "model.gguf", "-p", "hi", "--draft", "4")
    assert result.returncode == 2
    assert_one_line_error(result, "--draft-max 4", "-md")


@pytest.mark.parametrize("args, fragment", [
    (("-ctk", "q3"), "-ctk"),
    (("--chat-template", "nonesuch"), "unknown chat template"),
    (("--json-schema", "{bad"), "--json-schema is not valid JSON"),
    (("--grammar", "root ::= (", ), "--grammar"),
    (("--repeat-penalty", "0"), "--repeat-penalty"),
    (("--grammar", 'root ::= "a"', "--json-schema", "{}"), "use one"),
])
def test_bad_flag_values_get_one_line_naming_them(smollm2_path, capsys, args, fragment):
    status, lines = refused(capsys, "generate", "-m", smollm2_path, "-p", "hi", "-n", 1, "--cache-disk", 0, *args)
    assert status == 1 and len(lines) == 1 and fragment in lines[0], lines


@pytest.mark.parametrize("args, fragment", [
    (("--raw", "-sys", "x"), "--raw sends the prompt as is"),
    (("--no-spec", "-d", "lookup"), "--no-spec decodes plainly"),
    (("--no-spec", "-d", "none", "--draft-min", "2"), "there is none"),
    (("-d", "none", "--draft-max", "3"), "there is none"),
    (("--draft-p-min", "0.5", "-td", "3"), "--draft-p-min, -td set the draft model"),
    (("-ctk", "q8_0", "-ctv", "q8_0", "-fa", "off"), "needs flash attention: use -fa on or auto"),
    (("-n", "0"), "invalid -n 0"),
    (("--temp", "-1"), "invalid --temp -1.0"),
    (("-s", "-2"), "invalid -s -2"),
])
def test_flags_that_cannot_all_hold_are_refused_not_ignored(smollm2_path, capsys, args, fragment):
    status, lines = refused(capsys, "generate", "-m", smollm2_path, "-p", "hi", "--cache-disk", 0, *args)
    assert status == 1 and len(lines) == 1 and fragment in lines[0], lines


@pytest.mark.parametrize("command, glued", [
    ("generate", "-mli"), ("serve", "-n"), ("serve", "-sys"), ("verify", "-n"), ("bench", "-md"),
])
def test_a_flag_a_command_lacks_is_not_read_as_another(capsys, command, glued):
    # argparse would read -mli as -m li, -n as a prefix of -ngl, -sys as -s ys.
    needed = {"generate": ["-p", "hi"], "bench": ["-d", "lookup"]}.get(command, [])
    status, lines = refused(capsys, command, "-m", "model.gguf", *needed, glued, "10")
    assert status == 2
    assert lines == [f"edgespec: error: unrecognized arguments: {glued} 10 (see `edgespec {command} --help`)"]


def test_llama_cpp_minus_one_values_mean_what_they_mean_there(smollm2_path):
    # -n -1: until the context is full (or an end token); -s -1: a new seed; --repeat-last-n
    # -1: the whole context.
    out = generate(smollm2_path, "-p", "Say hi.", "-c", 256, "-n", -1, "-s", -1, "--repeat-last-n", -1,
                   "--repeat-penalty", 1.1)
    assert out["finish_reason"] in ("stop", "length") and out["text"].strip()


def test_exact_kernels_refuse_a_cache_type_they_cannot_keep(smollm2_path):
    result = edgespec("generate", "-m", smollm2_path, "-p", "hi", "-n", 1, "--kernels", "exact",
                      "-ctk", "f16", "--cache-disk", 0)
    assert result.returncode == 1 and "-ctk f16 cannot run on exact kernels" in result.stderr


def test_llama_cpp_batch_and_cache_flags_are_refused_on_mlx(smollm2_path):
    from edgespec.errors import EdgespecError
    from edgespec.models.loading import BackendOptions, load_backend
    with pytest.raises(EdgespecError, match="-ub, -ctk set llama.cpp's batch and cache"):
        load_backend(str(smollm2_path), BackendOptions(backend="mlx", n_ubatch=256, type_k="q8_0"))


# -- help ------------------------------------------------------------------------------


def commands(parser=None, prefix=()):
    """Every (sub)command's parser, by its words: ("generate",), ("pair", "check"), ..."""
    import argparse
    parser = parser or make_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from commands(sub, (*prefix, name))


def test_every_option_has_help_and_shows_its_default():
    import argparse
    seen = 0
    for words, parser in commands():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            seen += 1
            assert action.help, f"{' '.join(words)} {action.option_strings or action.dest}: no help"
            block = formatter._format_action(action)
            if action.option_strings and action.default is not None and \
                    not isinstance(action.default, bool) and action.default != []:
                assert "default" in block, f"{' '.join(words)}: {block}"
    assert seen > 150


def test_every_command_reads_each_option_it_lists():
    source = "\n".join(p.read_text() for p in (ROOT / "edgespec" / "cli").glob("*.py"))
    for words, parser in commands():
        for action in parser._actions:
            if action.dest in ("help", "command", "pair_command", "models_command") or \
                    not (action.option_strings or action.dest):
                continue
            assert re.search(rf"args\.{action.dest}\b", source), \
                f"{' '.join(words)} lists {action.dest}, which no command reads"


def test_verify_lists_no_sampling_drafting_or_cache_option():
    verify = dict(commands())[("verify",)]
    listed = {s for a in verify._actions for s in a.option_strings}
    for flag in ("--temp", "--top-k", "--top-p", "--min-p", "-s", "--seed", "--num-draft",
                 "--draft-max", "--draft-min", "--draft-p-min", "--no-spec", "--cache-ram", "--typical"):
        assert flag not in listed
    assert {"-m", "-d", "-md", "-c", "-t", "-ngl", "--samples"} <= listed


def test_old_spellings_still_parse_as_the_new():
    parse = make_parser().parse_args
    old = parse(["generate", "-m", "m", "-p", "p", "--ctx", "512", "--num-draft", "3", "--system", "s",
                 "--threads", "2", "--max-tokens", "5", "--flash-attn", "off"])
    new = parse(["generate", "-m", "m", "-p", "p", "-c", "512", "--draft-max", "3", "-sys", "s",
                 "-t", "2", "-n", "5", "-fa", "off"])
    assert vars(old) == vars(new)
    bench = parse(["bench", "--target", "t", "--drafters", "a,b", "--num-draft", "2"])
    assert (bench.model, bench.drafters, bench.num_draft) == ("t", "a,b", "2")


# -- one near-tie figure ---------------------------------------------------------------


def test_the_docs_give_one_near_tie_figure_and_the_tests_allow_it():
    import greedy
    assert greedy.NEAR_TIE == NEAR_TIE
    for doc in ("README.md", "docs/design.md", "docs/exactness.md"):
        prose = re.sub(r"```.*?```", "", (ROOT / doc).read_text(), flags=re.S)
        figures = [float(f) for f in re.findall(r"top-2 logit gap under (\d+(?:\.\d+)?)", prose)]
        assert figures and set(figures) == {NEAR_TIE}, (doc, figures)


def test_readme_has_its_limits_within_its_line_budget():
    readme = (ROOT / "README.md").read_text()
    assert "## Limits" in readme and len(readme.splitlines()) <= 150
    assert "Apache License" in (ROOT / "LICENSE").read_text()
