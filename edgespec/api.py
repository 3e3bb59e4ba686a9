"""The Python API a desktop app embeds: ``edgespec.load(...)`` returns an Engine.

May import: models, planner, drafters, backends, core, errors, paths.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Callable, Sequence

from .core.engine import Engine
from .core.prompt_cache import PromptCache, default_budget_mib
from .core.prompt_disk import PromptDisk
from .core.prompt_disk import default_budget_mib as disk_budget_mib
from .errors import EdgespecError
from .models.arguments import pick_backend
from .models.loading import BackendOptions, load_backend, load_drafter
from .planner import AutoPlanners


def load(model: str | os.PathLike, draft: str | os.PathLike | None = None, backend: str = "auto", *,
         draft_backend: str | None = None, num_draft: int | str = "auto",
         draft_p_min: float | None = None, n_ctx: int = 4096,
         n_threads: int | None = None, n_gpu_layers: int = 0, flash_attn: bool | None = None,
         draft_n_threads: int | None = None, draft_n_gpu_layers: int | None = None,
         mlx_quantize: str = "4bit", fetch: bool = True,
         rpc: str | Sequence[str] | None = None, draft_rpc: str | Sequence[str] | None = None,
         kernels: str | None = None, cache_ram: int | None = None,
         cache_reuse: int = 0, cache_dir: str | os.PathLike | None = None,
         cache_disk: int | None = None, n_batch: int = 512, n_ubatch: int | None = None,
         type_k: str | None = None, type_v: str | None = None, use_mmap: bool = True,
         chat_template: str | None = None, draft_min: int = 0, prior: dict | None = None,
         clock: Callable[[], float] = time.perf_counter) -> Engine:
    """Load a target model (and optionally a drafter) and return an :class:`Engine`.

    ``model``/``draft``: a .gguf path, a name from ``edgespec models list``, an
    mlx-lm folder or a Hugging Face repo id; ``draft="lookup"`` uses prompt
    lookup. ``num_draft="auto"`` (the default) lets the engine pick prompt
    lookup, the draft model or plain decoding each round from measured costs
    and acceptance; an integer fixes k. ``draft_p_min``: the draft model stops
    drafting below this top probability (default: learned in auto mode, else 0).
    ``n_gpu_layers``/``n_threads`` (llama.cpp's ``-ngl``/``--threads``) apply to
    the draft model too unless ``draft_n_gpu_layers``/``draft_n_threads`` say
    otherwise (``-ngld``/``--threads-draft``).
    ``rpc``: ``rpc-server`` endpoints (``"HOST:PORT,..."`` or a list) that hold
    the target's layers, through llama.cpp's RPC backend; the draft model stays
    on this machine unless ``draft_rpc`` names servers for it.
    Known models that are missing are fetched when ``fetch`` is true.
    ``kernels="exact"`` runs the target's verify passes on kernels that round as
    one-token steps (speculative output is plain decoding's, token for token;
    docs/exactness.md): llama.cpp on the CPU, MLX where a probe at load finds its
    passes do; ``"fast"`` on the fastest; None: ``$EDGESPEC_KERNELS``
    or the default. The draft model always runs the fast ones (its rounding cannot
    change the output).
    ``cache_ram``: MiB of host RAM for saved prompts (llama-server's ``--cache-ram``):
    a prompt that repeats an earlier conversation's restores its KV state instead of
    evaluating it again (0: off; None: 8 GiB, or a quarter of the RAM if less).
    ``cache_reuse``: llama-server's ``--cache-reuse``: chunks of at least this many
    cached tokens that reappear after a divergence go into place by KV shift (llama.cpp
    only; 0, the default, off). Not exact: it moves the logits (docs/exactness.md), so
    exact kernels ignore it.
    ``cache_dir``: a folder for saved prompts that outlive the process: a state leaves
    RAM for it, and the conversation in the caches is written there when the engine
    closes, so the next process (a chat started again, a server restarted) restores a
    conversation's prompt instead of evaluating it (None, the default: no folder).
    ``cache_disk``: its budget in MiB (None: ``$EDGESPEC_CACHE_DISK``, else 4096; 0: off).
    Several processes may share one folder.
    llama.cpp's context settings, for the target (the draft model takes the batch sizes
    and ``use_mmap`` too): ``n_batch``/``n_ubatch`` (-b/-ub), ``type_k``/``type_v``
    (-ctk/-ctv: f16, q8_0, ...; None: f16), ``use_mmap=False`` (--no-mmap).
    ``chat_template``: a name (``chatml``, ``llama3``, ...) or a Jinja template used
    instead of the model's own (--chat-template). ``draft_min``: a draft shorter than
    this is not verified (--draft-min; 0, the default: any).
    ``prior``: the costs auto mode starts from instead of this machine's kept ones (a
    benchmark's, a replay's; then nothing is kept); ``clock``: what times passes (a
    replay's: :mod:`edgespec.measure.replay`).
    Raises :class:`~edgespec.errors.EdgespecError` with a readable reason on
    bad input (missing file, incompatible drafter, ...).
    """
    model = os.fspath(model)  # a pathlib.Path will do as well as a string
    draft = None if draft is None else os.fspath(draft)
    if draft_n_threads is not None and draft_n_threads < 1:
        raise EdgespecError(f"invalid -td {draft_n_threads}: must be >= 1")
    if cache_ram is not None and (not isinstance(cache_ram, int) or cache_ram < 0):
        raise EdgespecError(f"invalid --cache-ram {cache_ram!r}: MiB, an integer >= 0 (0 turns it off)")
    if not isinstance(cache_reuse, int) or cache_reuse < 0:
        raise EdgespecError(f"invalid --cache-reuse {cache_reuse!r}: a chunk size in tokens, >= 0 (0 turns it off)")
    if not isinstance(draft_min, int) or draft_min < 0:
        raise EdgespecError(f"invalid --draft-min {draft_min!r}: an integer >= 0 (0: any draft)")
    if cache_disk is not None and (not isinstance(cache_disk, int) or cache_disk < 0):
        raise EdgespecError(f"invalid --cache-disk {cache_disk!r}: MiB, an integer >= 0 (0 turns it off)")
    disk = None if cache_dir is None else \
        PromptDisk(cache_dir, (disk_budget_mib() if cache_disk is None else cache_disk) * 2**20)
    prompt_cache = PromptCache((default_budget_mib() if cache_ram is None else cache_ram) * 2**20,
                               shift_min=cache_reuse, disk=disk)
    options = BackendOptions(backend=backend, n_ctx=n_ctx, n_threads=n_threads,
                             n_gpu_layers=n_gpu_layers, flash_attn=flash_attn,
                             mlx_quantize=mlx_quantize, fetch=fetch, rpc=rpc or (), kernels=kernels,
                             n_batch=n_batch, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                             use_mmap=use_mmap, chat_template=chat_template)
    target = load_backend(model, options)
    try:
        draft_options = replace(
            options, backend=draft_backend or backend,
            n_threads=n_threads if draft_n_threads is None else draft_n_threads,
            n_gpu_layers=n_gpu_layers if draft_n_gpu_layers is None else draft_n_gpu_layers,
            rpc=draft_rpc or (), kernels="fast", type_k=None, type_v=None, chat_template=None)
        if draft is not None and pick_backend(draft, draft_options.backend) == "mlx":
            draft_options = draft_options.without_llama_cpp_settings()
        # A stop the user chose is the draft model's own, in every mode (auto mode keeps
        # it); otherwise auto mode learns where to stop. The engine checks the pair first,
        # then (in auto mode) times it, the first time, through the caches it generates with.
        drafter = load_drafter(draft, draft_options, min_confidence=draft_p_min)
        return Engine(target, drafter, num_draft=num_draft,
                      planners=AutoPlanners(prior=prior, min_draft=draft_min),
                      prompt_cache=prompt_cache, clock=clock)
    except BaseException:
        target.close()
        raise
