"""llama.cpp's own tools, built from the sources vendored in llama-cpp-python's sdist.

Benchmarks compare edgespec side by side with ``llama-bench`` (plain decoding
speed) and ``llama-speculative-simple`` (llama.cpp's draft-model and n-gram
speculation)
built from the *same* llama.cpp that edgespec runs through llama-cpp-python.
The build is cached in ``$EDGESPEC_HOME/llama.cpp-reference/<version>``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgespec.paths import edgespec_home

TOOLS = ("llama-bench", "llama-speculative-simple", "llama-lookup")


def llama_cpp_python_version() -> str:
    import llama_cpp
    return llama_cpp.__version__


def reference_bin_dir() -> Path:
    return edgespec_home() / "llama.cpp-reference" / llama_cpp_python_version() / "build" / "bin"


def build_reference(log=print) -> Path:
    """Build the llama.cpp tools once (about 6 minutes on 2 cores); return their folder."""
    bin_dir = reference_bin_dir()
    if all((bin_dir / tool).exists() for tool in TOOLS):
        return bin_dir
    log("building llama-bench, llama-speculative-simple, llama-lookup (cmake)")
    _cmake_build(reference_source(log), bin_dir.parent, TOOLS)
    return bin_dir


def rpc_server_path() -> Path:
    """Where :func:`build_rpc_server` puts ``rpc-server``."""
    return reference_bin_dir().parent.parent / "build-rpc" / "bin" / "rpc-server"


def build_rpc_server(log=print) -> Path:
    """Build llama.cpp's ``rpc-server`` (ggml only, RPC on; a few minutes on 2 cores)
    from the llama.cpp llama-cpp-python vendors, so both speak the same protocol;
    return the binary."""
    binary = rpc_server_path()
    if binary.exists():
        return binary
    log("building rpc-server (cmake, -DGGML_RPC=ON)")
    _cmake_build(reference_source(log), binary.parent.parent, ["ggml-rpc-server"],
                 "-DGGML_RPC=ON", "-DLLAMA_BUILD_EXAMPLES=OFF")
    built = next(binary.parent.glob("*rpc-server"))
    if built != binary:
        binary.symlink_to(built.name)  # llama.cpp's docs call it rpc-server
    return binary


def llama_server_path() -> Path:
    """Where :func:`build_llama_server` puts ``llama-server``."""
    return reference_bin_dir().parent.parent / "build-server" / "bin" / "llama-server"


def build_llama_server(log=print) -> Path:
    """Build ``llama-server`` (no web UI) from the llama.cpp llama-cpp-python vendors,
    the peer a user would run instead of ``edgespec serve`` (about 8 minutes on 2
    cores, once); return the binary."""
    binary = llama_server_path()
    if binary.exists():
        return binary
    log("building llama-server (cmake, no web UI)")
    _cmake_build(reference_source(log), binary.parent.parent, ["llama-server"],
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF")
    return binary


def build_llama_bench(log=print) -> Path:
    """Build ``llama-bench`` next to llama-server (the same configuration), for the
    prompt-processing rate llama.cpp itself reaches here; return the binary."""
    server = build_llama_server(log)
    binary = server.parent / "llama-bench"
    if not binary.exists():
        log("building llama-bench")
        _cmake_build(reference_source(log), server.parent.parent, ["llama-bench"],
                     "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF")
    return binary


def _cmake_build(source: Path, build: Path, targets, *flags: str) -> None:
    """Configure a Release build of ``source`` in ``build`` and build ``targets``
    (later ``flags`` win over the defaults here)."""
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", *flags],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2),
                    "--target", *targets], check=True, capture_output=True)


def reference_source(log=print) -> Path:
    """The llama.cpp sources vendored in this llama-cpp-python's sdist (downloaded once)."""
    root = reference_bin_dir().parent.parent
    root.mkdir(parents=True, exist_ok=True)
    version = llama_cpp_python_version()
    source = root / "src"
    if not (source / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory() as tmp:
            log(f"downloading the llama-cpp-python {version} sdist")
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                            ":all:", f"llama-cpp-python=={version}", "-d", tmp, "-q"], check=True)
            sdist = next(Path(tmp).glob("*.tar.gz"))
            with tarfile.open(sdist) as tar:
                tar.extractall(tmp, filter="data")
            vendored = next(Path(tmp).glob("*/vendor/llama.cpp"))
            vendored.rename(source)
    return source


