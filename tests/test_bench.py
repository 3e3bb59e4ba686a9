"""`edgespec quantize` and `edgespec bench` on tiny GGUF models written by the tests."""

import json
import subprocess
import sys

import gguf
import pytest

from edgespec import EdgespecError
from edgespec.bench import BenchConfig, recommend, run_bench, write_csv, write_json, write_plot
from edgespec.loading import BackendOptions
from edgespec.quantize import quantize_gguf
from ggufs import perturbed, tiny_llama_weights, write_tiny_llama_gguf


@pytest.fixture(scope="module")
def text_models(tmp_path_factory):
    """Tiny target and drafter whose vocabulary has byte tokens, so any text tokenizes."""
    folder = tmp_path_factory.mktemp("bench-models")
    weights = tiny_llama_weights(seed=7, vocab_size=300, n_embd=64, n_ff=128)
    target = write_tiny_llama_gguf(folder / "target.gguf", weights, byte_tokens=True, context_length=2048)
    draft = write_tiny_llama_gguf(folder / "draft.gguf", perturbed(weights, scale=0.2, seed=8),
                                  byte_tokens=True, context_length=2048)
    return target, draft


def tensor_types(path):
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0"])
def test_quantize_writes_a_loadable_gguf_of_that_type(text_models, tmp_path, type_name):
    out = quantize_gguf(text_models[0], tmp_path / f"t-{type_name}.gguf", type_name)
    types = tensor_types(out)
    assert types["blk.0.ffn_up.weight"] == type_name
    assert out.stat().st_size < text_models[0].stat().st_size
    from edgespec.backends.llamacpp import LlamaCppBackend
    assert LlamaCppBackend(out, n_ctx=64).forward([1, 5, 9]).shape == (3, 300)


def test_quantize_cli_errors_and_progress(text_models, tmp_path):
    bad = subprocess.run([sys.executable, "-m", "edgespec", "quantize", str(text_models[0]),
                          str(tmp_path / "x.gguf"), "--type", "Q9_9"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown quantization type 'Q9_9'" in bad.stderr
    assert "Traceback" not in bad.stderr
    ok = subprocess.run([sys.executable, "-m", "edgespec", "quantize", str(text_models[0]),
                         str(tmp_path / "q.gguf"), "--type", "q8_0"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("q.gguf")


def test_sweep_on_tiny_models_and_its_json_schema(text_models, tmp_path):
    target, draft = text_models
    config = BenchConfig(target=str(target), drafters=[str(draft), "lookup"], num_draft=[1, 3],
                         temperatures=[0.0, 0.7], prompt_sets=["code", "edit"], prompts_per_set=2,
                         max_tokens=24)
    seen = []
    result = run_bench(config, BackendOptions(n_ctx=2048), progress=lambda d, t, r: seen.append((d, t)),
                       log=lambda m: None)
    # plain + 2 drafters x 2 k + auto, per prompt (2 sets x 2 prompts) and temperature (2).
    runs = result["runs"]
    assert len(runs) == 8 * (1 + 4 + 1) == seen[-1][0] == seen[-1][1]
    assert {r["mode"] for r in runs} == {"plain", "fixed", "auto"}
    for r in runs:
        plain = next(p for p in runs if p["mode"] == "plain" and p["prompt_set"] == r["prompt_set"]
                     and p["prompt_index"] == r["prompt_index"] and p["temperature"] == r["temperature"])
        assert r["plain_tokens_per_second"] == plain["tokens_per_second"]
        assert r["speedup"] == pytest.approx(r["tokens_per_second"] / plain["tokens_per_second"])
    json_path, csv_path, png = tmp_path / "b.json", tmp_path / "b.csv", tmp_path / "b.png"
    write_json(result, json_path)
    write_csv(result, csv_path)
    write_plot(result, png)
    data = json.loads(json_path.read_text())
    assert data["schema_version"] == 1
    assert set(data) >= {"machine", "target", "config", "costs", "drafter_memory_bytes", "runs",
                         "summary", "recommendation"}
    assert set(data["costs"]) == {"v", "c", "target_step_seconds"}
    assert data["costs"]["v"]["1"] == pytest.approx(1.0) and draft.stem in data["costs"]["c"]
    row_keys = {"mode", "drafter", "num_draft", "temperature", "prompt_set", "runs", "acceptance_rate",
                "mean_accepted_length", "acceptance_per_position", "tokens_per_second",
                "speedup_median", "speedup_min", "speedup_max", "drafter_memory_bytes"}
    assert all(set(row) == row_keys for row in data["summary"])
    # 2 sets x 2 temperatures x (plain + 4 fixed + 1 auto) rows.
    assert len(data["summary"]) == 4 * 6
    assert data["drafter_memory_bytes"][draft.stem] > 0
    assert csv_path.read_text().splitlines()[0].startswith("mode,drafter,num_draft")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert data["recommendation"]["mode"] in ("plain", "fixed", "auto")


def test_recommendation_picks_the_best_geometric_mean():
    rows = [{"mode": "fixed", "drafter": "a", "num_draft": 2, "speedup_median": s} for s in (1.6, 0.7)] + \
           [{"mode": "fixed", "drafter": "b", "num_draft": 4, "speedup_median": s} for s in (1.2, 1.1)]
    assert recommend(rows)["drafter"] == "b"
    assert recommend([{"mode": "fixed", "drafter": "a", "num_draft": 2, "speedup_median": 0.8}])["mode"] == "plain"


@pytest.mark.parametrize("args, message", [
    (["--drafters", "nope.gguf"], "model file not found"),
    (["--drafters", "llama-9000"], "unknown model name"),
    (["--prompts", "EMPTY"], "has no prompts"),
    (["--drafters", "SMOL"], "cannot pair"),
])
def test_bad_bench_input_fails_before_loading_models(text_models, tmp_path, smollm2_path, args, message):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    args = [str(empty) if a == "EMPTY" else str(smollm2_path) if a == "SMOL" else a for a in args]
    base = {"--drafters": "lookup", "--prompts": "code"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    command = [sys.executable, "-m", "edgespec", "bench", "--target", str(text_models[0])]
    for flag, value in base.items():
        command += [flag, value]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert message in result.stderr
    assert "measuring" not in result.stderr  # nothing was loaded or calibrated


def test_saved_profile_is_used_by_generate(text_models, tmp_path, monkeypatch):
    from edgespec.bench import load_profile, save_profile
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    target, draft = map(str, text_models)
    result = {"target": target, "recommendation": {"mode": "fixed", "drafter": draft,
                                                   "num_draft": 3, "speedup": 1.3}}
    save_profile(result, BackendOptions())
    assert load_profile(target)["draft"] == draft
    out = subprocess.run([sys.executable, "-m", "edgespec", "generate", "-m", target, "-p", "hi",
                          "--raw", "-n", "8", "--temp", "0", "--ctx", "256", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"saved profile: drafter {draft}, k=3" in out.stderr
    assert json.loads(out.stdout)["stats"]["drafter"] == "draft"
