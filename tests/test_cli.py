"""The command line on real models: output, --json, and one-line errors for bad input."""

import argparse
import json
import subprocess
import sys

import pytest

from edgespec.backends.llama_lib import gpu_offload_supported
from edgespec.cli.options import on_accelerator
from edgespec.models.arguments import on_apple_silicon


def edgespec(*args, env=None):
    return subprocess.run([sys.executable, "-m", "edgespec", *map(str, args)],
                          capture_output=True, text=True, timeout=600, env=env)


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edgespec: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_generate_json_has_text_tokens_and_stats(smollm2_path):
    result = edgespec("generate", "-m", smollm2_path, "-d", "lookup", "-p", "Count from 1 to 20.",
                      "--temp", "0", "-n", "24", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"text", "token_ids", "from_draft", "finish_reason", "stats"}
    assert len(out["token_ids"]) == len(out["from_draft"]) == out["stats"]["generated_tokens"] == 24
    assert out["finish_reason"] == "length" and out["text"]
    for name in ("rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted_length",
                 "accepted_per_position", "draft_time_s", "verify_time_s", "tokens_per_second"):
        assert name in out["stats"]
    plain = json.loads(edgespec("generate", "-m", smollm2_path, "--no-spec", "-p",
                                "Count from 1 to 20.", "--temp", "0", "-n", "24", "--json").stdout)
    assert plain["token_ids"] == out["token_ids"]


def test_missing_path(tmp_path):
    assert_one_line_error(edgespec("generate", "-m", tmp_path / "nope.gguf", "-p", "hi"),
                          "model file not found", "nope.gguf")


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("hello, I am text")
    assert_one_line_error(edgespec("generate", "-m", bogus, "-p", "hi"),
                          "is not a GGUF file", "pass a .gguf model file")


def test_truncated_gguf(tmp_path, tiny_gguf_pair):
    data = tiny_gguf_pair[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    assert_one_line_error(edgespec("generate", "-m", cut, "-p", "hi"),
                          "truncated or corrupt", "download it again")


def test_drafter_of_another_vocabulary(smollm2_path, tiny_gguf_pair):
    assert_one_line_error(edgespec("generate", "-m", smollm2_path, "-d", tiny_gguf_pair[1],
                                   "-p", "hi"),
                          "cannot pair", "draft vocab 16 != target vocab 49152",
                          "same model family")


def test_prompt_longer_than_the_context(smollm2_path):
    assert_one_line_error(edgespec("generate", "-m", smollm2_path, "--ctx", "256",
                                   "-p", "word " * 400),
                          "the context holds 256", "raise --ctx")


def test_unknown_model_name():
    assert_one_line_error(edgespec("generate", "-m", "llama-9000", "-p", "hi"),
                          "unknown model name 'llama-9000'", "smollm2-135m-instruct")


@pytest.mark.parametrize("flag, value, field", [
    ("--temp", "-1", "invalid --temp"), ("--top-p", "0", "invalid --top-p"), ("--min-p", "2", "invalid --min-p"),
    ("--num-draft", "0", "num-draft"),
])
def test_invalid_sampling_values(smollm2_path, flag, value, field):
    assert_one_line_error(edgespec("generate", "-m", smollm2_path, "-p", "hi", flag, value), field)


def test_pair_check_lists_reasons_or_says_compatible(smollm2_path, smollm2_q2k_path, tiny_gguf_pair):
    ok = edgespec("pair", "check", smollm2_path, smollm2_q2k_path)
    assert ok.returncode == 0 and ok.stdout.startswith("compatible:")
    bad = edgespec("pair", "check", smollm2_path, tiny_gguf_pair[1])
    assert bad.returncode == 1
    reasons = [line for line in bad.stdout.splitlines() if line.startswith("  - ")]
    assert len(reasons) >= 3  # vocabulary type, size, token text (and special tokens)
    assert any("token text differs" in r for r in reasons)


def test_models_list_shows_known_models():
    result = edgespec("models", "list")
    assert result.returncode == 0
    for name in ("smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
        assert name in result.stdout


def test_info_reports_what_each_backend_can_do_here():
    result = edgespec("info")
    assert result.returncode == 0, result.stderr
    lines = {line.strip().split("  ")[0]: line for line in result.stdout.splitlines()}
    assert "loads (llama-cpp-python" in lines["llama.cpp"]
    assert lines["GPU offload (-ngl)"] and lines["default threads"] and lines["weight repacking"]
    assert "MLX" in lines and "default device" in lines


def test_draft_model_threads_are_its_own(smollm2_path):
    from edgespec import load
    engine = load(smollm2_path, smollm2_path, n_threads=2, draft_n_threads=1, num_draft=2)
    try:
        assert engine.target.n_threads == 2 and engine.drafter.backend.n_threads == 1
    finally:
        engine.close()
    assert_one_line_error(edgespec("generate", "-m", smollm2_path, "-d", smollm2_path, "-p", "hi",
                                   "--threads-draft", "0"), "invalid -td 0")


def test_bench_output_into_a_missing_folder_fails_before_the_sweep(tmp_path):
    """A --json (--csv, --plot) path that cannot be written is reported at once,
    not after a sweep of tens of minutes."""
    missing = tmp_path / "no-such-folder" / "bench.json"
    result = edgespec("bench", "--target", "qwen2.5-coder-1.5b-instruct", "--drafters", "lookup",
                      "--json", missing)
    assert_one_line_error(result, "--json", "does not exist")


def test_ngl_on_a_build_without_gpu_offload_says_so_and_adds_no_draft_model(smollm2_path):
    if gpu_offload_supported():
        pytest.skip("this llama-cpp-python build offloads to a GPU")
    result = edgespec("generate", "-m", smollm2_path, "-ngl", "99", "-p", "Hi", "-n", "4", "--temp", "0")
    assert result.returncode == 0, result.stderr
    assert "cannot offload to a GPU" in result.stderr and "docs/gpu.md" in result.stderr
    # The default pairing adds its draft model only where the target really is on a GPU:
    # llama.cpp offloading, or MLX on Apple Silicon (elsewhere MLX runs on the CPU).
    args = argparse.Namespace(model=str(smollm2_path), backend="auto", n_gpu_layers=99)
    assert not on_accelerator(args)
    mlx_args = argparse.Namespace(model=str(smollm2_path), backend="mlx", n_gpu_layers=0)
    assert on_accelerator(mlx_args) == on_apple_silicon()


def test_version_names_edgespec_and_the_packages_that_run_models():
    from importlib.metadata import version

    from edgespec import __version__
    out = edgespec("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(f"edgespec {__version__} (")
    assert f"llama-cpp-python {version('llama-cpp-python')}" in out.stdout and "mlx " in out.stdout