def repack_flag() -> bool:
    """Run the reference with the same weight repacking edgespec uses."""
    from edgespec.backends.repack import use_extra_buffer_types
    return use_extra_buffer_types()


def llama_bench_tg(bin_dir: Path, model: Path, *, threads: int, n_gen: int, repetitions: int = 3) -> float:
    """Token-generation speed (tok/s) that llama-bench measures."""
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads),
                          "-p", "0", "-n", str(n_gen), "-r", str(repetitions),
                          "--repack", "1" if repack_flag() else "0", "-o", "json"],
                         check=True, capture_output=True, text=True)
    results = json.loads(out.stdout)
    return float(results[0]["avg_ts"])


@dataclass
class SpecResult:
    """What llama-speculative-simple reports for one prompt."""

    text: str
    decoded: int
    tokens_per_second: float
    drafted: int
    accepted: int
    prompt_seconds: float = 0.0  # processing the prompt ("encoded ... in ... seconds")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


# llama.cpp's speculation without a draft model, by name: the spec type and its sizes.
# With llama.cpp's defaults, sized for GPUs: ngram-simple continues the last earlier
# occurrence of the context's last 12 tokens with the 48 after it; ngram-map-k drafts
# 48 tokens seen to follow a 12-token key; ngram-mod matches a hashed 24-gram. And the
# two map modes sized like edgespec's lookup (a 4-token key, 8 tokens drafted).
NGRAM_MODES = {
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-simple n4 m8": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
                           "--spec-ngram-simple-size-m", "8"],
    "ngram-map-k n4 m8": ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "4",
                          "--spec-ngram-map-k-size-m", "8"],
}


def speculative_simple(bin_dir: Path, target: Path, draft: Path | None, prompt: str, *, threads: int,
                       num_draft: int, max_tokens: int, n_ctx: int = 4096,
                       spec_type: str = "draft-simple", spec_args: list[str] | None = None,
                       n_gpu_layers: int = 0) -> SpecResult:
    """Run llama.cpp's speculation greedily on one (already templated) prompt: with
    the ``draft`` model (``draft-simple``, up to ``num_draft`` tokens a round), or one
    of the :data:`NGRAM_MODES` by name, or the speculation options ``spec_args`` (no
    draft model; their own draft lengths)."""
    command = [str(bin_dir / "llama-speculative-simple"), "-m", str(target),
               "-t", str(threads), "-c", str(n_ctx), "-b", str(n_ctx), "-p", prompt,
               "-n", str(max_tokens), "--temp", "0", "-ngl", str(n_gpu_layers)]
    if spec_args is not None:
        command += spec_args
    elif spec_type == "draft-simple":
        command += ["--spec-type", "draft-simple", "-md", str(draft), "-td", str(threads),
                    "--spec-draft-n-max", str(num_draft), "--spec-draft-n-min", "0"]
    else:
        command += NGRAM_MODES[spec_type]
    if not repack_flag():
        command.append("--no-repack")
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr

    def number(pattern: str) -> float:
        match = re.search(pattern, log)
        if not match:
            raise RuntimeError(f"llama-speculative-simple printed no {pattern!r}:\n{log[-2000:]}")
        return float(match.group(1))

    decoded = int(number(r"decoded\s+(\d+) tokens"))
    # stdout is "\n\n", the prompt's pieces, the generated text, "\n\n".
    text = out.stdout[2:]
    if text.startswith(prompt):
        text = text[len(prompt):]
    text = text[:-2] if text.endswith("\n\n") else text
    return SpecResult(text=text, decoded=decoded,
                      tokens_per_second=number(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+)"),
                      drafted=int(number(r"n_drafted\s*=\s*(\d+)")),
                      accepted=int(number(r"n_accept\s*=\s*(\d+)")),
                      prompt_seconds=number(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds"))
