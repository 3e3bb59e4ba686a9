"""`edgespec quantize` and `edgespec bench` on tiny GGUF models written by the tests."""

import json
import math
import statistics
import subprocess
import sys
from dataclasses import asdict

import gguf
import pytest

from edgespec.measure.bench import BenchConfig, recommend, run_bench, write_csv, write_json, write_plot
from edgespec.core.config import DEFAULT_CONFIG
from edgespec.models.loading import BackendOptions
from edgespec.models.quantize import quantize_gguf
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
    seen, reported = [], []

    def progress(done, total, record):
        seen.append((done, total))
        reported.append(asdict(record))

    result = run_bench(config, BackendOptions(n_ctx=2048), progress=progress, log=lambda m: None)
    model = draft.stem  # a GGUF file's drafter is named by its stem
    runs = result["runs"]
    # plain + 2 drafters x 2 k + auto + plain again, per prompt (2 sets x 2 prompts) and
    # temperature (2).
    assert len(runs) == 8 * (1 + 4 + 1 + 1)
    assert seen == [(i, len(runs)) for i in range(1, len(runs) + 1)]
    # Progress saw every run, in order (before the base that needs the last plain run).
    what = ("mode", "drafter", "num_draft", "prompt_set", "prompt_index", "temperature", "tokens")
    assert [tuple(r[f] for f in what) for r in reported] == [tuple(r[f] for f in what) for r in runs]

    prompts = {(s, i, t) for s in ("code", "edit") for i in range(2) for t in (0.0, 0.7)}
    expected_fixed = {("fixed", name, k) for name in (model, "lookup") for k in (1, 3)}
    # Each prompt's runs are consecutive, between two plain runs: the speedups are side by side.
    groups = [runs[i:i + 7] for i in range(0, len(runs), 7)]
    assert {(g[0]["prompt_set"], g[0]["prompt_index"], g[0]["temperature"]) for g in groups} == prompts
    for group in groups:
        plain, after = group[0], group[-1]
        key = (plain["prompt_set"], plain["prompt_index"], plain["temperature"], plain["repeat"])
        assert all((r["prompt_set"], r["prompt_index"], r["temperature"], r["repeat"]) == key
                   for r in group)
        assert plain["mode"] == after["mode"] == "plain"
        assert plain["drafter"] == after["drafter"] == "none"
        assert plain["num_draft"] == after["num_draft"] == 0
        assert {(r["mode"], r["drafter"], r["num_draft"]) for r in group[1:-1]
                if r["mode"] == "fixed"} == expected_fixed
        autos = [r for r in group if r["mode"] == "auto"]
        assert len(autos) == 1 and autos[0]["num_draft"] == 0
        # Auto mode drafts with prompt lookup and the (first) draft model.
        assert model in autos[0]["drafter"] and "lookup" in autos[0]["drafter"]
        assert plain["tokens_per_second"] > 0 and after["tokens_per_second"] > 0
        for r in group:
            # Every mode's base is this prompt's own plain runs (the fastest mode of a
            # group and the slowest bound it), never another prompt's.
            assert r["plain_tokens_per_second"] == group[1]["plain_tokens_per_second"]
            assert min(plain["tokens_per_second"], after["tokens_per_second"]) \
                <= r["plain_tokens_per_second"] <= max(plain["tokens_per_second"], after["tokens_per_second"])
            # One target pass per round or plain step, each committing one token more than
            # it accepted: fewer passes than tokens exactly where drafts were accepted.
            assert r["rounds"] + r["plain_steps"] + r["accepted"] in (r["tokens"], r["tokens"] + 1)
            assert r["tokens"] <= config.max_tokens
            assert r["drafted"] == sum(r["drafted_per_position"])
            assert r["accepted"] == sum(r["accepted_per_position"]) <= r["drafted"]
            assert all(a <= d for a, d in zip(r["accepted_per_position"], r["drafted_per_position"]))
            assert sum(r["rounds_per_drafter"].values()) == r["rounds"]
            if plain["temperature"] == 0.0:
                # Greedy speculative decoding is exact: every mode writes plain's tokens.
                assert r["tokens"] == plain["tokens"], r
        # Plain decoding: one target step per token (and one for an end token), no rounds.
        assert (plain["speedup"] + after["speedup"]) / 2 == pytest.approx(1.0)
        for p in (plain, after):
            assert p["rounds"] == p["drafted"] == p["accepted"] == 0
            assert p["drafted_per_position"] == p["accepted_per_position"] == []
            assert p["rounds_per_drafter"] == {}
            assert p["tokens"] <= p["plain_steps"] <= p["tokens"] + 1
        for r in group:
            if r["mode"] != "fixed":
                continue
            k = r["num_draft"]
            # Never more than k drafts a round, and only by the drafter configured.
            assert len(r["drafted_per_position"]) <= k
            assert set(r["rounds_per_drafter"]) <= {r["drafter"]}
            if r["drafter"] == model:
                # A draft model with a fixed k has no confidence stop: it drafts in every
                # round, k tokens in the first (fewer only where max_tokens is near).
                assert r["rounds"] >= 1 and r["rounds_per_drafter"] == {model: r["rounds"]}
                assert len(r["drafted_per_position"]) == k
                assert r["drafted_per_position"][0] == r["rounds"]

    json_path, csv_path, png = tmp_path / "b.json", tmp_path / "b.csv", tmp_path / "b.png"
    write_json(result, json_path)
    write_csv(result, csv_path)
    write_plot(result, png)
    data = json.loads(json_path.read_text())
    assert data["schema_version"] == 1
    assert set(data) >= {"machine", "target", "config", "costs", "drafter_memory_bytes", "runs",
                         "summary", "recommendation"}
    assert data["runs"] == runs and data["config"]["num_draft"] == [1, 3]
    assert set(data["costs"]) == {"v", "c", "target_step_seconds"}
    # v(n) is measured for n = 1, every fixed k's pass, and each size auto mode's cached
    # calibration holds: auto mode starts here from the prior it has in `edgespec generate`.
    assert set(data["costs"]["v"]) >= {"1", "2", "4"} | {str(n) for n in DEFAULT_CONFIG.calibration_sizes}
    assert data["costs"]["v"]["1"] == pytest.approx(1.0) and set(data["costs"]["c"]) == {model}
    row_keys = {"mode", "drafter", "num_draft", "temperature", "sampling", "prompt_set", "runs", "acceptance_rate",
                "mean_accepted_length", "acceptance_per_position", "tokens_per_second",
                "speedup_geomean", "speedup_median", "speedup_min", "speedup_max", "drafter_memory_bytes"}
    assert all(set(row) == row_keys for row in data["summary"])
    # 2 sets x 2 temperatures x (plain + 4 fixed + 1 auto) rows, each over the set's 2 prompts.
    assert len(data["summary"]) == 4 * 6
    auto_name = next(r["drafter"] for r in runs if r["mode"] == "auto")
    for set_name in ("code", "edit"):
        for temperature in (0.0, 0.7):
            rows = [row for row in data["summary"]
                    if row["prompt_set"] == set_name and row["temperature"] == temperature]
            assert {(row["mode"], row["drafter"], row["num_draft"]) for row in rows} == \
                {("plain", "none", 0), ("auto", auto_name, 0)} | expected_fixed
            for row in rows:
                assert row["runs"] == (4 if row["mode"] == "plain" else 2)  # 2 prompts
                mine = [r for r in runs if (r["mode"], r["drafter"], r["num_draft"], r["prompt_set"],
                                            r["temperature"]) == (row["mode"], row["drafter"],
                                                                  row["num_draft"], set_name, temperature)]
                assert row["speedup_min"] == min(r["speedup"] for r in mine)
                assert row["speedup_max"] == max(r["speedup"] for r in mine)
                speedups = sorted(r["speedup"] for r in mine)
                assert row["speedup_median"] == pytest.approx(statistics.median(speedups))
                assert row["speedup_geomean"] == pytest.approx(
                    math.exp(statistics.fmean(math.log(x) for x in speedups)))
                assert speedups[0] <= row["speedup_geomean"] <= speedups[-1]
                if row["mode"] == "plain":
                    assert row["speedup_min"] <= 1.0 <= row["speedup_max"]
                    assert row["acceptance_rate"] == 0.0 and row["mean_accepted_length"] == 1.0
                    assert row["acceptance_per_position"] == []
                if row["mode"] == "fixed":
                    assert len(row["acceptance_per_position"]) <= row["num_draft"]
                    assert row["drafter_memory_bytes"] == (0 if row["drafter"] == "lookup"
                                                           else data["drafter_memory_bytes"][model])
    assert data["drafter_memory_bytes"] == {model: data["drafter_memory_bytes"][model], "lookup": 0}
    assert data["drafter_memory_bytes"][model] > 0
    assert csv_path.read_text().splitlines()[0].startswith("mode,drafter,num_draft")
    assert len(csv_path.read_text().splitlines()) == 1 + len(data["summary"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # The recommendation is the best of what was measured (which one depends on this
    # machine's timings): no setting's runs, over every set and temperature, have a
    # better geometric mean than the recommended one's (or plain decoding's 1, where it
    # recommends plain decoding).
    rec = data["recommendation"]
    by_setting: dict[tuple, list[float]] = {}
    for r in runs:
        if r["mode"] != "plain":
            name = auto_name if r["mode"] == "auto" else r["drafter"]
            by_setting.setdefault((r["mode"], name, r["num_draft"]), []).append(r["speedup"])
    best = max(statistics.geometric_mean(v) for v in by_setting.values())
    if rec["mode"] == "plain":
        assert best <= 1.0
    else:
        chosen = (rec["mode"], auto_name, 0) if rec["mode"] == "auto" else \
            ("fixed", rec["drafter"], rec["num_draft"])
        assert statistics.geometric_mean(by_setting[chosen]) == pytest.approx(best)
    if rec["mode"] == "fixed":
        assert (rec["drafter"], rec["num_draft"]) in {(name, k) for _, name, k in expected_fixed}
        assert rec["speedup"] > 1.0
    elif rec["mode"] == "auto":
        assert rec["drafter"] in (model, "lookup") and rec["num_draft"] == "auto"
        assert rec["speedup"] > 1.0
    else:
        assert rec["mode"] == "plain" and rec["speedup"] == 1.0


def test_recommendation_picks_the_best_geometric_mean():
    rows = [{"mode": "fixed", "drafter": "a", "num_draft": 2, "speedup_geomean": s} for s in (1.6, 0.7)] + \
           [{"mode": "fixed", "drafter": "b", "num_draft": 4, "speedup_geomean": s} for s in (1.2, 1.1)]
    assert recommend(rows)["drafter"] == "b"
    assert recommend([{"mode": "fixed", "drafter": "a", "num_draft": 2, "speedup_geomean": 0.8}])["mode"] == "plain"


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
    from edgespec.measure.profiles import load_profile, save_profile
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    target, draft = map(str, text_models)
    save_profile(target, {"mode": "fixed", "drafter": draft, "num_draft": 3, "speedup": 1.3})
    assert load_profile(target)["draft"] == draft
    out = subprocess.run([sys.executable, "-m", "edgespec", "generate", "-m", target, "-p", "hi",
                          "--raw", "-n", "8", "--temp", "0", "--ctx", "256", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"saved profile: drafter {draft}, k=3" in out.stderr
    assert json.loads(out.stdout)["stats"]["drafter"] == "draft"


def test_conversations_are_measured_turn_by_turn(text_models, tmp_path):
    target, _ = text_models
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps([["Write a haiku.", "Now repeat it twice."],
                                 ["Say hi.", "Say hi again.", "And once more."]]))
    config = BenchConfig(target=str(target), drafters=["suffix"], num_draft=[2], temperatures=[0.0],
                         prompt_sets=[str(chats)], prompts_per_set=2, max_tokens=16)
    runs = run_bench(config, BackendOptions(n_ctx=2048), log=lambda m: None)["runs"]
    assert len(runs) == (2 + 3) * 4  # per turn: plain, suffix k=2, auto, plain
    by_turn = {}
    for r in runs:
        by_turn.setdefault((r["prompt_index"], r["turn"]), []).append(r)
    assert sorted(by_turn) == [(0, 1), (0, 2), (1, 1), (1, 2), (1, 3)]
    for (index, turn), group in by_turn.items():
        assert [r["mode"] for r in group] == ["plain", "fixed", "auto", "plain"]
        assert {r["prompt_set"] for r in group} == {str(chats) if turn == 1 else f"{chats}@2+"}
        assert len({r["plain_tokens_per_second"] for r in group}) == 1  # one base per turn
        assert len({r["tokens"] for r in group}) == 1  # greedy: every mode writes the same reply
