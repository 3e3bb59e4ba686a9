"""From a model argument (path, name, Hub id) and options to a running backend."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..core.backend import Backend
from ..drafters import DraftModel
from ..core.draft import Drafter
from ..drafters.registry import drafter_from_name
from ..errors import EdgespecError
from .arguments import BACKENDS, looks_like_hub_id, pick_backend
from .catalog import hub_snapshot, resolve_model


@dataclass
class BackendOptions:
    """How to run a model: the options of ``generate``, ``chat`` and ``bench``."""

    backend: str = "auto"
    n_ctx: int = 4096
    n_threads: int | None = None
    n_gpu_layers: int = 0
    flash_attn: bool | None = None
    fetch: bool = False  # fetch a known model that is not downloaded yet
    mlx_quantize: str = "4bit"  # GGUF files with other than Q4_0/Q4_1/Q8_0 tensors, on MLX
    rpc: tuple[str, ...] = ()  # rpc-server endpoints for the model's layers (llama.cpp)
    kernels: str | None = None  # llama.cpp: "exact" or "fast" (backends/kernels.py; None: the default)
    # llama.cpp only: the logical and physical batch (-b/-ub), the K/V cache types
    # (-ctk/-ctv; None: f16) and whether the file is mapped (--no-mmap: read into memory).
    n_batch: int = 512
    n_ubatch: int | None = None
    type_k: str | None = None
    type_v: str | None = None
    use_mmap: bool = True
    chat_template: str | None = None  # --chat-template: Jinja used instead of the model's own

    # What only llama.cpp reads, with the flag that sets it (its default leaves it as is).
    LLAMA_CPP_ONLY = {"n_batch": "-b", "n_ubatch": "-ub", "type_k": "-ctk", "type_v": "-ctv",
                      "use_mmap": "--no-mmap"}

    def llama_cpp_flags(self) -> list[str]:
        """The flags of :attr:`LLAMA_CPP_ONLY` set to other than their defaults."""
        defaults = {f.name: f.default for f in fields(self)}
        return [flag for name, flag in self.LLAMA_CPP_ONLY.items() if getattr(self, name) != defaults[name]]

    def without_llama_cpp_settings(self) -> "BackendOptions":
        """These options with :attr:`LLAMA_CPP_ONLY` at their defaults (for an MLX model)."""
        defaults = {f.name: f.default for f in fields(self)}
        return replace(self, **{name: defaults[name] for name in self.LLAMA_CPP_ONLY})

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise EdgespecError(f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.n_ctx < 16:
            raise EdgespecError(f"invalid -c {self.n_ctx}: the context needs at least 16 tokens")
        if self.mlx_quantize not in ("4bit", "8bit", "none"):
            raise EdgespecError(f"invalid --mlx-quantize {self.mlx_quantize!r}: use 4bit, 8bit or none")
        if self.n_threads is not None and self.n_threads < 1:
            raise EdgespecError(f"invalid -t {self.n_threads}: must be >= 1")
        from ..backends.rpc import parse_endpoints
        self.rpc = parse_endpoints(self.rpc)
        if self.rpc and self.backend == "mlx":
            raise EdgespecError("--rpc runs a model on llama.cpp's RPC backend, not on MLX: "
                                "use a GGUF model with --backend llama.cpp (or auto)")
        if self.rpc:
            self.backend = "llama.cpp"
        from ..backends.kernels import kernel_mode
        self.kernels = kernel_mode(self.kernels)


def load_backend(spec: str, options: BackendOptions, *, name: str | None = None) -> Backend:
    """Load one model (target or drafter) on the chosen backend."""
    kind = pick_backend(spec, options.backend)
    if kind == "llama.cpp":
        path = resolve_model(spec, fetch=options.fetch)
        from ..backends.llamacpp import LlamaCppBackend
        backend = LlamaCppBackend(
            path, n_ctx=options.n_ctx, n_threads=options.n_threads, n_gpu_layers=options.n_gpu_layers,
            flash_attn=options.flash_attn, n_batch=options.n_batch, n_ubatch=options.n_ubatch,
            type_k=options.type_k, type_v=options.type_v, use_mmap=options.use_mmap,
            name=name or _display_name(spec), rpc=options.rpc, kernels=options.kernels)
    else:
        given = options.llama_cpp_flags()
        if given:
            raise EdgespecError(f"{', '.join(given)} set llama.cpp's batch and cache, which MLX "
                                f"does not have: leave {'them' if len(given) > 1 else 'it'} out "
                                f"with an MLX model (or use --backend llama.cpp with a GGUF file)")
        backend = _load_mlx(spec, options, name=name or _display_name(spec))
    if options.chat_template is not None:
        from ..core.chat_template import chat_template_from
        try:
            backend.use_chat_template(chat_template_from(options.chat_template))
        except BaseException:
            backend.close()
            raise
    return backend


def _load_mlx(spec: str, options: BackendOptions, *, name: str) -> Backend:
    """Load ``spec`` (GGUF file, model name, mlx-lm folder or Hub id) on MLX."""
    from ..backends.mlx_backend import load_mlx_folder, load_mlx_gguf
    path = Path(spec).expanduser()
    if not path.is_dir() and not (looks_like_hub_id(spec) and not path.exists()):
        path = resolve_model(spec, fetch=options.fetch)  # a GGUF file or a known model name
        return load_mlx_gguf(path, name=name, n_ctx=options.n_ctx, quantize=options.mlx_quantize,
                             kernels=options.kernels)
    folder = path if path.is_dir() else hub_snapshot(spec)
    return load_mlx_folder(folder, name=name, n_ctx=options.n_ctx, kernels=options.kernels)


def load_drafter(spec: str | None, options: BackendOptions, *,
                 min_confidence: float | None = None) -> Drafter | None:
    """``None``/``"none"``: no drafter; a name of :data:`~edgespec.drafters.registry.BUILTIN`
    (``"lookup"``, ``"suffix"``, ...): that drafter; else a draft model (stopping below
    ``min_confidence``, if given: --draft-p-min).

    The :class:`~edgespec.core.engine.Engine` checks a draft model's vocabulary
    against the target's.
    """
    return drafter_from_name(spec, lambda name: DraftModel(load_backend(name, options),
                                                           min_confidence=min_confidence or 0.0))


def _display_name(spec: str) -> str:
    path = Path(spec)
    return path.stem if path.suffix == ".gguf" else spec.rstrip("/").split("/")[-1]
