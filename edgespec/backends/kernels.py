"""Exact kernels: llama.cpp on the CPU with verify passes that round exactly as
one-token steps, so speculative output is plain decoding's, token for token, with
no near-tie exception.

Found op by op with ``scripts/kernel_invariance.py`` (an n-token pass against n
one-token steps, max |logit difference| over Qwen2.5's 151,936 ids; 0 is
bit-identical). Where llama.cpp's CPU backend takes another route for the rows of a
batch than for one row:

- **attention without flash attention**: K·Q goes through llamafile's sgemm for
  n >= 2 tokens, vec_dot for one. Flash attention does each query row alone.
- **an f16 (or f32) KV cache**: flash attention splits the cache between threads
  for a one-token step once the cache view reaches 512 cells, and tiles passes of
  64 queries or more: other summation orders than a batch row's. A q8_0 cache takes
  neither path.
- **repacked weights** (CPU_REPACK): a gemm for 4 rows or more, a gemv below.
- **the tiled K-quant matmul** (``GGML_CPU_TILED_MM``): from 8 rows.
- (llamafile's sgemm also multiplies Q4_0, Q8_0 and float weights from 2 rows.)

Exact kernels turn on flash attention with a q8_0 KV cache and, for the weights,
split a verify pass into pieces short enough to take the one-row routes: the
longest of 7, 3 and 2 tokens that a probe at load finds bit-identical to one-token
steps (:func:`invariant_chunk`; 3 with repacked Q4_K weights, 7 without). Prompt
processing stays batched: plain and speculative decoding process a prompt alike.
A model or CPU where even 2 tokens part gets no exact kernels, and says why; so
does a GPU or RPC offload, where no such path is known. What they cost is in
docs/exactness.md (``scripts/bench_kernels.py``).
"""

from __future__ import annotations

import os

import numpy as np

EXACT, FAST = "exact", "fast"
MODES = (EXACT, FAST)
ENV = "EDGESPEC_KERNELS"
DEFAULT = FAST  # docs/exactness.md: the costs this default was chosen from
EXACT_KV_CACHE = "q8_0"
CHUNKS = (7, 3, 2)  # pass sizes the probe tries, longest first (the tiled matmul starts at 8)
# MLX: its CPU backend measured bit-identical from 2 to 33 tokens; what Metal does is for
# the probe to find on the Mac (docs/exactness.md).
MLX_CHUNKS = (33, 9, 3, 2)


def check_exact_settings(flash_attn: bool | None, type_k: str | None, type_v: str | None) -> None:
    """Refuse settings exact kernels cannot keep: they run flash attention over a
    q8_0 K/V cache (what the probe found to round alike in every pass size)."""
    from ..errors import EdgespecError
    asked = ["-fa off"] if flash_attn is False else []
    asked += [f"{flag} {value}" for flag, value in (("-ctk", type_k), ("-ctv", type_v))
              if value is not None and value.lower() != EXACT_KV_CACHE]
    if asked:
        raise EdgespecError(f"{' and '.join(asked)} cannot run on exact kernels, which need flash "
                            f"attention over a {EXACT_KV_CACHE} K/V cache: leave "
                            f"{'them' if len(asked) > 1 else 'it'} out, or use --kernels fast")
PROBE_TEXT = "def mean(xs):\n    return sum(xs) / len(xs)\n\nprint(mean([1, 2, 3]))\n" * 3


def kernel_mode(requested: str | None = None) -> str:
    """The kernels asked for: ``requested``, else ``$EDGESPEC_KERNELS``, else the default."""
    mode = requested or os.environ.get(ENV) or DEFAULT
    if mode not in MODES:
        from ..errors import EdgespecError
        raise EdgespecError(f"invalid kernels {mode!r} (--kernels or ${ENV}): use exact or fast")
    return mode


def pass_difference(model, context, tokens) -> float:
    """The largest |logit difference| between ``tokens`` evaluated after ``context`` as
    one pass and as one-token steps, on ``model`` (a backend or a cache: ``forward`` and
    ``rewind``; its cache is left empty). 0 is bit-identical."""
    model.rewind(0)
    model.forward(context, last_only=True)
    batched = np.asarray(model.forward(tokens), dtype=np.float32)
    model.rewind(len(context))
    steps = np.concatenate([np.asarray(model.forward([t]), dtype=np.float32) for t in tokens])
    model.rewind(0)
    return float(np.max(np.abs(batched - steps)))


def invariant_chunk(backend, sizes=CHUNKS) -> int:
    """The longest pass size of ``sizes`` whose rows equal one-token steps bit for bit
    on ``backend`` (with an empty cache), after a few tokens of context; 0 if none.
    Leaves the cache empty."""
    ids = backend.tokenize(PROBE_TEXT, add_bos=False, special=False)
    start = 4
    return next((size for size in sizes
                 if pass_difference(backend, ids[:start], ids[start:start + size]) == 0.0), 0)


def prefill_invariant(backend, sizes=(8, 64)) -> bool:
    """Whether a prompt pass (one batch, logits of its last row only) leaves the K/V a
    cold run of one-token steps leaves, on ``backend`` with an empty cache: the next
    token's logits compared bit for bit after each of ``sizes`` tokens (the cheap size
    first: where the weights are repacked, 4 rows already part). Where it holds, a
    reply's tokens, decoded in one-token steps, may be reused for the next prompt with
    exact kernels; where not, only K/V from whole prompt passes may
    (:class:`edgespec.core.cache.CachedModel`). Leaves the cache empty."""
    ids = backend.tokenize(PROBE_TEXT * 4, add_bos=False, special=False)
    for n in sizes:
        if n + 1 > min(len(ids), backend.n_ctx):
            return False
        backend.rewind(0)
        backend.forward(ids[:n], last_only=True)
        batched = np.asarray(backend.forward([ids[n]]), dtype=np.float32)
        backend.rewind(0)
        for t in ids[:n]:
            backend.forward([t], last_only=True)
        steps = np.asarray(backend.forward([ids[n]]), dtype=np.float32)
        backend.rewind(0)
        if not np.array_equal(batched, steps):
            return False
    return True


def probe(backend, sizes=CHUNKS) -> tuple[int, str | None]:
    """Exact kernels on ``backend``: the pass size its verify passes go in
    (:func:`invariant_chunk`), and why there are none where that is 0 (else None)."""
    chunk = invariant_chunk(backend, sizes)
    return chunk, None if chunk else "on this CPU and build even a 2-token pass rounds unlike one-token steps"


def describe() -> str:
    """``edgespec info``'s line: which kernels a CPU target runs here, and what that means."""
    if kernel_mode() == EXACT:
        return ("exact: speculative output is plain decoding's, token for token (flash attention, "
                "q8_0 KV cache, verify passes in pieces; docs/exactness.md)")
    return ("fast: batched and one-token passes round differently, so speculative output may "
            "part from plain decoding at a near-tie (--kernels exact: token for token)")
