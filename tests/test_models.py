"""Fetching models offline: from a local Hugging Face cache and from local wheels."""

import hashlib
import json
import subprocess
import sys
import zipfile

import pytest

from edgespec import EdgespecError
from edgespec.models import fetch_model, manifests, resolve_model

PAYLOAD = b"GGUF" + bytes(range(256)) * 40  # stands in for a model file


@pytest.fixture
def catalogue(tmp_path, monkeypatch):
    """A private manifest folder, EDGESPEC_HOME and Hugging Face cache under tmp_path."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "manifests"
    folder.mkdir()
    monkeypatch.setenv("EDGESPEC_MODELS_DIR", str(folder))

    def add(name, *, hub=None, pypi=(), sha256=None):
        manifest = {"name": name, "description": "test payload", "file": f"{name}.gguf",
                    "size": len(PAYLOAD), "sha256": sha256 or hashlib.sha256(PAYLOAD).hexdigest(),
                    "hub": hub, "pypi": list(pypi)}
        (folder / f"{name}.json").write_text(json.dumps(manifest))
    return add


def put_in_hub_cache(tmp_path, repo, filename, data):
    """Lay out a file as huggingface-hub's cache stores it."""
    revision = "0" * 40
    root = tmp_path / "hf" / f"models--{repo.replace('/', '--')}"
    (root / "snapshots" / revision).mkdir(parents=True)
    (root / "snapshots" / revision / filename).write_bytes(data)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(revision)


def make_wheel(folder, package, version, member, data):
    """A minimal wheel carrying ``data`` at ``member``, as the PyPI weight packages do."""
    dist = package.replace("-", "_")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(member, data)
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_fetch_from_the_local_hub_cache_needs_no_network(tmp_path, catalogue):
    catalogue("hubbed", hub={"repo": "someone/tiny-GGUF", "filename": "tiny.gguf"})
    put_in_hub_cache(tmp_path, "someone/tiny-GGUF", "tiny.gguf", PAYLOAD)
    path = fetch_model("hubbed", log=lambda m: None)
    assert path.read_bytes() == PAYLOAD
    assert manifests()["hubbed"].is_present()
    assert resolve_model("hubbed") == path


def test_fetch_from_wheels_concatenates_parts_in_order(tmp_path, catalogue, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    half = len(PAYLOAD) // 2
    parts = []
    for i, chunk in enumerate((PAYLOAD[:half], PAYLOAD[half:]), 1):
        member = f"tiny_part{i}/data/part{i:02d}.bin"
        make_wheel(wheels, f"tiny-part{i}", "1.0", member, chunk)
        parts.append({"package": f"tiny-part{i}", "version": "1.0", "member": member})
    catalogue("split", pypi=parts)
    monkeypatch.setenv("EDGESPEC_PIP_ARGS", f"--no-index --find-links {wheels}")
    messages = []
    path = fetch_model("split", log=messages.append)
    assert path.read_bytes() == PAYLOAD
    assert any("[2/2]" in m for m in messages)
    # Idempotent: a second fetch finds it verified and downloads nothing.
    messages.clear()
    assert fetch_model("split", log=messages.append) == path
    assert messages == ["split: already present"]


def test_checksum_mismatch_is_refused(tmp_path, catalogue):
    catalogue("corrupt", hub={"repo": "someone/bad", "filename": "bad.gguf"}, sha256="0" * 64)
    put_in_hub_cache(tmp_path, "someone/bad", "bad.gguf", PAYLOAD)
    with pytest.raises(EdgespecError, match="does not match the manifest"):
        fetch_model("corrupt", log=lambda m: None)
    assert not manifests()["corrupt"].path.exists()


def test_missing_model_says_how_to_fetch(catalogue):
    catalogue("absent", hub={"repo": "someone/absent", "filename": "x.gguf"})
    with pytest.raises(EdgespecError, match="edgespec models fetch absent"):
        resolve_model("absent")


def test_cli_fetch_prints_the_path_last(tmp_path, catalogue):
    catalogue("hubbed", hub={"repo": "someone/tiny-GGUF", "filename": "tiny.gguf"})
    put_in_hub_cache(tmp_path, "someone/tiny-GGUF", "tiny.gguf", PAYLOAD)
    result = subprocess.run([sys.executable, "-m", "edgespec", "models", "fetch", "hubbed"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].endswith("hubbed/hubbed.gguf")
